"""Child processes of the tests and benchmarks (control-plane components, operators): each
leads its own process group, so stopping it stops whatever it started too, and appends its
output to a log file whose tail explains a failure."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# How long a process group gets to go after SIGKILL before it counts as stuck.
KILL_WAIT: Final = 10.0


def _die_with_parent() -> None:
    """In the child before exec: killed if the parent dies (Linux), so a crashed test run
    leaves no control plane behind."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group `pgid` is left (a zombie counts until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (or the process is gone). SIGSTOP is
    delivered to each thread in its own time: a thread inside a system call (a write, say)
    finishes it first."""
    try:
        stats = [task.read_text() for task in Path(f"/proc/{pid}/task").glob("*/stat")]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return all(stat.rsplit(")", 1)[1].split()[0] in ("T", "t", "Z", "X") for stat in stats)


def log_tail(log: Path, lines: int) -> str:
    """The last `lines` lines of a log file; empty when it cannot be read."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def spawn_logged(
    argv: Sequence[str | Path],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a session of its own, output appended to `log`; stdin is /dev/null, so
    nothing waits on the terminal."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(a) for a in argv],
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # only prctl in the child, no locks
            preexec_fn=_die_with_parent if die_with_parent else None,  # noqa: PLW1509
        )


@dataclass
class LoggedProcess:
    """A child process in a session (and process group) of its own, its stdout and stderr
    appended to `log`."""

    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)

    def kill(self, timeout: float = KILL_WAIT) -> None:
        """SIGKILL the process group: no cleanup at all, as when the machine dies under it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=timeout)

    def stop(self, grace: float = 10.0) -> bool:
        """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds.
        Returns whether the group is gone."""
        pgid = self.process.pid  # start_new_session: the child leads its own group
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT)):
            self.process.poll()  # reaps an exited leader, which would count in its group
            if not group_alive(pgid):
                return True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait)
        return not group_alive(pgid)
