"""The policy engine's observation step (pure): the replicas' Pods (or processes) folded into
their records, so that the rules judge records, not Pods. A Pod of an older attempt is stale
(deleted, never counted), a Pod of a newer one is adopted, a DisruptionTarget is remembered as
soon as it is seen, and every replica of the current attempt that ended becomes a
:class:`~trainjob.core.policy_terms.Failure` for the rules to judge (policy_failure.failure_fate
decides even whether an exit 0 is one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from trainjob.core import policy_disruption, policy_failure, policy_waiting
from trainjob.core import status as st
from trainjob.core.policy_failure import Fate
from trainjob.core.policy_terms import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    REASON_FAILED_CREATE,
    DecisionDraft,
    Failure,
    ObservedReplica,
    ReplicaKey,
)


def fold_observed(
    draft: DecisionDraft, pods: Mapping[ReplicaKey, ObservedReplica]
) -> list[Failure]:
    """Fold observed Pods into replica records; return the failures of current attempts."""
    failures: list[Failure] = []
    finished = draft.status.finished
    new_causes: dict[str, list[str]] = {}  # waiting reason -> lines of replicas newly waiting
    for key in draft.job.replica_keys():
        record = draft.replicas[key]
        pod = pods.get(key)
        if record.state in (st.STATE_SUCCEEDED, st.STATE_STOPPED):
            continue
        if pod is None:
            message = draft.refused.get(key)
            if not finished and record.state == st.STATE_NONE:
                # Not created (yet): refused by the API server, or no longer refused.
                reason = REASON_FAILED_CREATE if message is not None else None
                if reason is not None and record.waiting_reason != reason:
                    line = policy_waiting.waiting_line(key, reason, message or "")
                    new_causes.setdefault(reason, []).append(line)
                if record.waiting_reason == REASON_FAILED_CREATE or reason is not None:
                    draft.replicas[key] = dataclasses.replace(
                        record, waiting_reason=reason, waiting_message=message
                    )
            if not finished and record.state in (st.STATE_PENDING, st.STATE_RUNNING):
                failures.append(policy_disruption.vanished(key, record, draft.now))
            continue
        if pod.attempt > record.attempt:
            # Created by an earlier reconcile whose status write was lost: adopt it.
            record = dataclasses.replace(record, attempt=pod.attempt)
            draft.replicas[key] = record
        if pod.attempt < record.attempt:
            if not pod.deleting:
                draft.delete_pods.append(key)
            elif not finished and key in draft.lost:
                _wait_for_lost_node(draft, key, new_causes)
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
            draft.replicas[key] = record
        if pod.deleting:
            # Terminating is not a failure by itself (kubeflow #2124); judge it once it's gone.
            continue
        if finished:
            continue
        if pod.phase in (PHASE_PENDING, PHASE_RUNNING):
            waiting = pod.waiting_reason if pod.phase == PHASE_PENDING else None
            message = pod.waiting_message if waiting is not None else None
            if key in draft.lost:
                # The node outranks what its kubelet last said: it says nothing new now.
                waiting, message = draft.lost[key]
            if waiting is not None and policy_waiting.new_cause(waiting, record.waiting_reason):
                line = policy_waiting.waiting_line(key, waiting, message or "")
                new_causes.setdefault(waiting, []).append(line)
            draft.replicas[key] = dataclasses.replace(
                record, state=pod.phase, waiting_reason=waiting, waiting_message=message
            )
        elif pod.phase == PHASE_SUCCEEDED:
            exited = Failure(key, 0, pod.reason or "Completed", pod.finished_at, succeeded=True)
            if policy_failure.failure_fate(draft.job, exited) is Fate.COMPLETED:
                draft.replicas[key] = dataclasses.replace(
                    record, state=st.STATE_SUCCEEDED, exit_code=0, reason=None
                )
            else:
                failures.append(exited)
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
    policy_waiting.announce(draft, new_causes)
    return failures


# What removes a Pod whose node is gone: nothing on the node answers any more.
LOST_POD_REMOVAL: Final = (
    "; its old Pod is removed once the Node is deleted (a cloud deletes a lost machine's) "
    "or tainted node.kubernetes.io/out-of-service, and only then can it start again"
)


def _wait_for_lost_node(
    draft: DecisionDraft, key: ReplicaKey, new_causes: dict[str, list[str]]
) -> None:
    """A replica restarted while its old Pod hangs Terminating on a lost node (no kubelet
    confirms its end): its new Pod cannot be created under the same name until Kubernetes
    removes the old one, so the replica waits on the node, and says what ends the wait."""
    record = draft.replicas[key]
    waiting, message = draft.lost[key]
    message += LOST_POD_REMOVAL
    if policy_waiting.new_cause(waiting, record.waiting_reason):
        new_causes.setdefault(waiting, []).append(
            policy_waiting.waiting_line(key, waiting, message)
        )
    draft.replicas[key] = dataclasses.replace(
        record, waiting_reason=waiting, waiting_message=message
    )
