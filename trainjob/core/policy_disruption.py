"""Rule: a disruption is no failure of the replica. A Pod that ended under the DisruptionTarget
condition (preempted, evicted) or was taken with its lost node did nothing wrong: its restart
counts toward runPolicy.disruptionLimit instead of backoffLimit (the Job controller's
podFailurePolicy Ignore). Here: when a failure is a disruption, which kind, and the limit.
"""

from __future__ import annotations

import datetime
from typing import Final

from trainjob.core import spec
from trainjob.core import status as st
from trainjob.core.policy_terms import (
    NODE_REASONS,
    REASON_DISRUPTION_LIMIT,
    REASON_EVICTED,
    REASON_PREEMPTED,
    DecisionDraft,
    Failure,
    ReplicaKey,
)

# DisruptionTarget's reason for a preemption; every other one (EvictionByEvictionAPI,
# DeletionByTaintManager, TerminationByKubelet, DeletionByPodGC) is an eviction.
DISRUPTION_PREEMPTION: Final = "PreemptionByScheduler"


def disruption_kind(disruption_reason: str) -> str:
    """Preempted or Evicted, from the DisruptionTarget condition's reason."""
    if disruption_reason == DISRUPTION_PREEMPTION:
        return REASON_PREEMPTED
    return REASON_EVICTED


def vanished(key: ReplicaKey, record: st.ReplicaRecord, now: datetime.datetime) -> Failure:
    """The Failure of a replica whose Pod is gone without a verdict of its own: a deletion
    (counted), unless a disruption took it. Its node was lost when last seen (the record says
    so): the node's removal took it (pod GC of a deleted Node, or a force delete), a disruption
    even when its DisruptionTarget was never seen."""
    reason, message = record.disruption_reason, record.disruption_message
    if reason is None and record.waiting_reason in NODE_REASONS:
        reason, message = record.waiting_reason, record.waiting_message
    return Failure.deleted(key, now, reason, message)


def group_disruption(
    draft: DecisionDraft, scope: tuple[ReplicaKey, ...], group: list[Failure]
) -> Failure | None:
    """The disruption that made a restart group fail, if one did: a disrupted failure, or a
    peer still terminating under DisruptionTarget, or a peer on a lost node. Its peers of an
    all-reduce job exit 1 within seconds *because* it was taken away, often before its Pod is
    gone: the group's restart is then a disruption, not their failures."""
    for failure in sorted(group, key=lambda f: f.key):
        if failure.disrupted:
            return failure
    for key in scope:
        record = draft.replicas[key]
        if record.disruption_reason is not None:
            return Failure.deleted(
                key, draft.now, record.disruption_reason, record.disruption_message
            )
    for key in scope:
        # A peer on a lost node: the collective broke because its node went away.
        record = draft.replicas[key]
        if key in draft.lost and record.waiting_reason in NODE_REASONS:
            return Failure.deleted(key, draft.now, record.waiting_reason, record.waiting_message)
    return None


def exceeds_disruption_limit(job: spec.TrainJob, disruption_count: int, disruptions: int) -> bool:
    """Whether `disruptions` more restarts after a disruption, after `disruption_count`, are
    more than disruptionLimit."""
    return disruptions > 0 and disruption_count + disruptions > job.run_policy.disruption_limit


def fail_past_disruption_limit(draft: DecisionDraft, what: str) -> None:
    """Fail the job, DisruptionLimitExceeded: `what` (a disruption) would have been one restart
    too many."""
    draft.finish(
        st.FAILED,
        REASON_DISRUPTION_LIMIT,
        f"{what}; disruptionLimit={draft.job.run_policy.disruption_limit} restarts after a "
        f"preemption or eviction already used",
    )
