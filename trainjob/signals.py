"""The signals that stop a `trainjob` command that runs until stopped (`run`, `tensorboard`),
in one place: Ctrl-C (SIGINT), `kill` (SIGTERM) and the terminal going away (SIGHUP), except
those the command was started with ignored, which stay ignored as whoever started it asked.

`nohup` starts a command with SIGHUP ignored so that it outlives the terminal; a shell script's
`command &` starts it with SIGINT ignored so that Ctrl-C meant for the foreground passes it by.
Catching them anyway would undo what the user asked: `nohup trainjob run -f job.yaml &` would
stop training when the window closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Final

# The replicas of `trainjob run` run in sessions of their own: without SIGHUP they would
# outlive a closed window.
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signals_to_catch(dispositions: Mapping[signal.Signals, object]) -> tuple[signal.Signals, ...]:
    """The signals a command catches, given what each was set to when it started: all but the
    ignored ones."""
    return tuple(signum for signum, handler in dispositions.items() if handler != signal.SIG_IGN)


def how_to_stop(sigint_ignored: bool, pid: int) -> str:
    """How the user stops a command that runs until stopped (`trainjob tensorboard`)."""
    if sigint_ignored:
        return f"It was started with Ctrl-C ignored (in the background): kill {pid} stops it"
    return "Ctrl-C stops it"


def stop_hint() -> str:
    """`how_to_stop` for this process."""
    return how_to_stop(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, os.getpid())


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[str], None]) -> Iterator[None]:
    """Call `on_signal(name)` for each of STOP_SIGNALS that arrives while inside (main thread
    only), but for those the command was started with ignored (`signals_to_catch`)."""

    def record(signum: int, frame: FrameType | None) -> None:
        del frame
        on_signal(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = signals_to_catch({signum: signal.getsignal(signum) for signum in STOP_SIGNALS})
    previous = {signum: signal.signal(signum, record) for signum in caught}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
