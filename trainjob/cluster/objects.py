"""The objects the cluster commands read and write (pure): a stored TrainJob's name, status,
model and progress report, a Pod's replica, a manifest made ready to create or apply (or made
from a parsed job), and kubectl's ways of printing them (durations, ages, aligned columns).

Everything takes the plain objects `trainjob.cluster.api` returns (TrainJobs, Pods and Events
as `kubectl get -o json` prints them). A Kubeflow TFJob that the TrainJob operator serves
(`--tfjob`) comes as its view (`tfjob_view`): the TrainJob it means, with the engine's status,
and the TFJob itself beside it under `TFJOB_KEY`, so every command reads both kinds alike and
names each as the user does (`job_ref`, `ref_of`: `mnist`, `tfjob/mnist`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, convert, spec, tfjob, times
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey, replica_label

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
    """The stored TrainJob as the core's model (the server has applied the CRD defaults); a
    TFJob's view as the operator reads it (its webhook's problems named first)."""
    source = obj.get(TFJOB_KEY)
    manifest = {key: value for key, value in obj.items() if key != TFJOB_KEY}
    try:
        job = spec.parse(manifest, require_images=False)
    except spec.SpecError as error:
        found = (
            tfjob.webhook_problems(source) + tfjob.template_problems(source)
            if isinstance(source, Mapping)
            else []
        )
        problems = "; ".join(str(p) for p in found or error.problems)
        raise ShowError(f"{ref_of(obj).kind} {name_of(obj)} cannot be read: {problems}") from error
    if isinstance(source, Mapping) and tfjob.replica_types(source).get(constants.CHIEF) == "Master":
        # Its Pods are <job>-master-<i>, as the operator names them (doors.TFJobDoor.parse).
        return dataclasses.replace(job, chief_name="master")
    return job


# ----- which job: a TrainJob, or a TFJob the TrainJob operator serves -----
# Where a TFJob's view keeps the TFJob it was read from, as the operator's own view of one does
# (trainjob_operator.doors.TFJOB_KEY); left out before `spec.parse`.
TFJOB_KEY: Final = "tfjob"
# The words kubectl takes for each kind (`tfjob/x`, `tfjobs.kubeflow.org/x`, `tj/x`), and the
# group each may be qualified with.
_KIND_WORDS: Final = {
    "trainjob": constants.KIND, "trainjobs": constants.KIND, "tj": constants.KIND,
    "tfjob": tfjob.KIND, "tfjobs": tfjob.KIND,
}  # fmt: skip
_GROUPS: Final = {
    constants.KIND: (constants.GROUP, f"{constants.VERSION}.{constants.GROUP}"),
    tfjob.KIND: (tfjob.GROUP, f"{tfjob.VERSION}.{tfjob.GROUP}"),
}


def kind_named(word: str) -> str | None:
    """The kind a kubectl resource word names (`tfjob`, `tfjobs.kubeflow.org`, `TFJob`, `tj`,
    `trainjobs.trainjob.dev`), else None."""
    resource, _, group = word.lower().partition(".")
    kind = _KIND_WORDS.get(resource)
    if kind is None or (group and group not in _GROUPS[kind]):
        return None
    return kind


@dataclasses.dataclass(frozen=True)
class JobRef:
    """A job as the commands name it: `mnist` (a TrainJob) or `tfjob/mnist` (a TFJob)."""

    kind: str  # constants.KIND or tfjob.KIND
    name: str

    @property
    def is_tfjob(self) -> bool:
        return self.kind == tfjob.KIND

    def __str__(self) -> str:
        return f"tfjob/{self.name}" if self.is_tfjob else self.name

    @property
    def resource(self) -> str:
        """kubectl's name of the kind (`get -o name`, `delete`): trainjob.trainjob.dev,
        tfjob.kubeflow.org."""
        return f"tfjob.{tfjob.GROUP}" if self.is_tfjob else f"trainjob.{constants.GROUP}"

    @property
    def short(self) -> str:
        """What kubectl is told (`kubectl patch tj ...`, `kubectl describe tfjob ...`)."""
        return "tfjob" if self.is_tfjob else "tj"


def job_ref(text: str) -> JobRef:
    """`mnist` or `trainjob/mnist`: a TrainJob; `tfjob/mnist` (any of kubectl's words for the
    kind, as `get -o name` prints it): a TFJob. ShowError for anything else."""
    word, slash, name = text.partition("/")
    if not slash:
        return JobRef(constants.KIND, text)
    kind = kind_named(word)
    if kind is None or not name or "/" in name:
        raise ShowError(
            f"{text}: name a job as NAME or trainjob/NAME (a TrainJob), or tfjob/NAME (a TFJob)"
        )
    return JobRef(kind, name)


def ref_of(obj: Obj) -> JobRef:
    """How the commands name this job: a TFJob's view as `tfjob/NAME`, a TrainJob by name."""
    kind = tfjob.KIND if isinstance(obj.get(TFJOB_KEY), Mapping) else constants.KIND
    return JobRef(kind, name_of(obj))


def source_of(obj: Obj) -> Obj:
    """The object as the API server stores it: a view's TFJob, else the object itself."""
    source = obj.get(TFJOB_KEY)
    return source if isinstance(source, Mapping) else obj


def not_served(raw: Obj) -> str | None:
    """Why the TrainJob operator keeps no status for this TFJob (another controller runs it),
    in words with where to look; None when it does, or may yet (nobody wrote one so far)."""
    name, namespace = name_of(raw), namespace_of(raw)
    look = f"kubectl describe tfjob {name} -n {namespace} shows it"
    managed = tfjob.managed_by(raw)
    if managed not in (None, tfjob.TRAINING_OPERATOR, tfjob.OURS):
        return (
            f"tfjob/{name} is run by {managed} (spec.runPolicy.managedBy), not by the TrainJob "
            f"operator: {look}"
        )
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    if tfjob.ANNOTATION_ENGINE_STATUS in annotations or not raw.get("status"):
        return None
    coexist = (
        ""
        if managed == tfjob.OURS
        else " Beside training-operator (--tfjob-mode coexist) it serves only the TFJobs with "
        f"spec.runPolicy.managedBy: {tfjob.OURS}."
    )
    return (
        f"tfjob/{name} has no status from the TrainJob operator (no "
        f"{tfjob.ANNOTATION_ENGINE_STATUS} annotation) but has one from another controller: "
        f"is the operator running with --tfjob (chart tfjob.enabled)?{coexist} {look}"
    )


def no_status_yet(obj: Obj) -> str | None:
    """For a TFJob's view that nobody has written a status for yet: what that may mean."""
    source = obj.get(TFJOB_KEY)
    if not isinstance(source, Mapping):
        return None
    annotations = (source.get("metadata") or {}).get("annotations") or {}
    if tfjob.ANNOTATION_ENGINE_STATUS in annotations:
        return None
    return (
        "no status from the TrainJob operator yet (it serves TFJobs when run with --tfjob, "
        "chart tfjob.enabled)"
    )


def tfjob_view(raw: Obj) -> dict[str, Any]:
    """What the commands read of a TFJob: the TrainJob it means (`tfjob.as_trainjob`: its spec
    as training-operator defaults it, the engine's status from the TFJob's annotation), its
    creation time, and the TFJob itself under TFJOB_KEY. ShowError, saying so, for a TFJob that
    another controller runs (`not_served`)."""
    problem = not_served(raw)
    if problem is not None:
        raise ShowError(problem)
    metadata = raw.get("metadata") or {}
    try:
        view = tfjob.as_trainjob(raw)
    except convert.ConvertError:  # replica types nobody can read: the operator failed it
        view = {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "metadata": {k: metadata[k] for k in ("name", "namespace", "uid") if k in metadata},
            "spec": {},
            "status": tfjob.engine_status(raw),
        }
    view["metadata"] = {
        **view["metadata"],
        **{k: metadata[k] for k in ("creationTimestamp", "deletionTimestamp") if k in metadata},
    }
    view[TFJOB_KEY] = dict(raw)
    return view


def tfjob_views(raws: Sequence[Obj]) -> tuple[list[dict[str, Any]], list[str]]:
    """The views of the TFJobs the TrainJob operator serves (or may yet), and the names
    (`namespace/name`) of those another controller runs."""
    views, others = [], []
    for raw in raws:
        if not_served(raw) is None:
            views.append(tfjob_view(raw))
        else:
            others.append(f"{namespace_of(raw)}/{name_of(raw)}")
    return views, others


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
        f"kubectl patch {ref_of(obj).short} {name} -n {namespace} --type merge -p "
        f"'{RESUME_PATCH}'"
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
    return replica_label(key) if key is not None else name_of(pod)


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
def age(obj: Obj, now: datetime.datetime) -> str:
    created = times.parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return NONE if created is None else times.format_age((now - created).total_seconds())


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
