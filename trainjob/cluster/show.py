"""What the cluster commands show and decide about a job (pure): the `get` table, the live
view's `Snapshot` and the final `Summary` built from a TrainJob's status, and what `wait`
concludes. Beside it: the objects themselves (`trainjob.cluster.objects`) and `describe` and
`logs` (`trainjob.cluster.describe`).

Everything takes the plain objects `trainjob.cluster.api` returns (TrainJobs, Pods and Events
as `kubectl get -o json` prints them) and `now`, and returns data or strings, so the same
`trainjob.console.view` draws a cluster job exactly as it draws a local run.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.cluster.objects import (
    NONE,
    Hold,
    Obj,
    age,
    align,
    hold_of,
    namespace_of,
    no_status_yet,
    parse_job,
    pod_key,
    ref_of,
    report_of,
    source_of,
    status_of,
)
from trainjob.console import view
from trainjob.console.outcome import Cause, Summary, failed_replicas
from trainjob.console.replica_progress import ReplicaProgress, lead_replica
from trainjob.core import containers, spec, termination, times
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey, replica_label

WAIT_FOR: Final = ("succeeded", "finished", "running")


# ----- get -----
HEADERS: Final = (
    "NAME",
    "STATE",
    "READY",
    "RESTARTS",
    "REASON",
    "PROGRESS",
    "ETA",
    "LOSS",
    "DEVICES",
    "AGE",
)


def _cell(value: object) -> str:
    return NONE if value is None or value == "" else str(value)


def job_row(obj: Obj, now: datetime.datetime, *, wide: bool = False) -> list[str]:
    """The columns of `kubectl get tj` (the CRD's printer columns), from the same fields; a
    TFJob is named `tfjob/NAME`, as the commands take it."""
    status = obj.get("status") or {}
    progress = status.get("progress") or {}
    row = [
        str(ref_of(obj)),
        job_state(obj),
        _cell(status.get("ready")),
        _cell(status.get("restartCount")),
        _cell(_running_reason(status)),
        _cell(progress.get("summary")),
        _cell(progress.get("eta")),
        _cell(progress.get("loss")),
        _cell(progress.get(core_progress.DEVICE_SUMMARY)),
        age(obj, now),
    ]
    if wide:
        step, total = progress.get("step"), progress.get("totalSteps")
        row.append(NONE if step is None else f"{step}/{total}" if total else str(step))
        row.append(_cell(state_message(status_of(obj)) or waiting_note(obj)))
    return row


NO_STATUS_YET: Final = (
    "no status from the TrainJob operator yet: the job was just created, or the operator is "
    "not running"
)


def waiting_note(obj: Obj) -> str | None:
    """What a job nobody has written a status for yet may mean (None once it has one): a
    TrainJob's first status holds its conditions (Created at least)."""
    if ref_of(obj).is_tfjob:
        return no_status_yet(obj)
    return None if (obj.get("status") or {}).get("conditions") else NO_STATUS_YET


def job_state(obj: Obj) -> str:
    """The STATE column: what the operator wrote, else what the conditions say, which for a
    job nobody has written a status for yet (just created, the operator down; a TFJob the
    operator has not served yet) is Pending, as `kubectl get tj` says from the CRD's default."""
    written = (obj.get("status") or {}).get("state")
    return str(written) if written else st.state_of(status_of(obj))


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


# ----- the live view and the summary -----
def replica_key(text: str | None) -> ReplicaKey | None:
    match = re.match(r"^(chief|worker|ps|evaluator)-(\d+)$", text or "")
    return None if match is None else (match[1], int(match[2]))


def replica_progress(
    job: spec.TrainJob, status: Mapping[str, Any] | None
) -> dict[ReplicaKey, ReplicaProgress]:
    """status.progress as the view's per-replica progress: the report's numbers on the replica
    it names (else the lead), and each replica's devices (`replicaDevices`)."""
    progress = (status or {}).get("progress")
    result = {
        key: ReplicaProgress(devices=devices)
        for name, devices in core_progress.devices_of_status(progress).items()
        if (key := replica_key(name)) is not None
    }
    report = report_of(status)
    if report is None:
        return result
    key = replica_key(report.replica) or lead_replica(job)
    result[key] = ReplicaProgress(
        # Both count from 1; a script of one's own may report epoch 0.
        epoch=None if report.epoch is None else max(1, report.epoch),
        step=report.step,
        loss=report.loss,
        examples_per_sec=report.examples_per_second,
        checkpoint=report.last_checkpoint,
        end_status=None if report.state == core_progress.STATE_RUNNING else report.state,
        devices=result[key].devices if key in result else report.devices,
    )
    return result


def elapsed_seconds(obj: Obj, now: datetime.datetime) -> float:
    """Since the job started (else since it was created), until it completed."""
    raw = obj.get("status") or {}
    start = times.parse_time(raw.get("startTime")) or times.parse_time(
        (obj.get("metadata") or {}).get("creationTimestamp")
    )
    end = times.parse_time(raw.get("completionTime")) or now
    return view.elapsed(start, end)


def rows_of(job: spec.TrainJob, status: st.JobStatus, waiting: str = "") -> list[view.ReplicaRow]:
    """A row per replica; one with no Pod of its attempt shows `waiting` (Queued, Suspended)
    when the job waits suspended, else the view's "Starting"."""
    rows = []
    for key in job.replica_keys():
        record = status.record(key)
        state = record.state or waiting
        rows.append(view.ReplicaRow(key, state, record.attempt, record.exit_code, None))
    return rows


def snapshot(obj: Obj, now: datetime.datetime) -> view.Snapshot:
    """The live table's state of a cluster job, from its status alone."""
    job, status = parse_job(obj), status_of(obj)
    report = report_of(obj.get("status"))
    hold = hold_of(obj)
    return view.Snapshot(
        kind=ref_of(obj).kind,
        job=job,
        status=status,
        rows=rows_of(job, status, "" if hold is None else hold.state),
        progress=replica_progress(job, obj.get("status")),
        elapsed_seconds=elapsed_seconds(obj, now),
        report=report,
    )


def logs_command(obj: Obj, replica: str | None = None) -> str:
    target = f"{ref_of(obj)} {replica}" if replica else str(ref_of(obj))
    return f"trainjob logs {target} -n {namespace_of(obj)} --cluster"


def _termination_cause(pods: Sequence[Obj], key: ReplicaKey) -> str | None:
    """The cause in the replica container's termination message, read as the operator reads
    it (`termination.read`): never the runtime's final progress report, nor a
    progress bar that filled the log's tail."""
    for pod in pods:
        if pod_key(pod) != key:
            continue
        for container in containers.of_pod(pod):
            terminated = container.terminated or {}
            cause = termination.read(terminated.get("message")).cause
            if cause:
                return cause
    return None


def summary(obj: Obj, pods: Sequence[Obj], now: datetime.datetime) -> Summary:
    """The final summary of a cluster job, as `trainjob run` prints one for a local run; the
    causes quote the failed replicas' last words (or their exit codes) and say
    which command prints their logs."""
    job, status = parse_job(obj), status_of(obj)
    report = report_of(obj.get("status"))
    causes = []
    for key in failed_replicas(status, job):
        record = status.record(key)
        # The operator's quote first: it read the log where the termination message had no
        # exception (a Keras progress bar fills the kubelet's 2 KiB tail: issue 32).
        line = (
            record.message
            or _termination_cause(pods, key)
            or f"exit code {record.exit_code}" + (f" ({record.reason})" if record.reason else "")
        )
        causes.append(Cause(replica_label(key), line, logs_command(obj, replica_label(key))))
    if job.checkpoint is not None:
        checkpoint = job.checkpoint.path + (
            f" on PVC {job.checkpoint.claim_name}" if job.checkpoint.claim_name else ""
        )
    elif ref_of(obj).is_tfjob:
        checkpoint = "none named (a TFJob has no spec.checkpoint: its code writes where it chooses)"
    else:
        checkpoint = "none (spec.checkpoint is not set)"
    return Summary(
        kind=ref_of(obj).kind,
        job=job,
        status=status,
        interrupted=None,
        elapsed_seconds=elapsed_seconds(obj, now),
        run_dir="",
        log_dir=logs_command(obj),
        checkpoint_dir=checkpoint,
        export=None,
        progress=replica_progress(job, obj.get("status")),
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
    """What Ctrl-C in `attach` leaves behind: the job goes on (or waits, and for what) on the
    cluster, and how to attach again."""
    hold = hold_of(obj)
    ref = ref_of(obj)
    where = f"{ref.kind} {ref.name} keeps running on the cluster. "
    if hold is not None:
        where = (
            f"{ref.kind} {ref.name} stays {hold.state} on the cluster ({hold.meanwhile}).\n"
            f"{hold.resume}\n"
        )
    return f"Detached: {where}Attach again with:\n  trainjob attach {ref} -n {namespace_of(obj)}\n"


def hold_lines(hold: Hold, said: Sequence[str]) -> list[str]:
    """What `attach` says of a job that waits suspended, when it first sees it so (or sees a
    new reason): why, unless an Event it printed said so already (Events expire after an
    hour, the condition stays), then what exists of it and what starts it."""
    why = [] if hold.message in said else [f"* {hold.reason}: {hold.message}"]
    return [*why, f"  {hold.state}, {hold.meanwhile}.", f"  {hold.resume}"]


# ----- wait -----
def wait_outcome(obj: Obj, wait_for: str) -> int | None:
    """What `wait` exits with now (0 the awaited state was reached, 1 the job Failed, which
    no later state can undo), or None to keep waiting.

    A TFJob's verdict must also be in the TFJob's own conditions: the operator writes the
    engine's status (its annotation, which the view reads) before the TFJob's status, so for
    a moment the annotation says Running while `kubectl describe tfjob`, the SDK and Kueue
    read no Running yet; `wait` returns once what it reported is what they read next."""
    status = status_of(obj)
    if status.is_true(st.FAILED):
        reached, outcome = st.FAILED, 0 if wait_for == "finished" else 1
    elif status.is_true(st.SUCCEEDED):
        reached, outcome = st.SUCCEEDED, 0
    elif wait_for == "running" and status.is_true(st.RUNNING):
        reached, outcome = st.RUNNING, 0
    else:
        return None
    if ref_of(obj).is_tfjob and not _tfjob_says(source_of(obj), reached):
        return None
    return outcome


def _tfjob_says(tfjob_obj: Obj, condition_type: str) -> bool:
    """Whether the TFJob's own status has `condition_type` True (Kubeflow's condition types
    are named as the engine's: Created, Running, Restarting, Succeeded, Failed)."""
    conditions = (tfjob_obj.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == condition_type and c.get("status") == "True"
        for c in conditions
    )
