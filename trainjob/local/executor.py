"""Run a planned TrainJob as local processes: the only module of local mode with side effects.

Each tick it observes its child processes, asks the policy engine (the same
`trainjob.core.policy.reconcile` the operator calls) what to do, and does it: a "pod" created is
a process started, a "pod" deleted is a process group sent SIGTERM, then SIGKILL after the grace
period. Observations map to Pod phases: running -> Running, exit 0 -> Succeeded, exit n ->
Failed(n), killed by signal N -> Failed(128 + N), as the kubelet reports containers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import glob
import io
import json
import os
import queue
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import IO, Any, Final, TextIO

from trainjob.core import constants, policy
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.local import events, logfilter, outcome, plan, view

ReplicaKey = tuple[str, int]

POLL_SECONDS: Final = 0.1
REDRAW_SECONDS: Final = 0.5  # the live table refreshes at least this often on a TTY
EXEC_FAILED_EXIT_CODE: Final = 127  # what a shell reports for a command it cannot run
LOCK_FILE: Final = ".trainjob.lock"
PREPARE_MNIST: Final = (sys.executable, "-m", "trainjob", "data", "prepare", "mnist")
LOG_TAIL_BYTES: Final = 64 * 1024  # enough for the last traceback of a failed replica
STOPPED_BY_US: Final = (137, 143)  # SIGKILL / SIGTERM that trainjob sent


def pipe_reader_gone(stream: IO[str]) -> bool:
    """Whether `stream` is a pipe whose reading end is closed (Linux reports POLLERR on the
    writing end then, without anything having to be written). Not a pipe: never gone."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


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


def port_in_use(port: int) -> bool:
    """Whether another process listens on `port` (on any interface, as a TF task binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


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


def terminal_size(stream: TextIO) -> tuple[int, int]:
    """(columns, rows) of the terminal behind `stream`; 80x24 when it cannot be asked."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        size = shutil.get_terminal_size()
    return size.columns or 80, size.lines or 24


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct free TCP ports, chosen once per run (every TF task binds its own port)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def package_root() -> str:
    """The directory holding the `trainjob` package, for children's PYTHONPATH."""
    import trainjob

    return os.path.dirname(os.path.dirname(os.path.abspath(trainjob.__file__)))


def default_data_dir(environ: Mapping[str, str]) -> str:
    """Shared tfds data dir: $TRAINJOB_DATA_DIR, else ~/.cache/trainjob/datasets."""
    if environ.get(constants.ENV_DATA_DIR):
        return environ[constants.ENV_DATA_DIR]
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "trainjob", "datasets")


def exit_code_of(returncode: int) -> int:
    """Popen's -N (killed by signal N) is 128 + N, as container runtimes report it."""
    return 128 - returncode if returncode < 0 else returncode


def observed_replica(
    attempt: int, exit_code: int | None, deleting: bool, finished_at: datetime.datetime | None
) -> policy.ObservedReplica:
    """A process as the policy engine sees a Pod: Running until it exits, then its exit code."""
    if exit_code is None:
        phase = policy.PHASE_RUNNING
    else:
        phase = policy.PHASE_SUCCEEDED if exit_code == 0 else policy.PHASE_FAILED
    return policy.ObservedReplica(
        phase=phase,
        attempt=attempt,
        exit_code=exit_code,
        deleting=deleting,
        finished_at=finished_at,
    )


@dataclasses.dataclass
class Child:
    process: plan.ProcessPlan
    attempt: int
    popen: subprocess.Popen[bytes] | None
    reader: threading.Thread | None
    exit_code: int | None = None  # set once exited (already 128+N for signals)
    finished_at: datetime.datetime | None = None
    deleting: bool = False
    kill_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _read_output(
    key: ReplicaKey, attempt: int, stream: IO[bytes], log: IO[bytes], lines: queue.Queue[Any]
) -> None:
    """Copy a child's output to its log file and to the terminal queue, line by line."""
    with log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            lines.put((key, attempt, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    stream.close()


class Executor:
    def __init__(
        self,
        run_plan: plan.RunPlan,
        *,
        environ: Mapping[str, str],
        out: TextIO,
        tty: bool,
        show_logs: bool = True,
        verbose: bool = False,
        color: bool = False,
        cwd: str | None = None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
        size: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.plan = run_plan
        self.job = run_plan.job
        self.environ = dict(environ)
        self.out = out
        self.tty = tty
        self.show_logs = show_logs
        self.verbose = verbose
        self.color = color
        self.cwd = cwd or os.getcwd()
        self.now = now
        self.size = size or (lambda: terminal_size(out))
        self.children: dict[ReplicaKey, Child] = {}
        self.lines: queue.Queue[Any] = queue.Queue()
        self.progress: dict[ReplicaKey, events.ReplicaProgress] = {}
        self.status = st.JobStatus()
        self.stop_signal: str | None = None
        self.width = view.prefix_width(plan.all_keys(run_plan))
        self.export: str | None = None
        self.timer = core_progress.StepTimer()  # the job's step time, for the ETA
        # The chief's latest progress report (events carry it) and when it arrived: what the
        # operator would write to status.progress, written to status.json the same way.
        self.report: core_progress.Report | None = None
        self.report_received = self.now()
        self.problem: str | None = None
        self._written_status: dict[str, Any] | None = None
        self._pending: list[str] = []
        self._last: dict[str, dict[str, Any]] = {}
        self._drawn_at = 0.0
        self._out_gone = False
        self._drawn_widths: list[int] = []  # visible width of each table line last drawn
        self._filters: dict[ReplicaKey, logfilter.FilterState] = {}
        self._stopped_attempts: set[tuple[ReplicaKey, int]] = set()
        self._finished_attempts: set[tuple[ReplicaKey, int]] = set()
        self._exit_codes: dict[ReplicaKey, int | None] = {}
        self._waiting_port: dict[ReplicaKey, int] = {}  # key -> attempt waiting for its port
        self._styles = {key: view.prefix_style(i) for i, key in enumerate(plan.all_keys(run_plan))}

    # ----- output -----
    def emit(self, text: str) -> None:
        """A line for the terminal; on a TTY it goes above the live table."""
        if self.tty:
            self._pending.append(text)
        else:
            self._write(text + "\n")

    def _write(self, text: str) -> None:
        """Write to the terminal; once it is gone (a closed window, a closed pipe) the run goes
        on without it (it is being stopped, or its logs and status are in the run dir)."""
        if self._out_gone:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            # `trainjob run ... | head`: the reader is gone. Stop as a shell tool would on
            # SIGPIPE, but cleanly: nothing may go on training unseen.
            self._out_gone = True
            self.stop_signal = self.stop_signal or "SIGPIPE"
        except OSError:  # EIO from a hung-up terminal (SIGHUP is on its way)
            self._out_gone = True

    def _notice_reader_gone(self) -> None:
        """A reader that closed our pipe after taking everything we wrote (`| head -3` reads a
        whole chunk, so a fourth line may already be in it) leaves no write to fail: replicas
        that print nothing more would train on unseen. Ask the pipe itself, once per loop."""
        if not self._out_gone and not self.tty and pipe_reader_gone(self.out):
            self._out_gone = True
            self.stop_signal = self.stop_signal or "SIGPIPE"

    def _table_lines(self, started: datetime.datetime, width: int, height: int) -> list[str]:
        state = outcome.INTERRUPTED if self.stop_signal else None
        snapshot = view.Snapshot(
            self.job,
            self.status,
            self._rows(),
            self.progress,
            view.elapsed(started, self.now()),
            timer=self.timer,
            state=state,
            report=self.report,
        )
        segments = view.table_segments(snapshot, width=width, height=height)
        self._drawn_widths = [len(view.plain(line)) for line in segments]
        return [view.render_segments(line, self.color) for line in segments]

    def _flush_display(self, started: datetime.datetime, force: bool = False) -> None:
        if not self.tty:
            return
        mono = time.monotonic()
        if not self._pending and not force and mono - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = mono
        width, height = self.size()
        previous = view.drawn_height(self._drawn_widths, width)
        lines = self._table_lines(started, width, height)
        self._write(view.redraw(previous, lines, self._pending))
        self._pending = []

    def _erase_display(self) -> None:
        """Remove the live table and print what is pending: the summary takes its place."""
        if not self.tty:
            return
        width, _ = self.size()
        previous = view.drawn_height(self._drawn_widths, width)
        self._write(view.redraw(previous, [], self._pending))
        self._pending = []
        self._drawn_widths = []

    def _rows(self) -> list[view.ReplicaRow]:
        rows = []
        for key in self.job.replica_keys():
            record = self.status.record(key)
            child = self.children.get(key)
            state = record.state
            if child is not None and child.deleting and child.alive:
                state = "Stopping"
            elif key in self._waiting_port:
                state = "WaitPort"
            rows.append(
                view.ReplicaRow(
                    key=key,
                    state=state,
                    attempt=record.attempt,
                    exit_code=record.exit_code,
                    pid=child.pid if child is not None and child.alive else None,
                )
            )
        return rows

    def _note_progress(self, event: Mapping[str, Any]) -> None:
        """Keep the job's step timer (for the ETA): started afresh when training (re)starts.
        Replicas report the same global step; the timer ignores steps it has seen."""
        step = event.get("step")
        if event.get("event") == "start":
            self.timer = core_progress.StepTimer()
        elif isinstance(step, int) and not isinstance(step, bool):
            self.timer = self.timer.observe(step, time.monotonic())

    def _note_report(self, event: Mapping[str, Any]) -> None:
        if not isinstance(event.get("progress"), Mapping):
            return
        try:
            self.report = core_progress.parse_report(event["progress"])
        except core_progress.ReportError:
            return  # a foreign or damaged line: the table keeps the last good report
        self.report_received = self.now()

    def _drain_lines(self) -> None:
        from trainjob.runtime import progress as progress_events

        while True:
            try:
                key, attempt, text = self.lines.get_nowait()
            except queue.Empty:
                return
            stopping = (key, attempt) in self._stopped_attempts or self.stop_signal is not None
            event = progress_events.parse_line(text)
            if event is not None:
                if event.get("event") == "end" and event.get("status") == "succeeded":
                    self._finished_attempts.add((key, attempt))
                self.progress[key] = events.fold(self.progress.get(key), event)
                self._note_progress(event)
                self._note_report(event)
                if event.get("export") and event.get("chief"):
                    self.export = str(event["export"])
                if not self.tty or (view.keeps_line(key, event, self.job) and not stopping):
                    self.emit(view.event_line(key, event, self.job, stopped=stopping))
                continue
            if not self.show_logs:
                continue
            if (key, attempt) in self._finished_attempts and not self.verbose:
                # After its own successful end a replica only tears down; under
                # MultiWorkerMirrored the last one out logs its peers' "crash" (heartbeats).
                continue
            shown, self._filters[key] = logfilter.filter_line(
                text,
                self._filters.get(key, logfilter.FilterState()),
                verbose=self.verbose,
                stopping=stopping,
            )
            if shown is not None:
                self.emit(
                    view.prefix_line(
                        key, shown, self.width, color=self.color, style=self._styles.get(key)
                    )
                )

    # ----- processes -----
    def _start(self, key: ReplicaKey, attempt: int) -> None:
        process = self.plan.process(key)
        if port_in_use(process.port):
            # Like a Pod that cannot get its host port: Pending until the port is free (the
            # startup deadline bounds the wait); starting it would fail in gRPC's bind.
            if self._waiting_port.get(key) != attempt:
                self.emit(
                    f"! {process.label}: port {process.port} is in use by another process; "
                    f"waiting for it to be free (startupDeadlineSeconds "
                    f"{self.job.run_policy.startup_deadline_seconds})"
                )
            self._waiting_port[key] = attempt
            return
        self._waiting_port.pop(key, None)
        os.makedirs(os.path.dirname(process.log_path), exist_ok=True)
        log = open(process.log_path, "ab")  # noqa: SIM115 - closed by the reader thread
        stamp = st.format_time(self.now())
        log.write(f"=== trainjob: {process.name} attempt {attempt} started {stamp}\n".encode())
        log.flush()
        env = plan.process_env(process, self.environ)
        try:
            popen = subprocess.Popen(
                list(process.argv),
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
            )
        except OSError as error:
            message = f"=== trainjob: cannot start {process.argv[0]!r}: {error}\n"
            log.write(message.encode())
            log.close()
            self.emit(view.prefix_line(key, message.strip(), self.width))
            self.children[key] = Child(
                process, attempt, None, None, EXEC_FAILED_EXIT_CODE, self.now()
            )
            self._exit_codes[key] = EXEC_FAILED_EXIT_CODE
            return
        assert popen.stdout is not None
        reader = threading.Thread(
            target=_read_output,
            args=(key, attempt, popen.stdout, log, self.lines),
            name=f"trainjob-{process.label}",
            daemon=True,
        )
        reader.start()
        self.children[key] = Child(process, attempt, popen, reader)
        self._exit_codes[key] = None
        self._write_processes()

    def _cause(self, key: ReplicaKey) -> outcome.Cause:
        path = self.plan.process(key).log_path
        return outcome.Cause(
            plan.label(key), logfilter.last_exception_line(read_log_tail(path)), path
        )

    def _poll(self) -> None:
        mono = time.monotonic()
        for key, child in list(self.children.items()):
            if child.alive and child.popen is not None:
                code = child.popen.poll()
                if code is not None:
                    child.exit_code = exit_code_of(code)
                    child.finished_at = self.now()
                    self._exit_codes[key] = child.exit_code
                    # Whatever the leader left behind in its group goes with it.
                    _signal_group(child.popen.pid, signal.SIGKILL)
                    if child.reader is not None:
                        child.reader.join(timeout=5)
                    self._write_processes()
                    if child.exit_code != 0 and not child.deleting and self.stop_signal is None:
                        self._drain_lines()  # its last lines before the cause
                        self.emit(view.exit_line(self._cause(key), child.exit_code))
            if child.alive and child.kill_at is not None and mono >= child.kill_at:
                assert child.popen is not None
                _signal_group(child.popen.pid, signal.SIGKILL)
                child.kill_at = None
            if child.deleting and not child.alive:
                self._write_processes()
                del self.children[key]

    def _terminate(self, key: ReplicaKey) -> None:
        if self._waiting_port.pop(key, None) is not None:
            return
        child = self.children.get(key)
        if child is None:
            return
        if not child.alive:
            del self.children[key]
            return
        if child.deleting:
            return
        child.deleting = True
        self._stopped_attempts.add((key, child.attempt))
        assert child.popen is not None
        _signal_group(child.popen.pid, signal.SIGTERM)
        child.kill_at = time.monotonic() + child.process.grace_seconds

    def _kill_all_now(self) -> None:
        for child in self.children.values():
            if child.alive and child.popen is not None:
                _signal_group(child.popen.pid, signal.SIGKILL)

    def _observed(self) -> dict[ReplicaKey, policy.ObservedReplica]:
        observed = {
            key: observed_replica(child.attempt, child.exit_code, child.deleting, child.finished_at)
            for key, child in self.children.items()
        }
        for key, attempt in self._waiting_port.items():
            observed[key] = policy.ObservedReplica(
                phase=policy.PHASE_PENDING,
                attempt=attempt,
                exit_code=None,
                deleting=False,
                finished_at=None,
            )
        return observed

    # ----- files -----
    def _write_json(self, path: str, data: Any) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)

    def _write_status(self) -> None:
        data = {"jobName": self.job.name, **st.to_dict(self.job, self.status)}
        if self.report is not None:
            data["progress"] = core_progress.status_progress(self.report, self.report_received)
        if self.stop_signal is not None and not self.status.finished:
            data["state"] = outcome.INTERRUPTED
        if self.problem is not None and not self.status.finished:
            data["state"] = st.FAILED
            data["problem"] = self.problem
        if data != self._written_status:
            self._write_json(self.plan.status_file, data)
            self._written_status = data

    def _write_processes(self) -> None:
        """processes.json: the latest process of every replica (pid, attempt, port, exit)."""
        for child in self.children.values():
            self._last[child.process.label] = {
                "pid": child.pid,
                "attempt": child.attempt,
                "port": child.process.port,
                "alive": child.alive,
                "exitCode": child.exit_code,
            }
        self._write_json(os.path.join(self.plan.run_dir, "processes.json"), self._last)

    # ----- data -----
    def prepare_data(self, started: datetime.datetime) -> str | None:
        """Write the samples' offline MNIST into the shared data dir once (locked, idempotent).

        Returns None when the data is there, else one line saying why it is not."""
        data_dir = self.plan.data_dir
        if not self.plan.prepare_mnist or data_dir is None:
            return None
        if glob.glob(os.path.join(data_dir, "mnist", "*", "dataset_info.json")):
            return None
        try:
            os.makedirs(data_dir, exist_ok=True)
            lock = open(  # noqa: SIM115 - closed below
                os.path.join(data_dir, ".trainjob-prepare.lock"), "w", encoding="utf-8"
            )
        except OSError as error:
            return f"cannot write the offline MNIST into data dir {data_dir}: {error.strerror}"
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if glob.glob(os.path.join(data_dir, "mnist", "*", "dataset_info.json")):
                return None
            self.emit(f"Preparing the offline MNIST dataset in {data_dir} (once per machine)")
            self._flush_display(started, force=True)
            first = self.plan.processes[0]
            env = plan.process_env(first, self.environ)
            result = subprocess.run(
                [*PREPARE_MNIST, "--data-dir", data_dir],
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                check=False,
            )
            if result.returncode != 0:
                log_path = os.path.join(self.plan.log_dir, "prepare-data.log")
                with open(log_path, "w", encoding="utf-8") as handle:
                    handle.write(result.stdout + result.stderr)
                why = logfilter.last_exception_line(result.stdout + result.stderr)
                return (
                    f"preparing the offline MNIST failed (exit {result.returncode}): "
                    f"{why or 'no error message'} (log: {log_path})"
                )
        return None

    # ----- the loop -----
    @contextlib.contextmanager
    def _stop_signals(self) -> Iterator[None]:
        def record(signum: int, frame: FrameType | None) -> None:
            del frame
            name = signal.Signals(signum).name
            if self.stop_signal is not None:
                # A second Ctrl-C: no more grace.
                self._kill_all_now()
            self.stop_signal = name

        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            # SIGHUP: the terminal went away. The replicas run in their own sessions, so
            # without this they would outlive a closed window.
            signum: signal.signal(signum, record)
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def run(self) -> outcome.Summary:
        os.makedirs(self.plan.checkpoint_dir, exist_ok=True)
        os.makedirs(self.plan.log_dir, exist_ok=True)
        started = self.now()
        keys = set(plan.all_keys(self.plan))
        with self._stop_signals():
            for note in self.plan.notes:
                self.emit(f"note: {note}")
            self.emit(
                f"Running TrainJob {self.job.name}: {len(self.plan.processes)} process(es); "
                f"run dir {self.plan.run_dir}"
            )
            self.problem = None if self.stop_signal else self.prepare_data(started)
            if self.stop_signal is not None:
                self.problem = None  # Ctrl-C during the preparation is what ended it
            if self.problem is not None or self.stop_signal is not None:
                self._erase_display()
                return self._summary(started)
            stopping = False
            try:
                while True:
                    self._drain_lines()
                    self._notice_reader_gone()
                    self._poll()
                    if self.stop_signal is not None and not stopping:
                        stopping = True
                        self.emit(f"Stopping every replica ({self.stop_signal} received)")
                        for key in list(self.children):
                            self._terminate(key)
                        self._waiting_port.clear()
                    if stopping:
                        if not any(c.alive for c in self.children.values()):
                            break
                        self._flush_display(started)
                        time.sleep(POLL_SECONDS)
                        continue
                    for key, attempt in list(self._waiting_port.items()):
                        self._start(key, attempt)
                    decision = policy.reconcile(
                        self.job, self.status, self._observed(), keys, self.now()
                    )
                    self.status = decision.status
                    for event in decision.events:
                        self.emit(view.engine_event_line(event, self.color))
                    for key in decision.delete_pods:
                        self._terminate(key)
                    for rtype, index, attempt in decision.create_pods:
                        if (rtype, index) not in self.children:
                            self._start((rtype, index), attempt)
                    self._write_status()
                    if self.status.finished:
                        # Nothing may outlive `trainjob run`, whatever cleanPodPolicy says.
                        self._waiting_port.clear()
                        for key, child in list(self.children.items()):
                            if child.alive:
                                self._terminate(key)
                        if not any(c.alive for c in self.children.values()):
                            break
                    self._flush_display(started)
                    time.sleep(POLL_SECONDS)
            finally:
                self._kill_all_now()
                for key, child in self.children.items():
                    if child.popen is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.popen.wait(timeout=10)
                        if child.popen.returncode is not None and child.exit_code is None:
                            child.exit_code = exit_code_of(child.popen.returncode)
                            self._exit_codes[key] = child.exit_code
                    if child.reader is not None:
                        child.reader.join(timeout=5)
                self._drain_lines()
                self._write_processes()
            if self.stop_signal is not None and not self.status.finished:
                self.status = outcome.stopped_status(
                    self.status, self._exit_codes, self.stop_signal, self.now()
                )
            self._erase_display()
        return self._summary(started)

    def _has_checkpoint(self) -> bool:
        """Whether a new run would resume: a checkpoint was reported, or the checkpoint
        directory holds anything but the runtime's scratch directories."""
        if any(p.checkpoint or p.initial_step for p in self.progress.values()):
            return True
        try:
            entries = os.listdir(self.plan.checkpoint_dir)
        except OSError:
            return False
        return any(not name.startswith(".") for name in entries)

    def _summary(self, started: datetime.datetime) -> outcome.Summary:
        self._write_status()
        export = self.export
        if export is None:
            candidate = os.path.join(self.plan.checkpoint_dir, "export")
            if os.path.exists(candidate):
                export = candidate
        causes: list[outcome.Cause] = []
        if self.status.is_true(st.FAILED):
            causes = [self._cause(key) for key in outcome.failed_replicas(self.status, self.job)]
        return outcome.Summary(
            job=self.job,
            status=self.status,
            interrupted=self.stop_signal,
            elapsed_seconds=view.elapsed(started, self.now()),
            run_dir=self.plan.run_dir,
            log_dir=self.plan.log_dir,
            checkpoint_dir=self.plan.checkpoint_dir,
            export=export,
            progress=self.progress,
            causes=causes[:1],
            has_checkpoint=self._has_checkpoint(),
            problem=self.problem,
            report=self.report,
        )
