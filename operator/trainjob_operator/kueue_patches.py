"""Every change Kueue's protocol asks of a TrainJob and of its Workload, as pure data (kueue.py
applies them): the admission merged into the job's templates and the templates restored on
eviction (one merge patch each), the Workload status writes (PodsReady, Finished, an evicted
admission cleared), and what the job's own status says while Kueue holds it. The Workload
itself, and reading it, are in kueue_workload.py.

No I/O, no clock: every function takes what it needs and returns plain data.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from trainjob.core import policy, reasons, times
from trainjob.core import status as st
from trainjob_operator import kueue_workload as kw

Obj = dict[str, Any]


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
    from_multikueue = kw.MULTIKUEUE_ORIGIN_LABEL in (metadata.get("labels") or {})
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
        labels = {kw.PODSET_LABEL: name}
        if local_queue:
            labels[kw.LOCAL_QUEUE_LABEL] = local_queue
        if cluster_queue and _is_dns_label(cluster_queue):
            labels[kw.CLUSTER_QUEUE_LABEL] = cluster_queue
        if from_multikueue:
            labels[kw.MULTIKUEUE_POD_LABEL] = "true"
        info = PodSetInfo(
            name=name,
            labels=labels,
            annotations={kw.WORKLOAD_ANNOTATION: str(metadata.get("name") or "")},
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
                "message": message[: kw.MAX_MESSAGE],
                "lastTransitionTime": transition or times.format_time(now),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    if not found:
        result.append(
            {
                "type": ctype,
                "status": value,
                "reason": reason,
                "message": message[: kw.MAX_MESSAGE],
                "lastTransitionTime": times.format_time(now),
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
            _conditions(workload), kw.FINISHED, True, reason, message, now, _generation(workload)
        )
    }


def clear_admission_status(workload: Mapping[str, Any], now: datetime.datetime) -> Obj:
    """What an evicted job's controller writes once its Pods are gone, so that Kueue queues
    the Workload again (ReconcileGenericJob's eviction branch): no admission,
    QuotaReserved=False, Admitted=False (adding the admitted time to
    accumulatedPastExecutionTimeSeconds), and Requeued — True after a preemption or node
    failures, False otherwise — with the eviction's reason and message."""
    evicted = kw.condition(workload, kw.EVICTED) or {}
    reason = str(evicted.get("reason") or "")
    message = str(evicted.get("message") or "")
    generation = _generation(workload)
    conditions: Sequence[Mapping[str, Any]] = _conditions(workload)
    requeue = reason in (kw.REASON_EVICTED_BY_PREEMPTION, kw.REASON_NODE_FAILURES)
    conditions = _set_condition(
        conditions, kw.REQUEUED, requeue, reason or kw.REASON_PENDING, message, now, generation
    )
    conditions = _set_condition(
        conditions, kw.QUOTA_RESERVED, False, kw.REASON_PENDING, message, now, generation
    )
    result: Obj = {"admission": None}
    admitted = kw.condition(workload, kw.ADMITTED)
    if admitted is not None and admitted.get("status") == "True":
        since = times.parse_time(admitted.get("lastTransitionTime"))
        if since is not None:
            past = (workload.get("status") or {}).get("accumulatedPastExecutionTimeSeconds") or 0
            result["accumulatedPastExecutionTimeSeconds"] = int(past) + int(
                (now - since).total_seconds()
            )
    conditions = _set_condition(
        conditions,
        kw.ADMITTED,
        False,
        kw.REASON_NO_RESERVATION,
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
    if not kw.is_admitted(workload):
        return (False, kw.REASON_WAIT_FOR_START, not_ready)
    current = kw.condition(workload, kw.PODS_READY)
    if all_running:
        reason = kw.REASON_STARTED
        if current is not None and current.get("reason") in (
            kw.REASON_WAIT_FOR_RECOVERY,
            kw.REASON_RECOVERED,
        ):
            reason = kw.REASON_RECOVERED
        return (True, reason, "All pods reached readiness and the workload is running")
    if current is None:
        return (False, kw.REASON_WAIT_FOR_START, not_ready)
    if current.get("status") == "True" or current.get("reason") == kw.REASON_WAIT_FOR_RECOVERY:
        return (False, kw.REASON_WAIT_FOR_RECOVERY, recovering)
    return (False, kw.REASON_WAIT_FOR_START, not_ready)


def pods_ready_status(
    workload: Mapping[str, Any], all_running: bool, now: datetime.datetime
) -> Obj | None:
    """The status write that brings PodsReady in step; None when it already is."""
    status, reason, message = pods_ready_condition(workload, all_running)
    current = kw.condition(workload, kw.PODS_READY)
    if (
        current is not None
        and current.get("status") == ("True" if status else "False")
        and current.get("reason") == reason
    ):
        return None
    return {
        "conditions": _set_condition(
            _conditions(workload),
            kw.PODS_READY,
            status,
            reason,
            message,
            now,
            _generation(workload),
        )
    }


# -- what the job's status says while Kueue holds it ---------------------------------------------


# A hold's message before the Workload exists.
CREATING_WORKLOAD: Final = "Waiting for Kueue: creating the Workload"


def tells_kueues_reason(message: str) -> bool:
    """Whether a hold's message carries Kueue's own words (why it has not admitted the job),
    not only that the Workload is being made or that Kueue has yet to look at it."""
    return not message.startswith(CREATING_WORKLOAD) and not message.endswith(kw.NOT_LOOKED_AT)


def hold_reason(workload: Mapping[str, Any] | None, queue: str | None) -> tuple[str, str]:
    """The reason and message of the job's Suspended condition while Kueue holds it, in
    words a user acts on: which queue, which Workload, and Kueue's own reason."""
    if workload is None:
        return (
            kw.JOB_REASON_QUEUED,
            f"{CREATING_WORKLOAD} in LocalQueue {queue or kw.DEFAULT_LOCAL_QUEUE}",
        )
    name = str((workload.get("metadata") or {}).get("name") or "")
    local = str((workload.get("spec") or {}).get("queueName") or queue or "")
    if kw.is_finished(workload):
        finished = kw.condition(workload, kw.FINISHED) or {}
        return (
            kw.JOB_REASON_WORKLOAD_FINISHED,
            f"Kueue finished Workload {name} before the job ran: "
            f"{finished.get('reason')}: {finished.get('message')}",
        )
    evicted = kw.condition(workload, kw.EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        return (
            kw.JOB_REASON_EVICTED,
            f"Evicted by Kueue ({evicted.get('reason')}): {evicted.get('message')}; "
            f"Workload {name} waits in LocalQueue {local} to be admitted again",
        )
    if (workload.get("spec") or {}).get("active") is False:
        return (
            kw.JOB_REASON_QUEUED,
            f"Workload {name} is deactivated (spec.active=false): it waits until it is "
            "activated again",
        )
    return (
        kw.JOB_REASON_QUEUED,
        f"Waiting for Kueue to admit Workload {name} in LocalQueue {local}: "
        f"{kw.pending_message(workload)}",
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
    reason (`hold`), and the Event of each new hold (and of Kueue's first words about it)
    says so instead of a bare "Suspended";
    when Kueue admits it, "Admitted" (with the ClusterQueue) replaces "Resumed"."""
    status = decision.status
    events = list(decision.events)
    if hold is not None and status.is_true(st.SUSPENDED):
        reason, message = hold
        conditions = st.set_condition(status.conditions, st.SUSPENDED, True, reason, message, now)
        status = dataclasses.replace(status, conditions=conditions)
        before = old.condition(st.SUSPENDED)
        # An Event per new hold, and one more when Kueue first says why: the job's first
        # Queued Event comes before Kueue has looked at its Workload.
        if (
            before is None
            or not before.status
            or before.reason != reason
            or (tells_kueues_reason(message) and not tells_kueues_reason(before.message))
        ):
            kueue_event = policy.Event(
                "Warning" if reason != kw.JOB_REASON_QUEUED else "Normal",
                {
                    kw.JOB_REASON_QUEUED: reasons.EVENT_QUEUED,
                    kw.JOB_REASON_EVICTED: reasons.EVENT_EVICTED_BY_KUEUE,
                }.get(reason, reasons.EVENT_WORKLOAD_FINISHED),
                message,
            )
            suspended = [i for i, e in enumerate(events) if e.reason == reasons.EVENT_SUSPENDED]
            if suspended:
                events[suspended[0]] = kueue_event
            else:
                events.append(kueue_event)
    elif hold is None and workload is not None and old.is_true(st.SUSPENDED):
        resumed = [i for i, e in enumerate(events) if e.reason == reasons.EVENT_RESUMED]
        if resumed:
            name = (workload.get("metadata") or {}).get("name")
            admission = (workload.get("status") or {}).get("admission") or {}
            queue = admission.get("clusterQueue")
            events[resumed[0]] = policy.Event(
                "Normal",
                reasons.EVENT_ADMITTED,
                f"Admitted by Kueue: Workload {name} in ClusterQueue {queue}; "
                "creating its replicas",
            )
    return dataclasses.replace(decision, status=status, events=tuple(events))
