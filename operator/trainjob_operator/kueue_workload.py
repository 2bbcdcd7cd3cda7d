"""Kueue's side of a TrainJob, as pure data: which jobs Kueue manages, the Workload that
stands for a job in its queue, and how to read one (kueue_patches.py has the changes the
protocol asks of the job and of the Workload; kueue.py carries them out).

Kueue (v0.19, `integrations.externalFrameworks: ["TrainJob.v1alpha1.trainjob.dev"]`) creates
nothing for a kind it does not build in: the job's own controller keeps one Workload per job,
keeps the job suspended until Kueue admits that Workload, starts it with the admission's
flavors, stops it on eviction and tells Kueue when it ended. This is a port of Kueue's
`jobframework.ReconcileGenericJob` with its TFJob integration (`kubeflowjob`), which TFJob
users on Kueue know; the Kueue function each piece follows is named in its docstring.

No I/O, no clock: every function takes what it needs and returns plain data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, naming, reasons, render, spec
from trainjob.core import status as st

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
WORKLOADS: Final = "workloads"
RESOURCE_FLAVORS: Final = "resourceflavors"
WORKLOAD_PRIORITY_CLASSES: Final = "workloadpriorityclasses"

# Labels and annotations Kueue reads or writes (pkg/controller/constants, apis/kueue).
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL: Final = "kueue.x-k8s.io/priority-class"
MAX_EXEC_TIME_LABEL: Final = "kueue.x-k8s.io/max-exec-time-seconds"
PREBUILT_WORKLOAD: Final = "kueue.x-k8s.io/prebuilt-workload-name"
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
PODSET_LABEL: Final = "kueue.x-k8s.io/podset"
LOCAL_QUEUE_LABEL: Final = "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_LABEL: Final = "kueue.x-k8s.io/cluster-queue-name"
WORKLOAD_ANNOTATION: Final = "kueue.x-k8s.io/workload"
MULTIKUEUE_ORIGIN_LABEL: Final = "kueue.x-k8s.io/multikueue-origin"
MULTIKUEUE_POD_LABEL: Final = "kueue.x-k8s.io/multikueue-worker-workload-pod"
RESOURCE_IN_USE: Final = "kueue.x-k8s.io/resource-in-use"
# Kueue's LocalQueue for jobs that name none (constants.DefaultLocalQueueName).
DEFAULT_LOCAL_QUEUE: Final = "default"
# spec.managedBy values: ours (or unset) and MultiKueue's.
CONTROLLER_NAME: Final = f"{constants.GROUP}/trainjob-controller"
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
# Ours: the hash of what the Workload was built from (`equivalent`).
HASH_ANNOTATION: Final = f"{constants.GROUP}/workload-hash"

# Workload condition types and reasons (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED: Final = "QuotaReserved"
ADMITTED: Final = "Admitted"
EVICTED: Final = "Evicted"
PREEMPTED: Final = "Preempted"
REQUEUED: Final = "Requeued"
PODS_READY: Final = "PodsReady"
FINISHED: Final = "Finished"
REASON_PENDING: Final = "Pending"
REASON_NO_RESERVATION: Final = "NoReservation"
REASON_EVICTED_BY_PREEMPTION: Final = "Preempted"
REASON_NODE_FAILURES: Final = "NodeFailures"
REASON_WAIT_FOR_START: Final = "WaitForStart"
REASON_WAIT_FOR_RECOVERY: Final = "WaitForRecovery"
REASON_STARTED: Final = "Started"
REASON_RECOVERED: Final = "Recovered"
REASON_SUCCEEDED: Final = "Succeeded"
REASON_FAILED: Final = "Failed"
REASON_OWNER_NOT_FOUND: Final = "OwnerNotFound"
REASON_FAILED_TO_START: Final = "FailedToStart"
REASON_OUT_OF_SYNC: Final = "OutOfSync"

# The TrainJob's own condition reasons while Kueue holds it (Suspended=True).
JOB_REASON_QUEUED: Final = st.REASON_QUEUED
JOB_REASON_EVICTED: Final = st.REASON_EVICTED_BY_QUEUE
JOB_REASON_WORKLOAD_FINISHED: Final = reasons.REASON_WORKLOAD_FINISHED

# PodSets in TFJob's order (kubeflowjob: Chief, Master, PS, Worker, Evaluator).
PODSET_ORDER: Final = (constants.CHIEF, constants.PS, constants.WORKER, constants.EVALUATOR)
# The Workload name's prefix is cut so that prefix + "-" + 5 hash characters fit 253.
MAX_PREFIX: Final = 253 - 1 - 5
# Kueue truncates condition messages to this length (api.TruncateConditionMessage).
MAX_MESSAGE: Final = 32 * 1024

Obj = dict[str, Any]


# -- which jobs -----------------------------------------------------------------------------


def queue_name(labels: Mapping[str, str]) -> str | None:
    """The LocalQueue a job asks for (Kueue reads the label only: QueueNameForObject)."""
    value = labels.get(QUEUE_LABEL)
    return value or None


def is_managed(labels: Mapping[str, str], manage_without_queue_name: bool) -> bool:
    """Whether Kueue manages this job: it names a queue, or every job in the namespace is
    managed (`manageJobsWithoutQueueName`; the caller checks the namespace selector)."""
    return queue_name(labels) is not None or manage_without_queue_name


def managed_elsewhere(managed_by: str | None) -> bool:
    """Whether another controller (MultiKueue) runs this job's Pods and writes its status."""
    return managed_by not in (None, "", CONTROLLER_NAME)


def prebuilt_workload_name(metadata: Mapping[str, Any]) -> str | None:
    """A Workload made for this job by someone else (MultiKueue on a worker cluster): an
    annotation since Kueue 0.18, a label before."""
    for key in ("annotations", "labels"):
        value = (metadata.get(key) or {}).get(PREBUILT_WORKLOAD)
        if value:
            return str(value)
    return None


def workload_name(
    job_name: str, uid: str, kind: str = constants.KIND, group: str = constants.GROUP
) -> str:
    """Kueue's name for a job's Workload (jobframework.GetWorkloadNameForOwnerWithGVK):
    `trainjob-<name>-<5 hex of sha1(kind, group, name, uid)>`, so `kubectl get workloads`
    shows the same names a Go integration would make."""
    prefix = f"{kind.lower()}-{job_name}"[:MAX_PREFIX]
    digest = hashlib.sha1(f"{kind}\n{group}\n{job_name}\n{uid}".encode()).hexdigest()
    return f"{prefix}-{digest[:5]}"


# -- the Workload ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Priority:
    """The Workload's priority as Kueue resolves it (ExtractPriority): a WorkloadPriorityClass
    label, else schedulingPolicy.priorityClass, else the first template's priorityClassName;
    `value` is that class's value (0 without a class)."""

    kind: str | None  # "WorkloadPriorityClass", "PriorityClass" or None
    name: str | None
    value: int = 0


def priority_source(job: spec.TrainJob) -> tuple[str, str] | None:
    """Which priority class names the job's priority: (kind, name), or None for the
    cluster's default. The caller looks the class up to learn its value."""
    label = job.labels.get(PRIORITY_CLASS_LABEL)
    if label:
        return ("WorkloadPriorityClass", label)
    policy = job.run_policy.scheduling_policy
    if policy is not None and policy.priority_class:
        return ("PriorityClass", policy.priority_class)
    for rtype in PODSET_ORDER:
        replica = job.replica_specs.get(rtype)
        if replica is None:
            continue
        name = (replica.template.get("spec") or {}).get("priorityClassName")
        if isinstance(name, str) and name:
            return ("PriorityClass", name)
    return None


def podset_template(job: spec.TrainJob, rtype: str, options: render.RenderOptions) -> Obj:
    """What Kueue sees of one replica type's Pods: the user's template metadata (the stash
    that eviction restores from) and the Pod spec the operator renders for index 0, so the
    requests Kueue counts against quota are the containers that will run (an empty template
    with `spec.image` still gets its `tensorflow` container)."""
    plain = dataclasses.replace(options, progress=None, scheduler_name=None, pod_group_name=None)
    pod = render.render_pod(job, rtype, 0, 0, plain, None)
    pod_spec = dict(pod["spec"])
    # Per-Pod identity, not part of the replica type's shape.
    for key in ("hostname", "subdomain"):
        pod_spec.pop(key, None)
    template_meta = job.replica_specs[rtype].template.get("metadata") or {}
    metadata: Obj = {}
    for key in ("labels", "annotations"):
        if template_meta.get(key):
            metadata[key] = dict(template_meta[key])
    return {"metadata": metadata, "spec": pod_spec}


def pod_sets(job: spec.TrainJob, options: render.RenderOptions) -> list[Obj]:
    """One podSet per replica type present, in TFJob's order, `count = replicas` and no
    `minCount` (a TensorFlow job runs whole or not at all)."""
    return [
        {
            "name": rtype,
            "count": job.replicas(rtype),
            "template": podset_template(job, rtype, options),
        }
        for rtype in PODSET_ORDER
        if job.replicas(rtype) > 0
    ]


def podsets_hash(pod_sets_: Sequence[Mapping[str, Any]]) -> str:
    """What decides whether a Workload still matches its job (EquivalentToWorkload): per
    podSet its name, count, containers and initContainers. Stored on the Workload when it is
    made and compared as a hash, never as a deep compare: the API server defaults fields
    into the stored podSets and Kueue's updates re-encode quantities (`1000m` -> `1`), so a
    deep compare would never match and would delete and recreate the Workload in a loop."""
    shape = [
        {
            "name": ps.get("name"),
            "count": ps.get("count"),
            "containers": ((ps.get("template") or {}).get("spec") or {}).get("containers"),
            "initContainers": ((ps.get("template") or {}).get("spec") or {}).get("initContainers"),
        }
        for ps in pod_sets_
    ]
    encoded = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]


def build_workload(
    job: spec.TrainJob,
    namespace: str,
    owner: render.Owner,
    options: render.RenderOptions,
    priority: Priority,
    name: str | None = None,
) -> Obj:
    """The Workload of a job (jobframework.ConstructWorkload): Kueue's name, a controller
    ownerReference (Kueue finds the integration through it, and a Workload without one can
    crash Kueue before v0.19.3: kueue#15346), the `job-uid` label, the `resource-in-use`
    finalizer, the queue, the priority and the podSets. Our job-name label lets the
    operator's informer find it with the job's Pods."""
    sets = pod_sets(job, options)
    labels = {JOB_UID_LABEL: owner.uid, **naming.job_selector(job.name)}
    body: Obj = {"podSets": sets}
    # A job managed without a queue label (manageJobsWithoutQueueName) goes to the
    # namespace's LocalQueue named "default", as Kueue defaults its own jobs'.
    body["queueName"] = queue_name(job.labels) or DEFAULT_LOCAL_QUEUE
    if priority.kind is not None and priority.name:
        group = GROUP if priority.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
        body["priorityClassRef"] = {"group": group, "kind": priority.kind, "name": priority.name}
    body["priority"] = priority.value
    max_exec = job.labels.get(MAX_EXEC_TIME_LABEL)
    if max_exec and max_exec.isdigit() and int(max_exec) > 0:
        body["maximumExecutionTimeSeconds"] = int(max_exec)
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name or workload_name(job.name, owner.uid),
            "namespace": namespace,
            "labels": labels,
            "annotations": {HASH_ANNOTATION: podsets_hash(sets)},
            "finalizers": [RESOURCE_IN_USE],
            "ownerReferences": [render.owner_reference(owner)],
        },
        "spec": body,
    }


# -- reading a Workload -----------------------------------------------------------------------


def condition(workload: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def is_true(workload: Mapping[str, Any], ctype: str) -> bool:
    cond = condition(workload, ctype)
    return cond is not None and cond.get("status") == "True"


def is_admitted(workload: Mapping[str, Any]) -> bool:
    """Admitted: quota reserved and every admission check ready (workload.IsAdmitted)."""
    return is_true(workload, ADMITTED)


def has_quota_reservation(workload: Mapping[str, Any]) -> bool:
    return (workload.get("status") or {}).get("admission") is not None and is_true(
        workload, QUOTA_RESERVED
    )


def is_finished(workload: Mapping[str, Any]) -> bool:
    return is_true(workload, FINISHED)


def is_deleting(workload: Mapping[str, Any]) -> bool:
    return bool((workload.get("metadata") or {}).get("deletionTimestamp"))


def owner_uid(workload: Mapping[str, Any]) -> str | None:
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("uid") or "") or None
    return None


def equivalent(workload: Mapping[str, Any], wanted_hash: str, uid: str) -> bool:
    """Whether the Workload still stands for this job as it is now: the same owner and the
    same podSets (by the hash stored when it was made). A Workload made by someone else
    (prebuilt) carries no hash; it is judged by its podSets' hash instead."""
    if owner_uid(workload) not in (None, uid):
        return False
    stored = ((workload.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION)
    if stored:
        return str(stored) == wanted_hash
    return podsets_hash((workload.get("spec") or {}).get("podSets") or []) == wanted_hash


# pending_message while Kueue has said nothing of the Workload yet.
NOT_LOOKED_AT: Final = "waiting for Kueue to look at it"


def pending_message(workload: Mapping[str, Any]) -> str:
    """Why Kueue has not admitted the Workload yet, in Kueue's words (the QuotaReserved=False
    message, e.g. "couldn't assign flavors to pod set worker: insufficient unused quota for
    cpu in flavor default, 4 more needed"), or what it waits for."""
    for ctype in (QUOTA_RESERVED, ADMITTED):
        cond = condition(workload, ctype)
        if cond is not None and cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    if has_quota_reservation(workload) and not is_admitted(workload):
        return "quota reserved; waiting for admission checks"
    return NOT_LOOKED_AT
