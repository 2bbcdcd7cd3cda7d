"""The lifecycle policy engine: one pure function, :func:`reconcile`, from (spec, status, observed
replicas, now) to what to do next. The operator applies its decisions as API calls, the local
executor as processes, so "worker 1 exited 137 under ExitCode" has exactly one implementation.

Semantics (the docs' concepts/semantics.md says the same for users):
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

This module is the decision function: it folds what is observed into the replicas' records
(:mod:`~trainjob.core.policy_fold`), applies the rules in their order (:func:`_judge`), and does
what follows once the verdict is in (clean up, create, suspend). Each rule lives in a module
named after it, all pure: :mod:`~trainjob.core.policy_success`,
:mod:`~trainjob.core.policy_clocks` (the deadlines), :mod:`~trainjob.core.policy_restart` (what
failures do, with :mod:`~trainjob.core.policy_failure` for one failure's fate,
:mod:`~trainjob.core.policy_backoff` and :mod:`~trainjob.core.policy_disruption`) and
:mod:`~trainjob.core.policy_waiting` (Running, and why replicas wait); their shared types are in
:mod:`~trainjob.core.policy_terms`. `__all__` re-exports what the engine's callers use of them.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping

from trainjob.core import (
    policy_backoff,
    policy_clocks,
    policy_fold,
    policy_restart,
    policy_success,
    policy_waiting,
    reasons,
    spec,
)
from trainjob.core import status as st
from trainjob.core.policy_backoff import restart_delay
from trainjob.core.policy_failure import EXIT_CODE_NON_FINITE_LOSS, retryable_exit_code
from trainjob.core.policy_terms import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    PHASE_UNKNOWN,
    REASON_BACKOFF,
    REASON_CREATED,
    REASON_DEADLINE,
    REASON_FAILED,
    REASON_GANG_PENDING,
    REASON_INVALID,
    REASON_NODE_NOT_READY,
    REASON_NODE_UNREACHABLE,
    REASON_NON_FINITE_LOSS,
    REASON_RESUMED,
    REASON_STARTING,
    REASON_STARTUP,
    REASON_SUSPENDED,
    REASON_UNSCHEDULABLE,
    WAITING_REASONS,
    Decision,
    DecisionDraft,
    Event,
    Failure,
    ObservedReplica,
    ReplicaKey,
    Verdict,
)

# The engine's entry points, and the names of the other policy modules its callers use (each
# still lives where it is defined; everything else is imported from there).
__all__ = [
    "EXIT_CODE_NON_FINITE_LOSS",
    "PHASE_FAILED",
    "PHASE_PENDING",
    "PHASE_RUNNING",
    "PHASE_SUCCEEDED",
    "REASON_BACKOFF",
    "REASON_DEADLINE",
    "REASON_FAILED",
    "REASON_GANG_PENDING",
    "REASON_INVALID",
    "REASON_NODE_NOT_READY",
    "REASON_NODE_UNREACHABLE",
    "REASON_NON_FINITE_LOSS",
    "REASON_STARTING",
    "REASON_STARTUP",
    "REASON_UNSCHEDULABLE",
    "WAITING_REASONS",
    "Decision",
    "Event",
    "ObservedReplica",
    "ReplicaKey",
    "invalid_spec",
    "reconcile",
    "restart_delay",
    "retryable_exit_code",
]


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
    draft = DecisionDraft(
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
    if not status.finished and not draft.is_true(st.CREATED):
        draft.condition(st.CREATED, True, REASON_CREATED, f"{job.kind} {job.name} is created")
        draft.event("Normal", reasons.EVENT_CREATED, f"Created {job.kind} {job.name}")

    if not status.finished and job.run_policy.suspend:
        return _suspend(draft, pods, existing_services)

    if not status.finished:
        if status.is_true(st.SUSPENDED):
            draft.condition(st.SUSPENDED, False, REASON_RESUMED, f"{job.kind} resumed")
            draft.event(
                "Normal", reasons.EVENT_RESUMED, f"Resumed {job.kind}: recreating its replicas"
            )
            start_time = attempt_start = now
        if start_time is None:
            start_time = attempt_start = now
        running = status.condition(st.RUNNING)
        if held is None and running is not None and running.reason == REASON_GANG_PENDING:
            attempt_start = now  # released: the startup clock starts once Pods may be created

    failures = policy_fold.fold_observed(draft, pods)

    if not status.finished:
        verdict = _judge(
            draft, failures, restart_count, disruption_count, start_time, attempt_start
        )
        if verdict is not None:
            restart_count = verdict.restart_count
            disruption_count = verdict.disruption_count
            attempt_start = verdict.attempt_start or attempt_start
            if verdict.finished:
                completion_time = now

    finished = draft.is_true(st.SUCCEEDED) or draft.is_true(st.FAILED)
    create_pods: list[tuple[str, int, int]] = []
    create_services: list[ReplicaKey] = []
    delete_services: list[ReplicaKey] = []
    delete_job = False
    if finished:
        delete_services = _clean_up(draft, pods, existing_services)
        delete_job = policy_clocks.ttl_expired(draft, completion_time)
    else:
        hold = policy_backoff.delay_remaining(draft, restart_count, attempt_start)
        for key in job.replica_keys():
            record = draft.replicas[key]
            if key not in existing_services:
                create_services.append(key)
            if key not in pods and record.state != st.STATE_SUCCEEDED:
                if held is not None:
                    continue  # the gang is not admitted: no Pod may take a node yet
                if hold > 0 and record.state == st.STATE_NONE:
                    draft.requeue.append(hold)  # a restarted replica waits out its delay
                    continue
                create_pods.append((key[0], key[1], record.attempt))
        policy_waiting.update_running(draft)

    new_status = st.JobStatus(
        conditions=draft.conditions,
        replicas=draft.replicas,
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
            for key in dict.fromkeys(draft.delete_pods)
            if key in pods and not pods[key].deleting and key not in draft.lost
        ),
        create_services=tuple(create_services),
        delete_services=tuple(delete_services),
        events=tuple(draft.events),
        delete_job=delete_job,
        requeue_after=min(draft.requeue) if draft.requeue else None,
    )


def _judge(
    draft: DecisionDraft,
    failures: list[Failure],
    restart_count: int,
    disruption_count: int,
    start_time: datetime.datetime | None,
    attempt_start: datetime.datetime | None,
) -> Verdict | None:
    """The rules in their order, the first that applies decides: success, the active deadline,
    failures (restart or fail), a stall (the progress deadline), the startup deadline. None:
    nothing to decide, the counters and the attempt's start stay."""
    if policy_success.finish_if_succeeded(draft):
        return Verdict(restart_count, disruption_count, None, True)
    if policy_clocks.fail_past_active_deadline(draft, start_time):
        return Verdict(restart_count, disruption_count, None, True)
    if failures:
        return policy_restart.restart_or_fail(draft, failures, restart_count, disruption_count)
    stalled = policy_clocks.progress_deadline(draft, restart_count, disruption_count)
    if stalled is not None:
        return stalled
    return policy_clocks.startup_deadline(draft, restart_count, disruption_count, attempt_start)


def _clean_up(
    draft: DecisionDraft, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
) -> list[ReplicaKey]:
    """Apply cleanPodPolicy to a finished job; return the Services to delete.

    ps and evaluator never exit by themselves, so the default (Running) stops whatever is still
    running; finished Pods stay for their logs unless the policy is All."""
    policy = draft.job.run_policy.clean_pod_policy
    delete_services: list[ReplicaKey] = []
    for key in draft.job.replica_keys():
        pod = pods.get(key)
        record = draft.replicas[key]
        if record.state in (st.STATE_PENDING, st.STATE_RUNNING, st.STATE_NONE) and policy != "None":
            draft.replicas[key] = dataclasses.replace(record, state=st.STATE_STOPPED)
        if policy == "None" or pod is None or pod.deleting:
            continue
        active = pod.phase in (PHASE_PENDING, PHASE_RUNNING, PHASE_UNKNOWN)
        if policy == "All" or active:
            draft.delete_pods.append(key)
    if policy == "All":
        delete_services = [key for key in draft.job.replica_keys() if key in services]
    elif policy == "Running":
        delete_services = [
            key for key in draft.job.replica_keys() if key in services and key in draft.delete_pods
        ]
    return delete_services


def _suspend(
    draft: DecisionDraft, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
) -> Decision:
    """Suspend deletes every Pod and Service and keeps status (what Kueue needs). Pods of the
    suspended attempt become stale, so none of their exits is ever counted as a failure.

    A job suspended before it started (created suspended, or queued by Kueue) never had a Pod
    or Service: no startTime (set whenever Pods may be created), none observed. Its replicas
    stay at attempt 0 (no stale Pod to tell apart) and its Event says nothing was deleted."""
    newly = not draft.status.is_true(st.SUSPENDED)
    if newly:
        never_started = draft.status.start_time is None and not pods and not services
        if not never_started:
            for key, record in draft.replicas.items():
                if record.state != st.STATE_SUCCEEDED:
                    draft.replicas[key] = record.next_attempt()
        suspended = f"{draft.job.kind} is suspended"
        draft.condition(st.SUSPENDED, True, REASON_SUSPENDED, suspended)
        if draft.is_true(st.RUNNING):
            draft.condition(st.RUNNING, False, REASON_SUSPENDED, suspended)
        if draft.is_true(st.RESTARTING):
            draft.condition(st.RESTARTING, False, REASON_SUSPENDED, suspended)
        draft.event(
            "Normal", reasons.EVENT_SUSPENDED, _suspended_message(draft.job.kind, never_started)
        )
    delete_pods = tuple(key for key, pod in pods.items() if not pod.deleting)
    new_status = dataclasses.replace(
        draft.status,
        conditions=draft.conditions,
        replicas=draft.replicas,
        observed_generation=draft.job.generation,
    )
    return Decision(
        status=new_status,
        delete_pods=delete_pods,
        delete_services=tuple(sorted(services)),
        events=tuple(draft.events),
    )


def _suspended_message(kind: str, never_started: bool) -> str:
    """The Suspended Event's words: what suspending did."""
    if never_started:
        return f"Suspended {kind} before it started: no Pod or Service was created"
    return f"Suspended {kind}: deleted its Pods and Services"


def invalid_spec(
    status: st.JobStatus,
    message: str,
    now: datetime.datetime,
    generation: int | None,
    reason: str = REASON_INVALID,
) -> st.JobStatus:
    """The status of a TrainJob the operator cannot run: Failed, reason InvalidSpec (or
    `reason`: NameInUse)."""
    conditions = st.set_condition(status.conditions, st.FAILED, True, reason, message, now)
    return dataclasses.replace(
        status,
        conditions=conditions,
        completion_time=status.completion_time or now,
        observed_generation=generation,
    )
