"""One replica's part in leader election (client-go's LeaderElector): the loop that reads the
Lease, asks leader.py what to do, and does it through kube.py. While it leads, the API
layer's write gate is open (`leading`); the job loops, the progress writer and the release
of Kueue's Workloads wait for it (`wait_leading`). A standby does everything else a leader
does: its informers list and watch, its index and job loops stay current, so a takeover
starts from a warm cache.

A leader that stops leading without being asked (its renewals failed for the renew
deadline, or another replica holds the Lease) does not go back to standing by: its write
gate has already closed by the clock, and `on_lost` stops the process (handlers.py), as
controller-runtime's manager does. Why: a leader's memory (what it wrote and expects to see,
retry counters, timers, half-done reconciles) was built on being the only writer; a fresh
process rejoins as a standby with nothing stale, and the kubelet restarts it at once.

On a graceful stop (`resign`, then `release` once the job loops are closed) the leader
writes a Lease with no holder, so that a standby takes over at its next try, not a whole
lease duration later.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import time
from collections.abc import Callable

from trainjob_operator import kube, leader, metrics

logger = logging.getLogger(__name__)


def wall_now() -> str:
    """The time to write into the Lease (a MicroTime)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self,
        api: kube.Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: leader.Timing,
        meters: metrics.Metrics,
        on_lost: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = wall_now,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self._metrics = meters
        self._on_lost = on_lost
        self._clock = clock
        self._wall = wall
        self._jitter = jitter
        self._memory = leader.Memory()
        # The resourceVersion of the Lease as this replica last read or wrote it.
        self._version = ""
        self._elected = asyncio.Event()
        # Called once when this replica becomes the leader (after its gate opened).
        self.on_elected: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        # What this replica knew when it resigned as the leader (for `release`).
        self._releasing: leader.Memory | None = None
        # The holder of the Lease as last read or written (the probe says it).
        self.holder = ""

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    def leading(self) -> bool:
        """Whether this replica may write now (leader.may_write, by the monotonic clock)."""
        return leader.may_write(self._memory, self._clock(), self.timing)

    async def wait_leading(self) -> None:
        while not self.leading():
            await self._elected.wait()
            if not self.leading():
                # Elected, but the gate has closed since (the loop steps down next).
                await asyncio.sleep(self.timing.retry_period)

    def start(self) -> None:
        self._metrics.leader.set(0)
        logger.info(
            "Standing by for the leader Lease %s as %s (lease %ds, renew deadline %gs, retry %gs)",
            self.lease,
            self.identity,
            self.timing.lease_duration,
            self.timing.renew_deadline,
            self.timing.retry_period,
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="leader election")

    async def _run(self) -> None:
        while True:
            why = await self._try()
            if why is not None:
                self._lose(why)
                return
            await asyncio.sleep(leader.next_try(self._memory, self.timing, self._jitter()))

    def _timeout(self) -> float:
        """How long a Lease request may take: a leader's must end before its gate closes (it
        then steps down rather than wait); a standby's, one renew deadline."""
        renewed = self._memory.renewed_at
        if renewed is None:
            return self.timing.renew_deadline
        return max(0.05, renewed + self.timing.renew_deadline - self._clock())

    async def _try(self) -> str | None:
        """One try to acquire or renew; returns why this leader must step down, or None."""
        if leader.lapsed(self._memory, self._clock(), self.timing):
            return f"not renewed for {self.timing.renew_deadline:g}s"
        try:
            body = await self.api.get_lease(self.namespace, self.name, self._timeout())
        except (kube.TransientError, kube.RejectedError) as exc:
            self._failed(exc)
            return None
        lease = leader.lease_of(body)
        if lease is not None:
            self._version = lease.resource_version
            self.holder = lease.record.holder
        step = leader.decide(
            self._memory, lease, self.identity, self._clock(), self._wall(), self.timing
        )
        self._memory = step.memory
        if step.verb == leader.STEP_DOWN:
            return step.why
        if step.write is None:
            return None
        spec = leader.spec_of(step.write)
        sent = self._clock()
        try:
            if step.verb == leader.CREATE:
                stored = await self.api.create_lease(
                    self.namespace, self.name, spec, self._timeout()
                )
            else:
                stored = await self.api.update_lease(
                    self.namespace, self.name, spec, self._version, self._timeout()
                )
        except kube.ConflictError as exc:
            logger.debug("Lost the race for the Lease %s: %s", self.lease, exc)
            return None
        except (kube.TransientError, kube.RejectedError) as exc:
            self._failed(exc)
            return None
        was_leading = self._memory.renewed_at is not None
        self._memory = leader.written(self._memory, step.write, sent)
        self._version = str((stored.get("metadata") or {}).get("resourceVersion") or "")
        self.holder = self.identity
        if not was_leading:
            self._elected.set()
            self._metrics.leader.set(1)
            logger.info(
                "Became the leader (Lease %s, %s) as %s", self.lease, step.why, self.identity
            )
            for callback in self.on_elected:
                callback()
        return None

    def _failed(self, exc: Exception) -> None:
        if self._memory.renewed_at is not None:
            logger.warning("Could not renew the leader Lease %s: %s", self.lease, exc)
        else:
            logger.debug("Could not read or take the Lease %s: %s", self.lease, exc)

    def _lose(self, why: str) -> None:
        self._memory = leader.Memory(seen=self._memory.seen, seen_at=self._memory.seen_at)
        self._elected.clear()
        self._metrics.leader.set(0)
        logger.error(
            "Lost the leader Lease %s (%s): stopped writing; the operator stops so that a "
            "fresh start stands by",
            self.lease,
            why,
        )
        self._on_lost(why)

    async def resign(self) -> None:
        """Stop trying and close the write gate (a graceful stop). The Lease still names this
        replica until `release`: nobody else writes meanwhile, and the job loops can end
        their reconciles (their writes are refused now)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if not self.leading():
            self._memory = leader.Memory(seen=self._memory.seen, seen_at=self._memory.seen_at)
            return
        self._releasing = self._memory
        self._memory = leader.Memory(seen=self._memory.seen, seen_at=self._memory.seen_at)
        self._elected.clear()
        self._metrics.leader.set(0)

    async def release(self) -> None:
        """After `resign` and once nothing else writes: hand the Lease over (no holder), so
        that a standby takes over at its next try."""
        memory, self._releasing = self._releasing, None
        if memory is None:
            return
        record = leader.released(memory, self._wall())
        if record is None:
            return
        try:
            await self.api.update_lease(
                self.namespace,
                self.name,
                leader.spec_of(record),
                self._version,
                self.timing.renew_deadline,
            )
        except (kube.TransientError, kube.RejectedError) as exc:
            logger.warning(
                "Could not release the leader Lease %s (a standby takes over when it "
                "expires, in %ds): %s",
                self.lease,
                self.timing.lease_duration,
                exc,
            )
            return
        logger.info("Released the leader Lease %s", self.lease)
