"""`trainjob run` on a real pseudo-terminal (pexpect), its output read back as the screen a user
sees (pyte, a VT100 emulator with scrollback): the live table fits, is redrawn in place, and
leaves no stale rows behind, at 60, 80 and 200 columns and when the terminal is resized.

The replicas are small Python processes (no TensorFlow) that print log lines (some wider than
the terminal) and progress events, paced so the table is redrawn many times during a run."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pexpect
import pyte
import pytest

from tests.support.processes import all_threads_stopped

from .conftest import (
    cli_env,
    command_replica,
    group_alive,
    job_manifest,
    read_json,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.local

ROWS = 24
LINES_PER_REPLICA = 24
# Each replica prints numbered lines (every third one wider than any terminal here) and a
# progress event per line; 60 ms apart, so a run lasts ~2 s and the table is redrawn often.
CHATTY = (
    "import json, os, time\n"
    "me = os.environ['TRAINJOB_REPLICA_TYPE'] + '-' + os.environ['TRAINJOB_REPLICA_INDEX']\n"
    f"for i in range({LINES_PER_REPLICA}):\n"
    "    tail = ' wide' * 36 if i % 3 == 0 else ''\n"
    "    print(f'line {i:02d} of {me}{tail}', flush=True)\n"
    "    event = {'event': 'step', 'epoch': 0, 'step': i + 1, 'loss': 1.0 / (i + 1),\n"
    "             'examples_per_sec': 12345.6}\n"
    "    print('TRAINJOB_PROGRESS ' + json.dumps(event), flush=True)\n"
    "    time.sleep(1.5 if i == 8 else 0.06)  # a quiet moment: the resize test resizes then\n"
)
JOB_LINE = re.compile(r"^TrainJob tty  ")  # the table's job line (the summary has one space)
REPLICA_ROW = re.compile(r"^  worker-\d +(Running|Starting|Pending|Stopping|Succeeded)")
# What a table row leaves behind when it is overwritten but not cleared.
DEBRIS = re.compile(r"pid \d+|loss \d\.\d{4}|ex/s|Running +epoch")
WIDE_WORDS = 2 * 8 * 36  # 2 replicas x 8 wide lines (~210 columns: a short last row) x 36
DEADLINE_S = 60


def group_gone(pgid: int) -> Callable[[], bool]:
    """A probe for wait_until: no process of group `pgid` is alive."""
    return lambda: not group_alive(pgid)


def _lines(screen: pyte.HistoryScreen) -> list[str]:
    """Every line the terminal holds: scrollback, then the visible screen."""

    def text(line: dict[int, pyte.screens.Char]) -> str:
        return "".join(line[x].data for x in range(screen.columns)).rstrip()

    return [text(line) for line in screen.history.top] + [row.rstrip() for row in screen.display]


def _both_at_line_08(snapshot: list[str]) -> bool:
    return all(
        any(f"line 08 of {r}" in line for line in snapshot) for r in ("worker-0", "worker-1")
    )


def _wait_for_quiet(child: pexpect.spawn, stream: pyte.ByteStream) -> None:
    """Feed output until nothing came for 300 ms (idle, the table is redrawn every 0.5 s)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            stream.feed(child.read_nonblocking(65536, timeout=0.3))
        except pexpect.TIMEOUT:
            return


def _resize_between_draws(
    child: pexpect.spawn, stream: pyte.ByteStream, screen: pyte.HistoryScreen, columns: int
) -> None:
    """Resize as a person dragging a window does, between two draws: a real terminal draws
    every byte written before the resize at the old width, but this harness reads in chunks,
    so a redraw the run wrote after the last read was drawn at the new width (two tables in
    one snapshot, seen once on a loaded machine). So the run is frozen (SIGSTOP; each frame
    is one write, which a stopping thread finishes first), what it wrote is drawn at the old
    width, both sides are resized, and the run goes on (SIGCONT) to redraw for the new one."""
    os.kill(child.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: all_threads_stopped(child.pid), DEADLINE_S, "the run frozen")
        _wait_for_quiet(child, stream)  # frozen: this drains what it wrote, and returns
        child.setwinsize(ROWS, columns)
        screen.resize(ROWS, columns)
    finally:
        os.kill(child.pid, signal.SIGCONT)


def _run_on_terminal(
    tmp_path: Path, columns: int, resize_to: int | None = None
) -> tuple[list[str], list[list[str]], int]:
    """Run the chatty job on a pty; (final lines, snapshots taken during the run, exit code)."""
    manifest = job_manifest(
        "tty", {"worker": command_replica(CHATTY, replicas=2)}, successPolicy="AllWorkers"
    )
    write_job(tmp_path / "job.yaml", manifest)
    env = {**cli_env(), "TERM": "xterm", "NO_COLOR": "1"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"],
        cwd=str(tmp_path),
        env=env,
        dimensions=(ROWS, columns),
        timeout=DEADLINE_S,
    )
    screen = pyte.HistoryScreen(columns, ROWS, history=5000)
    stream = pyte.ByteStream(screen)
    snapshots: list[list[str]] = []
    resized = False
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            try:
                chunk = child.read_nonblocking(65536, timeout=1)
            except pexpect.EOF:
                break
            except pexpect.TIMEOUT:
                continue
            stream.feed(chunk)
            snapshot = _lines(screen)
            snapshots.append(snapshot)
            if resize_to is not None and not resized and _both_at_line_08(snapshot):
                _wait_for_quiet(child, stream)
                _resize_between_draws(child, stream, screen, resize_to)
                resized = True
        else:
            raise AssertionError(f"trainjob run did not end in {DEADLINE_S}s")
    finally:
        child.close(force=True)
    return _lines(screen), snapshots, child.exitstatus


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_the_live_table_fits_and_leaves_no_stale_rows(tmp_path: Path, columns: int) -> None:
    lines, snapshots, code = _run_on_terminal(tmp_path, columns)
    output = "\n".join(lines)
    assert code == 0, output
    # During the run: exactly one table, at the bottom, each line narrower than the terminal.
    # A snapshot is taken after each chunk the pty gives back, and a loaded machine can split
    # one redraw over two chunks: such a snapshot holds the first rows of a frame only.
    tables = [s for s in snapshots if any(JOB_LINE.match(line) for line in s)]
    for snapshot in snapshots:
        assert sum(1 for line in snapshot if JOB_LINE.match(line)) <= 1, "\n".join(snapshot)
        assert sum(1 for line in snapshot if REPLICA_ROW.match(line)) <= 2, "\n".join(snapshot)
    whole = 0
    for snapshot in tables:
        first = next(i for i, line in enumerate(snapshot) if JOB_LINE.match(line))
        table = [line for line in snapshot[first:] if line]
        assert len(table) <= 3 and all(len(line) <= columns - 1 for line in table), table
        whole += len(table) == 3
    assert whole >= 3, "the whole table was drawn a few times while the replicas ran"
    # After the run: no table row anywhere (screen or scrollback), nor any piece of one, and
    # every log line once, whole (wrapped lines included).
    assert not [line for line in lines if JOB_LINE.match(line) or REPLICA_ROW.match(line)], output
    assert not [line for line in lines if DEBRIS.search(line)], output
    assert sum(line.count("wide") for line in lines) == WIDE_WORDS, output
    for replica in ("worker-0", "worker-1"):
        for i in range(LINES_PER_REPLICA):
            starts = [line for line in lines if f"| line {i:02d} of {replica}" in line]
            assert len(starts) == 1, (replica, i, output)
    assert any(line.startswith("TrainJob tty Succeeded after") for line in lines), output


def test_a_resized_terminal_keeps_one_table_and_no_debris(tmp_path: Path) -> None:
    lines, snapshots, code = _run_on_terminal(tmp_path, 200, resize_to=70)
    output = "\n".join(lines)
    assert code == 0, output
    for snapshot in snapshots:
        assert sum(1 for line in snapshot if JOB_LINE.match(line)) <= 1, "\n".join(snapshot)
    after = [
        s
        for s in snapshots
        if any("line 20" in line for line in s) and any(JOB_LINE.match(line) for line in s)
    ]
    assert after, output
    table = [line for line in after[-1] if JOB_LINE.match(line) or REPLICA_ROW.match(line)]
    assert len(table) == 3 and all(len(line) <= 69 for line in table), table
    assert not [line for line in lines if JOB_LINE.match(line) or REPLICA_ROW.match(line)], output
    assert not [line for line in lines if DEBRIS.search(line)], output
    assert any(line.startswith("TrainJob tty Succeeded after") for line in lines), output


def test_no_table_and_no_escape_codes_when_output_is_not_a_terminal(tmp_path: Path) -> None:
    manifest = job_manifest("plain", {"worker": command_replica(CHATTY, replicas=1)})
    write_job(tmp_path / "job.yaml", manifest)
    output, code = pexpect.run(
        f"{sys.executable} -m trainjob run -f job.yaml --run-dir run --no-tty",
        cwd=str(tmp_path),
        env={**cli_env(), "TERM": "xterm"},
        withexitstatus=True,
        timeout=DEADLINE_S,
    )
    text = output.decode()
    assert code == 0, text
    assert "\x1b[" not in text
    assert "[worker-0] progress: epoch 1 step 24 loss 0.0417 12,346 ex/s" in text
    assert os.path.exists(tmp_path / "run" / "logs" / "worker-0.log")


def test_color_on_a_terminal_and_none_with_no_color(tmp_path: Path) -> None:
    manifest = job_manifest("hue", {"worker": command_replica("print('hi', flush=True)")})
    write_job(tmp_path / "job.yaml", manifest)
    sgr = re.compile(rb"\x1b\[[0-9;]*m")
    outputs = {}
    for name, extra in (("color", {}), ("plain", {"NO_COLOR": "1"})):
        child = pexpect.spawn(
            sys.executable,
            ["-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", name, "--rerun"],
            cwd=str(tmp_path),
            env={**cli_env(), "TERM": "xterm", **extra},
            dimensions=(ROWS, 80),
            timeout=DEADLINE_S,
        )
        outputs[name] = child.read()
        child.close()
        assert child.exitstatus == 0, outputs[name]
    assert sgr.search(outputs["color"]), outputs["color"]
    assert b"\x1b[32mTrainJob hue Succeeded" in outputs["color"]
    assert not sgr.search(outputs["plain"]), outputs["plain"]


def test_closing_the_terminal_stops_every_replica(tmp_path: Path) -> None:
    """The replicas run in their own sessions: a closed window (SIGHUP, then EIO on every
    write) must still stop them and leave a true status."""
    serve = "import time\nprint('serving', flush=True)\nwhile True: time.sleep(0.2)"
    write_job(tmp_path / "job.yaml", job_manifest("hup", {"worker": command_replica(serve, 2)}))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"],
        cwd=str(tmp_path),
        env={**cli_env(), "TERM": "xterm"},
        dimensions=(ROWS, 80),
        timeout=DEADLINE_S,
    )
    run_dir = tmp_path / "run"

    def both_alive() -> dict[str, dict[str, int]] | None:
        procs = read_json(run_dir / "processes.json")
        return (
            procs if procs and all(p["alive"] for p in procs.values()) and len(procs) == 2 else None
        )

    try:
        procs = wait_until(both_alive, DEADLINE_S, "both replicas")
        child.expect("serving")
        # Closing the pty sends SIGHUP to trainjob run; it may still be stopping its replicas
        # when pexpect gives up waiting, which is fine: what matters is checked below.
        with contextlib.suppress(pexpect.ExceptionPexpect):
            child.close(force=False)
        for info in procs.values():
            wait_until(group_gone(info["pid"]), DEADLINE_S, "replica gone")
        wait_until(
            lambda: (read_json(run_dir / "status.json") or {}).get("state") == "Interrupted",
            DEADLINE_S,
            "status Interrupted",
        )
    finally:
        if child.isalive():
            child.kill(signal.SIGKILL)
        for info in (read_json(run_dir / "processes.json") or {}).values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(info["pid"], signal.SIGKILL)  # never leave orphans behind
