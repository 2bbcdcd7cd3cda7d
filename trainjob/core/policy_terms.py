"""The policy engine's terms, no rule among them: what it observes of a replica
(:class:`ObservedReplica`), what it decides (:class:`Decision`, :class:`Event`), the phases and
condition reasons it speaks in, one replica's end (:class:`Failure`), a rule's :class:`Verdict`,
and :class:`DecisionDraft`, the decision one reconcile writes before it is frozen.

The rules live in modules named after them (:mod:`trainjob.core.policy_failure`,
:mod:`~trainjob.core.policy_restart`, ...); what they share is here, so that none of them takes
a type from another.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Final

from trainjob.core import spec
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey as ReplicaKey  # noqa: PLC0414 (policy re-exports it)

# Phases as the kubelet (or the local executor) reports them.
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASE_UNKNOWN: Final = "Unknown"

# Condition reasons.
REASON_CREATED: Final = "TrainJobCreated"
REASON_RUNNING: Final = "AllReplicasRunning"
REASON_RESTARTING: Final = "ReplicasRestarting"
REASON_SUCCEEDED: Final = "TrainJobSucceeded"
REASON_FAILED: Final = "ReplicaFailed"
REASON_BACKOFF: Final = "BackoffLimitExceeded"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_STARTUP: Final = "StartupDeadlineExceeded"
REASON_SUSPENDED: Final = "TrainJobSuspended"
REASON_RESUMED: Final = "TrainJobResumed"
REASON_INVALID: Final = "InvalidSpec"
# A job of another kind with the same namespace and name was there first: this one's Pods
# and Services would take its children's names, so it is refused (operator only).
REASON_NAME_IN_USE: Final = "NameInUse"
REASON_STARTING: Final = "ReplicasStarting"
REASON_PREEMPTED: Final = "Preempted"
REASON_EVICTED: Final = "Evicted"
REASON_DISRUPTION_LIMIT: Final = "DisruptionLimitExceeded"
REASON_STALLED: Final = "Stalled"
# The runtime's verdict on a training loss that became NaN or +/-Inf (its exit code:
# policy_failure.EXIT_CODE_NON_FINITE_LOSS).
REASON_NON_FINITE_LOSS: Final = "NonFiniteLoss"
# The runtime's verdicts on the checkpoint store (its exit codes: constants
# EXIT_CODE_CHECKPOINT_STORAGE, EXIT_CODE_STORAGE_UNREACHABLE).
REASON_CHECKPOINT_STORAGE: Final = "CheckpointStorageRefused"
REASON_STORAGE_UNREACHABLE: Final = "CheckpointStorageUnreachable"
# The node a replica's Pod runs on is lost (its Ready condition Unknown: the kubelet stopped
# reporting) or not ready (False). Kubernetes, not the operator, decides the Pod's end (taint
# eviction after tolerationSeconds, the pod GC once the Node is deleted): until then the
# replica is shown waiting on its node, and its removal is a disruption (restarted uncounted).
REASON_NODE_UNREACHABLE: Final = "NodeUnreachable"
REASON_NODE_NOT_READY: Final = "NodeNotReady"
NODE_REASONS: Final = frozenset({REASON_NODE_UNREACHABLE, REASON_NODE_NOT_READY})

# The kubelet's waiting reasons of a container that will not start by waiting longer: a user
# must act. ContainerCreating and PodInitializing are normal starting states, never reported.
CONTAINER_STUCK_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
# Why a Pending Pod will not run by itself, as observe.py reports it: a stuck container, the
# scheduler's Unschedulable, a refused create, a gang not admitted, a lost node.
WAITING_REASONS: Final = CONTAINER_STUCK_REASONS.union(
    {"Unschedulable", "FailedCreate", "GangPending"}, NODE_REASONS
)
# The API server refused to create the replica's Pod (Pod Security, a ResourceQuota, a
# LimitRange, a denying admission webhook): the executor says so with its message and retries.
REASON_FAILED_CREATE: Final = "FailedCreate"
# The scheduler's reason on PodScheduled=False when no node fits a Pod.
REASON_UNSCHEDULABLE: Final = "Unschedulable"
# The gang scheduler has not admitted the job's PodGroup yet (Volcano: not Inqueue): its Pods
# are not created, so that a job that cannot fit holds nothing (the executor says why).
REASON_GANG_PENDING: Final = "GangPending"

# A Failure's reason when the replica's Pod went away without a verdict of its own: deleted
# under us, or taken with its lost node.
DELETED: Final = "Deleted"


@dataclasses.dataclass(frozen=True)
class ObservedReplica:
    """What an executor sees of one replica's Pod (or process) right now."""

    phase: str
    attempt: int = 0
    exit_code: int | None = None
    reason: str | None = None
    deleting: bool = False
    finished_at: datetime.datetime | None = None
    # Why a Pending Pod does not start (one of WAITING_REASONS) and the words that say so.
    waiting_reason: str | None = None
    waiting_message: str | None = None
    # The DisruptionTarget condition's reason and message when it is True.
    disruption_reason: str | None = None
    disruption_message: str | None = None
    # The replica's last words: its exception line from the termination message.
    cause: str | None = None


@dataclasses.dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Decision:
    status: st.JobStatus
    create_pods: tuple[tuple[str, int, int], ...] = ()  # (type, index, attempt)
    delete_pods: tuple[ReplicaKey, ...] = ()
    create_services: tuple[ReplicaKey, ...] = ()
    delete_services: tuple[ReplicaKey, ...] = ()
    events: tuple[Event, ...] = ()
    delete_job: bool = False
    # Seconds until a deadline or TTL needs another look even if nothing else happens.
    requeue_after: float | None = None


@dataclasses.dataclass(frozen=True)
class Failure:
    """A replica of the current attempt that ended: its Pod failed, went away (reason DELETED),
    or `succeeded` (exit 0), which policy_failure.failure_fate may still judge a failure."""

    key: ReplicaKey
    exit_code: int | None
    reason: str | None
    finished_at: datetime.datetime | None
    disruption_reason: str | None = None
    disruption_message: str | None = None
    cause: str | None = None
    succeeded: bool = False

    @property
    def disrupted(self) -> bool:
        return self.disruption_reason is not None

    @classmethod
    def deleted(
        cls,
        key: ReplicaKey,
        now: datetime.datetime,
        disruption_reason: str | None,
        disruption_message: str | None,
    ) -> Failure:
        """A replica whose Pod is gone (or going) without a verdict of its own, as of `now`."""
        return cls(key, None, DELETED, now, disruption_reason, disruption_message)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a rule decided for the job's counters: the restarts and disruptions used, when the
    attempt now running started (None: unchanged), and whether the job finished."""

    restart_count: int
    disruption_count: int
    attempt_start: datetime.datetime | None
    finished: bool


@dataclasses.dataclass
class DecisionDraft:
    """The decision one reconcile writes as its rules apply (conditions, replica records,
    Events, Pods to delete, when to look again); it is then frozen into a :class:`Decision`."""

    job: spec.TrainJob
    now: datetime.datetime
    status: st.JobStatus
    replicas: dict[ReplicaKey, st.ReplicaRecord]
    conditions: tuple[st.Condition, ...]
    progress_at: datetime.datetime | None = None
    # Replicas whose Pod the API server refused to create, with its message.
    refused: Mapping[ReplicaKey, str] = dataclasses.field(default_factory=dict)
    # Replicas whose Pod is on a node that is not Ready: (NodeUnreachable | NodeNotReady, text).
    lost: Mapping[ReplicaKey, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # (reason, message) while the executor holds the creation of Pods (a gang not admitted).
    held: tuple[str, str] | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    delete_pods: list[ReplicaKey] = dataclasses.field(default_factory=list)
    requeue: list[float] = dataclasses.field(default_factory=list)

    def condition(self, ctype: str, value: bool, reason: str, message: str) -> None:
        self.conditions = st.set_condition(self.conditions, ctype, value, reason, message, self.now)

    def is_true(self, ctype: str) -> bool:
        return any(c.type == ctype and c.status for c in self.conditions)

    def event(self, etype: str, reason: str, message: str) -> None:
        self.events.append(Event(etype, reason, message))

    def finish(self, ctype: str, reason: str, message: str) -> None:
        """The job ends (`ctype` Succeeded or Failed): Running and Restarting end with it, and
        one Event says why."""
        self.condition(ctype, True, reason, message)
        self.condition(st.RUNNING, False, reason, message)
        if self.is_true(st.RESTARTING):
            self.condition(st.RESTARTING, False, reason, message)
        event_type = "Normal" if ctype == st.SUCCEEDED else "Warning"
        self.event(event_type, reason, message)
