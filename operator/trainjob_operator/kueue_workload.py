"""Kueue's side of a TrainJob, as pure data: which jobs Kueue manages, the Workload that
stands for a job in its queue, and every change the Kueue protocol asks of the job and of
the Workload (kueue.py carries them out).

Kueue (v0.19, `integrations.externalFrameworks: ["TrainJob.v1alpha1.trainjob.dev"]`) creates
nothing for a kind it does not build in: the job's own controller keeps one Workload per job,
keeps the job suspended until Kueue admits that Workload, starts it with the admission's
flavors, stops it on eviction and tells Kueue when it ended. This is a port of Kueue's
`jobframework.ReconcileGenericJob` with its TFJob integration (`kubeflowjob`), which TFJob
users on Kueue know; the Kueue function each piece follows is named in its docstring.

No I/O, no clock: every function takes what it needs and returns plain data.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, naming, policy, render, spec
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
JOB_REASON_WORKLOAD_FINISHED: Final = "WorkloadFinished"

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
    queue = queue_name(job.labels)
    if queue:
        body["queueName"] = queue
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
    return "waiting for Kueue to look at it"


# -- admission: the templates the job runs with -----------------------------------------------


class MergeConflictError(ValueError):
    """An admission would overwrite a value the template already sets (podset.Merge): Kueue
    finishes such a Workload with reason FailedToStart."""


@dataclasses.dataclass(frozen=True)
class PodSetInfo:
    """What an admission adds to one replica type's template (podset.PodSetInfo)."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    scheduling_gates: tuple[Mapping[str, Any], ...] = ()


def _merge_map(
    base: Mapping[str, str], extra: Mapping[str, str], what: str, podset: str
) -> dict[str, str]:
    merged = dict(base)
    for key, value in extra.items():
        if key in merged and merged[key] != value:
            raise MergeConflictError(
                f"podSet {podset}: {what} {key}={merged[key]!r} conflicts with {value!r} "
                "from the admission"
            )
        merged[key] = value
    return merged


def _merge_list(
    base: Sequence[Mapping[str, Any]], extra: Iterable[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    merged = list(base)
    for item in extra:
        if item not in merged:
            merged.append(item)
    return merged


def admission_infos(
    workload: Mapping[str, Any], flavors: Mapping[str, Mapping[str, Any]]
) -> list[PodSetInfo]:
    """What to add to each replica type's template for this admission
    (getPodSetsInfoFromStatus): every assigned flavor's nodeLabels and tolerations, the
    podset label, the queue labels, the workload annotation, and the admission checks'
    podSetUpdates. `flavors`: the ResourceFlavors by name. MergeConflictError when two of
    them disagree on a key."""
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    cluster_queue = str(admission.get("clusterQueue") or "")
    local_queue = str((workload.get("spec") or {}).get("queueName") or "")
    metadata = workload.get("metadata") or {}
    from_multikueue = MULTIKUEUE_ORIGIN_LABEL in (metadata.get("labels") or {})
    infos: list[PodSetInfo] = []
    for assignment in admission.get("podSetAssignments") or []:
        name = str(assignment.get("name") or "")
        node_selector: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        seen: set[str] = set()
        for flavor in (assignment.get("flavors") or {}).values():
            if flavor in seen:
                continue
            seen.add(flavor)
            flavor_spec = (flavors.get(flavor) or {}).get("spec") or {}
            node_selector.update(flavor_spec.get("nodeLabels") or {})
            tolerations.extend(flavor_spec.get("tolerations") or [])
        labels = {PODSET_LABEL: name}
        if local_queue:
            labels[LOCAL_QUEUE_LABEL] = local_queue
        if cluster_queue and _is_dns_label(cluster_queue):
            labels[CLUSTER_QUEUE_LABEL] = cluster_queue
        if from_multikueue:
            labels[MULTIKUEUE_POD_LABEL] = "true"
        info = PodSetInfo(
            name=name,
            labels=labels,
            annotations={WORKLOAD_ANNOTATION: str(metadata.get("name") or "")},
            node_selector=node_selector,
            tolerations=tuple(tolerations),
        )
        for check in status.get("admissionChecks") or []:
            for update in check.get("podSetUpdates") or []:
                if update.get("name") == name:
                    info = PodSetInfo(
                        name=name,
                        labels=_merge_map(info.labels, update.get("labels") or {}, "label", name),
                        annotations=_merge_map(
                            info.annotations, update.get("annotations") or {}, "annotation", name
                        ),
                        node_selector=_merge_map(
                            info.node_selector,
                            update.get("nodeSelector") or {},
                            "nodeSelector",
                            name,
                        ),
                        tolerations=tuple(
                            _merge_list(info.tolerations, update.get("tolerations") or [])
                        ),
                    )
        infos.append(info)
    return infos


def _is_dns_label(value: str) -> bool:
    return (
        0 < len(value) <= 63
        and value[0].isalnum()
        and value[-1].isalnum()
        and all(ch.islower() or ch.isdigit() or ch == "-" for ch in value)
    )


def merged_template(template: Mapping[str, Any], info: PodSetInfo) -> Obj:
    """A replica template with an admission's info merged in (podset.Merge)."""
    result = copy.deepcopy(dict(template))
    meta = dict(result.get("metadata") or {})
    pod_spec = dict(result.get("spec") or {})
    meta["labels"] = _merge_map(meta.get("labels") or {}, info.labels, "label", info.name)
    meta["annotations"] = _merge_map(
        meta.get("annotations") or {}, info.annotations, "annotation", info.name
    )
    node_selector = _merge_map(
        pod_spec.get("nodeSelector") or {}, info.node_selector, "nodeSelector", info.name
    )
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = _merge_list(pod_spec.get("tolerations") or [], info.tolerations)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    gates = _merge_list(pod_spec.get("schedulingGates") or [], info.scheduling_gates)
    if gates:
        pod_spec["schedulingGates"] = gates
    result["metadata"] = meta
    result["spec"] = pod_spec
    return result


def start_patch(raw_job: Mapping[str, Any], infos: Sequence[PodSetInfo]) -> Obj:
    """The one merge patch that starts an admitted job (startJob -> RunWithPodSetsInfo):
    the templates with the admission merged in, and `suspend: false`, together, so no Pod
    is ever made from a template without its flavor. Raises MergeConflictError."""
    replica_specs = (raw_job.get("spec") or {}).get("replicaSpecs") or {}
    patch_specs: Obj = {}
    for info in infos:
        replica = replica_specs.get(info.name)
        if not isinstance(replica, Mapping):
            raise MergeConflictError(f"podSet {info.name}: the job has no such replica type")
        template = merged_template(replica.get("template") or {}, info)
        patch_specs[info.name] = {"template": template}
    return {"spec": {"replicaSpecs": patch_specs, "runPolicy": {"suspend": False}}}


def stop_patch(raw_job: Mapping[str, Any], workload: Mapping[str, Any] | None) -> Obj:
    """The merge patch that stops a job Kueue does not (or no longer) admit (stopJob):
    `suspend: true` and each template's labels, annotations, nodeSelector, tolerations and
    schedulingGates restored from the Workload, which keeps them as they were before the
    admission (RestorePodSetsInfo)."""
    patch: Obj = {"spec": {"runPolicy": {"suspend": True}}}
    if workload is None:
        return patch
    replica_specs = (raw_job.get("spec") or {}).get("replicaSpecs") or {}
    restored: Obj = {}
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        name = pod_set.get("name")
        replica = replica_specs.get(name)
        if not isinstance(replica, Mapping):
            continue
        template = replica.get("template") or {}
        original = pod_set.get("template") or {}
        original_meta = original.get("metadata") or {}
        original_spec = original.get("spec") or {}
        current_meta = template.get("metadata") or {}
        current_spec = template.get("spec") or {}
        meta_patch: Obj = {}
        for key in ("labels", "annotations"):
            if (current_meta.get(key) or {}) != (original_meta.get(key) or {}):
                # A merge patch merges maps: null the keys the admission added.
                wanted = dict(original_meta.get(key) or {})
                meta_patch[key] = (
                    {
                        **{k: None for k in current_meta.get(key) or {} if k not in wanted},
                        **wanted,
                    }
                    if wanted
                    else None
                )
        spec_patch: Obj = {}
        current_selector = current_spec.get("nodeSelector") or {}
        original_selector = original_spec.get("nodeSelector") or {}
        if current_selector != original_selector:
            spec_patch["nodeSelector"] = (
                {
                    **{k: None for k in current_selector if k not in original_selector},
                    **original_selector,
                }
                if original_selector
                else None
            )
        for key in ("tolerations", "schedulingGates"):
            if (current_spec.get(key) or []) != (original_spec.get(key) or []):
                spec_patch[key] = original_spec.get(key) or None
        template_patch: Obj = {}
        if meta_patch:
            template_patch["metadata"] = meta_patch
        if spec_patch:
            template_patch["spec"] = spec_patch
        if template_patch:
            restored[str(name)] = {"template": template_patch}
    if restored:
        patch["spec"]["replicaSpecs"] = restored
    return patch


# -- Workload status writes --------------------------------------------------------------------


def _set_condition(
    conditions: Sequence[Mapping[str, Any]],
    ctype: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
    generation: int | None,
) -> list[Obj]:
    """metav1 SetStatusCondition: the transition time moves only when the status flips."""
    value = "True" if status else "False"
    result: list[Obj] = []
    found = False
    for cond in conditions:
        if cond.get("type") != ctype:
            result.append(dict(cond))
            continue
        found = True
        transition = cond.get("lastTransitionTime") if cond.get("status") == value else None
        result.append(
            {
                "type": ctype,
                "status": value,
                "reason": reason,
                "message": message[:MAX_MESSAGE],
                "lastTransitionTime": transition or st.format_time(now),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    if not found:
        result.append(
            {
                "type": ctype,
                "status": value,
                "reason": reason,
                "message": message[:MAX_MESSAGE],
                "lastTransitionTime": st.format_time(now),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    return result


def _generation(workload: Mapping[str, Any]) -> int | None:
    generation = (workload.get("metadata") or {}).get("generation")
    return generation if isinstance(generation, int) else None


def _conditions(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c for c in (workload.get("status") or {}).get("conditions") or [] if isinstance(c, Mapping)
    ]


def finish_status(
    workload: Mapping[str, Any], reason: str, message: str, now: datetime.datetime
) -> Obj:
    """Finished=True (workloadfinish.Finish): Kueue releases the quota."""
    return {
        "conditions": _set_condition(
            _conditions(workload), FINISHED, True, reason, message, now, _generation(workload)
        )
    }


def clear_admission_status(workload: Mapping[str, Any], now: datetime.datetime) -> Obj:
    """What an evicted job's controller writes once its Pods are gone, so that Kueue queues
    the Workload again (ReconcileGenericJob's eviction branch): no admission,
    QuotaReserved=False, Admitted=False (adding the admitted time to
    accumulatedPastExecutionTimeSeconds), and Requeued — True after a preemption or node
    failures, False otherwise — with the eviction's reason and message."""
    evicted = condition(workload, EVICTED) or {}
    reason = str(evicted.get("reason") or "")
    message = str(evicted.get("message") or "")
    generation = _generation(workload)
    conditions: Sequence[Mapping[str, Any]] = _conditions(workload)
    requeue = reason in (REASON_EVICTED_BY_PREEMPTION, REASON_NODE_FAILURES)
    conditions = _set_condition(
        conditions, REQUEUED, requeue, reason or REASON_PENDING, message, now, generation
    )
    conditions = _set_condition(
        conditions, QUOTA_RESERVED, False, REASON_PENDING, message, now, generation
    )
    result: Obj = {"admission": None}
    admitted = condition(workload, ADMITTED)
    if admitted is not None and admitted.get("status") == "True":
        since = st.parse_time(admitted.get("lastTransitionTime"))
        if since is not None:
            past = (workload.get("status") or {}).get("accumulatedPastExecutionTimeSeconds") or 0
            result["accumulatedPastExecutionTimeSeconds"] = int(past) + int(
                (now - since).total_seconds()
            )
    conditions = _set_condition(
        conditions,
        ADMITTED,
        False,
        REASON_NO_RESERVATION,
        "The workload has no reservation",
        now,
        generation,
    )
    result["conditions"] = conditions
    return result


def pods_ready_condition(workload: Mapping[str, Any], all_running: bool) -> tuple[bool, str, str]:
    """The PodsReady condition Kueue expects of the job's controller
    (generatePodsReadyCondition): (status, reason, message)."""
    not_ready = "Not all pods are ready or succeeded"
    recovering = "At least one pod has failed, waiting for recovery"
    if not is_admitted(workload):
        return (False, REASON_WAIT_FOR_START, not_ready)
    current = condition(workload, PODS_READY)
    if all_running:
        reason = REASON_STARTED
        if current is not None and current.get("reason") in (
            REASON_WAIT_FOR_RECOVERY,
            REASON_RECOVERED,
        ):
            reason = REASON_RECOVERED
        return (True, reason, "All pods reached readiness and the workload is running")
    if current is None:
        return (False, REASON_WAIT_FOR_START, not_ready)
    if current.get("status") == "True" or current.get("reason") == REASON_WAIT_FOR_RECOVERY:
        return (False, REASON_WAIT_FOR_RECOVERY, recovering)
    return (False, REASON_WAIT_FOR_START, not_ready)


def pods_ready_status(
    workload: Mapping[str, Any], all_running: bool, now: datetime.datetime
) -> Obj | None:
    """The status write that brings PodsReady in step; None when it already is."""
    status, reason, message = pods_ready_condition(workload, all_running)
    current = condition(workload, PODS_READY)
    if (
        current is not None
        and current.get("status") == ("True" if status else "False")
        and current.get("reason") == reason
    ):
        return None
    return {
        "conditions": _set_condition(
            _conditions(workload), PODS_READY, status, reason, message, now, _generation(workload)
        )
    }


# -- what the job's status says while Kueue holds it ---------------------------------------------


def hold_reason(workload: Mapping[str, Any] | None, queue: str | None) -> tuple[str, str]:
    """The reason and message of the job's Suspended condition while Kueue holds it, in
    words a user acts on: which queue, which Workload, and Kueue's own reason."""
    if workload is None:
        return (
            JOB_REASON_QUEUED,
            f"Waiting for Kueue: creating the Workload in LocalQueue {queue}",
        )
    name = str((workload.get("metadata") or {}).get("name") or "")
    local = str((workload.get("spec") or {}).get("queueName") or queue or "")
    if is_finished(workload):
        finished = condition(workload, FINISHED) or {}
        return (
            JOB_REASON_WORKLOAD_FINISHED,
            f"Kueue finished Workload {name} before the job ran: "
            f"{finished.get('reason')}: {finished.get('message')}",
        )
    evicted = condition(workload, EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        return (
            JOB_REASON_EVICTED,
            f"Evicted by Kueue ({evicted.get('reason')}): {evicted.get('message')}; "
            f"Workload {name} waits in LocalQueue {local} to be admitted again",
        )
    if (workload.get("spec") or {}).get("active") is False:
        return (
            JOB_REASON_QUEUED,
            f"Workload {name} is deactivated (spec.active=false): it waits until it is "
            "activated again",
        )
    return (
        JOB_REASON_QUEUED,
        f"Waiting for Kueue to admit Workload {name} in LocalQueue {local}: "
        f"{pending_message(workload)}",
    )


def held_decision(
    decision: policy.Decision,
    old: st.JobStatus,
    hold: tuple[str, str] | None,
    workload: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> policy.Decision:
    """The policy engine's decision for a Kueue-managed job, told in Kueue's terms: while
    Kueue holds the job, its Suspended condition names the queue, the Workload and Kueue's
    reason (`hold`), and the Event of each new hold says so instead of a bare "Suspended";
    when Kueue admits it, "Admitted" (with the ClusterQueue) replaces "Resumed"."""
    status = decision.status
    events = list(decision.events)
    if hold is not None and status.is_true(st.SUSPENDED):
        reason, message = hold
        conditions = st.set_condition(status.conditions, st.SUSPENDED, True, reason, message, now)
        status = dataclasses.replace(status, conditions=conditions)
        before = old.condition(st.SUSPENDED)
        if before is None or not before.status or before.reason != reason:
            kueue_event = policy.Event(
                "Warning" if reason != JOB_REASON_QUEUED else "Normal",
                {JOB_REASON_QUEUED: "Queued", JOB_REASON_EVICTED: "Evicted"}.get(
                    reason, "WorkloadFinished"
                ),
                message,
            )
            suspended = [i for i, e in enumerate(events) if e.reason == "Suspended"]
            if suspended:
                events[suspended[0]] = kueue_event
            else:
                events.append(kueue_event)
    elif hold is None and workload is not None and old.is_true(st.SUSPENDED):
        resumed = [i for i, e in enumerate(events) if e.reason == "Resumed"]
        if resumed:
            name = (workload.get("metadata") or {}).get("name")
            admission = (workload.get("status") or {}).get("admission") or {}
            queue = admission.get("clusterQueue")
            events[resumed[0]] = policy.Event(
                "Normal",
                "Admitted",
                f"Admitted by Kueue: Workload {name} in ClusterQueue {queue}; "
                "creating its replicas",
            )
    return dataclasses.replace(decision, status=status, events=tuple(events))
