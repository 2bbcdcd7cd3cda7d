"""Node readiness as the operator keeps it (nodes.py): what a Node's Ready condition says of
the replicas bound to it, and which nodes' jobs must look again after an event or a list."""

from __future__ import annotations

import datetime
from typing import Any

from trainjob_operator import nodes

T0 = datetime.datetime(2026, 11, 24, 6, 40, tzinfo=datetime.timezone.utc)


def node(name: str, ready: str | None, since: str = "2026-11-24T06:30:00Z") -> Any:
    conditions = (
        []
        if ready is None
        else [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": ready, "lastTransitionTime": since},
        ]
    )
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


def test_ready_unknown_is_unreachable_and_false_is_not_ready_with_since_when() -> None:
    index = nodes.NodeIndex()
    index.replace([node("n1", "True"), node("n2", "Unknown"), node("n3", "False")], T0)
    assert index.loss("n1") is None
    assert index.loss("n2") == ("NodeUnreachable", "node n2 unreachable since 2026-11-24T06:30:00Z")
    assert index.loss("n3") == ("NodeNotReady", "node n3 not ready since 2026-11-24T06:30:00Z")
    assert index.loss("never-seen") is None  # nothing known: nothing claimed


def test_a_node_without_a_ready_condition_yet_counts_as_ready() -> None:
    index = nodes.NodeIndex()
    index.event(node("n1", None), False, T0)
    assert index.loss("n1") is None


def test_only_a_readiness_change_wakes_the_nodes_jobs() -> None:
    index = nodes.NodeIndex()
    assert index.event(node("n1", "True"), False, T0) == {"n1"}  # first seen
    assert index.event(node("n1", "True", "2026-11-24T06:31:00Z"), False, T0) == set()  # heartbeat
    assert index.event(node("n1", "Unknown"), False, T0) == {"n1"}
    assert index.event(node("n1", "True"), False, T0) == {"n1"}
    assert index.loss("n1") is None


def test_a_deleted_node_stays_lost_until_its_pods_are_gone() -> None:
    index = nodes.NodeIndex()
    index.event(node("n1", "Unknown"), False, T0)
    assert index.event(node("n1", "Unknown"), True, T0) == {"n1"}
    assert index.loss("n1") == ("NodeUnreachable", "node n1 deleted at 2026-11-24T06:40:00Z")


def test_a_node_missing_from_a_fresh_list_was_deleted_while_nobody_watched() -> None:
    index = nodes.NodeIndex()
    index.replace([node("n1", "True"), node("n2", "True")], T0)
    assert index.replace([node("n1", "True")], T0) == {"n2"}
    loss = index.loss("n2")
    assert loss is not None and loss[0] == "NodeUnreachable"


def test_deleted_nodes_kept_are_bounded() -> None:
    index = nodes.NodeIndex()
    for i in range(nodes.MAX_DELETED_KEPT + 5):
        index.event(node(f"n{i}", "True"), True, T0)
    assert index.loss("n0") is None  # the oldest forgotten
    assert index.loss(f"n{nodes.MAX_DELETED_KEPT + 4}") is not None
