"""The one polling wait of the tests and benchmarks: poll real state until it holds, with a
deadline (never a bare sleep), and say what was awaited when the deadline passes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A wait's deadline passed (an AssertionError: in a test, a failed expectation)."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
    error: Callable[[str], Exception] = WaitTimeoutError,
) -> T:
    """Poll `probe` every `interval` seconds until it returns something truthy, and return
    that. After `timeout` seconds raise `error` naming `what`, followed by what `on_timeout`
    tells (a log tail, the object's status). The probe may raise to end the wait early."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_timeout() if on_timeout is not None else ""
            raise error(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    """Whether a plain-HTTP endpoint answers 200 right now (a probe for `wait_until`)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:  # URLError is an OSError
        return False
