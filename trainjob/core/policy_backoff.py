"""Rule: runPolicy.backoffLimit. Every restart decided for a failure or a stall counts, and the
one past the limit fails the job instead; restarts after the first also wait, doubling each time
(as the Job controller backs off, backoff_utils.go), so that a replica that fails at once, or a
Pod deleted in a loop, cannot use up backoffLimit in seconds (6 restarts took 2.7 s without a
delay).
"""

from __future__ import annotations

import datetime
from typing import Final

from trainjob.core import model, spec
from trainjob.core import status as st
from trainjob.core.policy_terms import REASON_BACKOFF, DecisionDraft

RESTART_DELAY_FIRST: Final = 2.0
RESTART_DELAY_MAX: Final = 60.0


def restart_delay(restart_count: int) -> float:
    """Seconds between the `restart_count`-th restart decision and its new replicas: none for
    the first restart (a preemption or one lost worker resumes at once), then 2 s, 4 s, ...
    up to RESTART_DELAY_MAX."""
    if restart_count <= 1:
        return 0.0
    return float(min(RESTART_DELAY_MAX, RESTART_DELAY_FIRST * 2 ** (restart_count - 2)))


def delay_remaining(
    draft: DecisionDraft, restart_count: int, attempt_start: datetime.datetime | None
) -> float:
    """Seconds a restarting job's restarted replicas still wait before they are created again
    (<= 0: none)."""
    if not draft.is_true(st.RESTARTING) or attempt_start is None:
        return 0.0
    ready_at = attempt_start + datetime.timedelta(seconds=restart_delay(restart_count))
    return (ready_at - draft.now).total_seconds()


def restart_words(job: spec.TrainJob, restart_count: int) -> str:
    """How a restart Event counts restart `restart_count` against backoffLimit, in restarts
    allowed (a TFJob's backoffLimit N allows N - 1, as training-operator counts it)."""
    limit = job.run_policy.backoff_limit
    if limit >= model.UNLIMITED_BACKOFF:
        return f"restart {restart_count}; backoffLimit unset: no limit"
    return f"restart {restart_count} of {limit} allowed by backoffLimit"


def exceeds_backoff_limit(job: spec.TrainJob, restart_count: int, restarts: int) -> bool:
    """Whether `restarts` more restarts, after `restart_count`, are more than backoffLimit.
    None more never are: with the limit edited below the restarts already used, a disruption
    alone (not counted) still restarts."""
    return restarts > 0 and restart_count + restarts > job.run_policy.backoff_limit


def fail_past_backoff_limit(draft: DecisionDraft, what: str, last_words: str = "") -> None:
    """Fail the job, BackoffLimitExceeded: `what` (a failure or the stall) would have been one
    restart too many; `last_words` quote a replica's (policy_failure.last_words)."""
    limit = draft.job.run_policy.backoff_limit
    draft.finish(
        st.FAILED, REASON_BACKOFF, f"{what}; backoffLimit={limit} restarts already used{last_words}"
    )
