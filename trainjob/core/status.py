"""The TrainJob status model: what the policy engine remembers between reconciles.

Status is an API (kubectl, dashboards, Kueue read it) and also the engine's memory: which
replicas succeeded (never recreated, even when their Pods are gone), each replica's attempt
(Pods of older attempts are stale) and last exit code, and how many restarts count toward
backoffLimit. Completion is recorded here, never inferred from Pods.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, spec, times
from trainjob.core.naming import ReplicaKey

# Condition types, Kubernetes API conventions.
CREATED: Final = "Created"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
CONDITION_TYPES: Final = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)

# Replica states recorded per index. "" means: no Pod of the current attempt seen yet.
STATE_NONE: Final = ""
STATE_PENDING: Final = "Pending"
STATE_RUNNING: Final = "Running"
STATE_SUCCEEDED: Final = "Succeeded"
STATE_FAILED: Final = "Failed"
STATE_STOPPED: Final = "Stopped"  # stopped by us after the job finished


@dataclasses.dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str
    last_transition_time: datetime.datetime


@dataclasses.dataclass(frozen=True)
class ReplicaRecord:
    attempt: int = 0
    state: str = ""
    exit_code: int | None = None
    reason: str | None = None
    # Why the current attempt's Pod does not start (the kubelet's or the scheduler's words).
    waiting_reason: str | None = None
    waiting_message: str | None = None
    # Set while the current attempt's Pod is going away under a DisruptionTarget condition:
    # remembered here because the Pod, and the condition with it, is gone when it is judged.
    disruption_reason: str | None = None
    disruption_message: str | None = None
    # The replica's last words (its exception line) from its last termination message.
    message: str | None = None

    def next_attempt(self) -> ReplicaRecord:
        """The record of a restarted replica: a new attempt with nothing observed of it yet;
        the last exit code, reason and message stay until the new attempt ends."""
        return dataclasses.replace(
            self,
            attempt=self.attempt + 1,
            state=STATE_NONE,
            waiting_reason=None,
            waiting_message=None,
            disruption_reason=None,
            disruption_message=None,
        )


@dataclasses.dataclass(frozen=True)
class JobStatus:
    conditions: tuple[Condition, ...] = ()
    replicas: Mapping[ReplicaKey, ReplicaRecord] = dataclasses.field(default_factory=dict)
    restart_count: int = 0
    # Restarts after a disruption (preemption, eviction): not counted in restart_count.
    disruption_count: int = 0
    start_time: datetime.datetime | None = None
    # When the current attempt began (start, restart or resume): the startup deadline's origin.
    attempt_start_time: datetime.datetime | None = None
    completion_time: datetime.datetime | None = None
    observed_generation: int | None = None

    def condition(self, condition_type: str) -> Condition | None:
        for condition in self.conditions:
            if condition.type == condition_type:
                return condition
        return None

    def is_true(self, condition_type: str) -> bool:
        condition = self.condition(condition_type)
        return condition is not None and condition.status

    @property
    def finished(self) -> bool:
        return self.is_true(SUCCEEDED) or self.is_true(FAILED)

    def record(self, key: ReplicaKey) -> ReplicaRecord:
        return self.replicas.get(key, ReplicaRecord())


# A job a queue manager (Kueue) holds is Suspended with one of these reasons: waiting for
# admission, or evicted and waiting to be admitted again. `kubectl get tj` says Queued.
STATE_QUEUED: Final = "Queued"
REASON_QUEUED: Final = "Queued"
REASON_EVICTED_BY_QUEUE: Final = "EvictedByKueue"


def state_of(status: JobStatus) -> str:
    """One word for `kubectl get tj`: the most significant true condition (Queued for a job
    its queue holds)."""
    for condition_type in (FAILED, SUCCEEDED, SUSPENDED, RESTARTING, RUNNING, CREATED):
        if status.is_true(condition_type):
            suspended = status.condition(SUSPENDED) if condition_type == SUSPENDED else None
            if suspended is not None and suspended.reason in (
                REASON_QUEUED,
                REASON_EVICTED_BY_QUEUE,
            ):
                return STATE_QUEUED
            return condition_type
    return "Pending"


def set_condition(
    conditions: Sequence[Condition],
    condition_type: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime.datetime,
) -> tuple[Condition, ...]:
    """Upsert a condition; lastTransitionTime moves only when the status flips."""
    result: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != condition_type:
            result.append(condition)
            continue
        found = True
        transition = condition.last_transition_time if condition.status == status else now
        result.append(Condition(condition_type, status, reason, message, transition))
    if not found:
        result.append(Condition(condition_type, status, reason, message, now))
    return tuple(result)


def to_dict(job: spec.TrainJob, status: JobStatus) -> dict[str, Any]:
    """The `status` object written to the API server (and printed by local mode)."""
    result: dict[str, Any] = {
        "state": state_of(status),
        "ready": _ready_text(job, status),
        "restartCount": status.restart_count,
        "disruptionCount": status.disruption_count,
        "conditions": [
            {
                "type": c.type,
                "status": "True" if c.status else "False",
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": times.format_time(c.last_transition_time),
            }
            for c in status.conditions
        ],
        "replicaStatuses": {
            rtype: _replica_type_status(job, status, rtype)
            for rtype in constants.REPLICA_TYPES
            if job.replicas(rtype) > 0
        },
    }
    if status.start_time is not None:
        result["startTime"] = times.format_time(status.start_time)
    if status.attempt_start_time is not None:
        result["attemptStartTime"] = times.format_time(status.attempt_start_time)
    if status.completion_time is not None:
        result["completionTime"] = times.format_time(status.completion_time)
    if status.observed_generation is not None:
        result["observedGeneration"] = status.observed_generation
    return result


def _ready_text(job: spec.TrainJob, status: JobStatus) -> str:
    # A Running replica with a waiting cause is one whose node is lost: not ready.
    ready = sum(
        1
        for key in job.replica_keys()
        if (record := status.record(key)).state == STATE_SUCCEEDED
        or (record.state == STATE_RUNNING and record.waiting_reason is None)
    )
    return f"{ready}/{job.total_replicas}"


def _replica_type_status(job: spec.TrainJob, status: JobStatus, rtype: str) -> dict[str, Any]:
    records = [status.record((rtype, i)) for i in range(job.replicas(rtype))]
    indexes: list[dict[str, Any]] = []
    for index, record in enumerate(records):
        entry: dict[str, Any] = {"index": index, "attempt": record.attempt, "state": record.state}
        if record.exit_code is not None:
            entry["exitCode"] = record.exit_code
        for name, value in (
            ("reason", record.reason),
            ("message", record.message),
            ("waitingReason", record.waiting_reason),
            ("waitingMessage", record.waiting_message),
            ("disruptionReason", record.disruption_reason),
            ("disruptionMessage", record.disruption_message),
        ):
            if value:
                entry[name] = value
        indexes.append(entry)
    return {
        "replicas": len(records),
        "active": sum(1 for r in records if r.state in (STATE_PENDING, STATE_RUNNING)),
        "running": sum(1 for r in records if r.state == STATE_RUNNING),
        "succeeded": sum(1 for r in records if r.state == STATE_SUCCEEDED),
        "failed": sum(1 for r in records if r.state == STATE_FAILED),
        "indexes": indexes,
    }


def from_dict(raw: object) -> JobStatus:
    """Read back what `to_dict` wrote; tolerant, because status may be partial or foreign."""
    if not isinstance(raw, Mapping):
        return JobStatus()
    conditions: list[Condition] = []
    for item in raw.get("conditions") or []:
        if not isinstance(item, Mapping) or item.get("type") not in CONDITION_TYPES:
            continue
        conditions.append(
            Condition(
                type=str(item["type"]),
                status=item.get("status") == "True",
                reason=str(item.get("reason") or ""),
                message=str(item.get("message") or ""),
                last_transition_time=times.parse_time(item.get("lastTransitionTime"))
                or datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
            )
        )
    replicas: dict[ReplicaKey, ReplicaRecord] = {}
    replica_statuses = raw.get("replicaStatuses")
    if isinstance(replica_statuses, Mapping):
        for rtype, type_status in replica_statuses.items():
            if not isinstance(type_status, Mapping):
                continue
            for entry in type_status.get("indexes") or []:
                if not isinstance(entry, Mapping) or not isinstance(entry.get("index"), int):
                    continue
                exit_code = entry.get("exitCode")
                replicas[(str(rtype), int(entry["index"]))] = ReplicaRecord(
                    attempt=int(entry.get("attempt") or 0),
                    state=str(entry.get("state") or ""),
                    exit_code=exit_code if isinstance(exit_code, int) else None,
                    reason=_text(entry, "reason"),
                    waiting_reason=_text(entry, "waitingReason"),
                    waiting_message=_text(entry, "waitingMessage"),
                    disruption_reason=_text(entry, "disruptionReason"),
                    disruption_message=_text(entry, "disruptionMessage"),
                    message=_text(entry, "message"),
                )
    generation = raw.get("observedGeneration")
    return JobStatus(
        conditions=tuple(conditions),
        replicas=replicas,
        restart_count=int(raw.get("restartCount") or 0),
        disruption_count=int(raw.get("disruptionCount") or 0),
        start_time=times.parse_time(raw.get("startTime")),
        attempt_start_time=times.parse_time(raw.get("attemptStartTime")),
        completion_time=times.parse_time(raw.get("completionTime")),
        observed_generation=generation if isinstance(generation, int) else None,
    )


def _text(entry: Mapping[str, Any], key: str) -> str | None:
    value = entry.get(key)
    return str(value) if value else None
