"""The engine's verdict on a TFJob, shown in TFJob's own status (training-operator v1.9.4).

Clients read this, not the engine's status: the SDK (`is_job_succeeded`: a condition of that
type with status "True"), KFP's launcher and `kubectl get tfjob` (the *last* condition),
Katib (gjson on the conditions), Kueue (`replicaStatuses[*].active`, Running for PodsReady,
the first terminal condition). So the rules are training-operator's, exactly
(`pkg/util/status.go`, `common/job.go`; research/tfjob-dropin.md §1.1-1.5):

- conditions are updated, never rewritten: an updated type moves to the end of the list (the
  terminal condition is last); Running and Restarting replace each other; Succeeded or Failed
  flip an existing Running to False in place; nothing changes once Failed is True;
- `replicaStatuses` is keyed by the canonical type and counted from the Pods' phases (a Running
  Pod being deleted counts as failed), frozen once the job has finished, with the active ones
  counted as succeeded on success; every `active` is 0 at once when the job is suspended;
- `startTime` and `completionTime` are the engine's (startTime moves on resume).

Where the engine knows more (the cause of a failure, a disruption not counted), it says so in
the condition's message and in Events, never in a new condition type or field.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, policy, policy_failure, policy_terms, reasons, times
from trainjob.core import status as st

REASON_CREATED: Final = reasons.TFJOB_REASON_CREATED
REASON_RUNNING: Final = reasons.TFJOB_REASON_RUNNING
REASON_RESTARTING: Final = reasons.TFJOB_REASON_RESTARTING
REASON_SUCCEEDED: Final = reasons.TFJOB_REASON_SUCCEEDED
REASON_FAILED: Final = reasons.TFJOB_REASON_FAILED
REASON_SUSPENDED: Final = reasons.TFJOB_REASON_SUSPENDED
REASON_RESUMED: Final = reasons.TFJOB_REASON_RESUMED
# training-operator's reason when it could not create a Pod (control/pod_control.go).
REASON_FAILED_CREATE_POD: Final = "FailedCreatePod"

# The engine's Event reasons in training-operator's vocabulary: each of the engine's
# transitions is one of TFJob's (a failure of any cause is TFJobFailed; a restart after a
# failure, a disruption or a stall is TFJobRestarting: the message keeps the engine's cause).
# What the engine says beyond training-operator (a replica waiting on its image, the
# scheduler, its node, its gang) keeps the kubelet's or the scheduler's own reason.
_FAILED_REASONS: Final = frozenset(
    {
        policy_terms.REASON_FAILED,
        policy_terms.REASON_BACKOFF,
        policy_terms.REASON_DEADLINE,
        policy_terms.REASON_STARTUP,
        policy_terms.REASON_STALLED,
        policy_terms.REASON_NON_FINITE_LOSS,
        policy_terms.REASON_DISRUPTION_LIMIT,
        policy_terms.REASON_INVALID,
        policy_terms.REASON_NAME_IN_USE,
        *policy_failure.VERDICT_REASONS.values(),
    }
)
EVENT_REASONS: Final[Mapping[str, str]] = {
    reasons.EVENT_CREATED: REASON_CREATED,
    reasons.EVENT_RUNNING: REASON_RUNNING,
    reasons.EVENT_RESTARTING: REASON_RESTARTING,
    policy_terms.REASON_PREEMPTED: REASON_RESTARTING,
    policy_terms.REASON_EVICTED: REASON_RESTARTING,
    reasons.EVENT_SUSPENDED: REASON_SUSPENDED,
    reasons.EVENT_RESUMED: REASON_RESUMED,
    policy_terms.REASON_SUCCEEDED: REASON_SUCCEEDED,
    policy_terms.REASON_FAILED_CREATE: REASON_FAILED_CREATE_POD,
    **dict.fromkeys(_FAILED_REASONS, REASON_FAILED),
}


def event_reason(engine_reason: str) -> str:
    """The reason a TFJob's Event gives for the engine's `engine_reason` (EVENT_REASONS)."""
    return EVENT_REASONS.get(engine_reason, engine_reason)


@dataclasses.dataclass(frozen=True)
class PodPhase:
    """One of the job's Pods, as replicaStatuses counts it."""

    engine_type: str
    phase: str
    deleting: bool = False


def _stamp(when: datetime.datetime) -> str:
    return times.format_time(when)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    condition_type: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """training-operator's `setCondition` (util/status.go): no change once Failed is True, or
    when the type already has this status and reason; else the type is taken out (with
    Running/Restarting taking each other out, and a terminal type flipping Running to False)
    and appended, keeping its lastTransitionTime when its status did not change."""
    current = [dict(c) for c in conditions]
    if any(c.get("type") == st.FAILED and c.get("status") == "True" for c in current):
        return current
    text = "True" if status else "False"
    old = next((c for c in current if c.get("type") == condition_type), None)
    if old is not None and old.get("status") == text and old.get("reason") == reason:
        return current
    transition = _stamp(now)
    if old is not None and old.get("status") == text and old.get("lastTransitionTime"):
        transition = str(old["lastTransitionTime"])
    kept: list[dict[str, Any]] = []
    for condition in current:
        kind = condition.get("type")
        if kind == condition_type:
            continue
        if {kind, condition_type} == {st.RUNNING, st.RESTARTING}:
            continue
        if condition_type in (st.SUCCEEDED, st.FAILED) and kind == st.RUNNING:
            kept.append({**condition, "status": "False"})
        else:
            kept.append(condition)
    kept.append(
        {
            "type": condition_type,
            "status": text,
            "reason": reason,
            "message": message,
            "lastUpdateTime": _stamp(now),
            "lastTransitionTime": transition,
        }
    )
    return kept


def _is_true(conditions: Iterable[Mapping[str, Any]], condition_type: str) -> bool:
    return any(c.get("type") == condition_type and c.get("status") == "True" for c in conditions)


def finished(tfjob_status: Mapping[str, Any]) -> bool:
    conditions = tfjob_status.get("conditions") or []
    return _is_true(conditions, st.SUCCEEDED) or _is_true(conditions, st.FAILED)


def _running(engine: st.JobStatus, types: Mapping[str, str]) -> bool:
    """training-operator's Running: the chief's Pod runs; without a chief, any worker's."""
    wanted = constants.CHIEF if constants.CHIEF in types else constants.WORKER
    return any(
        rtype == wanted and record.state == st.STATE_RUNNING
        for (rtype, _), record in engine.replicas.items()
    )


# "; backoffLimit=N restarts already used" in the engine's backoff message.
_ENGINE_BACKOFF: Final = re.compile(r"; backoffLimit=\d+ restarts already used")
# The order training-operator visits replica types in (the first failed one is named).
_VISIT_ORDER: Final = ("Chief", "Evaluator", "Master", "PS", "Worker")


def _failed(pods: Sequence[PodPhase], types: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """(engine type, TFJob type, how many) of the replica types with a failed Pod, in
    training-operator's order."""
    counts: dict[str, int] = {}
    for pod in pods:
        if pod.phase == "Failed" or (pod.phase == "Running" and pod.deleting):
            counts[pod.engine_type] = counts.get(pod.engine_type, 0) + 1
    found = [(t, types.get(t, t), n) for t, n in counts.items()]
    return sorted(found, key=lambda f: _VISIT_ORDER.index(f[1]) if f[1] in _VISIT_ORDER else 9)


def _cause(condition: st.Condition | None) -> str:
    """The engine's words (they name the job's kind: model.TrainJob.kind), after
    training-operator's."""
    text = condition.message if condition is not None else ""
    return f" {text}" if text else ""


def failed_message(
    engine: st.JobStatus,
    pods: Sequence[PodPhase],
    types: Mapping[str, str],
    restart_policies: Mapping[str, str],
    namespace: str,
    name: str,
) -> str:
    """training-operator's Failed message for the way the engine failed the job, then the
    engine's cause (which replica, its exit code and last words)."""
    failed = engine.condition(st.FAILED)
    reason = failed.reason if failed is not None else ""
    if reason == policy.REASON_DEADLINE:
        head = f"Job {name} has failed because it was active longer than specified deadline"
    elif reason == policy.REASON_BACKOFF:
        head = f"Job {name} has failed because it has reached the specified backoff limit"
        if failed is not None:
            # The engine counts restarts allowed (the TFJob's limit less one): its number
            # would contradict the TFJob's, and the head already says the limit was reached.
            text = _ENGINE_BACKOFF.sub("", failed.message)
            failed = dataclasses.replace(failed, message=text)
    elif reason == policy.REASON_FAILED and (found := _failed(pods, types)):
        engine_type, type_name, count = found[0]
        if restart_policies.get(engine_type) == "ExitCode":
            head = f'job "{name}" is failing because "{type_name}" replica(s) failed.'
        else:
            head = (
                f"TFJob {namespace}/{name} has failed because {count} {type_name} "
                "replica(s) failed."
            )
    else:
        head = f"TFJob {namespace}/{name} has failed."
    return head + _cause(failed)


def conditions_of(
    previous: Sequence[Mapping[str, Any]],
    engine: st.JobStatus,
    types: Mapping[str, str],
    namespace: str,
    name: str,
    now: datetime.datetime,
    pods: Sequence[PodPhase] = (),
    restart_policies: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The TFJob's conditions after this reconcile, from the ones it had and the engine's."""
    conditions = [dict(c) for c in previous]
    if not any(c.get("type") == st.CREATED for c in conditions):
        conditions = set_condition(
            conditions, st.CREATED, True, REASON_CREATED, f"TFJob {name} is created.", now
        )
    suspended = engine.is_true(st.SUSPENDED)
    if suspended and not engine.finished:
        if _is_true(conditions, st.RUNNING):
            conditions = set_condition(
                conditions, st.RUNNING, False, REASON_SUSPENDED, f"TFJob {name} is suspended.", now
            )
        return set_condition(
            conditions, st.SUSPENDED, True, REASON_SUSPENDED, f"TFJob {name} is suspended.", now
        )
    if _is_true(conditions, st.SUSPENDED):
        conditions = set_condition(
            conditions, st.SUSPENDED, False, REASON_RESUMED, f"TFJob {name} is resumed.", now
        )
    restarting = engine.condition(st.RESTARTING)
    if engine.is_true(st.FAILED):
        message = failed_message(engine, pods, types, restart_policies or {}, namespace, name)
        return set_condition(conditions, st.FAILED, True, REASON_FAILED, message, now)
    if engine.is_true(st.SUCCEEDED):
        return set_condition(
            conditions,
            st.SUCCEEDED,
            True,
            REASON_SUCCEEDED,
            f"TFJob {namespace}/{name} successfully completed.",
            now,
        )
    if restarting is not None and restarting.status:
        failed_types = ", ".join(t for _, t, _ in _failed(pods, types)) or "some"
        return set_condition(
            conditions,
            st.RESTARTING,
            True,
            REASON_RESTARTING,
            f"job {name} is restarting because {failed_types} replica(s) failed."
            + _cause(restarting),
            now,
        )
    if _running(engine, types):
        conditions = set_condition(
            conditions,
            st.RUNNING,
            True,
            REASON_RUNNING,
            f"TFJob {namespace}/{name} is running.",
            now,
        )
    return conditions


def replica_statuses(
    pods: Iterable[PodPhase], types: Mapping[str, str], suspended: bool, succeeded: bool
) -> dict[str, dict[str, int]]:
    """`replicaStatuses` counted from Pod phases (`core/status.go UpdateJobReplicaStatuses`):
    Running is active, a Running Pod being deleted is failed, Pending is not counted; zero
    counts are left out. Suspended: no active. Succeeded: the active ones count as succeeded."""
    counts: dict[str, dict[str, int]] = {types[t]: {} for t in types}
    for pod in pods:
        name = types.get(pod.engine_type)
        if name is None:
            continue
        entry = counts[name]
        if pod.phase == "Running":
            field = "failed" if pod.deleting else "active"
        elif pod.phase == "Succeeded":
            field = "succeeded"
        elif pod.phase == "Failed":
            field = "failed"
        else:
            continue
        entry[field] = entry.get(field, 0) + 1
    for entry in counts.values():
        if succeeded and entry.get("active"):
            entry["succeeded"] = entry.get("succeeded", 0) + entry.pop("active")
        if suspended:
            entry.pop("active", None)
    return counts


def view(
    previous: Mapping[str, Any],
    engine: st.JobStatus,
    types: Mapping[str, str],
    pods: Iterable[PodPhase],
    namespace: str,
    name: str,
    now: datetime.datetime,
    restart_policies: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The TFJob's status after this reconcile (the whole object, as training-operator writes
    it with a full update); `previous` is the status it has now."""
    pods = list(pods)
    old_conditions = previous.get("conditions")
    conditions = conditions_of(
        old_conditions if isinstance(old_conditions, list) else [],
        engine,
        types,
        namespace,
        name,
        now,
        pods,
        restart_policies,
    )
    result: dict[str, Any] = {"conditions": conditions}
    old_counts = previous.get("replicaStatuses")
    old_counts = old_counts if isinstance(old_counts, Mapping) else {}
    if finished(previous) and old_counts:
        result["replicaStatuses"] = dict(old_counts)  # as it ended
    elif engine.is_true(st.SUSPENDED) and not engine.finished:
        if "replicaStatuses" not in previous:
            return _times(result, engine, previous)  # created suspended: none until it runs
        # Suspended: not counted again (the Pods are being deleted), only active zeroed.
        result["replicaStatuses"] = {
            name: {
                k: v
                for k, v in (old_counts.get(name) or {}).items()
                if k != "active" and isinstance(v, int)
            }
            for name in types.values()
        }
    else:
        result["replicaStatuses"] = replica_statuses(
            pods, types, False, engine.is_true(st.SUCCEEDED)
        )
    return _times(result, engine, previous)


def _times(
    result: dict[str, Any], engine: st.JobStatus, previous: Mapping[str, Any]
) -> dict[str, Any]:
    if engine.start_time is not None and not (
        engine.is_true(st.SUSPENDED) and not engine.finished and "startTime" not in previous
    ):
        result["startTime"] = _stamp(engine.start_time)
    if engine.completion_time is not None:
        result["completionTime"] = _stamp(engine.completion_time)
    return result
