"""The run directory: its lock, status.json, processes.json, the replicas' log files, and
reading them back for `trainjob status` and `trainjob logs`.

The recorder writes the run directory's files; the replicas' output is appended to the logs it
opens by the supervisor's reader threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Mapping
from typing import IO, Any, Final, TextIO

from trainjob.console import logfilter, outcome, view
from trainjob.core import naming, storage
from trainjob.core.naming import ReplicaKey
from trainjob.local import plan
from trainjob.local.supervisor import ProcessRecord

LOCK_FILE: Final = ".trainjob.lock"
PROCESSES_FILE: Final = "processes.json"
LOG_TAIL_BYTES: Final = 64 * 1024  # enough for the last traceback of a failed replica


class RunDirError(OSError):
    """The run directory cannot be used: a file, read-only, or in use by another run."""


@dataclasses.dataclass
class RunDirLock:
    """An exclusive lock on a run directory, held for the whole run (released at exit)."""

    path: str
    handle: IO[str]

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def lock_run_dir(run_dir: str) -> RunDirLock:
    """Create and lock the run directory; RunDirError with a sentence when it cannot be used."""
    try:
        os.makedirs(run_dir, exist_ok=True)
    except FileExistsError as error:
        raise RunDirError(f"run directory {run_dir} exists and is not a directory") from error
    except NotADirectoryError as error:
        raise RunDirError(f"run directory {run_dir}: a parent is not a directory") from error
    except OSError as error:
        raise RunDirError(f"cannot create run directory {run_dir}: {error.strerror}") from error
    if not os.path.isdir(run_dir):
        raise RunDirError(f"run directory {run_dir} exists and is not a directory")
    path = os.path.join(run_dir, LOCK_FILE)
    try:
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
    except OSError as error:
        raise RunDirError(f"cannot write in run directory {run_dir}: {error.strerror}") from error
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise RunDirError(
            f"run directory {run_dir} is in use by another trainjob run (pid {holder}); "
            "wait for it to end, stop it, or choose another --run-dir"
        ) from error
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return RunDirLock(path, handle)


def read_status_file(path: str) -> dict[str, Any] | None:
    """A previous run's status.json, or None when there is none (or it is not readable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_dir_holder(run_dir: str) -> int | None:
    """The pid of the `trainjob run` that holds a run dir's lock, or None when none does."""
    try:
        handle = open(os.path.join(run_dir, LOCK_FILE), encoding="utf-8")  # noqa: SIM115
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def read_from(path: str, offset: int, *, final: bool = False) -> tuple[str, int]:
    """Complete lines appended to a file since `offset` (and the unfinished last one when
    `final`), with the offset to read from next; ('', offset) when there is nothing."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return "", offset
    if not final:
        end = data.rfind(b"\n")
        data = data[: end + 1] if end >= 0 else b""
    return data.decode("utf-8", errors="replace"), offset + len(data)


FOLLOW_POLL_SECONDS: Final = 0.2


def log_names(log_dir: str) -> list[str]:
    """`<type>-<index>.log` files of a run's log dir, sorted; [] when there is none yet."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    return sorted(name for name in names if name.endswith(".log"))


def print_logs(
    log_dir: str, names: list[str] | None, out: TextIO, *, follow_until_free: str | None
) -> None:
    """`trainjob logs`: print the logs `names` (None: every replica's, prefixed with its name),
    then, with `follow_until_free` (a run dir), new lines until no `trainjob run` holds that
    run dir and nothing more was written."""
    offsets: dict[str, int] = {}

    def pump(final: bool) -> bool:
        current = names if names is not None else log_names(log_dir)
        width = max((len(n) - len(".log") for n in current), default=8)
        grew = False
        for name in current:
            text, offsets[name] = read_from(
                os.path.join(log_dir, name), offsets.get(name, 0), final=final
            )
            grew = grew or bool(text)
            label = None if names is not None else name.removesuffix(".log")
            for line in text.splitlines():
                out.write(view.log_line(label, line, width) + "\n")
        out.flush()
        return grew

    if follow_until_free is None:
        pump(final=True)
        return
    while True:
        running = run_dir_holder(follow_until_free) is not None
        if not pump(final=False) and not running:
            pump(final=True)
            return
        time.sleep(FOLLOW_POLL_SECONDS)


def read_log_tail(path: str, limit: int = LOG_TAIL_BYTES) -> str:
    """The end of a log file (decoded leniently), '' when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def write_json(path: str, data: Any) -> None:
    """Replace a JSON file at once (a reader never sees half of it)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


class Recorder:
    """Writes what a run leaves in its run directory; each file only when its content changed."""

    def __init__(self, run_plan: plan.RunPlan) -> None:
        self._plan = run_plan
        self._status: dict[str, Any] | None = None
        self._processes: dict[str, dict[str, Any]] = {}
        self._written_processes: dict[str, dict[str, Any]] | None = None

    def make_dirs(self) -> None:
        if not storage.is_url(self._plan.checkpoint_dir):  # s3:// and gs:// are the runtime's
            os.makedirs(self._plan.checkpoint_dir, exist_ok=True)
        os.makedirs(self._plan.log_dir, exist_ok=True)

    def open_log(self, process: plan.ProcessPlan, attempt: int, stamp: str) -> IO[bytes]:
        """A replica's log, opened for appending after a line that marks this attempt."""
        os.makedirs(os.path.dirname(process.log_path), exist_ok=True)
        log = open(process.log_path, "ab")  # noqa: SIM115 - the caller owns it
        log.write(f"=== trainjob: {process.name} attempt {attempt} started {stamp}\n".encode())
        log.flush()
        return log

    def write_status(self, data: dict[str, Any]) -> None:
        """status.json (what `trainjob status` reads)."""
        if data != self._status:
            write_json(self._plan.status_file, data)
            self._status = data

    def write_processes(self, records: Mapping[ReplicaKey, ProcessRecord]) -> None:
        """processes.json: the latest process of every replica (pid, attempt, port, exit)."""
        for key, record in records.items():
            self._processes[naming.replica_label(key)] = {
                "pid": record.pid,
                "attempt": record.attempt,
                "port": record.port,
                "alive": record.alive,
                "exitCode": record.exit_code,
            }
        if self._processes != self._written_processes:
            write_json(os.path.join(self._plan.run_dir, PROCESSES_FILE), self._processes)
            self._written_processes = {k: dict(v) for k, v in self._processes.items()}

    def cause(self, key: ReplicaKey) -> outcome.Cause:
        """Why a replica failed, quoted from the end of its log."""
        path = self._plan.process(key).log_path
        return outcome.Cause(
            naming.replica_label(key), logfilter.last_exception_line(read_log_tail(path)), path
        )

    def has_checkpoint(self) -> bool:
        """Whether the checkpoint directory holds anything but the runtime's scratch
        directories (a new run would resume from it)."""
        try:
            entries = os.listdir(self._plan.checkpoint_dir)
        except OSError:
            return False
        return any(not name.startswith(".") for name in entries)

    def export(self) -> str | None:
        """The exported model the runtime leaves in the checkpoint directory, if any."""
        candidate = os.path.join(self._plan.checkpoint_dir, "export")
        return candidate if os.path.exists(candidate) else None
