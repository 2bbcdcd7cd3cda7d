"""What the cluster commands show and decide (pure): the `get` table, `describe` text, the live
view's `Snapshot` and the final `Summary` built from a TrainJob's status, which Pod logs to
follow, what `wait` concludes, and how `apply` merges a manifest into the stored object.

Everything takes the plain objects `trainjob.cluster.api` returns (TrainJobs, Pods and Events
as `kubectl get -o json` prints them) and `now`, and returns data or strings, so the same
`trainjob.local.view` draws a cluster job exactly as it draws a local run.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, spec
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.local import view
from trainjob.local.outcome import Cause, Summary, failed_replicas
from trainjob.local.plan import ReplicaKey, label
from trainjob.local.replica_progress import ReplicaProgress, lead_replica

Obj = Mapping[str, Any]
NONE: Final = "<none>"  # an empty cell, as kubectl prints it
# A line of `api.Cluster.follow_logs` that is a note about a stream, not a log line.
NOTE_PREFIX: Final = "\x00note: "
WAIT_FOR: Final = ("succeeded", "finished", "running")


class ShowError(ValueError):
    """An object that cannot be shown as asked (e.g. a spec this version cannot read)."""


# ----- objects -----
def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def namespace_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def status_of(obj: Obj) -> st.JobStatus:
    return st.from_dict(obj.get("status"))


def finished(obj: Obj) -> bool:
    return status_of(obj).finished


def parse_job(obj: Obj) -> spec.TrainJob:
    """The stored TrainJob as the core's model (the server has applied the CRD defaults)."""
    try:
        return spec.parse(obj, require_images=False)
    except spec.SpecError as error:
        problems = "; ".join(str(p) for p in error.problems)
        raise ShowError(f"TrainJob {name_of(obj)} cannot be read: {problems}") from error


# What the API server sets on an object it stores: a manifest saved with `get -o yaml` carries
# them, and a create that names a resourceVersion or uid is refused.
SERVER_SET_METADATA: Final = (
    "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "managedFields", "selfLink", "finalizers", "ownerReferences",
)  # fmt: skip


def submittable(manifest: Obj) -> dict[str, Any]:
    """The manifest as a new object: no status, none of the metadata the server sets."""
    metadata = {
        key: value
        for key, value in (manifest.get("metadata") or {}).items()
        if key not in SERVER_SET_METADATA
    }
    body = {key: value for key, value in manifest.items() if key != "status"}
    body["metadata"] = metadata
    return body


def applied(current: Obj, manifest: Obj) -> dict[str, Any]:
    """The object `apply` writes: the manifest's spec, labels and annotations on the stored
    object (its status, uid, finalizers and resourceVersion kept, so the write is a checked
    update of what we read)."""
    metadata = dict(current.get("metadata") or {})
    wanted = manifest.get("metadata") or {}
    for field in ("labels", "annotations"):
        if field in wanted:
            metadata[field] = {**(metadata.get(field) or {}), **(wanted.get(field) or {})}
    result = {key: value for key, value in current.items() if key != "metadata"}
    result["metadata"] = metadata
    result["spec"] = manifest.get("spec")
    return result


def _without_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def manifest_of(job: spec.TrainJob) -> dict[str, Any]:
    """A manifest for a parsed TrainJob (the client submits one given as a model): every field
    the model keeps, under the names the CRD gives them, so parsing it gives the same job."""
    policy = job.run_policy
    scheduling = policy.scheduling_policy
    run_policy = _without_none(
        {
            "cleanPodPolicy": policy.clean_pod_policy,
            "backoffLimit": policy.backoff_limit,
            "activeDeadlineSeconds": policy.active_deadline_seconds,
            "ttlSecondsAfterFinished": policy.ttl_seconds_after_finished,
            "startupDeadlineSeconds": policy.startup_deadline_seconds,
            "suspend": policy.suspend,
            "schedulingPolicy": None
            if scheduling is None
            else _without_none(
                {
                    "minAvailable": scheduling.min_available,
                    "queue": scheduling.queue,
                    "priorityClass": scheduling.priority_class,
                    "scheduleTimeoutSeconds": scheduling.schedule_timeout_seconds,
                }
            ),
        }
    )
    body = _without_none(
        {
            "managedBy": job.managed_by,
            "image": job.image,
            "runtime": None
            if job.runtime is None
            else {
                "entrypoint": job.runtime.entrypoint,
                "strategy": job.runtime.strategy,
                "framework": job.runtime.framework,
                "config": dict(job.runtime.config),
            },
            "replicaSpecs": {
                rtype: {
                    "replicas": replica.replicas,
                    "restartPolicy": replica.restart_policy,
                    "template": dict(replica.template),
                }
                for rtype, replica in job.replica_specs.items()
            },
            "checkpoint": None
            if job.checkpoint is None
            else _without_none(
                {
                    "path": job.checkpoint.path,
                    "claimName": job.checkpoint.claim_name,
                    "subPath": job.checkpoint.sub_path,
                }
            ),
            "runPolicy": run_policy,
            "successPolicy": job.success_policy,
        }
    )
    metadata = _without_none(
        {"name": job.name, "namespace": job.namespace, "labels": dict(job.labels) or None}
    )
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": metadata,
        "spec": body,
    }


# ----- time -----
def human_duration(seconds: float) -> str:
    """kubectl's AGE: `45s`, `3m20s`, `15m`, `5h2m`, `30h`, `3d4h`, `40d`, `2y10d`."""
    s = int(max(0.0, seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d"


_DURATION: Final = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """`90`, `90s`, `5m`, `1h30m` as seconds (kubectl's --timeout); ValueError naming it."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration such as 30s, 5m or 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _age(obj: Obj, now: datetime.datetime) -> str:
    created = st.parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return NONE if created is None else human_duration((now - created).total_seconds())


# ----- get -----
HEADERS: Final = ("NAME", "STATE", "READY", "RESTARTS", "REASON", "PROGRESS", "ETA", "LOSS", "AGE")


def _cell(value: object) -> str:
    return NONE if value is None or value == "" else str(value)


def job_row(obj: Obj, now: datetime.datetime, *, wide: bool = False) -> list[str]:
    """The columns of `kubectl get tj` (the CRD's printer columns), from the same fields."""
    status = obj.get("status") or {}
    progress = status.get("progress") or {}
    row = [
        name_of(obj),
        _cell(status.get("state")),
        _cell(status.get("ready")),
        _cell(status.get("restartCount")),
        _cell(_running_reason(status)),
        _cell(progress.get("summary")),
        _cell(progress.get("eta")),
        _cell(progress.get("loss")),
        _age(obj, now),
    ]
    if wide:
        step, total = progress.get("step"), progress.get("totalSteps")
        row.append(NONE if step is None else f"{step}/{total}" if total else str(step))
        row.append(_cell(state_message(status_of(obj))))
    return row


def _running_reason(status: Mapping[str, Any]) -> str | None:
    """The Running condition's reason (the REASON printer column: why a job is not running)."""
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == st.RUNNING:
            return str(condition.get("reason") or "") or None
    return None


def state_message(status: st.JobStatus) -> str:
    """`Reason: message` of the condition that gives the job its state."""
    for ctype in (st.FAILED, st.SUCCEEDED, st.SUSPENDED, st.RESTARTING, st.RUNNING, st.CREATED):
        condition = status.condition(ctype)
        if condition is not None and condition.status:
            return f"{condition.reason}: {condition.message}".strip(": ")
    return ""


def jobs_table(
    jobs: Sequence[Obj], now: datetime.datetime, *, all_namespaces: bool, wide: bool
) -> list[str]:
    """`kubectl get tj` as text: aligned columns, NAMESPACE first with -A, more with wide."""
    headers = list(HEADERS) + (["STEP", "MESSAGE"] if wide else [])
    rows = [job_row(job, now, wide=wide) for job in jobs]
    if all_namespaces:
        headers.insert(0, "NAMESPACE")
        rows = [[namespace_of(job), *row] for job, row in zip(jobs, rows, strict=True)]
    return align([headers, *rows])


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


# ----- progress and the live view -----
def report_of(raw_status: object) -> core_progress.Report | None:
    """The chief's latest report as the operator wrote it to status.progress (its display
    fields, `summary`, `eta` and `lastUpdateTime`, left out); None when there is none."""
    if not isinstance(raw_status, Mapping):
        return None
    progress = raw_status.get("progress")
    if not isinstance(progress, Mapping):
        return None
    wire = {k: v for k, v in progress.items() if k in core_progress.WIRE_FIELDS}
    try:
        return core_progress.parse_report(wire)
    except core_progress.ReportError:
        return None


def replica_key(text: str | None) -> ReplicaKey | None:
    match = re.match(r"^(chief|worker|ps|evaluator)-(\d+)$", text or "")
    return None if match is None else (match[1], int(match[2]))


def replica_progress(
    job: spec.TrainJob, report: core_progress.Report | None
) -> dict[ReplicaKey, ReplicaProgress]:
    """The report as the view's per-replica progress (the replica it names, else the lead)."""
    if report is None:
        return {}
    key = replica_key(report.replica) or lead_replica(job)
    return {
        key: ReplicaProgress(
            # A report counts epochs from 1, a local progress event from 0.
            epoch=None if report.epoch is None else max(0, report.epoch - 1),
            step=report.step,
            loss=report.loss,
            examples_per_sec=report.examples_per_second,
            checkpoint=report.last_checkpoint,
            end_status=None if report.state == core_progress.STATE_RUNNING else report.state,
        )
    }


def elapsed_seconds(obj: Obj, now: datetime.datetime) -> float:
    """Since the job started (else since it was created), until it completed."""
    raw = obj.get("status") or {}
    start = st.parse_time(raw.get("startTime")) or st.parse_time(
        (obj.get("metadata") or {}).get("creationTimestamp")
    )
    end = st.parse_time(raw.get("completionTime")) or now
    return view.elapsed(start, end)


def rows_of(job: spec.TrainJob, status: st.JobStatus) -> list[view.ReplicaRow]:
    rows = []
    for key in job.replica_keys():
        record = status.record(key)
        rows.append(view.ReplicaRow(key, record.state, record.attempt, record.exit_code, None))
    return rows


def snapshot(obj: Obj, now: datetime.datetime) -> view.Snapshot:
    """The live table's state of a cluster job, from its status alone."""
    job, status = parse_job(obj), status_of(obj)
    report = report_of(obj.get("status"))
    return view.Snapshot(
        job=job,
        status=status,
        rows=rows_of(job, status),
        progress=replica_progress(job, report),
        elapsed_seconds=elapsed_seconds(obj, now),
        report=report,
    )


def logs_command(obj: Obj, replica: str | None = None) -> str:
    target = f"{name_of(obj)} {replica}" if replica else name_of(obj)
    return f"trainjob logs {target} -n {namespace_of(obj)} --cluster"


def _termination_message(pods: Sequence[Obj], key: ReplicaKey) -> str | None:
    """The last line of the replica container's termination message, unless it is the
    runtime's final progress report."""
    for pod in pods:
        if pod_key(pod) != key:
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            message = str(terminated.get("message") or "").strip()
            if message and core_progress.from_termination_message(message) is None:
                return message.splitlines()[-1]
    return None


def summary(obj: Obj, pods: Sequence[Obj], now: datetime.datetime) -> Summary:
    """The final summary of a cluster job, as `trainjob run` prints one for a local run; the
    causes quote the failed replicas' termination messages (or their exit codes) and say
    which command prints their logs."""
    job, status = parse_job(obj), status_of(obj)
    report = report_of(obj.get("status"))
    causes = []
    for key in failed_replicas(status, job):
        record = status.record(key)
        line = _termination_message(pods, key) or (
            f"exit code {record.exit_code}" + (f" ({record.reason})" if record.reason else "")
        )
        causes.append(Cause(label(key), line, logs_command(obj, label(key))))
    checkpoint = (
        "none (spec.checkpoint is not set)"
        if job.checkpoint is None
        else f"{job.checkpoint.path}"
        + (f" on PVC {job.checkpoint.claim_name}" if job.checkpoint.claim_name else "")
    )
    return Summary(
        job=job,
        status=status,
        interrupted=None,
        elapsed_seconds=elapsed_seconds(obj, now),
        run_dir="",
        log_dir=logs_command(obj),
        checkpoint_dir=checkpoint,
        export=None,
        progress=replica_progress(job, report),
        causes=causes,
        report=report,
    )


def event_lines(events: Sequence[Obj]) -> list[str]:
    """`* Reason: message` (`!` for a Warning) per Event, as `trainjob run` prints its own."""
    lines = []
    for event in events:
        marker = "!" if event.get("type") == "Warning" else "*"
        lines.append(f"{marker} {event.get('reason')}: {event.get('message') or ''}".rstrip())
    return lines


def event_key(event: Obj) -> tuple[str, int]:
    """Tells Events apart across polls (an Event seen again with a higher count is new)."""
    return (str((event.get("metadata") or {}).get("uid")), int(event.get("count") or 1))


def attach_hint(obj: Obj) -> str:
    return (
        f"Detached: TrainJob {name_of(obj)} keeps running on the cluster. Attach again with:\n"
        f"  trainjob attach {name_of(obj)} -n {namespace_of(obj)}\n"
    )


# ----- wait -----
def wait_outcome(obj: Obj, wait_for: str) -> int | None:
    """What `wait` exits with now (0 the awaited state was reached, 1 the job Failed, which
    no later state can undo), or None to keep waiting."""
    status = status_of(obj)
    if status.is_true(st.FAILED):
        return 0 if wait_for == "finished" else 1
    if status.is_true(st.SUCCEEDED):
        return 0
    if wait_for == "running" and status.is_true(st.RUNNING):
        return 0
    return None


# ----- describe -----
def pod_key(pod: Obj) -> ReplicaKey | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    rtype, index = (
        labels.get(constants.LABEL_REPLICA_TYPE),
        labels.get(constants.LABEL_REPLICA_INDEX),
    )
    if not rtype or not str(index or "").isdigit():
        return None
    return (str(rtype), int(str(index)))


def pod_label(pod: Obj) -> str:
    key = pod_key(pod)
    return label(key) if key is not None else name_of(pod)


def log_instance(pod: Obj) -> str | None:
    """One container run of a Pod (its uid and restart count) whose log can be read: it has
    started (running or terminated). None while it waits to start."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") != constants.DEFAULT_CONTAINER_NAME:
            continue
        state = container.get("state") or {}
        if "running" in state or "terminated" in state:
            uid = (pod.get("metadata") or {}).get("uid")
            return f"{uid}/{container.get('restartCount') or 0}"
    return None


def log_unavailable(pod: Obj) -> str | None:
    """Why a Pod can have no log yet (the kubelet of its node keeps logs), else None."""
    if not (pod.get("spec") or {}).get("nodeName"):
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        return f"Pod {name_of(pod)} is on no node yet ({phase}, not scheduled), so it has no log"
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if container.get("name") == constants.DEFAULT_CONTAINER_NAME and waiting:
            why = waiting.get("reason") or "waiting"
            return f"Pod {name_of(pod)}: its container has not started ({why}), so it has no log"
    return None


def order_pods(pods: Sequence[Obj]) -> list[Obj]:
    """Replica order (chief, worker, ps, evaluator; by index), foreign Pods last by name."""

    def rank(pod: Obj) -> tuple[int, int, str]:
        key = pod_key(pod)
        if key is None or key[0] not in constants.REPLICA_TYPES:
            return (len(constants.REPLICA_TYPES), 0, name_of(pod))
        return (constants.REPLICA_TYPES.index(key[0]), key[1], "")

    return sorted(pods, key=rank)


def describe_text(
    obj: Obj, pods: Sequence[Obj], events: Sequence[Obj], now: datetime.datetime
) -> str:
    """`trainjob describe`: what kubectl describe would say, with the replicas, exit codes,
    cause and progress of a TrainJob laid out."""
    raw = obj.get("status") or {}
    status = status_of(obj)
    metadata = obj.get("metadata") or {}
    lines = [
        f"Name:         {name_of(obj)}",
        f"Namespace:    {namespace_of(obj)}",
        f"Created:      {metadata.get('creationTimestamp') or NONE} ({_age(obj, now)} ago)",
        f"State:        {raw.get('state') or st.state_of(status)}",
        f"Ready:        {raw.get('ready') or NONE}",
        f"Restarts:     {status.restart_count}",
        f"Started:      {raw.get('startTime') or NONE}",
        f"Completed:    {raw.get('completionTime') or NONE}",
    ]
    for ctype in (st.FAILED, st.SUCCEEDED):
        condition = status.condition(ctype)
        if condition is not None and condition.status:
            lines.append(f"Cause:        {condition.reason}: {condition.message}")
    report = report_of(raw)
    if report is not None:
        lines.append(f"Progress:     {view.progress_line(report)}")
        progress = raw.get("progress") or {}
        if progress.get("eta"):
            lines.append(f"ETA:          {progress['eta']}")
        if report.last_checkpoint:
            lines.append(f"Checkpoint:   {report.last_checkpoint}")
    else:
        lines.append(f"Progress:     {NONE}")
    lines.append("Conditions:")
    if status.conditions:
        rows = [["Type", "Status", "Reason", "Last Transition", "Message"]]
        rows += [
            [c.type, str(c.status), c.reason, st.format_time(c.last_transition_time), c.message]
            for c in status.conditions
        ]
        lines += ["  " + line for line in align(rows)]
    else:
        lines.append(f"  {NONE}")
    lines.append("Replicas:")
    replica_rows = [["Replica", "State", "Attempt", "Exit Code", "Reason", "Pod"]]
    pods_by_key = {pod_key(p): name_of(p) for p in pods}
    for rtype, type_status in (raw.get("replicaStatuses") or {}).items():
        for entry in (type_status or {}).get("indexes") or []:
            key = (str(rtype), int(entry.get("index") or 0))
            exit_code = entry.get("exitCode")
            replica_rows.append(
                [
                    label(key),
                    entry.get("state") or "Starting",
                    str(entry.get("attempt") or 0),
                    NONE if exit_code is None else str(exit_code),
                    entry.get("reason") or "",
                    pods_by_key.get(key, NONE),
                ]
            )
    if len(replica_rows) > 1:
        lines += ["  " + line for line in align(replica_rows)]
    else:
        lines.append(f"  {NONE}")
    lines.append("Events:")
    if events:
        rows = [["Type", "Reason", "Age", "From", "Object", "Message"]]
        for event in events:
            when = st.parse_time(
                event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
            )
            involved = event.get("involvedObject") or {}
            source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
            rows.append(
                [
                    str(event.get("type") or ""),
                    str(event.get("reason") or ""),
                    NONE if when is None else human_duration((now - when).total_seconds()),
                    str(source or ""),
                    f"{involved.get('kind', '')}/{involved.get('name', '')}",
                    str(event.get("message") or "").replace("\n", " "),
                ]
            )
        lines += ["  " + line for line in align(rows)]
    else:
        lines.append(f"  {NONE}")
    return "\n".join(lines) + "\n"


def sort_events(events: Sequence[Obj]) -> list[Obj]:
    def when(event: Obj) -> str:
        return str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
            or ""
        )

    return sorted(events, key=when)


@dataclasses.dataclass(frozen=True)
class LogRequest:
    """Which replicas `logs` prints: all of them, or one (`worker-0`)."""

    job: str
    replica: str | None = None

    def wants(self, pod: Obj) -> bool:
        return self.replica is None or pod_label(pod) == self.replica
