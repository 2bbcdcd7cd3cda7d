"""Turn a Pod (as the API server returns it, a camelCase mapping) into what the policy engine
needs: replica key, phase, attempt, exit code, deletion. Pure, so it is tested as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainjob.core import constants, policy, status


def replica_key(labels: Mapping[str, Any]) -> tuple[str, int] | None:
    rtype = labels.get(constants.LABEL_REPLICA_TYPE)
    index = labels.get(constants.LABEL_REPLICA_INDEX)
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
    return key, policy.ObservedReplica(
        phase=str(pod_status.get("phase") or policy.PHASE_PENDING),
        attempt=int(attempt_text) if attempt_text.isdigit() else 0,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(reason) if reason else None,
        deleting=bool(metadata.get("deletionTimestamp")),
        finished_at=status.parse_time((terminated or {}).get("finishedAt")),
    )


def _tf_container_terminated(pod_status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The terminated state of the TensorFlow container (else of the first terminated one)."""
    statuses = [s for s in pod_status.get("containerStatuses") or [] if isinstance(s, Mapping)]
    statuses.sort(key=lambda s: s.get("name") != constants.DEFAULT_CONTAINER_NAME)
    for container_status in statuses:
        terminated = (container_status.get("state") or {}).get("terminated")
        if isinstance(terminated, Mapping):
            return terminated
    return None
