"""The objects the cluster commands read and write (pure): a stored TrainJob's name, status,
model and progress report, a Pod's replica, a manifest made ready to create or apply (or made
from a parsed job), and kubectl's ways of printing them (durations, ages, aligned columns).

Everything takes the plain objects `trainjob.cluster.api` returns (TrainJobs, Pods and Events
as `kubectl get -o json` prints them).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, spec
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.local.plan import ReplicaKey, label

Obj = Mapping[str, Any]
NONE: Final = "<none>"  # an empty cell, as kubectl prints it


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


# ----- a job that waits suspended -----
# The label Kueue's Workloads carry for the job they admit (the operator's Kueue integration
# sets it too: kueue_workload.JOB_UID_LABEL).
KUEUE_JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
# The Suspended condition's reasons while Kueue holds the job (kueue_workload.JOB_REASON_*):
# waiting for admission (again), or its Workload finished before the job ran.
KUEUE_WAITING_REASONS: Final = (st.REASON_QUEUED, st.REASON_EVICTED_BY_QUEUE)
KUEUE_FINISHED_REASON: Final = "WorkloadFinished"
RESUME_PATCH: Final = json.dumps({"spec": {"runPolicy": {"suspend": False}}}, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class Hold:
    """A job that waits suspended, said as it is: Queued (Kueue holds it) or Suspended, as
    `kubectl get tj` says; why (the Suspended condition, in Kueue's words while Kueue holds
    it); whether it ever started (else nothing was ever created for it); how it goes on."""

    state: str
    reason: str
    message: str
    started: bool
    resume: str

    @property
    def meanwhile(self) -> str:
        """What exists of the job while it waits."""
        if self.started:
            return (
                "stopped: its Pods and Services were deleted; it resumes from its checkpoint "
                "as a new attempt"
            )
        return "not started: no Pod or Service is created until it starts"


def hold_of(obj: Obj) -> Hold | None:
    """How a suspended, unfinished job waits; None for any other job."""
    status = status_of(obj)
    condition = status.condition(st.SUSPENDED)
    if condition is None or not condition.status or status.finished:
        return None
    started = status.start_time is not None  # set whenever its Pods may be created
    return Hold(
        state=st.state_of(status),
        reason=condition.reason,
        message=condition.message,
        started=started,
        resume=resume_hint(obj, condition.reason, started),
    )


def resume_hint(obj: Obj, reason: str, started: bool) -> str:
    """What starts a suspended job: Kueue's admission, or its user unsuspending it."""
    name, namespace = name_of(obj), namespace_of(obj)
    if reason in KUEUE_WAITING_REASONS:
        uid = (obj.get("metadata") or {}).get("uid") or "<uid>"
        when = (
            "resumes it once it admits its Workload again"
            if started
            else "starts it once it admits its Workload"
        )
        return (
            f"Kueue {when}; where it waits: kubectl describe workloads -n {namespace} "
            f"-l {KUEUE_JOB_UID_LABEL}={uid}"
        )
    if reason == KUEUE_FINISHED_REASON:
        return "Kueue finished its Workload, so it does not start: delete it and submit it again"
    return (
        "It waits for spec.runPolicy.suspend to be false: "
        f"kubectl patch tj {name} -n {namespace} --type merge -p '{RESUME_PATCH}'"
    )


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


def age(obj: Obj, now: datetime.datetime) -> str:
    created = st.parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return NONE if created is None else human_duration((now - created).total_seconds())


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
