"""The operator's one JSON merge patch (RFC 7386, writes.py): the patch from one document to
another, applied as the API server applies it, gives the other; the status patch covers only
the keys the operator owns."""

from __future__ import annotations

from typing import Any

import pytest

from trainjob_operator import writes

CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 1}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "z": [1, 2]}}),
    ({"a": {"x": 1}}, {"a": 3}),
    ({"a": [1, 2]}, {"a": [2]}),
    ({"a": {"b": {"c": 1}}}, {"a": {"b": {}}}),
]


@pytest.mark.parametrize(("old", "new"), CASES)
def test_the_patch_from_old_to_new_turns_old_into_new(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    patch = writes.merge_patch(old, new)
    assert writes.apply_merge_patch(old, patch) == new
    assert writes.merge_patch(new, new) == {}


def test_the_status_patch_writes_only_what_changed_of_our_keys() -> None:
    current = {
        "state": "Running",
        "replicaStatuses": {"worker": {"active": 2, "failed": 0}},
        "progress": {"step": 10},  # progress reporting's, not ours
        "startTime": "2026-11-29T00:00:00Z",
    }
    wanted = {"state": "Running", "replicaStatuses": {"worker": {"active": 1, "failed": 1}}}
    assert writes.status_diff(current, wanted) == {
        "replicaStatuses": {"worker": {"active": 1, "failed": 1}},
        "startTime": None,
    }
    assert writes.status_diff(current, {**current, "progress": {"step": 11}}) is None
