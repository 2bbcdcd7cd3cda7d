"""The policy engine's terms (pure): what it observes of a replica (:class:`ObservedReplica`),
what it decides (:class:`Decision`, :class:`Event`), the phases and condition reasons it speaks
in, a failure (:class:`Failure`) and the rules that judge one (retryable under a restart
policy, the restart group it takes down, the root cause of several), and :class:`Work`, the
scratch space one reconcile fills.

:mod:`trainjob.core.policy` (the engine) re-exports every public name here.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Final

from trainjob.core import constants, spec
from trainjob.core import status as st

ReplicaKey = tuple[str, int]

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
REASON_STARTING: Final = "ReplicasStarting"
REASON_PREEMPTED: Final = "Preempted"
REASON_EVICTED: Final = "Evicted"
REASON_DISRUPTION_LIMIT: Final = "DisruptionLimitExceeded"
REASON_STALLED: Final = "Stalled"
# The runtime's exit code for a training loss that became NaN or +/-Inf (permanent: 1-127).
EXIT_CODE_NON_FINITE_LOSS: Final = 6
REASON_NON_FINITE_LOSS: Final = "NonFiniteLoss"
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
# DisruptionTarget's reason for a preemption; every other one (EvictionByEvictionAPI,
# DeletionByTaintManager, TerminationByKubelet, DeletionByPodGC) is an eviction.
DISRUPTION_PREEMPTION: Final = "PreemptionByScheduler"

# Exit codes 1-127 are the program's own verdict; >= 128 means killed by a signal (128 + n).
FIRST_SIGNAL_EXIT_CODE: Final = 128

# Restarts after the first wait before their replicas are created again, doubling each time
# (as the Job controller backs off): a replica that fails at once, or a Pod deleted in a loop,
# must not use up backoffLimit in a few seconds (6 restarts took 2.7 s without a delay).
RESTART_DELAY_FIRST: Final = 2.0
RESTART_DELAY_MAX: Final = 60.0


def restart_delay(restart_count: int) -> float:
    """Seconds between the `restart_count`-th restart decision and its new replicas: none for
    the first restart (a preemption or one lost worker resumes at once), then 2 s, 4 s, ...
    up to RESTART_DELAY_MAX."""
    if restart_count <= 1:
        return 0.0
    return float(min(RESTART_DELAY_MAX, RESTART_DELAY_FIRST * 2 ** (restart_count - 2)))


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
    key: ReplicaKey
    exit_code: int | None
    reason: str | None
    finished_at: datetime.datetime | None
    disruption_reason: str | None = None
    disruption_message: str | None = None
    cause: str | None = None

    @property
    def disrupted(self) -> bool:
        return self.disruption_reason is not None


def is_retryable(restart_policy: str, failure: Failure) -> bool:
    """Whether a replica's failure may be retried, by its replica type's restart policy."""
    if failure.disrupted:
        # Preempted or evicted: the replica did nothing wrong; it runs again (uncounted).
        return True
    if failure.reason == "Deleted":
        # A Pod deleted under us (kubectl delete pod, node drain) is recreated under any
        # policy, as a Kubernetes controller would; it still counts toward backoffLimit.
        return True
    if restart_policy in ("OnFailure", "Always"):
        return True
    if restart_policy == "ExitCode":
        return retryable_exit_code(failure.exit_code)
    return False


def retryable_exit_code(code: int | None) -> bool:
    """The ExitCode restart policy's rule: 1-127, the program gave up, are permanent; >= 128
    or no code (killed, evicted, OOM-killed) are retried. The runtime's own exit codes are
    chosen by it (:mod:`trainjob.runtime.exitcodes`)."""
    return code is None or code == 0 or code >= FIRST_SIGNAL_EXIT_CODE


def success_deciders(job: spec.TrainJob) -> list[ReplicaKey]:
    """The replicas whose success makes the job succeed."""
    workers = [(constants.WORKER, i) for i in range(job.replicas(constants.WORKER))]
    chief = [(constants.CHIEF, 0)] if job.replicas(constants.CHIEF) > 0 else []
    if job.success_policy == "AllWorkers":
        return chief + workers
    return chief or workers[:1]


def is_success(job: spec.TrainJob, replicas: Mapping[ReplicaKey, st.ReplicaRecord]) -> bool:
    deciders = success_deciders(job)
    return bool(deciders) and all(
        replicas.get(key, st.ReplicaRecord()).state == st.STATE_SUCCEEDED for key in deciders
    )


def restart_scope(job: spec.TrainJob, key: ReplicaKey) -> tuple[ReplicaKey, ...]:
    """The replicas restarted together when `key` fails."""
    rtype = key[0]
    if rtype == constants.EVALUATOR:
        return (key,)
    if not job.uses_parameter_servers:
        # All-reduce: chief + workers form one collective.
        return tuple(k for k in job.replica_keys() if k[0] in (constants.CHIEF, constants.WORKER))
    if rtype == constants.WORKER:
        return (key,)
    # Coordinator or a ps lost: variables must be restored from the checkpoint into fresh ps.
    return tuple(k for k in job.replica_keys() if k[0] in (constants.CHIEF, constants.PS))


def root_cause(failures: Iterable[Failure]) -> Failure:
    """The earliest failure of a group: peers of an all-reduce job fail *because* one was lost
    (exit 1 within seconds), so only the first failure tells whether to retry."""
    far_future = datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
    ordered = sorted(failures, key=lambda f: (f.finished_at or far_future,))
    return ordered[0]


def disruption_kind(disruption_reason: str) -> str:
    """Preempted or Evicted, from the DisruptionTarget condition's reason."""
    if disruption_reason == DISRUPTION_PREEMPTION:
        return REASON_PREEMPTED
    return REASON_EVICTED


def failed_reason(failure: Failure) -> str:
    """The Failed condition's reason for a replica failure no policy retries: the runtime's
    own verdict where its exit code names one (a diverged loss), else ReplicaFailed."""
    if failure.exit_code == EXIT_CODE_NON_FINITE_LOSS and not failure.disrupted:
        return REASON_NON_FINITE_LOSS
    return REASON_FAILED


def describe(failure: Failure) -> str:
    rtype, index = failure.key
    if failure.disruption_reason is not None:
        preempted = disruption_kind(failure.disruption_reason) == REASON_PREEMPTED
        verb = "preempted" if preempted else "evicted"
        detail = failure.disruption_reason
        if failure.disruption_message:
            detail += f": {failure.disruption_message}"
        return f"{rtype} {index} was {verb} ({detail})"
    if failure.reason == "Deleted":
        return f"{rtype} {index} was deleted"
    if failure.exit_code is None:
        return f"{rtype} {index} failed ({failure.reason or 'no exit code'})"
    detail = f", {failure.reason}" if failure.reason else ""
    return f"{rtype} {index} exited with code {failure.exit_code}{detail}"


@dataclasses.dataclass
class Work:
    """Mutable scratch space of one reconcile; the result is frozen into a Decision."""

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
