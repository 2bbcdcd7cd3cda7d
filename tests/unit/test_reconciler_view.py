"""Which copy of a TrainJob a reconcile decides from (writes.current_trainjob), and the
names of the Events of a decision. The API is a stand-in that counts GETs: the rule under test
is which copy is trusted, decided before any request is made."""

from __future__ import annotations

import asyncio
from typing import Any

from trainjob.core import policy
from trainjob_operator import writes


def job(version: str, state: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "n", "resourceVersion": version},
        "status": {"state": state},
    }


class FakeKube:
    def __init__(self, current: dict[str, Any]) -> None:
        self.current = current
        self.gets = 0

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        return self.current


class FakeRuntime:
    def __init__(self, current: dict[str, Any]) -> None:
        self.kube = FakeKube(current)


def read(rt: FakeRuntime, live: dict[str, Any], seen: writes.Seen) -> dict[str, Any] | None:
    return asyncio.run(writes.current_trainjob(rt.kube, "n", "j", live, seen))  # type: ignore[arg-type]


def test_live_copy_is_used_when_nothing_newer_is_known() -> None:
    rt = FakeRuntime(job("9"))
    assert read(rt, job("5"), writes.Seen()) == job("5")
    assert rt.kube.gets == 0


def test_a_live_copy_older_than_our_last_write_is_never_decided_from() -> None:
    """The chaos run's stale view: our Succeeded write is at version 7 while kopf's copy stays
    at 5 (its watch is down). Every reconcile reads afresh until kopf's copy shows 7."""
    written = job("7", "Succeeded")
    rt = FakeRuntime(written)
    seen = writes.Seen(known=written)
    stale = job("5", "Running")
    for _ in range(3):  # the old code trusted the stale copy again from the second read
        assert read(rt, stale, seen) == written
    assert rt.kube.gets == 3
    assert read(rt, job("7", "Succeeded"), seen) == job("7", "Succeeded")
    assert rt.kube.gets == 3 and seen.known is None
    assert read(rt, job("8", "Succeeded"), seen) == job("8", "Succeeded")  # newer: trusted
    assert rt.kube.gets == 3


def test_after_a_conflict_the_next_decision_reads_afresh() -> None:
    rt = FakeRuntime(job("12"))
    seen = writes.Seen(stale=True)
    assert read(rt, job("10"), seen) == job("12")
    assert rt.kube.gets == 1 and not seen.stale


def test_event_names_repeat_for_the_same_transition_only() -> None:
    created = policy.Event("Normal", "Created", "Created TrainJob a")
    fresh = writes.status_fingerprint({})
    first = writes.event_id("uid-1", fresh, 0, created)
    assert first == writes.event_id("uid-1", fresh, 0, created)  # decided again
    running = writes.status_fingerprint({"state": "Running", "restartCount": 0})
    assert first != writes.event_id("uid-1", running, 0, created)  # from another status
    assert first != writes.event_id("uid-1", fresh, 1, created)  # the decision's 2nd Event
    assert first != writes.event_id("uid-2", fresh, 0, created)  # another job, same name
    other = policy.Event("Normal", "Suspended", "Suspended TrainJob a")
    assert first != writes.event_id("uid-1", fresh, 0, other)  # another transition


def test_a_progress_report_does_not_change_the_decided_from_status() -> None:
    status = {"state": "Running", "restartCount": 1}
    with_progress = {**status, "progress": {"step": 40}}
    assert writes.status_fingerprint(status) == writes.status_fingerprint(with_progress)
