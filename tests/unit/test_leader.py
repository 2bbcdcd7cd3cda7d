"""Leader election on a Lease (leader.py), as data: replicas with their own monotonic clocks
take turns against a tiny in-memory API server that keeps one Lease with a resourceVersion
(optimistic concurrency, as the real one does). The world steps time in small ticks and
checks after every tick that at most one replica may write: through deaths, partitions,
releases and races."""

from __future__ import annotations

import dataclasses
import random

import pytest

from trainjob_operator import leader

# client-go's defaults, and the short ones the integration tests use.
DEFAULTS = leader.Timing()
SHORT = leader.Timing(lease_duration=4, renew_deadline=3.0, retry_period=1.0)
TICK = 0.05


@dataclasses.dataclass
class Server:
    """The API server's part: one Lease, every write conditional on its resourceVersion."""

    lease: leader.Lease | None = None
    version: int = 0
    writes: int = 0

    def write(self, verb: str, record: leader.Record, version: str) -> bool:
        if verb == leader.CREATE and self.lease is not None:
            return False  # 409 AlreadyExists
        if verb == leader.UPDATE and (self.lease is None or self.lease.resource_version != version):
            return False  # 409 Conflict
        self.version += 1
        self.writes += 1
        self.lease = leader.Lease(record, str(self.version))
        return True


@dataclasses.dataclass
class Replica:
    name: str
    # Its monotonic clock reads the world's time plus this (clocks of two machines share
    # nothing but their rate).
    offset: float = 0.0
    memory: leader.Memory = dataclasses.field(default_factory=leader.Memory)
    next_at: float = 0.0
    alive: bool = True
    # Cut off from the API server: every request fails.
    cut: bool = False
    stepped_down_at: float | None = None
    became_leader_at: float | None = None


@dataclasses.dataclass
class World:
    timing: leader.Timing
    replicas: list[Replica]
    server: Server = dataclasses.field(default_factory=Server)
    t: float = 0.0
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(7))
    # (time, replica) for every tick a replica could write in.
    writers: list[tuple[float, str]] = dataclasses.field(default_factory=list)

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def clock(self, replica: Replica) -> float:
        return self.t + replica.offset

    def may_write(self, replica: Replica) -> bool:
        return replica.alive and leader.may_write(replica.memory, self.clock(replica), self.timing)

    def leader(self) -> str | None:
        names = [r.name for r in self.replicas if self.may_write(r)]
        assert len(names) <= 1, f"two replicas may write at {self.t:.2f}: {names}"
        return names[0] if names else None

    def run(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end - 1e-9:
            for replica in self.replicas:
                if replica.alive and replica.stepped_down_at is None and self.t >= replica.next_at:
                    self.tick(replica)
            who = self.leader()
            if who is not None:
                self.writers.append((self.t, who))
            self.t = round(self.t + TICK, 6)

    def tick(self, replica: Replica) -> None:
        now = self.clock(replica)
        if leader.lapsed(replica.memory, now, self.timing):
            self.step_down(replica)
            return
        if not replica.cut:
            lease = self.server.lease
            step = leader.decide(
                replica.memory, lease, replica.name, now, f"t={self.t:.2f}", self.timing
            )
            replica.memory = step.memory
            if step.verb == leader.STEP_DOWN:
                self.step_down(replica)
                return
            if step.write is not None:
                version = lease.resource_version if lease is not None else ""
                if self.server.write(step.verb, step.write, version):
                    if replica.memory.renewed_at is None:
                        replica.became_leader_at = self.t
                    replica.memory = leader.written(replica.memory, step.write, now)
        replica.next_at = self.t + leader.next_try(replica.memory, self.timing, self.rng.random())

    def step_down(self, replica: Replica) -> None:
        # As elector.py does: forget the leadership; the process then exits.
        replica.memory = dataclasses.replace(replica.memory, renewed_at=None)
        replica.stepped_down_at = self.t

    def release(self, replica: Replica) -> None:
        """A graceful stop: the leader writes the release record and goes."""
        record = leader.released(replica.memory, f"t={self.t:.2f}")
        assert record is not None
        lease = self.server.lease
        assert lease is not None
        replica.memory = dataclasses.replace(replica.memory, renewed_at=None)
        replica.alive = False
        assert self.server.write(leader.UPDATE, record, lease.resource_version)


def started(timing: leader.Timing = SHORT, standbys: int = 1) -> World:
    """`a` leads (it started first), the others stand by."""
    world = World(timing, [Replica("a", offset=1000.0)])
    world.run(0.5)
    assert world.leader() == "a"
    for i in range(standbys):
        world.replicas.append(Replica(f"b{i}", offset=-50.0 * (i + 1), next_at=world.t))
    world.run(3 * timing.lease_duration)
    assert world.leader() == "a"
    return world


def test_the_first_replica_creates_the_lease_and_renews_it_every_retry_period() -> None:
    world = World(DEFAULTS, [Replica("a")])
    world.run(0.1)
    lease = world.server.lease
    assert lease is not None and lease.record.holder == "a"
    assert lease.record.lease_duration_seconds == 15 and lease.record.transitions == 0
    acquired = lease.record.acquire_time
    world.run(20.0)
    renewed = world.server.lease
    assert renewed is not None and renewed.record.holder == "a"
    # About one renewal per retry period (2 s), the acquire time kept.
    assert 9 <= world.server.writes <= 12
    assert renewed.record.acquire_time == acquired and renewed.record.renew_time != acquired


def test_a_standby_never_writes_while_the_leader_renews() -> None:
    world = started(standbys=2)
    world.run(60.0)
    assert {who for _, who in world.writers} == {"a"}
    lease = world.server.lease
    assert lease is not None and lease.record.holder == "a" and lease.record.transitions == 0


def test_a_dead_leader_is_replaced_within_the_lease_duration_and_a_retry_period() -> None:
    world = started(standbys=2)
    died = world.t
    world.replica("a").alive = False
    world.run(3 * SHORT.lease_duration)
    new = [r for r in world.replicas if r.became_leader_at is not None and r.name != "a"]
    assert len(new) == 1, "exactly one standby takes over"
    took = new[0].became_leader_at
    assert took is not None
    # Counted from the last renewal the standby saw (at most a retry period before the
    # death): the lease duration, then its next try (at most 1.2 retry periods).
    assert SHORT.lease_duration - SHORT.retry_period <= took - died
    assert took - died <= SHORT.lease_duration + leader.JITTER * SHORT.retry_period + TICK
    lease = world.server.lease
    assert lease is not None and lease.record.holder == new[0].name
    assert lease.record.transitions == 1


def test_a_partitioned_leader_stops_writing_before_another_may_start() -> None:
    world = started()
    a, b = world.replica("a"), world.replica("b0")
    cut = world.t
    a.cut = True
    world.run(3 * SHORT.lease_duration)
    # The old leader's writes stopped by its own clock, a whole second (lease duration -
    # renew deadline) before the standby's began; World.leader asserted no overlap at all.
    last_a = max(t for t, who in world.writers if who == "a")
    first_b = min(t for t, who in world.writers if who == "b0")
    assert last_a < cut + SHORT.renew_deadline
    assert first_b - last_a >= SHORT.lease_duration - SHORT.renew_deadline - TICK
    assert a.stepped_down_at is not None and a.stepped_down_at < first_b + SHORT.retry_period
    assert b.became_leader_at == first_b
    # Healed, the old leader has stepped down: it never writes again.
    a.cut = False
    world.run(10.0)
    assert max(t for t, who in world.writers if who == "a") == last_a


def test_a_slow_leader_whose_renewals_fail_steps_down_by_its_renew_deadline() -> None:
    """Cut off but still running (its requests time out): the gate closes by the clock
    alone, before a try notices; the try after that steps down."""
    world = started()
    a = world.replica("a")
    renewed = a.memory.renewed_at
    assert renewed is not None
    a.cut = True
    world.replica("b0").alive = False  # nobody takes over: only the clock closes the gate
    world.run(SHORT.renew_deadline + 2 * SHORT.retry_period)
    assert world.leader() is None
    assert a.stepped_down_at is not None
    assert leader.lapsed(dataclasses.replace(a.memory, renewed_at=renewed), renewed + 3.0, SHORT)


def test_a_released_lease_is_taken_at_the_standbys_next_try() -> None:
    world = started(leader.Timing(lease_duration=15, renew_deadline=10.0, retry_period=1.0))
    released = world.t
    world.release(world.replica("a"))
    lease = world.server.lease
    assert (
        lease is not None and lease.record.holder == "" and lease.record.lease_duration_seconds == 1
    )
    world.run(5.0)
    b = world.replica("b0")
    assert b.became_leader_at is not None
    assert b.became_leader_at - released <= leader.JITTER * 1.0 + TICK  # not 15 s
    lease = world.server.lease
    assert lease is not None and lease.record.holder == "b0" and lease.record.transitions == 1


def test_two_standbys_racing_for_a_free_lease_elect_one() -> None:
    world = World(SHORT, [Replica("a"), Replica("b", offset=3.0), Replica("c", offset=-9.0)])
    world.run(20.0)  # all three try at t=0: the first create wins, the others see it held
    assert {who for _, who in world.writers} == {"a"}
    lease = world.server.lease
    assert lease is not None and lease.record.holder == "a"


def test_a_leader_that_finds_another_holder_steps_down_at_once() -> None:
    memory = leader.Memory(leader.Record("me", 4, "x", "x", 0), 10.0, renewed_at=10.0)
    taken = leader.Lease(leader.Record("other", 4, "y", "y", 1), "7")
    step = leader.decide(memory, taken, "me", 10.5, "z", SHORT)
    assert step.verb == leader.STEP_DOWN and "other" in step.why


def test_a_lease_held_by_another_expires_by_this_replicas_clock_and_its_own_duration() -> None:
    held = leader.Lease(leader.Record("other", 4, "x", "x", 2), "5")
    first = leader.decide(leader.Memory(), held, "me", 100.0, "w", SHORT)
    assert first.verb == leader.WAIT
    # Unchanged 3.9 s later: still held; 4 s after it was first seen: taken.
    assert leader.decide(first.memory, held, "me", 103.9, "w", SHORT).verb == leader.WAIT
    take = leader.decide(first.memory, held, "me", 104.0, "w", SHORT)
    assert take.verb == leader.UPDATE and take.write is not None
    assert (take.write.holder, take.write.transitions, take.write.acquire_time) == ("me", 3, "w")
    # A renewal seen restarts the count, whatever wall time it claims.
    renewed = leader.Lease(leader.Record("other", 4, "x", "old", 2), "6")
    again = leader.decide(first.memory, renewed, "me", 103.0, "w", SHORT)
    assert leader.decide(again.memory, renewed, "me", 106.9, "w", SHORT).verb == leader.WAIT


@pytest.mark.parametrize(
    ("timing", "problem"),
    [
        (leader.Timing(15, 15.0, 2.0), "longer than the renew deadline"),
        (leader.Timing(15, 2.0, 2.0), "1.2 x the retry period"),
        (leader.Timing(0, 0.5, 0.1), "at least 1 s"),
        (leader.Timing(4, 3.0, 0.0), "positive"),
    ],
)
def test_durations_that_cannot_elect_safely_are_refused(
    timing: leader.Timing, problem: str
) -> None:
    found = timing.problem()
    assert found is not None and problem in found
    assert DEFAULTS.problem() is None and SHORT.problem() is None


def test_the_wire_format_round_trips_and_no_holder_is_no_field() -> None:
    record = leader.Record(
        "pod-1_uuid", 15, "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:02.000000Z", 3
    )
    spec = leader.spec_of(record)
    assert spec == {
        "holderIdentity": "pod-1_uuid",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:02.000000Z",
        "leaseTransitions": 3,
    }
    assert leader.record_of(spec) == record
    released = leader.Record("", 1, "t", "t", 3)
    assert "holderIdentity" not in leader.spec_of(released)
    body = {"metadata": {"resourceVersion": "42"}, "spec": leader.spec_of(released)}
    assert leader.lease_of(body) == leader.Lease(released, "42")
    assert leader.lease_of(None) is None
    assert leader.record_of({}) == leader.Record()
