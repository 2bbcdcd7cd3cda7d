"""What the policy engine observes (pure): replicas' Pods (or processes) folded into their
records, the failures of current attempts, and the words of replicas that wait (one line each,
one Event per cause)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from trainjob.core import status as st
from trainjob.core.policy_terms import (
    NODE_REASONS,
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_SUCCEEDED,
    REASON_FAILED_CREATE,
    Failure,
    ObservedReplica,
    ReplicaKey,
    Work,
    success_deciders,
)

# The kubelet alternates these two for one bad image while it backs off: one cause, one Event.
_SAME_CAUSE: Final = {"ErrImagePull": "ImagePullBackOff"}


def fold_observed(work: Work, pods: Mapping[ReplicaKey, ObservedReplica]) -> list[Failure]:
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


def _vanished(work: Work, key: ReplicaKey, record: st.ReplicaRecord) -> Failure:
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


def waiting_lines(work: Work) -> list[tuple[str, str]]:
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
