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

This module is the decision function and what it does once the verdict is in (clean up, show
why replicas wait, suspend); beside it, all pure: the engine's terms and the rules on one
failure (:mod:`trainjob.core.policy_terms`), the fold of observed replicas into their records
(:mod:`trainjob.core.policy_fold`) and the verdicts (:mod:`trainjob.core.policy_verdict`).
Their public names are the engine's and are re-exported here (`policy.ObservedReplica`,
`policy.REASON_UNSCHEDULABLE`, ...).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping

from trainjob.core import spec
from trainjob.core import status as st
from trainjob.core.policy_fold import (
    MAX_LINES_QUOTED,
    fold_observed,
    summarize,
    waiting_line,
    waiting_lines,
)
from trainjob.core.policy_terms import (
    DISRUPTION_PREEMPTION,
    EXIT_CODE_NON_FINITE_LOSS,
    FIRST_SIGNAL_EXIT_CODE,
    NODE_REASONS,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    PHASE_UNKNOWN,
    REASON_BACKOFF,
    REASON_CREATED,
    REASON_DEADLINE,
    REASON_DISRUPTION_LIMIT,
    REASON_EVICTED,
    REASON_FAILED,
    REASON_FAILED_CREATE,
    REASON_GANG_PENDING,
    REASON_INVALID,
    REASON_NODE_NOT_READY,
    REASON_NODE_UNREACHABLE,
    REASON_NON_FINITE_LOSS,
    REASON_PREEMPTED,
    REASON_RESTARTING,
    REASON_RESUMED,
    REASON_RUNNING,
    REASON_STALLED,
    REASON_STARTING,
    REASON_STARTUP,
    REASON_SUCCEEDED,
    REASON_SUSPENDED,
    REASON_UNSCHEDULABLE,
    RESTART_DELAY_FIRST,
    RESTART_DELAY_MAX,
    WAITING_REASONS,
    Decision,
    Event,
    Failure,
    ObservedReplica,
    ReplicaKey,
    Work,
    describe,
    disruption_kind,
    failed_reason,
    is_retryable,
    is_success,
    restart_delay,
    restart_scope,
    retryable_exit_code,
    root_cause,
    success_deciders,
)
from trainjob.core.policy_verdict import judge, stall_remaining

# The engine's terms, observations and verdicts are imported from policy_terms, policy_fold and
# policy_verdict: every public name is the engine's, as `policy.X`.
__all__ = [
    "DISRUPTION_PREEMPTION",
    "EXIT_CODE_NON_FINITE_LOSS",
    "FIRST_SIGNAL_EXIT_CODE",
    "MAX_LINES_QUOTED",
    "NODE_REASONS",
    "PHASE_FAILED",
    "PHASE_PENDING",
    "PHASE_RUNNING",
    "PHASE_SUCCEEDED",
    "PHASE_UNKNOWN",
    "REASON_BACKOFF",
    "REASON_CREATED",
    "REASON_DEADLINE",
    "REASON_DISRUPTION_LIMIT",
    "REASON_EVICTED",
    "REASON_FAILED",
    "REASON_FAILED_CREATE",
    "REASON_GANG_PENDING",
    "REASON_INVALID",
    "REASON_NODE_NOT_READY",
    "REASON_NODE_UNREACHABLE",
    "REASON_NON_FINITE_LOSS",
    "REASON_PREEMPTED",
    "REASON_RESTARTING",
    "REASON_RESUMED",
    "REASON_RUNNING",
    "REASON_STALLED",
    "REASON_STARTING",
    "REASON_STARTUP",
    "REASON_SUCCEEDED",
    "REASON_SUSPENDED",
    "REASON_UNSCHEDULABLE",
    "RESTART_DELAY_FIRST",
    "RESTART_DELAY_MAX",
    "WAITING_REASONS",
    "Decision",
    "Event",
    "Failure",
    "ObservedReplica",
    "ReplicaKey",
    "describe",
    "disruption_kind",
    "failed_reason",
    "invalid_spec",
    "is_retryable",
    "is_success",
    "reconcile",
    "restart_delay",
    "restart_scope",
    "retryable_exit_code",
    "root_cause",
    "stall_remaining",
    "success_deciders",
    "summarize",
    "waiting_line",
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
    work = Work(
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

    failures = fold_observed(work, pods)

    if not status.finished:
        verdict = judge(work, failures, restart_count, disruption_count, start_time, attempt_start)
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


def _clean_up(
    work: Work, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
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


def _update_running(work: Work) -> None:
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


def _show_waiting(work: Work) -> None:
    running = next((c for c in work.conditions if c.type == st.RUNNING), None)
    if work.held is not None:
        reason, message = work.held
        if not work.status.is_true(st.RUNNING) and (running is None or running.reason != reason):
            work.event("Normal", reason, message)
        work.condition(st.RUNNING, False, reason, message)
        return
    waiting = waiting_lines(work)
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
    work: Work, pods: Mapping[ReplicaKey, ObservedReplica], services: set[ReplicaKey]
) -> Decision:
    """Suspend deletes every Pod and Service and keeps status (what Kueue needs). Pods of the
    suspended attempt become stale, so none of their exits is ever counted as a failure.

    A job suspended before it started (created suspended, or queued by Kueue) never had a Pod
    or Service: no startTime (set whenever Pods may be created), none observed. Its replicas
    stay at attempt 0 (no stale Pod to tell apart) and its Event says nothing was deleted."""
    newly = not work.status.is_true(st.SUSPENDED)
    if newly:
        never_started = work.status.start_time is None and not pods and not services
        if not never_started:
            for key, record in work.replicas.items():
                if record.state != st.STATE_SUCCEEDED:
                    work.replicas[key] = record.next_attempt()
        work.condition(st.SUSPENDED, True, REASON_SUSPENDED, "TrainJob is suspended")
        if work.is_true(st.RUNNING):
            work.condition(st.RUNNING, False, REASON_SUSPENDED, "TrainJob is suspended")
        if work.is_true(st.RESTARTING):
            work.condition(st.RESTARTING, False, REASON_SUSPENDED, "TrainJob is suspended")
        work.event("Normal", "Suspended", _suspended_message(never_started))
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


def _suspended_message(never_started: bool) -> str:
    """The Suspended Event's words: what suspending did."""
    if never_started:
        return "Suspended TrainJob before it started: no Pod or Service was created"
    return "Suspended TrainJob: deleted its Pods and Services"


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
