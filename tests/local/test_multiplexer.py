"""The live table of `trainjob run` and `trainjob attach` in real terminal multiplexers: tmux
(default settings, so `scroll-on-clear` is on) and GNU screen, plus pyte as a plain xterm-like
terminal. Redrawing the table must leave nothing in the scrollback: not when the table starts
on the top row, not when it is taller than the window (it is cut to fit), not after a resize.

A table used to be redrawn by going up to its first row and clearing the screen from there; on
the top row that clear starts at the top-left cell, which tmux and screen take for a clear
screen: they pushed the whole screen into the scrollback on every redraw (29 lines a second for
a queued 32-worker job in a 100x30 window; the 2,000-line history gone in about 70 s).

The table is drawn by tests/local/table_driver.py through the same `Terminal` both commands
use. A resize itself may move rows into the scrollback (tmux keeps the cursor's row when the
window gets shorter, as for any program); what is checked is that the redraws after it add
nothing more. These need tmux and screen installed (tests/controlplane/install.sh
--node-packages installs them): without them they fail, saying so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import pyte
import pytest

from tests.local import table_driver
from tests.support import tmux as tmux_support

from .conftest import REPO_ROOT, cli_env, wait_until

pytestmark = pytest.mark.local

DEADLINE_S = 30
DRAWS = 40  # redraws watched at each size: one leak per redraw would add 40 copies
# Queued or running, 32 workers do not fit in 30 rows: the table is cut to 29 and starts on
# the top row of a fresh window.
WORKERS = 32
QUIET_S = 0.3  # no byte to read for this long, from a paused driver: all it drew has been read
RESIZES = [(60, 30), (100, 12), (100, 30), (200, 40)]  # narrower, shorter, back, bigger


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"{name} is not installed: this test draws the live table in a real {name} "
            f"(Debian: apt-get install -y {name}; `bash tests/controlplane/install.sh "
            "--node-packages` installs it as root)",
            pytrace=False,
        )
    return found


def _driver_command(counter: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "tests.local.table_driver", str(WORKERS), str(counter), *flags]


def _draws(counter: Path) -> int:
    try:
        return int(counter.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _wait_draws(counter: Path, more: int, what: str) -> None:
    """Until the driver has drawn `more` tables after the ones drawn so far."""
    target = _draws(counter) + more
    wait_until(lambda: _draws(counter) >= target, DEADLINE_S, f"{more} draws {what}")


@contextlib.contextmanager
def _tmux(
    tmp_path: Path, columns: int, rows: int, command: list[str]
) -> Iterator[tmux_support.Tmux]:
    env = {**cli_env(), "PYTHONPATH": str(REPO_ROOT)}
    with tmux_support.running(tmp_path, columns, rows, command, cwd=REPO_ROOT, env=env) as server:
        yield server


def _tables(lines: list[str]) -> int:
    return sum(1 for line in lines if line.startswith(table_driver.JOB_LINE))


def _assert_table_at_the_bottom(shown: list[str], rows: int) -> None:
    """The screen ends with one whole table, cut to the window's rows, and nothing after it.
    (What is above it may be rows that tmux brought back from the scrollback when the window
    grew: a copy of the table that tmux itself moved there at an earlier resize.)"""
    while shown and not shown[-1]:
        shown = shown[:-1]
    first = max(i for i, line in enumerate(shown) if line.startswith(table_driver.JOB_LINE))
    table = shown[first:]
    assert len(table) == min(rows - 1, WORKERS + 1), "\n".join(shown)
    assert all(line.startswith(("  worker-", "  … ")) for line in table[1:]), "\n".join(shown)


def test_tmux_redraws_leave_nothing_in_the_scrollback(tmp_path: Path) -> None:
    counter = tmp_path / "draws"
    with _tmux(tmp_path, 100, 30, _driver_command(counter)) as tmux:
        _wait_draws(counter, 3, "at 100x30")
        shown = tmux.screen()
        assert shown[0].startswith(table_driver.JOB_LINE), "\n".join(shown)  # on the top row
        assert _tables(shown) == 1, "\n".join(shown)
        _assert_table_at_the_bottom(shown, 30)  # cut to 29 lines
        _wait_draws(counter, DRAWS, "at 100x30")
        assert tmux.history_size() == 0, "\n".join(tmux.history())
        for columns, rows in RESIZES:
            tmux.resize(columns, rows)
            # The resize itself may move rows into the scrollback; the redraws after it may not.
            _wait_draws(counter, 3, f"after the resize to {columns}x{rows}")
            settled = tmux.history_size()
            _wait_draws(counter, DRAWS, f"at {columns}x{rows}")
            now = tmux.history_size()
            assert now == settled, (
                f"{now - settled} rows went into the scrollback in {DRAWS} redraws at "
                f"{columns}x{rows}:\n" + "\n".join(tmux.history())
            )
            _assert_table_at_the_bottom(tmux.screen(), rows)


def test_tmux_log_lines_scroll_into_the_scrollback_and_the_table_does_not(tmp_path: Path) -> None:
    counter = tmp_path / "draws"
    with _tmux(tmp_path, 100, 30, _driver_command(counter, "--logs")) as tmux:
        # 5 draws per log line: enough for the logs to fill the screen and scroll 20 lines.
        _wait_draws(counter, 5 * (30 + 20), "with log lines")
        history = tmux.history()
        assert len(history) >= 20
        assert all(line.startswith("log line ") for line in history), "\n".join(history)
        shown = tmux.screen()
        assert _tables(shown) == 1, "\n".join(shown)


def _text_of(path: Path) -> Callable[[], str | None]:
    """A probe for a file that another process writes: its text once two reads agree."""
    last: list[str] = []

    def probe() -> str | None:
        text = path.read_text() if path.exists() else ""
        settled = bool(text) and last == [text]
        last[:] = [text]
        return text if settled else None

    return probe


def _screen_scrollback(screen: str, env: dict[str, str], session: str, tmp_path: Path) -> int:
    """How many lines GNU screen holds in its scrollback: a hardcopy with the scrollback (-h)
    holds those and the screen's rows, a plain one the rows only."""
    counts = []
    for name, flags in (("with", ["-h"]), ("without", [])):
        path = tmp_path / f"hardcopy-{name}"
        path.unlink(missing_ok=True)
        subprocess.run(
            [screen, "-S", session, "-X", "hardcopy", *flags, str(path)],
            env=env,
            check=True,
            timeout=DEADLINE_S,
        )
        # The command returns once sent; screen writes the file when it handles it.
        counts.append(len(wait_until(_text_of(path), DEADLINE_S, "a hardcopy").splitlines()))
    return counts[0] - counts[1]


def test_gnu_screen_redraws_leave_nothing_in_the_scrollback(tmp_path: Path) -> None:
    screen = _tool("screen")
    counter = tmp_path / "draws"
    sockets = tmp_path / "screens"  # screen's own socket folder, mode 700 as screen demands
    sockets.mkdir(mode=0o700)
    rc = tmp_path / "screenrc"
    rc.write_text("startup_message off\ndefscrollback 5000\n")
    env = {**os.environ, "SCREENDIR": str(sockets)}
    session = "table"
    # screen runs attached inside a tmux window, so that a resize of the window reaches it as
    # it reaches a person's screen session.
    command = ["env", f"SCREENDIR={sockets}", screen, "-c", str(rc), "-S", session]
    with _tmux(tmp_path, 100, 30, [*command, *_driver_command(counter)]) as tmux:
        try:
            _wait_draws(counter, 3 + DRAWS, "in screen at 100x30")
            assert _screen_scrollback(screen, env, session, tmp_path) == 0
            for columns, rows in RESIZES:
                tmux.resize(columns, rows)
                _wait_draws(counter, 3, f"in screen after the resize to {columns}x{rows}")
                settled = _screen_scrollback(screen, env, session, tmp_path)
                _wait_draws(counter, DRAWS, f"in screen at {columns}x{rows}")
                now = _screen_scrollback(screen, env, session, tmp_path)
                added = now - settled
                assert added == 0, f"{added} lines in {DRAWS} redraws at {columns}x{rows}"
        finally:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    [screen, "-S", session, "-X", "quit"], env=env, timeout=DEADLINE_S, check=False
                )


def test_an_xterm_like_terminal_keeps_one_table_and_no_scrollback(tmp_path: Path) -> None:
    """pyte (a VT100/xterm emulator with a scrollback), on a pseudo-terminal.

    pyte reads a table more slowly than the driver draws one (about 20 ms each on 2 cores), so
    tables drawn for the old size queue in the pseudo-terminal; fed after the resize, their
    wider lines would wrap and scroll, which says nothing about a redraw. So the driver pauses
    between two whole tables, everything it drew is fed, and only then is the window resized,
    as a terminal that keeps up with its program would be."""
    counter = tmp_path / "draws"
    pause = tmp_path / "pause"
    columns, rows = 100, 30
    env = {**cli_env(), "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"}
    child = pexpect.spawn(
        sys.executable,
        _driver_command(counter, "--pause", str(pause))[1:],
        cwd=str(REPO_ROOT),
        env=env,
        dimensions=(rows, columns),
    )
    screen = pyte.HistoryScreen(columns, rows, history=5000)
    stream = pyte.ByteStream(screen)

    def feed_until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            assert time.monotonic() < deadline, f"{what} within {DEADLINE_S}s"
            with contextlib.suppress(pexpect.TIMEOUT):
                stream.feed(child.read_nonblocking(65536, timeout=0.1))

    def feed_draws(more: int) -> None:
        target = _draws(counter) + more
        feed_until(lambda: _draws(counter) >= target, f"{more} more draws")

    def feed_all_drawn() -> None:
        """Pause the driver (fed meanwhile: a full pseudo-terminal would block its write),
        then feed until the pseudo-terminal has nothing more to read."""
        pause.touch()
        feed_until(table_driver.paused_marker(pause).exists, "the driver paused")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert time.monotonic() < deadline, f"the terminal still busy after {DEADLINE_S}s"
            try:
                stream.feed(child.read_nonblocking(65536, timeout=QUIET_S))
            except pexpect.TIMEOUT:
                return  # the driver is paused: nothing more is on its way

    try:
        feed_draws(3 + DRAWS)
        for next_columns, next_rows in [(columns, rows), *RESIZES]:
            if (next_columns, next_rows) != (columns, rows):
                feed_all_drawn()
                child.setwinsize(next_rows, next_columns)
                screen.resize(next_rows, next_columns)
                columns, rows = next_columns, next_rows
                pause.unlink()
            feed_draws(DRAWS)
            shown = [line.rstrip() for line in screen.display]
            assert len(screen.history.top) == 0, f"scrollback at {columns}x{rows}"
            assert _tables(shown) == 1, "\n".join(shown)
    finally:
        child.close(force=True)
