"""Which signals stop a command (trainjob.signals): a signal the command was started with
ignored (nohup's SIGHUP, a background job's SIGINT) stays ignored."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from trainjob.signals import STOP_SIGNALS, how_to_stop, signals_to_catch, stop_signals


def test_an_ignored_signal_is_not_caught_and_every_other_is() -> None:
    def handler(signum: int, frame: object) -> None:
        del signum, frame

    dispositions = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_IGN,
        signal.SIGUSR1: handler,
    }
    assert signals_to_catch(dispositions) == (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    assert signals_to_catch(dict.fromkeys(STOP_SIGNALS, signal.SIG_IGN)) == ()


def test_the_stop_hint_names_the_pid_when_ctrl_c_cannot_stop_it() -> None:
    assert how_to_stop(False, 4321) == "Ctrl-C stops it"
    hint = how_to_stop(True, 4321)
    assert "kill 4321 stops it" in hint and "Ctrl-C ignored" in hint


@pytest.fixture
def hup_ignored() -> Iterator[None]:
    """SIGHUP ignored, as under nohup; the runner's own dispositions afterwards."""
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def test_stop_signals_leaves_nohups_sighup_ignored_and_restores_the_rest(
    hup_ignored: None,
) -> None:
    del hup_ignored
    before_term = signal.getsignal(signal.SIGTERM)
    got: list[str] = []
    with stop_signals(got.append):
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) not in (before_term, signal.SIG_IGN)
        signal.raise_signal(signal.SIGHUP)  # discarded by the kernel: ignored
        signal.raise_signal(signal.SIGTERM)
    assert got == ["SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) == before_term
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
