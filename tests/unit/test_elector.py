"""The election loop (elector.py) against an in-memory Lease API, on a real event loop with
sub-second durations: it acquires and renews, its write gate closes by the clock when its
renewals fail and it then says it lost, and a graceful stop releases the Lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from trainjob_operator import elector, kube, leader, metrics

TIMING = leader.Timing(lease_duration=1, renew_deadline=0.6, retry_period=0.1)


class FakeLeases:
    """kube.Kube's Lease calls, on one Lease with a resourceVersion; `down` fails them all."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.writes: list[dict[str, Any]] = []
        self.stored_at = 0.0  # monotonic time of the last write the "server" stored

    def _check(self) -> None:
        if self.down:
            raise kube.TransientError("API server unreachable")

    def _store(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.body = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        self.writes.append(dict(spec))
        self.stored_at = time.monotonic()
        return self.body

    async def get_lease(self, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
        self._check()
        return self.body

    async def create_lease(
        self, namespace: str, name: str, spec: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        self._check()
        if self.body is not None:
            raise kube.ConflictError("exists")
        return self._store(spec)

    async def update_lease(
        self, namespace: str, name: str, spec: dict[str, Any], version: str, timeout: float
    ) -> dict[str, Any]:
        self._check()
        if self.body is None or self.body["metadata"]["resourceVersion"] != version:
            raise kube.ConflictError("changed")
        return self._store(spec)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "timed out"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def leader_metric(meters: metrics.Metrics) -> float | None:
    return meters.registry.get_sample_value("trainjob_operator_leader")


def build(api: FakeLeases, lost: list[str], meters: metrics.Metrics) -> elector.Elector:
    return elector.Elector(
        cast(kube.Kube, api), "ops", "trainjob-operator", "me_1", TIMING, meters, lost.append
    )


def test_it_leads_renews_and_closes_its_gate_by_the_clock_when_renewals_fail() -> None:
    async def scenario() -> None:
        api, meters = FakeLeases(), metrics.Metrics()
        lost: list[str] = []
        election = build(api, lost, meters)
        elected: list[bool] = []
        election.on_elected.append(lambda: elected.append(True))
        election.start()
        assert leader_metric(meters) == 0  # a standby until it holds the Lease
        await until(election.leading)
        await asyncio.wait_for(election.wait_leading(), 1.0)
        assert elected == [True] and leader_metric(meters) == 1
        assert api.body is not None and api.body["spec"]["holderIdentity"] == "me_1"
        renewals = len(api.writes)
        await asyncio.sleep(0.5)
        assert len(api.writes) >= renewals + 3  # every retry period
        api.down = True
        # The gate goes by the clock: whenever it lets this replica write, the last renewal
        # the server stored is less than the renew deadline old, so it is shut before the
        # Lease (lease_duration) could be taken by another. Checked at each poll, not as the
        # time until it was seen shut: a loaded machine delays a poll (0.65 s against 0.6 s
        # once, at load 22), which only ever sees the gate shut later, never open too long.
        deadline = time.monotonic() + 5.0
        while election.leading():
            assert time.monotonic() < deadline, "the gate stayed open with the API server down"
            asked = time.monotonic()  # before the gate reads its clock
            if election.leading():
                assert asked - api.stored_at < TIMING.renew_deadline, asked - api.stored_at
            await asyncio.sleep(0.01)
        await until(lambda: bool(lost))
        assert "not renewed" in lost[0] and leader_metric(meters) == 0
        await election.resign()

    asyncio.run(scenario())


def test_a_standby_waits_for_a_held_lease_and_takes_a_released_one() -> None:
    async def scenario() -> None:
        api, meters = FakeLeases(), metrics.Metrics()
        lost: list[str] = []
        first = build(api, lost, meters)
        first.start()
        await until(first.leading)
        second = elector.Elector(
            cast(kube.Kube, api),
            "ops",
            "trainjob-operator",
            "other_2",
            TIMING,
            metrics.Metrics(),
            lost.append,
        )
        second.start()
        await asyncio.sleep(2 * TIMING.lease_duration)
        assert not second.leading() and second.holder == "me_1"
        await first.resign()
        assert not first.leading()  # the gate closes before the Lease is handed over
        await first.release()
        assert api.body is not None
        assert "holderIdentity" not in api.body["spec"]
        assert api.body["spec"]["leaseDurationSeconds"] == 1
        took = await until(second.leading)
        assert took < 2 * TIMING.retry_period  # its next try, not a lease duration
        assert api.body["spec"]["holderIdentity"] == "other_2"
        assert api.body["spec"]["leaseTransitions"] == 1
        assert lost == []
        await second.resign()

    asyncio.run(scenario())
