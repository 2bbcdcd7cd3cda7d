"""The policy engine's verdicts (pure): success, then the deadlines, then failures (restart
the failed replica's group, or fail the job), then a stalled job and the startup deadline; the
first that applies decides."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable

from trainjob.core import spec
from trainjob.core import status as st
from trainjob.core.policy_terms import (
    NODE_REASONS,
    REASON_BACKOFF,
    REASON_DEADLINE,
    REASON_DISRUPTION_LIMIT,
    REASON_FAILED_CREATE,
    REASON_RESTARTING,
    REASON_STALLED,
    REASON_STARTUP,
    REASON_SUCCEEDED,
    REASON_UNSCHEDULABLE,
    Failure,
    ReplicaKey,
    Work,
    describe,
    disruption_kind,
    failed_reason,
    is_retryable,
    is_success,
    restart_scope,
    root_cause,
    success_deciders,
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    restart_count: int
    disruption_count: int
    attempt_start: datetime.datetime | None
    finished: bool


def judge(
    work: Work,
    failures: list[Failure],
    restart_count: int,
    disruption_count: int,
    start_time: datetime.datetime | None,
    attempt_start: datetime.datetime | None,
) -> Verdict | None:
    """Success, then deadlines, then failures: the first that applies decides."""
    job, now = work.job, work.now
    if is_success(job, work.replicas):
        deciders = ", ".join(f"{t} {i}" for t, i in success_deciders(job))
        _finish(work, st.SUCCEEDED, REASON_SUCCEEDED, f"TrainJob {job.name} succeeded ({deciders})")
        return Verdict(restart_count, disruption_count, None, True)

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
            return Verdict(restart_count, disruption_count, None, True)
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
            return Verdict(restart_count, disruption_count, None, True)
        work.requeue.append(remaining)
    return Verdict(restart_count, disruption_count, now, False) if placed_now else None


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


def _stalled(work: Work, restart_count: int, disruption_count: int) -> Verdict:
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
        return Verdict(restart_count, disruption_count, None, True)
    backoff = job.run_policy.backoff_limit
    if restart_count + 1 > backoff:
        message = f"Stalled: {what}; backoffLimit={backoff} restarts already used"
        _finish(work, st.FAILED, REASON_BACKOFF, message)
        return Verdict(restart_count, disruption_count, None, True)
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
    return Verdict(restart_count, disruption_count, work.now, False)


def _not_up_text(work: Work, key: ReplicaKey) -> str:
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
    work: Work, failures: list[Failure], restart_count: int, disruption_count: int
) -> Verdict:
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
            return Verdict(restart_count, disruption_count, None, True)
    if restart_count + len(counted) > job.run_policy.backoff_limit:
        message = (
            f"{describe(counted[0])}; backoffLimit={job.run_policy.backoff_limit} "
            f"restarts already used"
        )
        _finish(work, st.FAILED, REASON_BACKOFF, message + _quote(counted[0], failures))
        return Verdict(restart_count, disruption_count, None, True)
    limit = job.run_policy.disruption_limit
    if disrupted and disruption_count + len(disrupted) > limit:
        _finish(
            work,
            st.FAILED,
            REASON_DISRUPTION_LIMIT,
            f"{describe(disrupted[0])}; disruptionLimit={limit} restarts after a preemption "
            f"or eviction already used",
        )
        return Verdict(restart_count, disruption_count, None, True)
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
    return Verdict(restart_count, disruption_count, work.now, False)


def _group_cause(work: Work, scope: tuple[ReplicaKey, ...], group: list[Failure]) -> Failure:
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


def _finish(work: Work, ctype: str, reason: str, message: str) -> None:
    work.condition(ctype, True, reason, message)
    work.condition(st.RUNNING, False, reason, message)
    if work.is_true(st.RESTARTING):
        work.condition(st.RESTARTING, False, reason, message)
    event_type = "Normal" if ctype == st.SUCCEEDED else "Warning"
    work.event(event_type, reason, message)
