"""Rule: the job's clocks, each a deadline in runPolicy. activeDeadlineSeconds runs from the
job's start; startupDeadlineSeconds from each attempt's start until every replica is up (it
waits while nothing is placed or the gang is held); progressDeadlineSeconds from the last new
step while Running, then fails the job or restarts the reporting replica's group, since
TensorFlow itself may wait for ever; ttlSecondsAfterFinished from completion. A clock that has
not run out asks for another look when it will.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from trainjob.core import policy_backoff, policy_restart, policy_success, reasons, spec
from trainjob.core import status as st
from trainjob.core.policy_terms import (
    REASON_DEADLINE,
    REASON_FAILED_CREATE,
    REASON_STALLED,
    REASON_STARTUP,
    REASON_UNSCHEDULABLE,
    DecisionDraft,
    ReplicaKey,
    Verdict,
)


def fail_past_active_deadline(draft: DecisionDraft, start_time: datetime.datetime | None) -> bool:
    """Fail the job once it ran longer than activeDeadlineSeconds (True)."""
    job = draft.job
    deadline = job.run_policy.active_deadline_seconds
    if not _ran_out(draft, start_time, deadline):
        return False
    draft.finish(
        st.FAILED,
        REASON_DEADLINE,
        f"{job.kind} {job.name} ran longer than activeDeadlineSeconds={deadline}",
    )
    return True


def progress_deadline(
    draft: DecisionDraft, restart_count: int, disruption_count: int
) -> Verdict | None:
    """The verdict on a job stalled past progressDeadlineSeconds; None while it is not."""
    stall = _stall_remaining(draft.job, draft.conditions, draft.progress_at, draft.now)
    if stall is None:
        return None
    if stall <= 0:
        return _stalled(draft, restart_count, disruption_count)
    draft.requeue.append(stall)
    return None


def _stall_remaining(
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


def _stalled(draft: DecisionDraft, restart_count: int, disruption_count: int) -> Verdict:
    """No new step for progressDeadlineSeconds (a hung collective, a dead input pipeline):
    fail, or restart the reporting replica's restart group from its checkpoint; a restart
    counts toward backoffLimit like any other."""
    job = draft.job
    limit = job.run_policy.progress_deadline_seconds
    reporter = policy_success.success_deciders(job)[0]
    what = (
        f"no new step from {reporter[0]} {reporter[1]} for {limit} s "
        f"(progressDeadlineSeconds={limit})"
    )
    if job.run_policy.progress_deadline_action == "Fail":
        draft.finish(st.FAILED, REASON_STALLED, f"Stalled: {what}")
        return Verdict(restart_count, disruption_count, None, True)
    if policy_backoff.exceeds_backoff_limit(job, restart_count, 1):
        policy_backoff.fail_past_backoff_limit(draft, f"Stalled: {what}")
        return Verdict(restart_count, disruption_count, None, True)
    restarted = policy_restart.restart_group(draft, policy_restart.restart_scope(job, reporter))
    restart_count += 1
    names = ", ".join(f"{t} {i}" for t, i in restarted)
    draft.event(
        "Warning",
        reasons.EVENT_RESTARTING,
        f"Restarting {names} from the last checkpoint after {what} "
        f"({policy_backoff.restart_words(job, restart_count)})",
    )
    draft.condition(st.RESTARTING, True, REASON_STALLED, f"Restarting after {what}")
    draft.condition(st.RUNNING, False, REASON_STALLED, f"Restarting after {what}")
    return Verdict(restart_count, disruption_count, draft.now, False)


def startup_deadline(
    draft: DecisionDraft,
    restart_count: int,
    disruption_count: int,
    attempt_start: datetime.datetime | None,
) -> Verdict | None:
    """Fail the job when not every replica was running within startupDeadlineSeconds of its
    attempt's start. The clock waits while the gang is held or every replica still waits for a
    node, and starts when they are placed (the verdict then moves the attempt's start)."""
    job, now = draft.job, draft.now
    not_up = [
        key
        for key in job.replica_keys()
        if draft.replicas[key].state not in (st.STATE_RUNNING, st.STATE_SUCCEEDED)
    ]
    if draft.held is not None:
        return None  # no Pod may be created yet: no startup clock runs
    if not_up and _nothing_placed([draft.replicas[key] for key in job.replica_keys()]):
        # Every replica still waits for a node (no capacity, a gang that does not fit yet):
        # nothing is held and no peer waits, so no startup clock runs (and nothing is written).
        return None
    # Placed now after waiting for a node: the startup clock starts here, not at creation.
    placed_now = _nothing_placed([draft.status.record(key) for key in job.replica_keys()])
    if placed_now:
        attempt_start = now
    limit = job.run_policy.startup_deadline_seconds
    if not_up and _ran_out(draft, attempt_start, limit):
        names = ", ".join(_not_up_text(draft, key) for key in not_up)
        draft.finish(
            st.FAILED,
            REASON_STARTUP,
            f"Not every replica was running within startupDeadlineSeconds={limit}; "
            f"still waiting for: {names}",
        )
        return Verdict(restart_count, disruption_count, None, True)
    return Verdict(restart_count, disruption_count, now, False) if placed_now else None


def _nothing_placed(records: list[st.ReplicaRecord]) -> bool:
    """Whether no replica has a node yet and each one waits for one (the scheduler says
    Unschedulable), so the job holds nothing while it waits."""
    return bool(records) and all(
        r.state == st.STATE_PENDING and r.waiting_reason == REASON_UNSCHEDULABLE for r in records
    )


def _not_up_text(draft: DecisionDraft, key: ReplicaKey) -> str:
    """`worker 1 (ImagePullBackOff: Back-off pulling image "nope:1")`, or `worker 1`."""
    record = draft.replicas[key]
    refused = record.state == st.STATE_NONE and record.waiting_reason == REASON_FAILED_CREATE
    if record.waiting_reason is None or (record.state != st.STATE_PENDING and not refused):
        return f"{key[0]} {key[1]}"
    detail = record.waiting_reason
    if record.waiting_message:
        detail += f": {record.waiting_message}"
    return f"{key[0]} {key[1]} ({detail})"


def ttl_expired(draft: DecisionDraft, completion_time: datetime.datetime | None) -> bool:
    """Whether a finished job's ttlSecondsAfterFinished ran out: the job is then deleted."""
    return _ran_out(draft, completion_time, draft.job.run_policy.ttl_seconds_after_finished)


def _ran_out(draft: DecisionDraft, origin: datetime.datetime | None, seconds: int | None) -> bool:
    """Whether a clock of `seconds` from `origin` ran out; while it runs, the draft asks for a
    look when it will. No origin or no limit: no clock."""
    if origin is None or seconds is None:
        return False
    remaining = (origin - draft.now).total_seconds() + seconds
    if remaining > 0:
        draft.requeue.append(remaining)
        return False
    return True
