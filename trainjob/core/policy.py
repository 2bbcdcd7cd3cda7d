"""The lifecycle policy engine: one pure function from (spec, status, observed replicas, now) to
what to do next. The operator applies its decisions as API calls, the local executor as
processes, so "worker 1 exited 137 under ExitCode" has exactly one implementation.

Semantics (the README's "Semantics" section says the same for users):
- Pods never restart in place; a restart bumps the replica's *attempt*, the old Pod becomes
  stale (deleted, its exit never counted), and a Pod of the new attempt is created under the
  same name once the old one is gone.
- Restart scope follows the strategy: an all-reduce job (no ps) restarts chief + workers
  together, because one lost worker breaks the collective; a ParameterServer job restarts a
  lost worker alone, and chief + ps together when either of them fails.
- Every restart decision counts toward backoffLimit; exceeding it fails the job. A disruption
  (a Pod ended under the DisruptionTarget condition: preemption, eviction) is not a failure: its
  restart counts toward runPolicy.disruptionLimit instead, as Job's podFailurePolicy Ignore.
- Nothing silent: a replica that cannot start says why (Running=False with the kubelet's or the
  scheduler's reason, and one Event per cause), and a failed job quotes the replica's last words.
- Success and per-replica completion are recorded in status and never inferred from Pods.
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

# Why a Pending Pod will not run by itself, as observe.py reports it: the kubelet's waiting
# reasons a user must act on, and the scheduler's Unschedulable. ContainerCreating and
# PodInitializing are normal starting states and never reported.
WAITING_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
        "Unschedulable",
        "FailedCreate",
        "GangPending",
    }
).union(NODE_REASONS)
# The API server refused to create the replica's Pod (Pod Security, a ResourceQuota, a
# LimitRange, a denying admission webhook): the executor says so with its message and retries.
REASON_FAILED_CREATE: Final = "FailedCreate"
# The kubelet alternates these two for one bad image while it backs off: one cause, one Event.
_SAME_CAUSE: Final = {"ErrImagePull": "ImagePullBackOff"}
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
class _Work:
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


def reconcile(
    job: spec.TrainJob,
    status: st.JobStatus,
    pods: Mapping[ReplicaKey, ObservedReplica],
    services: Iterable[ReplicaKey],
    now: datetime.datetime,
    progress_at: datetime.datetime | None = None,
    refused: Mapping[ReplicaKey, str] | None = None,
    lost: Mapping[ReplicaKey, tuple[str, str]] | None = None,
    held: tuple[str, str] | None = None,
) -> Decision:
    """Decide everything for one job from what is recorded and what is observed.

    `held`: (reason, message) while the executor may not create the job's Pods yet (its gang
    scheduler has not admitted the PodGroup): no Pod is created, Running=False says why, and
    the startup deadline waits (nothing is placed, nothing waits for a peer).

    `refused`: replicas whose Pod the API server refused to create at the executor's last
    try, with the API server's message (a waiting cause, FailedCreate; still created again).

    `progress_at`: when the reporting replica's step last advanced (when it was first seen
    reporting, before its first step); None when nothing of its progress is known. Only
    runPolicy.progressDeadlineSeconds reads it.

    `lost`: replicas whose Pod is bound to a node that is not Ready, with the reason
    (NodeUnreachable or NodeNotReady) and the words, e.g. `node n3 unreachable since
    2026-11-24T06:40:00Z`: a waiting cause; the Pod is left to Kubernetes."""
    work = _Work(
        job=job,
        now=now,
        progress_at=progress_at,
        refused=refused or {},
        lost=lost or {},
        held=held,
        status=status,
        replicas={key: status.record(key) for key in job.replica_keys()},
        conditions=status.conditions,
    )
    existing_services = set(services)
    start_time = status.start_time
    attempt_start = status.attempt_start_time
    completion_time = status.completion_time
    restart_count = status.restart_count
    disruption_count = status.disruption_count

    # Created first, suspended or not: a job created suspended is created (as Job and
    # TFJob say), and its first decision is the same whatever the spec says by then, so an
    # Event posted for it before a crash is the one posted again after the spec changed.
    if not status.finished and not work.is_true(st.CREATED):
        work.condition(st.CREATED, True, REASON_CREATED, f"TrainJob {job.name} is created")
        work.event("Normal", "Created", f"Created TrainJob {job.name}")

    if not status.finished and job.run_policy.suspend:
        return _suspend(work, pods, existing_services)

    if not status.finished:
        if status.is_true(st.SUSPENDED):
            work.condition(st.SUSPENDED, False, REASON_RESUMED, "TrainJob resumed")
            work.event("Normal", "Resumed", "Resumed TrainJob: recreating its replicas")
            start_time = attempt_start = now
        if start_time is None:
            start_time = attempt_start = now
        running = status.condition(st.RUNNING)
        if held is None and running is not None and running.reason == REASON_GANG_PENDING:
            attempt_start = now  # released: the startup clock starts once Pods may be created

    failures = _observe(work, pods)

    if not status.finished:
        verdict = _judge(work, failures, restart_count, disruption_count, start_time, attempt_start)
        if verdict is not None:
            restart_count = verdict.restart_count
            disruption_count = verdict.disruption_count
            attempt_start = verdict.attempt_start or attempt_start
            if verdict.finished:
                completion_time = now

    finished = work.is_true(st.SUCCEEDED) or work.is_true(st.FAILED)
    create_pods: list[tuple[str, int, int]] = []
    create_services: list[ReplicaKey] = []
    delete_services: list[ReplicaKey] = []
    delete_job = False
    if finished:
        delete_services = _clean_up(work, pods, existing_services)
        ttl = job.run_policy.ttl_seconds_after_finished
        if ttl is not None and completion_time is not None:
            remaining = (completion_time - now).total_seconds() + ttl
            if remaining <= 0:
                delete_job = True
            else:
                work.requeue.append(remaining)
    else:
        hold = 0.0
        if work.is_true(st.RESTARTING) and attempt_start is not None:
            ready_at = attempt_start + datetime.timedelta(seconds=restart_delay(restart_count))
            hold = (ready_at - now).total_seconds()
        for key in job.replica_keys():
            record = work.replicas[key]
            if key not in existing_services:
                create_services.append(key)
            if key not in pods and record.state != st.STATE_SUCCEEDED:
                if held is not None:
                    continue  # the gang is not admitted: no Pod may take a node yet
                if hold > 0 and record.state == st.STATE_NONE:
                    work.requeue.append(hold)  # a restarted replica waits out its delay
                    continue
                create_pods.append((key[0], key[1], record.attempt))
        _update_running(work)

    new_status = st.JobStatus(
        conditions=work.conditions,
        replicas=work.replicas,
        restart_count=restart_count,
        disruption_count=disruption_count,
        start_time=start_time,
        attempt_start_time=attempt_start,
        completion_time=completion_time,
        observed_generation=job.generation,
    )
    return Decision(
        status=new_status,
        create_pods=tuple(create_pods),
        # Only Pods that exist and are not already going away need a delete call; a Pod on a
        # lost node is left to Kubernetes (taint eviction, the pod GC), which removes it.
        delete_pods=tuple(
            key
            for key in dict.fromkeys(work.delete_pods)
            if key in pods and not pods[key].deleting and key not in work.lost
        ),
        create_services=tuple(create_services),
        delete_services=tuple(delete_services),
        events=tuple(work.events),
        delete_job=delete_job,
        requeue_after=min(work.requeue) if work.requeue else None,
    )


def _observe(work: _Work, pods: Mapping[ReplicaKey, ObservedReplica]) -> list[Failure]:
    """Fold observed Pods into replica records; return the failures of current attempts."""
    failures: list[Failure] = []
    finished = work.status.finished
    deciders = set(success_deciders(work.job))
    new_causes: dict[str, list[str]] = {}  # waiting reason -> lines of replicas newly waiting
    for key in work.job.replica_keys():
        record = work.replicas[key]
        pod = pods.get(key)
        if record.state in (st.STATE_SUCCEEDED, st.STATE_STOPPED):
            continue
        if pod is None:
            message = work.refused.get(key)
            if not finished and record.state == st.STATE_NONE:
                # Not created (yet): refused by the API server, or no longer refused.
                reason = REASON_FAILED_CREATE if message is not None else None
                if reason is not None and record.waiting_reason != reason:
                    line = waiting_line(key, reason, message or "")
                    new_causes.setdefault(reason, []).append(line)
                if record.waiting_reason == REASON_FAILED_CREATE or reason is not None:
                    work.replicas[key] = dataclasses.replace(
                        record, waiting_reason=reason, waiting_message=message
                    )
            if not finished and record.state in (st.STATE_PENDING, st.STATE_RUNNING):
                failures.append(_vanished(work, key, record))
            continue
        if pod.attempt > record.attempt:
            # Created by an earlier reconcile whose status write was lost: adopt it.
            record = dataclasses.replace(record, attempt=pod.attempt)
            work.replicas[key] = record
        if pod.attempt < record.attempt:
            if not pod.deleting:
                work.delete_pods.append(key)
            continue
        if not finished and (pod.disruption_reason is not None or not pod.deleting):
            # Remembered as soon as it is seen (whoever disrupts a Pod sets the condition,
            # then deletes it): once the Pod is gone, its condition is gone with it. A Pod
            # still running without it clears it (the pod GC controller removes a stale one).
            record = dataclasses.replace(
                record,
                disruption_reason=pod.disruption_reason,
                disruption_message=pod.disruption_message,
            )
            work.replicas[key] = record
        if pod.deleting:
            # Terminating is not a failure by itself (kubeflow #2124); judge it once it's gone.
            continue
        if finished:
            continue
        if pod.phase in (PHASE_PENDING, PHASE_RUNNING):
            waiting = pod.waiting_reason if pod.phase == PHASE_PENDING else None
            message = pod.waiting_message if waiting is not None else None
            if key in work.lost:
                # The node outranks what its kubelet last said: it says nothing new now.
                waiting, message = work.lost[key]
            if waiting is not None and _cause_of(waiting) != _cause_of(record.waiting_reason):
                line = waiting_line(key, waiting, message or "")
                new_causes.setdefault(waiting, []).append(line)
            work.replicas[key] = dataclasses.replace(
                record, state=pod.phase, waiting_reason=waiting, waiting_message=message
            )
        elif pod.phase == PHASE_SUCCEEDED:
            restart_policy = work.job.replica_specs[key[0]].restart_policy
            if restart_policy == "Always" and key not in deciders:
                failures.append(Failure(key, 0, pod.reason or "Completed", pod.finished_at))
            else:
                work.replicas[key] = dataclasses.replace(
                    record, state=st.STATE_SUCCEEDED, exit_code=0, reason=None
                )
        elif pod.phase == PHASE_FAILED:
            failures.append(
                Failure(
                    key,
                    pod.exit_code,
                    pod.reason,
                    pod.finished_at,
                    # The Pod is here: its own conditions say (a stale one is removed by then).
                    pod.disruption_reason,
                    pod.disruption_message,
                    pod.cause,
                )
            )
    for reason, lines in new_causes.items():
        # One Event per cause, not per replica: 500 workers that fit no node are one problem.
        work.event("Warning", reason, summarize(lines))
    return failures


# Lines quoted in one condition message or Event: a big job's all-alike causes stay readable
# and far below the API server's size limits.
MAX_LINES_QUOTED: Final = 3


def summarize(lines: list[str]) -> str:
    """`worker 1: ...; worker 2: ...; worker 3: ...; and 97 more replicas`."""
    shown = "; ".join(lines[:MAX_LINES_QUOTED])
    more = len(lines) - MAX_LINES_QUOTED
    return shown + (f"; and {more} more replicas" if more > 0 else "")


def _vanished(work: _Work, key: ReplicaKey, record: st.ReplicaRecord) -> Failure:
    """The Failure of a replica whose Pod is gone without a verdict of its own. Its node was
    lost when last seen (the record says so): the node's removal took it (pod GC of a deleted
    Node, or a force delete), a disruption even when its DisruptionTarget was never seen."""
    reason, message = record.disruption_reason, record.disruption_message
    if reason is None and record.waiting_reason in NODE_REASONS:
        reason, message = record.waiting_reason, record.waiting_message
    return Failure(key, None, "Deleted", work.now, reason, message)


def _cause_of(waiting_reason: str | None) -> str | None:
    return _SAME_CAUSE.get(waiting_reason or "", waiting_reason)


def waiting_line(key: ReplicaKey, reason: str, message: str) -> str:
    """`worker 1: ImagePullBackOff: Back-off pulling image "nope:1"`; a lost node's words
    say it all: `worker 1: node n3 unreachable since 2026-11-24T06:40:00Z`."""
    if reason in NODE_REASONS and message:
        return f"{key[0]} {key[1]}: {message}"
    return f"{key[0]} {key[1]}: {reason}" + (f": {message}" if message else "")


def _waiting_lines(work: _Work) -> list[tuple[str, str]]:
    """(reason, line) of every replica whose Pod waits for a user to act, in replica order."""
    result: list[tuple[str, str]] = []
    for key in work.job.replica_keys():
        record = work.replicas[key]
        refused = record.state == st.STATE_NONE and record.waiting_reason == REASON_FAILED_CREATE
        lost = record.waiting_reason in NODE_REASONS and record.state == st.STATE_RUNNING
        if record.waiting_reason is not None and (
            record.state == st.STATE_PENDING or refused or lost
        ):
            line = waiting_line(key, record.waiting_reason, record.waiting_message or "")
            result.append((record.waiting_reason, line))
    return result


@dataclasses.dataclass(frozen=True)
class _Verdict:
    restart_count: int
    disruption_count: int
    attempt_start: datetime.datetime | None
    finished: bool


def _judge(
    work: _Work,
    failures: list[Failure],
    restart_count: int,
    disruption_count: int,
    start_time: datetime.datetime | None,
    attempt_start: datetime.datetime | None,
) -> _Verdict | None:
    """Success, then deadlines, then failures: the first that applies decides."""
    job, now = work.job, work.now
    if is_success(job, work.replicas):
        deciders = ", ".join(f"{t} {i}" for t, i in success_deciders(job))
        _finish(work, st.SUCCEEDED, REASON_SUCCEEDED, f"TrainJob {job.name} succeeded ({deciders})")
        return _Verdict(restart_count, disruption_count, None, True)

    deadline = job.run_policy.active_deadline_seconds
    if deadline is not None and start_time is not None:
        remaining = (start_time - now).total_seconds() + deadline
        if remaining <= 0:
            _finish(
                work,
                st.FAILED,
                REASON_DEADLINE,
                f"TrainJob {job.name} ran longer than activeDeadlineSeconds={deadline}",
            )
            return _Verdict(restart_count, disruption_count, None, True)
        work.requeue.append(remaining)

    if failures:
        return _handle_failures(work, failures, restart_count, disruption_count)

    stall = stall_remaining(job, work.conditions, work.progress_at, now)
    if stall is not None:
        if stall <= 0:
            return _stalled(work, restart_count, disruption_count)
        work.requeue.append(stall)

    not_up = [
        key
        for key in job.replica_keys()
        if work.replicas[key].state not in (st.STATE_RUNNING, st.STATE_SUCCEEDED)
    ]
    if work.held is not None:
        return None  # no Pod may be created yet: no startup clock runs
    if not_up and _nothing_placed([work.replicas[key] for key in job.replica_keys()]):
        # Every replica still waits for a node (no capacity, a gang that does not fit yet):
        # nothing is held and no peer waits, so no startup clock runs (and nothing is written).
        return None
    # Placed now after waiting for a node: the startup clock starts here, not at creation.
    placed_now = _nothing_placed([work.status.record(key) for key in job.replica_keys()])
    if placed_now:
        attempt_start = now
    if not_up and attempt_start is not None:
        limit = job.run_policy.startup_deadline_seconds
        remaining = (attempt_start - now).total_seconds() + limit
        if remaining <= 0:
            names = ", ".join(_not_up_text(work, key) for key in not_up)
            _finish(
                work,
                st.FAILED,
                REASON_STARTUP,
                f"Not every replica was running within startupDeadlineSeconds={limit}; "
                f"still waiting for: {names}",
            )
            return _Verdict(restart_count, disruption_count, None, True)
        work.requeue.append(remaining)
    return _Verdict(restart_count, disruption_count, now, False) if placed_now else None


def _nothing_placed(records: list[st.ReplicaRecord]) -> bool:
    """Whether no replica has a node yet and each one waits for one (the scheduler says
    Unschedulable), so the job holds nothing while it waits."""
    return bool(records) and all(
        r.state == st.STATE_PENDING and r.waiting_reason == REASON_UNSCHEDULABLE for r in records
    )


def stall_remaining(
    job: spec.TrainJob,
    conditions: Iterable[st.Condition],
    progress_at: datetime.datetime | None,
    now: datetime.datetime,
) -> float | None:
    """Seconds until a Running job counts as stalled (<= 0: it is); None when no progress
    deadline applies. The clock starts when the job (last) became Running, so a restarted job
    gets the whole deadline again, and moves with every new step reported after that.

    `progress_at` None means the executor has no progress of this job at all (no endpoint, a
    script that never reports): silence is then no evidence of a hang, so nothing is judged."""
    limit = job.run_policy.progress_deadline_seconds
    running = next((c for c in conditions if c.type == st.RUNNING and c.status), None)
    if limit is None or running is None or progress_at is None:
        return None
    origin = max(running.last_transition_time, progress_at)
    return (origin - now).total_seconds() + limit


def _stalled(work: _Work, restart_count: int, disruption_count: int) -> _Verdict:
    """No new step for progressDeadlineSeconds (a hung collective, a dead input pipeline):
    TensorFlow itself may wait for ever. Fail, or restart the reporting replica's restart
    group from its checkpoint; a restart counts toward backoffLimit like any other."""
    job = work.job
    limit = job.run_policy.progress_deadline_seconds
    reporter = success_deciders(job)[0]
    what = (
        f"no new step from {reporter[0]} {reporter[1]} for {limit} s "
        f"(progressDeadlineSeconds={limit})"
    )
    if job.run_policy.progress_deadline_action == "Fail":
        _finish(work, st.FAILED, REASON_STALLED, f"Stalled: {what}")
        return _Verdict(restart_count, disruption_count, None, True)
    backoff = job.run_policy.backoff_limit
    if restart_count + 1 > backoff:
        message = f"Stalled: {what}; backoffLimit={backoff} restarts already used"
        _finish(work, st.FAILED, REASON_BACKOFF, message)
        return _Verdict(restart_count, disruption_count, None, True)
    scope = restart_scope(job, reporter)
    restarted = [key for key in scope if work.replicas[key].state != st.STATE_SUCCEEDED]
    for key in restarted:
        work.replicas[key] = work.replicas[key].next_attempt()
        work.delete_pods.append(key)
    restart_count += 1
    names = ", ".join(f"{t} {i}" for t, i in restarted)
    work.event(
        "Warning",
        "Restarting",
        f"Restarting {names} from the last checkpoint after {what} "
        f"(restart {restart_count} of backoffLimit {backoff})",
    )
    work.condition(st.RESTARTING, True, REASON_STALLED, f"Restarting after {what}")
    work.condition(st.RUNNING, False, REASON_STALLED, f"Restarting after {what}")
    return _Verdict(restart_count, disruption_count, work.now, False)


def _not_up_text(work: _Work, key: ReplicaKey) -> str:
    """`worker 1 (ImagePullBackOff: Back-off pulling image "nope:1")`, or `worker 1`."""
    record = work.replicas[key]
    refused = record.state == st.STATE_NONE and record.waiting_reason == REASON_FAILED_CREATE
    if record.waiting_reason is None or (record.state != st.STATE_PENDING and not refused):
        return f"{key[0]} {key[1]}"
    detail = record.waiting_reason
    if record.waiting_message:
        detail += f": {record.waiting_message}"
    return f"{key[0]} {key[1]} ({detail})"


def _handle_failures(
    work: _Work, failures: list[Failure], restart_count: int, disruption_count: int
) -> _Verdict:
    job = work.job
    groups: dict[tuple[ReplicaKey, ...], list[Failure]] = {}
    for failure in failures:
        groups.setdefault(restart_scope(job, failure.key), []).append(failure)
    for failure in failures:
        record = work.replicas[failure.key]
        work.replicas[failure.key] = dataclasses.replace(
            record,
            state=st.STATE_FAILED,
            exit_code=failure.exit_code,
            reason=failure.reason,
            message=failure.cause or record.message,
        )
    causes = [_group_cause(work, scope, group) for scope, group in groups.items()]
    counted = [c for c in causes if not c.disrupted]
    disrupted = [c for c in causes if c.disrupted]
    for cause in counted:
        policy = job.replica_specs[cause.key[0]].restart_policy
        if not is_retryable(policy, cause):
            message = f"{describe(cause)}; restartPolicy {policy} does not retry it"
            _finish(work, st.FAILED, failed_reason(cause), message + _quote(cause, failures))
            return _Verdict(restart_count, disruption_count, None, True)
    if restart_count + len(counted) > job.run_policy.backoff_limit:
        message = (
            f"{describe(counted[0])}; backoffLimit={job.run_policy.backoff_limit} "
            f"restarts already used"
        )
        _finish(work, st.FAILED, REASON_BACKOFF, message + _quote(counted[0], failures))
        return _Verdict(restart_count, disruption_count, None, True)
    limit = job.run_policy.disruption_limit
    if disrupted and disruption_count + len(disrupted) > limit:
        _finish(
            work,
            st.FAILED,
            REASON_DISRUPTION_LIMIT,
            f"{describe(disrupted[0])}; disruptionLimit={limit} restarts after a preemption "
            f"or eviction already used",
        )
        return _Verdict(restart_count, disruption_count, None, True)
    for scope, cause in zip(groups, causes, strict=True):
        restarted = [key for key in scope if work.replicas[key].state != st.STATE_SUCCEEDED]
        for key in restarted:
            work.replicas[key] = work.replicas[key].next_attempt()
            work.delete_pods.append(key)
        names = ", ".join(f"{t} {i}" for t, i in restarted)
        if cause.disrupted:
            disruption_count += 1
            work.event(
                "Warning",
                disruption_kind(cause.disruption_reason or ""),
                f"Restarting {names} after {describe(cause)} (disruption {disruption_count} "
                f"of disruptionLimit {limit}, not counted toward backoffLimit)",
            )
            continue
        restart_count += 1
        work.event(
            "Warning",
            "Restarting",
            f"Restarting {names} after {describe(cause)} "
            f"(restart {restart_count} of backoffLimit {job.run_policy.backoff_limit})"
            + _quote(cause, failures),
        )
    message = "; ".join(describe(c) for c in causes)
    reason = REASON_RESTARTING
    if not counted:
        # Only disruptions: the reason says which, so `kubectl get tj` shows Preempted.
        reason = disruption_kind(disrupted[0].disruption_reason or "")
    work.condition(st.RESTARTING, True, reason, f"Restarting after {message}")
    work.condition(st.RUNNING, False, reason, f"Restarting after {message}")
    return _Verdict(restart_count, disruption_count, work.now, False)


def _group_cause(work: _Work, scope: tuple[ReplicaKey, ...], group: list[Failure]) -> Failure:
    """What made a restart group fail. A disruption anywhere in the group (a failed Pod, or
    one still terminating under DisruptionTarget) is the cause: its peers of an all-reduce job
    exit 1 within seconds *because* it was taken away, often before its Pod is gone."""
    for failure in sorted(group, key=lambda f: f.key):
        if failure.disrupted:
            return failure
    for key in scope:
        record = work.replicas[key]
        if record.disruption_reason is not None:
            return Failure(
                key, None, "Deleted", work.now, record.disruption_reason, record.disruption_message
            )
    for key in scope:
        # A peer on a lost node: the collective broke because its node went away.
        record = work.replicas[key]
        if key in work.lost and record.waiting_reason in NODE_REASONS:
            return Failure(
                key, None, "Deleted", work.now, record.waiting_reason, record.waiting_message
            )
    return root_cause(group)


def _quote(cause: Failure, failures: list[Failure]) -> str:
    """`; cause: worker-0: ValueError: ...`: the replica's last words, the root cause's when
    it left any, else the first of its peers' (one exit 1 often just follows a lost peer)."""
    candidates = [cause, *sorted(failures, key=lambda f: f.key)]
    for failure in candidates:
        if failure.cause:
            return f"; cause: {failure.key[0]}-{failure.key[1]}: {failure.cause}"
    return ""


def _finish(work: _Work, ctype: str, reason: str, message: str) -> None:
    work.condition(ctype, True, reason, message)
    work.condition(st.RUNNING, False, reason, message)
    if work.is_true(st.RESTARTING):
        work.condition(st.RESTARTING, False, reason, message)
    event_type = "Normal" if ctype == st.SUCCEEDED else "Warning"
    work.event(event_type, reason, message)


def _clean_up(
    work: _Work, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
) -> list[ReplicaKey]:
    """Apply cleanPodPolicy to a finished job; return the Services to delete.

    ps and evaluator never exit by themselves, so the default (Running) stops whatever is still
    running; finished Pods stay for their logs unless the policy is All."""
    policy = work.job.run_policy.clean_pod_policy
    delete_services: list[ReplicaKey] = []
    for key in work.job.replica_keys():
        pod = pods.get(key)
        record = work.replicas[key]
        if record.state in (st.STATE_PENDING, st.STATE_RUNNING, st.STATE_NONE) and policy != "None":
            work.replicas[key] = dataclasses.replace(record, state=st.STATE_STOPPED)
        if policy == "None" or pod is None or pod.deleting:
            continue
        active = pod.phase in (PHASE_PENDING, PHASE_RUNNING, PHASE_UNKNOWN)
        if policy == "All" or active:
            work.delete_pods.append(key)
    if policy == "All":
        delete_services = [key for key in work.job.replica_keys() if key in services]
    elif policy == "Running":
        delete_services = [
            key for key in work.job.replica_keys() if key in services and key in work.delete_pods
        ]
    return delete_services


def _update_running(work: _Work) -> None:
    """Running once every replica is up (or already done); that also ends a restart. Until
    then, a replica that waits for a user to act (a bad image, no node fits) shows why in
    Running=False, so `kubectl get tj` says it without a look at the Pods."""
    all_up = all(
        work.replicas[key].state in (st.STATE_RUNNING, st.STATE_SUCCEEDED)
        and work.replicas[key].waiting_reason not in NODE_REASONS
        for key in work.job.replica_keys()
    )
    if not all_up:
        _show_waiting(work)
    if all_up and not work.is_true(st.RUNNING):
        work.condition(st.RUNNING, True, REASON_RUNNING, "All replicas are running")
        if work.is_true(st.RESTARTING):
            work.condition(st.RESTARTING, False, REASON_RUNNING, "All replicas are running again")
        work.event("Normal", "Running", f"TrainJob {work.job.name} is running")


def _show_waiting(work: _Work) -> None:
    running = next((c for c in work.conditions if c.type == st.RUNNING), None)
    if work.held is not None:
        reason, message = work.held
        if not work.status.is_true(st.RUNNING) and (running is None or running.reason != reason):
            work.event("Normal", reason, message)
        work.condition(st.RUNNING, False, reason, message)
        return
    waiting = _waiting_lines(work)
    if waiting:
        work.condition(st.RUNNING, False, waiting[0][0], summarize([line for _, line in waiting]))
        return
    if running is not None and not running.status and running.reason in WAITING_REASONS:
        # The cause went away (the image pulled, a node freed): say what we wait for now.
        if work.is_true(st.RESTARTING):
            work.condition(st.RUNNING, False, REASON_RESTARTING, "Replicas are restarting")
        else:
            work.condition(st.RUNNING, False, REASON_STARTING, "Replicas are starting")


def _suspend(
    work: _Work, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
) -> Decision:
    """Suspend deletes every Pod and Service and keeps status (what Kueue needs). Pods of the
    suspended attempt become stale, so none of their exits is ever counted as a failure."""
    newly = not work.status.is_true(st.SUSPENDED)
    if newly:
        for key, record in work.replicas.items():
            if record.state != st.STATE_SUCCEEDED:
                work.replicas[key] = record.next_attempt()
        work.condition(st.SUSPENDED, True, REASON_SUSPENDED, "TrainJob is suspended")
        if work.is_true(st.RUNNING):
            work.condition(st.RUNNING, False, REASON_SUSPENDED, "TrainJob is suspended")
        if work.is_true(st.RESTARTING):
            work.condition(st.RESTARTING, False, REASON_SUSPENDED, "TrainJob is suspended")
        work.event("Normal", "Suspended", "Suspended TrainJob: deleted its Pods and Services")
    delete_pods = tuple(key for key, pod in pods.items() if not pod.deleting)
    new_status = dataclasses.replace(
        work.status,
        conditions=work.conditions,
        replicas=work.replicas,
        observed_generation=work.job.generation,
    )
    return Decision(
        status=new_status,
        delete_pods=delete_pods,
        delete_services=tuple(sorted(services)),
        events=tuple(work.events),
    )


def invalid_spec(
    status: st.JobStatus, message: str, now: datetime.datetime, generation: int | None
) -> st.JobStatus:
    """The status of a TrainJob the operator cannot run: Failed, reason InvalidSpec."""
    conditions = st.set_condition(status.conditions, st.FAILED, True, REASON_INVALID, message, now)
    return dataclasses.replace(
        status,
        conditions=conditions,
        completion_time=status.completion_time or now,
        observed_generation=generation,
    )
