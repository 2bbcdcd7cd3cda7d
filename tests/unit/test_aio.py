"""`within` (operator/trainjob_operator/aio.py), the operator's wait with a time limit, on a
real event loop: it returns the result, times out, and never loses its caller's
cancellation, even one that comes as the awaited thing completes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trainjob_operator.aio import within


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_the_result_comes_back_and_a_slow_awaitable_times_out_and_is_cancelled() -> None:
    async def scenario() -> None:
        assert await within(asyncio.sleep(0, result="ready"), 5.0) == "ready"
        assert await within(asyncio.sleep(0, result="unlimited"), None) == "unlimited"
        slow = asyncio.ensure_future(asyncio.sleep(600))
        with pytest.raises(asyncio.TimeoutError):
            await within(slow, 0.01)
        assert slow.cancelled()

    asyncio.run(scenario())


def test_an_error_of_the_awaitable_is_raised_as_it_is() -> None:
    async def failing() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        asyncio.run(within(failing(), 5.0))


def test_a_cancellation_in_the_turn_the_awaited_event_is_set_is_not_lost() -> None:
    async def scenario() -> None:
        event = asyncio.Event()
        reached: list[str] = []

        async def loop_body() -> None:
            await within(event.wait(), 600.0)
            reached.append("after the wait")  # only if the cancellation was lost

        task = asyncio.ensure_future(loop_body())
        await _turns(5)
        event.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert done and task.cancelled() and reached == []

    asyncio.run(scenario())


def test_a_cancelled_caller_cancels_what_it_waited_for() -> None:
    async def scenario() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(600))
        outer = asyncio.ensure_future(within(inner, 600.0))
        await _turns(3)
        outer.cancel()
        await asyncio.wait({outer}, timeout=2.0)
        await _turns(2)
        assert outer.cancelled() and inner.cancelled()

    asyncio.run(scenario())


def test_the_operator_waits_with_a_time_limit_only_through_within() -> None:
    package = Path(__file__).resolve().parents[2] / "operator" / "trainjob_operator"
    callers = [
        p.name for p in sorted(package.rglob("*.py")) if "asyncio.wait_for(" in p.read_text()
    ]
    assert callers == [], f"asyncio.wait_for loses cancellations before Python 3.12: {callers}"
