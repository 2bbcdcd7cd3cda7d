"""Rule: what a job does about its failed replicas, the answer to "why did my job restart".
Each failure takes down its restart group (the scope follows the strategy), the group is judged
by its root cause's fate (policy_failure), and the group restarts unless that fate, or
backoffLimit or disruptionLimit used up, fails the job. Pods never restart in place: a restart
bumps the replica's attempt and deletes the old Pod, whose exit is then never counted.
"""

from __future__ import annotations

import dataclasses
import datetime

from trainjob.core import (
    constants,
    policy_backoff,
    policy_disruption,
    policy_failure,
    reasons,
    spec,
)
from trainjob.core import status as st
from trainjob.core.policy_failure import Fate
from trainjob.core.policy_terms import (
    REASON_RESTARTING,
    DecisionDraft,
    Failure,
    ReplicaKey,
    Verdict,
)


def restart_scope(job: spec.TrainJob, key: ReplicaKey) -> tuple[ReplicaKey, ...]:
    """The replicas restarted together when `key` fails: an all-reduce job (no ps) restarts
    chief + workers together, because one lost worker breaks the collective; a
    ParameterServer job restarts a lost worker alone, and chief + ps together when either of
    them fails."""
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


def root_cause(
    draft: DecisionDraft, scope: tuple[ReplicaKey, ...], group: list[Failure]
) -> Failure:
    """What made a restart group fail: a disruption anywhere in it
    (policy_disruption.group_disruption), else its earliest failure: peers of an all-reduce
    job fail *because* one was lost (exit 1 within seconds), so only the first tells whether
    to retry."""
    disruption = policy_disruption.group_disruption(draft, scope, group)
    if disruption is not None:
        return disruption
    far_future = datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
    return sorted(group, key=lambda f: (f.finished_at or far_future,))[0]


def restart_group(draft: DecisionDraft, scope: tuple[ReplicaKey, ...]) -> list[ReplicaKey]:
    """Restart the replicas of `scope` that have not succeeded: their next attempt, their old
    Pods deleted. Returns them."""
    restarted = [key for key in scope if draft.replicas[key].state != st.STATE_SUCCEEDED]
    for key in restarted:
        draft.replicas[key] = draft.replicas[key].next_attempt()
        draft.delete_pods.append(key)
    return restarted


def restart_or_fail(
    draft: DecisionDraft, failures: list[Failure], restart_count: int, disruption_count: int
) -> Verdict:
    """Record the failures, then fail the job (a root cause no policy retries, backoffLimit or
    disruptionLimit used up) or restart each failed group, one Event per group."""
    job = draft.job
    groups: dict[tuple[ReplicaKey, ...], list[Failure]] = {}
    for failure in failures:
        groups.setdefault(restart_scope(job, failure.key), []).append(failure)
    for failure in failures:
        record = draft.replicas[failure.key]
        draft.replicas[failure.key] = dataclasses.replace(
            record,
            state=st.STATE_FAILED,
            exit_code=failure.exit_code,
            reason=failure.reason,
            message=failure.cause or record.message,
        )
    causes = [root_cause(draft, scope, group) for scope, group in groups.items()]
    fates = [policy_failure.failure_fate(job, cause) for cause in causes]
    counted = [c for c, fate in zip(causes, fates, strict=True) if fate is not Fate.DISRUPTED]
    disrupted = [c for c, fate in zip(causes, fates, strict=True) if fate is Fate.DISRUPTED]
    failed = Verdict(restart_count, disruption_count, None, True)
    for cause, fate in zip(causes, fates, strict=True):
        if fate is Fate.FAIL_JOB:
            policy = job.replica_specs[cause.key[0]].restart_policy
            message = f"{policy_failure.describe(cause)}; restartPolicy {policy} does not retry it"
            last_words = policy_failure.last_words(cause, failures)
            draft.finish(st.FAILED, policy_failure.failed_reason(cause), message + last_words)
            return failed
    if policy_backoff.exceeds_backoff_limit(job, restart_count, len(counted)):
        last_words = policy_failure.last_words(counted[0], failures)
        policy_backoff.fail_past_backoff_limit(
            draft, policy_failure.describe(counted[0]), last_words
        )
        return failed
    if policy_disruption.exceeds_disruption_limit(job, disruption_count, len(disrupted)):
        policy_disruption.fail_past_disruption_limit(draft, policy_failure.describe(disrupted[0]))
        return failed
    for scope, cause, fate in zip(groups, causes, fates, strict=True):
        names = ", ".join(f"{t} {i}" for t, i in restart_group(draft, scope))
        what = policy_failure.describe(cause)
        if fate is Fate.DISRUPTED:
            disruption_count += 1
            draft.event(
                "Warning",
                policy_disruption.disruption_kind(cause.disruption_reason or ""),
                f"Restarting {names} after {what} (disruption {disruption_count} of "
                f"disruptionLimit {job.run_policy.disruption_limit}, not counted toward "
                f"backoffLimit)",
            )
            continue
        restart_count += 1
        draft.event(
            "Warning",
            reasons.EVENT_RESTARTING,
            f"Restarting {names} after {what} "
            f"({policy_backoff.restart_words(job, restart_count)})"
            + policy_failure.last_words(cause, failures),
        )
    message = "; ".join(policy_failure.describe(c) for c in causes)
    reason = REASON_RESTARTING
    if not counted:
        # Only disruptions: the reason says which, so `kubectl get tj` shows Preempted.
        reason = policy_disruption.disruption_kind(disrupted[0].disruption_reason or "")
    draft.condition(st.RESTARTING, True, reason, f"Restarting after {message}")
    draft.condition(st.RUNNING, False, reason, f"Restarting after {message}")
    return Verdict(restart_count, disruption_count, draft.now, False)
