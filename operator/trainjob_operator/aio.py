"""`within`: asyncio.wait_for without its lost cancellations.

Before Python 3.12, `asyncio.wait_for` returns the inner result when its caller is cancelled
at the moment the inner awaitable completes (CPython gh-86296): the cancellation is lost and
the task runs on. The operator's long-lived loops wait this way on events that other tasks
set, so a loop cancelled just after one of them was set kept running, and shutting down
waited for its next timeout (the work queue's: the resync period, minutes). `within`
waits with `asyncio.wait`, which never swallows the caller's cancellation, on every Python
the project supports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`'s result, or `asyncio.TimeoutError` once `timeout` seconds have passed
    (None: no limit); the awaitable is cancelled when the time is up or the caller is."""
    inner = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except BaseException:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        # Let it end before returning, as wait_for does; a cancellation of ours still raises.
        await asyncio.wait({inner})
        raise asyncio.TimeoutError
    return inner.result()
