"""Turn a Pod (as the API server returns it, a camelCase mapping) into what the policy engine
needs: replica key, phase, attempt, exit code, deletion, and why it is not running or why it
ended (the kubelet's, the scheduler's or the replica's own words). Pure, so it is tested as
data."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants, lastwords, policy, status, tfjob

# The scheduler's PodScheduled=False reason for a Pod that fits no node.
REASON_UNSCHEDULABLE: Final = policy.REASON_UNSCHEDULABLE
# Pod condition (Kubernetes >= 1.26) set by whoever disrupts a Pod: the scheduler's
# preemption, the Eviction API, the taint manager, the kubelet's node-pressure eviction, pod GC.
DISRUPTION_TARGET: Final = "DisruptionTarget"
# The key of the replica's last exception line in a termination message the runtime writes.
TERMINATION_ERROR_KEY: Final = "trainjobError"
# A cause longer than this is cut: it is quoted in a condition message and an Event.
MAX_CAUSE_CHARS: Final = 400


# training-operator's replica-type label values (a TFJob's children it made before a
# takeover carry only its labels) as TF task types.
_KUBEFLOW_TYPES: Final = {
    "chief": constants.CHIEF,
    "master": constants.CHIEF,
    "ps": constants.PS,
    "worker": constants.WORKER,
    "evaluator": constants.EVALUATOR,
}


def replica_key(labels: Mapping[str, Any]) -> tuple[str, int] | None:
    rtype = labels.get(constants.LABEL_REPLICA_TYPE)
    index = labels.get(constants.LABEL_REPLICA_INDEX)
    if rtype is None and index is None:
        rtype = _KUBEFLOW_TYPES.get(str(labels.get(tfjob.LABEL_REPLICA_TYPE)))
        index = labels.get(tfjob.LABEL_REPLICA_INDEX)
    if rtype not in constants.REPLICA_TYPES or not isinstance(index, str) or not index.isdigit():
        return None
    return str(rtype), int(index)


def observe_pod(pod: Mapping[str, Any]) -> tuple[tuple[str, int], policy.ObservedReplica] | None:
    """None for a Pod that is not a TrainJob replica (labels missing or foreign)."""
    metadata = pod.get("metadata") or {}
    key = replica_key(metadata.get("labels") or {})
    if key is None:
        return None
    annotations = metadata.get("annotations") or {}
    attempt_text = str(annotations.get(constants.ANNOTATION_ATTEMPT, "0"))
    pod_status = pod.get("status") or {}
    terminated = _tf_container_terminated(pod_status)
    exit_code = terminated.get("exitCode") if terminated else None
    reason = (terminated or {}).get("reason") or pod_status.get("reason")
    phase = str(pod_status.get("phase") or policy.PHASE_PENDING)
    waiting = _waiting(pod_status) if phase == policy.PHASE_PENDING else None
    disruption = _condition(pod_status, DISRUPTION_TARGET)
    return key, policy.ObservedReplica(
        phase=phase,
        attempt=int(attempt_text) if attempt_text.isdigit() else 0,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(reason) if reason else None,
        deleting=bool(metadata.get("deletionTimestamp")),
        finished_at=status.parse_time((terminated or {}).get("finishedAt")),
        waiting_reason=waiting[0] if waiting else None,
        waiting_message=waiting[1] if waiting else None,
        disruption_reason=disruption[0] if disruption else None,
        disruption_message=disruption[1] if disruption else None,
        cause=termination_cause((terminated or {}).get("message")),
    )


def _container_statuses(pod_status: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The statuses under `key`, the TensorFlow container's first."""
    statuses = [s for s in pod_status.get(key) or [] if isinstance(s, Mapping)]
    statuses.sort(key=lambda s: s.get("name") != constants.DEFAULT_CONTAINER_NAME)
    return statuses


def _tf_container_terminated(pod_status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The terminated state of the TensorFlow container (else of the first terminated one)."""
    for container_status in _container_statuses(pod_status, "containerStatuses"):
        terminated = (container_status.get("state") or {}).get("terminated")
        if isinstance(terminated, Mapping):
            return terminated
    return None


def _condition(pod_status: Mapping[str, Any], ctype: str) -> tuple[str, str] | None:
    """(reason, message) of a Pod condition of type `ctype` that is True."""
    for condition in pod_status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == ctype:
            if condition.get("status") != "True":
                return None
            return str(condition.get("reason") or ctype), str(condition.get("message") or "")
    return None


def _waiting(pod_status: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a Pending Pod does not run, when a user must act: a container stuck waiting (init
    containers first: they run first), else the scheduler's Unschedulable. None while the Pod
    is merely starting (pulling, creating)."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for container_status in _container_statuses(pod_status, key):
            waiting = (container_status.get("state") or {}).get("waiting")
            if isinstance(waiting, Mapping) and waiting.get("reason") in policy.WAITING_REASONS:
                message = str(waiting.get("message") or "")
                if not message and container_status.get("image"):
                    message = f"image {container_status['image']}"
                return str(waiting["reason"]), cut_cause(message)
    for condition in pod_status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == REASON_UNSCHEDULABLE
        ):
            return REASON_UNSCHEDULABLE, cut_cause(str(condition.get("message") or ""))
    return None


def termination_cause(message: object) -> str | None:
    """The replica's own last words in its termination message: the runtime's error line (a
    JSON object beside its final progress report), else what a person would read as the cause
    in whatever else the container wrote there (FallbackToLogsOnError puts the log's 2 KiB
    tail there): the last traceback's exception line, else the last line unless it is a
    redrawn progress bar (`lastwords`). None for a progress report alone or nothing."""
    if not isinstance(message, str) or not message.strip():
        return None
    text = message.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, Mapping):
            error = parsed.get(TERMINATION_ERROR_KEY)
            return cut_cause(str(error)) if error else None
    found = lastwords.last_exception(message) or lastwords.last_line(message)
    return cut_cause(found) if found else None


def cut_cause(text: str) -> str:
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 3] + "..."
