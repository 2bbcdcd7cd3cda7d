"""Leader election on a `coordination.k8s.io/v1` Lease, decided as data: what one replica
does next, given the Lease it read, what it remembers, its identity and its monotonic clock.
The rules are client-go's leaderelection (what controller-runtime, kube-scheduler, the
controller manager and Kueue use), so a reader who knows those knows these:

- The Lease names its holder (`holderIdentity`), how long a holder's claim lasts after its
  last renewal (`leaseDurationSeconds`), `acquireTime`, `renewTime` and `leaseTransitions`.
  Every write is a create or a replace conditional on the resourceVersion read, so of two
  replicas writing at once one wins and the other gets 409.
- A replica never trusts another's wall clock: a Lease held by another expires
  `leaseDurationSeconds` after *this replica saw it change* (monotonic time, taken after the
  read returned), not after the `renewTime` written in it.
- The leader renews every retry period. It may write only while its last successful renewal
  was *sent* less than `renew_deadline` ago (`may_write`, monotonic). Since a standby cannot
  see a renewal before it was sent, and waits a whole lease duration after seeing it, a
  leader cut off from the API server stops writing at least `lease_duration -
  renew_deadline` before anyone else may start (5 s with the defaults 15/10/2).
- A released Lease (no holder, as a leader leaves it on a graceful stop) is free at once.

Side effects live elsewhere: the API calls in kube.py, the loop that makes them in
elector.py. Nothing here reads a clock: `now` is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Protocol

# client-go's defaults (controller-runtime's and kube-scheduler's too).
DEFAULT_LEASE_DURATION: Final = 15
DEFAULT_RENEW_DEADLINE: Final = 10.0
DEFAULT_RETRY_PERIOD: Final = 2.0
# client-go's JitterFactor: tries are `retry_period` to 1.2 x `retry_period` apart, and the
# renew deadline must leave room for more than one of them.
JITTER: Final = 1.2

CREATE: Final = "create"
UPDATE: Final = "update"
WAIT: Final = "wait"
STEP_DOWN: Final = "step down"


class Leadership(Protocol):
    """What the job loops, the progress writer and the Workload release ask of the election."""

    def leading(self) -> bool:
        """Whether this replica may write now."""
        ...

    async def wait_leading(self) -> None:
        """Return once this replica may write."""
        ...


class Alone:
    """No leader election (one replica, `--leader-elect` off): this replica always writes."""

    def leading(self) -> bool:
        return True

    async def wait_leading(self) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds. The Lease stores whole seconds, so `lease_duration` is an int."""

    lease_duration: int = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD

    def problem(self) -> str | None:
        """Why these durations cannot elect safely (client-go refuses the same), or None."""
        if self.lease_duration < 1:
            return f"lease duration: at least 1 s, got {self.lease_duration}"
        if self.retry_period <= 0:
            return f"retry period: must be positive, got {self.retry_period:g}"
        if self.lease_duration <= self.renew_deadline:
            return (
                f"the lease duration ({self.lease_duration} s) must be longer than the renew "
                f"deadline ({self.renew_deadline:g} s): a leader that cannot renew must stop "
                "writing before another replica may take its Lease"
            )
        if self.renew_deadline <= JITTER * self.retry_period:
            return (
                f"the renew deadline ({self.renew_deadline:g} s) must be longer than "
                f"{JITTER:g} x the retry period ({self.retry_period:g} s)"
            )
        return None


@dataclasses.dataclass(frozen=True)
class Record:
    """A Lease's spec, as far as leader election reads and writes it."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0


@dataclasses.dataclass(frozen=True)
class Lease:
    """A Lease as read: its record and the resourceVersion a write must be conditional on."""

    record: Record
    resource_version: str


@dataclasses.dataclass(frozen=True)
class Memory:
    """What one replica keeps between tries (client-go's observedRecord and observedTime)."""

    # The Lease's record as last seen, and when (monotonic) it was first seen as it is.
    seen: Record | None = None
    seen_at: float = 0.0
    # When the last successful acquire or renewal was sent (monotonic); None: not leading.
    renewed_at: float | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """What to do: `verb` CREATE or UPDATE `write` (conditional on the version read), WAIT,
    or STEP_DOWN; `memory` is what to remember (whatever the write's outcome); `why` is
    for the log."""

    verb: str
    memory: Memory
    why: str
    write: Record | None = None


def may_write(memory: Memory, now: float, timing: Timing) -> bool:
    """Whether a replica with `memory` may write at monotonic time `now`: it renewed (sent
    its last successful renewal) less than the renew deadline ago."""
    return memory.renewed_at is not None and now - memory.renewed_at < timing.renew_deadline


def lapsed(memory: Memory, now: float, timing: Timing) -> bool:
    """A leader whose renewals have failed for the whole renew deadline: it has stopped
    writing (`may_write` is False) and must step down."""
    return memory.renewed_at is not None and not may_write(memory, now, timing)


def observe(memory: Memory, record: Record | None, now: float) -> Memory:
    """`memory` after reading `record` at `now`: a changed record restarts its clock."""
    if record == memory.seen:
        return memory
    return dataclasses.replace(memory, seen=record, seen_at=now)


def expired(memory: Memory, now: float) -> bool:
    """Whether the Lease as last seen may be taken: it has no holder, or its holder has not
    renewed it for its own `leaseDurationSeconds` (counted from when it was seen)."""
    record = memory.seen
    if record is None or not record.holder:
        return True
    return now >= memory.seen_at + record.lease_duration_seconds


def decide(
    memory: Memory,
    lease: Lease | None,
    me: str,
    now: float,
    wall: str,
    timing: Timing,
) -> Step:
    """The next step of replica `me` that read `lease` (None: there is none) at monotonic
    `now`; `wall` is the time to write into the Lease (RFC 3339, microseconds)."""
    record = lease.record if lease is not None else None
    memory = observe(memory, record, now)
    leading = memory.renewed_at is not None
    if leading and not may_write(memory, now, timing):
        return Step(STEP_DOWN, memory, f"not renewed for {timing.renew_deadline:g}s")
    if record is None:
        claim = Record(me, timing.lease_duration, wall, wall, 0)
        return Step(CREATE, memory, "no Lease yet", claim)
    if record.holder == me:
        renewal = dataclasses.replace(
            record,
            lease_duration_seconds=timing.lease_duration,
            acquire_time=record.acquire_time or wall,
            renew_time=wall,
        )
        return Step(UPDATE, memory, "renewing", renewal)
    if leading:
        # Another replica holds it while this one believed it did (an operator edited it,
        # or this replica's renewals were lost): stop writing at once.
        return Step(STEP_DOWN, memory, f"the Lease is held by {record.holder}")
    if not expired(memory, now):
        return Step(WAIT, memory, f"held by {record.holder}")
    why = f"taken over from {record.holder}" if record.holder else "released"
    claim = Record(me, timing.lease_duration, wall, wall, record.transitions + 1)
    return Step(UPDATE, memory, why, claim)


def written(memory: Memory, record: Record, sent_at: float) -> Memory:
    """After a successful write of `record`, sent at monotonic `sent_at`: this replica leads
    until `sent_at` + renew deadline unless it renews again."""
    return Memory(seen=record, seen_at=sent_at, renewed_at=sent_at)


def released(memory: Memory, wall: str) -> Record | None:
    """The record a leader writes when it stops on purpose (client-go's ReleaseOnCancel): no
    holder and a 1 s duration, so that a standby takes over at its next try instead of
    after a whole lease duration. None: this replica holds nothing to release."""
    if memory.seen is None or memory.renewed_at is None:
        return None
    return Record("", 1, wall, wall, memory.seen.transitions)


def next_try(memory: Memory, timing: Timing, jitter: float) -> float:
    """Seconds until the next try: a leader renews every retry period; a standby tries
    every retry period to 1.2 x that (`jitter` in [0, 1)), so that standbys spread out."""
    if memory.renewed_at is not None:
        return timing.retry_period
    return timing.retry_period * (1.0 + (JITTER - 1.0) * jitter)


# -- the Lease's wire format (coordination.k8s.io/v1) --------------------------------------


def record_of(spec: Mapping[str, Any]) -> Record:
    """A Lease's spec as a Record (fields it lacks read as their zero values)."""
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=_int(spec.get("leaseDurationSeconds")),
        acquire_time=_text(spec.get("acquireTime")),
        renew_time=_text(spec.get("renewTime")),
        transitions=_int(spec.get("leaseTransitions")),
    )


def lease_of(body: Mapping[str, Any] | None) -> Lease | None:
    """A Lease object as read from the API server (None: there is none)."""
    if body is None:
        return None
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return Lease(record_of(spec), str(metadata.get("resourceVersion") or ""))


def spec_of(record: Record) -> dict[str, Any]:
    """The Lease spec to write. No holder is written as no field, as client-go does."""
    spec: dict[str, Any] = {
        "leaseDurationSeconds": record.lease_duration_seconds,
        "leaseTransitions": record.transitions,
    }
    if record.holder:
        spec["holderIdentity"] = record.holder
    if record.acquire_time:
        spec["acquireTime"] = record.acquire_time
    if record.renew_time:
        spec["renewTime"] = record.renew_time
    return spec


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: object) -> str | None:
    return str(value) if value else None
