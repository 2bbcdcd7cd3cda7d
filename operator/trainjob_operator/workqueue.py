"""A keyed work queue with delayed adds: client-go's workqueue semantics, on asyncio.

- A key waits in the queue at most once, however often it is added (adds coalesce).
- A key is handed to one worker at a time: added while a worker holds it, it is queued
  again once that worker is done, never to a second worker meanwhile. So one job's
  reconciles are serialized while different jobs' run in parallel, on a bounded pool.
- `add_after` is a timer: one pending wake-up per key (the later call replaces the earlier),
  all keys on one heap served by one task. A finished job holds no timer and no task.

No API calls and no job knowledge here; `controller.py` decides what a key means.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

from trainjob_operator import aio

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: collections.deque[K] = collections.deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        # Added while processing: queued again by `done`.
        self._dirty: set[K] = set()
        # Workers waiting for a key, woken one per added key.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # The timer heap: (due, tie-breaker, key); `_due` holds each key's live entry, so a
        # replaced or cancelled entry is skipped when it comes up (lazy deletion).
        self._heap: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._ticket = itertools.count()
        self._timer_changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def timers(self) -> int:
        return len(self._due)

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._notify()

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` in `delay` seconds, replacing any wake-up it had."""
        if delay <= 0:
            self.cancel_timer(key)
            self.add(key)
            return
        due = asyncio.get_running_loop().time() + delay
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._ticket), key))
        self._timer_changed.set()

    def cancel_timer(self, key: K) -> None:
        self._due.pop(key, None)

    async def get(self) -> K:
        """The next key to work on; the caller must call `done(key)` when finished."""
        while not self._queue:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the wake-up this worker was given on
                raise
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """Drop every pending wake-up of `key` (it is gone). A worker holding it finishes."""
        self.cancel_timer(key)
        self._dirty.discard(key)
        if key in self._queued:
            self._queued.discard(key)
            self._queue.remove(key)

    async def run_timers(self) -> None:
        """Move keys whose time has come into the queue, forever (one task per queue)."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            while self._heap and self._heap[0][0] <= now:
                due, _, key = heapq.heappop(self._heap)
                if self._due.get(key) == due:
                    del self._due[key]
                    self.add(key)
            self._timer_changed.clear()
            timeout = self._heap[0][0] - now if self._heap else None
            with contextlib.suppress(asyncio.TimeoutError):
                await aio.within(self._timer_changed.wait(), timeout)

    def _notify(self) -> None:
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
