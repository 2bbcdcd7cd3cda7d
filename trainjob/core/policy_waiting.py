"""Rule: nothing waits silently. A replica that cannot start by itself (a bad image, no node
fits, a refused create, a lost node, a gang not admitted) says why in Running=False, one line
per replica, with one Event per cause, not per replica (500 workers that fit no node are one
problem), so that `kubectl get tj` tells it without a look at the Pods; Running turns True once
every replica is up.
"""

from __future__ import annotations

from typing import Final

from trainjob.core import reasons
from trainjob.core import status as st
from trainjob.core.policy_terms import (
    NODE_REASONS,
    REASON_FAILED_CREATE,
    REASON_RESTARTING,
    REASON_RUNNING,
    REASON_STARTING,
    WAITING_REASONS,
    DecisionDraft,
    ReplicaKey,
)

# Lines quoted in one condition message or Event: a big job's all-alike causes stay readable
# and far below the API server's size limits.
MAX_LINES_QUOTED: Final = 3

# The kubelet alternates these two for one bad image while it backs off: one cause, one Event.
_SAME_CAUSE: Final = {"ErrImagePull": "ImagePullBackOff"}


def summarize(lines: list[str]) -> str:
    """`worker 1: ...; worker 2: ...; worker 3: ...; and 97 more replicas`."""
    shown = "; ".join(lines[:MAX_LINES_QUOTED])
    more = len(lines) - MAX_LINES_QUOTED
    return shown + (f"; and {more} more replicas" if more > 0 else "")


def new_cause(waiting_reason: str, before: str | None) -> bool:
    """Whether a replica waiting for `waiting_reason` waits for another cause than `before`."""
    return _SAME_CAUSE.get(waiting_reason, waiting_reason) != _SAME_CAUSE.get(before or "", before)


def announce(draft: DecisionDraft, new_causes: dict[str, list[str]]) -> None:
    """One Warning Event per new cause (waiting reason -> lines of the replicas newly waiting)."""
    for reason, lines in new_causes.items():
        draft.event("Warning", reason, summarize(lines))


def waiting_line(key: ReplicaKey, reason: str, message: str) -> str:
    """`worker 1: ImagePullBackOff: Back-off pulling image "nope:1"`; a lost node's words
    say it all: `worker 1: node n3 unreachable since 2026-11-24T06:40:00Z`."""
    if reason in NODE_REASONS and message:
        return f"{key[0]} {key[1]}: {message}"
    return f"{key[0]} {key[1]}: {reason}" + (f": {message}" if message else "")


def waiting_lines(draft: DecisionDraft) -> list[tuple[str, str]]:
    """(reason, line) of every replica whose Pod waits for a user to act, in replica order."""
    result: list[tuple[str, str]] = []
    for key in draft.job.replica_keys():
        record = draft.replicas[key]
        refused = record.state == st.STATE_NONE and record.waiting_reason == REASON_FAILED_CREATE
        # on a lost node: its Pod running there, or its old Pod hanging there (restarted)
        lost = record.waiting_reason in NODE_REASONS and record.state in (
            st.STATE_RUNNING,
            st.STATE_NONE,
        )
        if record.waiting_reason is not None and (
            record.state == st.STATE_PENDING or refused or lost
        ):
            line = waiting_line(key, record.waiting_reason, record.waiting_message or "")
            result.append((record.waiting_reason, line))
    return result


def update_running(draft: DecisionDraft) -> None:
    """Running once every replica is up (or already done); that also ends a restart. Until
    then, a replica that waits for a user to act shows why in Running=False."""
    all_up = all(
        draft.replicas[key].state in (st.STATE_RUNNING, st.STATE_SUCCEEDED)
        and draft.replicas[key].waiting_reason not in NODE_REASONS
        for key in draft.job.replica_keys()
    )
    if not all_up:
        _show_waiting(draft)
    if all_up and not draft.is_true(st.RUNNING):
        draft.condition(st.RUNNING, True, REASON_RUNNING, "All replicas are running")
        if draft.is_true(st.RESTARTING):
            draft.condition(st.RESTARTING, False, REASON_RUNNING, "All replicas are running again")
        draft.event(
            "Normal", reasons.EVENT_RUNNING, f"{draft.job.kind} {draft.job.name} is running"
        )


def _show_waiting(draft: DecisionDraft) -> None:
    running = next((c for c in draft.conditions if c.type == st.RUNNING), None)
    if draft.held is not None:
        reason, message = draft.held
        if not draft.status.is_true(st.RUNNING) and (running is None or running.reason != reason):
            draft.event("Normal", reason, message)
        draft.condition(st.RUNNING, False, reason, message)
        return
    waiting = waiting_lines(draft)
    if waiting:
        draft.condition(st.RUNNING, False, waiting[0][0], summarize([line for _, line in waiting]))
        return
    if running is not None and not running.status and running.reason in WAITING_REASONS:
        # The cause went away (the image pulled, a node freed): say what we wait for now.
        if draft.is_true(st.RESTARTING):
            draft.condition(st.RUNNING, False, REASON_RESTARTING, "Replicas are restarting")
        else:
            draft.condition(st.RUNNING, False, REASON_STARTING, "Replicas are starting")
