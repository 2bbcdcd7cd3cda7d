"""Turn a Pod (as the API server returns it, a camelCase mapping) into what the policy engine
needs: replica key, phase, attempt, exit code, deletion, and why it is not running or why it
ended (the kubelet's, the scheduler's or the replica's own words). Pure, so it is tested as
data."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final

from trainjob.core import constants, containers, lastwords, policy, termination, times

# The scheduler's PodScheduled=False reason for a Pod that fits no node.
REASON_UNSCHEDULABLE: Final = policy.REASON_UNSCHEDULABLE
# Pod condition (Kubernetes >= 1.26) set by whoever disrupts a Pod: the scheduler's
# preemption, the Eviction API, the taint manager, the kubelet's node-pressure eviction, pod GC.
DISRUPTION_TARGET: Final = "DisruptionTarget"


# scheduler-plugins' Coscheduling, once it has rejected a gang, answers every later try of the
# gang's Pods with words about the gang itself (its backoff, siblings rejected with it, its
# wait at Permit running out) instead of why no node fits; within a second those replace the
# scheduler's first words ("Insufficient nvidia.com/gpu") in each Pod's PodScheduled condition
# (scheduler-plugins v0.34 coscheduling.go and core.go; tests/integration/test_gpu_cluster.py).
GANG_ECHOES: Final = (
    "failed recently",
    "optimistic rejection in PostFilter",
    "rejected due to timeout after waiting",
)


# Which replica a child is, from its labels (None: not a replica).
KeyOf = Callable[[Mapping[str, Any]], "tuple[str, int] | None"]


def replica_key(labels: Mapping[str, Any]) -> tuple[str, int] | None:
    """Which replica our labels say a child is (a TFJob's children made by training-operator
    carry only its labels: trainjob.core.tfjob.replica_key reads those)."""
    return labelled_key(
        labels.get(constants.LABEL_REPLICA_TYPE), labels.get(constants.LABEL_REPLICA_INDEX)
    )


def labelled_key(rtype: object, index: object) -> tuple[str, int] | None:
    """(type, index) from a replica type and an index as labels spell them, if valid."""
    if rtype not in constants.REPLICA_TYPES or not isinstance(index, str) or not index.isdigit():
        return None
    return str(rtype), int(index)


def observe_pod(
    pod: Mapping[str, Any], key_of: KeyOf = replica_key
) -> tuple[tuple[str, int], policy.ObservedReplica] | None:
    """None for a Pod that is not a replica (`key_of` finds no key in its labels)."""
    metadata = pod.get("metadata") or {}
    key = key_of(metadata.get("labels") or {})
    if key is None:
        return None
    annotations = metadata.get("annotations") or {}
    attempt_text = str(annotations.get(constants.ANNOTATION_ATTEMPT, "0"))
    pod_status = pod.get("status") or {}
    terminated = containers.terminated(pod)
    exit_code = terminated.get("exitCode") if terminated else None
    reason = (terminated or {}).get("reason") or pod_status.get("reason")
    phase = str(pod_status.get("phase") or policy.PHASE_PENDING)
    waiting = _waiting(pod) if phase == policy.PHASE_PENDING else None
    disruption = _condition(pod_status, DISRUPTION_TARGET)
    return key, policy.ObservedReplica(
        phase=phase,
        attempt=int(attempt_text) if attempt_text.isdigit() else 0,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(reason) if reason else None,
        deleting=bool(metadata.get("deletionTimestamp")),
        finished_at=times.parse_time((terminated or {}).get("finishedAt")),
        waiting_reason=waiting[0] if waiting else None,
        waiting_message=waiting[1] if waiting else None,
        disruption_reason=disruption[0] if disruption else None,
        disruption_message=disruption[1] if disruption else None,
        cause=termination.read((terminated or {}).get("message")).cause,
    )


def _condition(pod_status: Mapping[str, Any], ctype: str) -> tuple[str, str] | None:
    """(reason, message) of a Pod condition of type `ctype` that is True."""
    for condition in pod_status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == ctype:
            if condition.get("status") != "True":
                return None
            return str(condition.get("reason") or ctype), str(condition.get("message") or "")
    return None


def _waiting(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a Pending Pod does not run, when a user must act: a container stuck waiting (init
    containers first: they run first), else the scheduler's Unschedulable. None while the Pod
    is merely starting (pulling, creating)."""
    for key in (containers.INIT, containers.MAIN):
        for container in containers.of_pod(pod, key):
            waiting = container.waiting
            if waiting is not None and waiting.get("reason") in policy.WAITING_REASONS:
                message = str(waiting.get("message") or "")
                if not message and container.image:
                    message = f"image {container.image}"
                return str(waiting["reason"]), lastwords.cut_cause(message)
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == REASON_UNSCHEDULABLE
        ):
            return REASON_UNSCHEDULABLE, lastwords.cut_cause(str(condition.get("message") or ""))
    return None


def is_gang_echo(message: str) -> bool:
    """Whether a scheduler message only echoes a gang's rejection (see GANG_ECHOES)."""
    return any(echo in message for echo in GANG_ECHOES)


def keep_cause(
    before: policy.ObservedReplica, now: policy.ObservedReplica
) -> policy.ObservedReplica:
    """The same Pod as seen now, keeping the scheduler's words about the nodes when its new
    words only echo the gang's rejection: the job's status then still says what the Pods
    wait for (a GPU, memory) instead of that their gang failed recently."""
    if (
        now.waiting_reason == REASON_UNSCHEDULABLE
        and before.waiting_reason == REASON_UNSCHEDULABLE
        and before.attempt == now.attempt
        and before.waiting_message
        and not is_gang_echo(before.waiting_message)
        and is_gang_echo(now.waiting_message or "")
    ):
        return dataclasses.replace(now, waiting_message=before.waiting_message)
    return now
