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
import fcntl
import glob
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import IO, Any, Final, TextIO

from trainjob.core import constants, policy
from trainjob.core import status as st
from trainjob.local import display, plan

ReplicaKey = tuple[str, int]

POLL_SECONDS: Final = 0.1
REDRAW_SECONDS: Final = 0.5  # the live table refreshes at least this often on a TTY
EXEC_FAILED_EXIT_CODE: Final = 127  # what a shell reports for a command it cannot run


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
        cwd: str | None = None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
    ) -> None:
        self.plan = run_plan
        self.job = run_plan.job
        self.environ = dict(environ)
        self.out = out
        self.tty = tty
        self.show_logs = show_logs
        self.cwd = cwd or os.getcwd()
        self.now = now
        self.children: dict[ReplicaKey, Child] = {}
        self.lines: queue.Queue[Any] = queue.Queue()
        self.progress: dict[ReplicaKey, display.ReplicaProgress] = {}
        self.status = st.JobStatus()
        self.stop_signal: str | None = None
        self.table_height = 0
        self.width = display.prefix_width(plan.all_keys(run_plan))
        self.export: str | None = None
        self._written_status: dict[str, Any] | None = None
        self._pending: list[str] = []
        self._last: dict[str, dict[str, Any]] = {}
        self._drawn_at = 0.0

    # ----- output -----
    def emit(self, text: str) -> None:
        """A line for the terminal; on a TTY it goes above the live table."""
        if self.tty:
            self._pending.append(text)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def _flush_display(self, started: datetime.datetime, force: bool = False) -> None:
        if not self.tty:
            return
        mono = time.monotonic()
        if not self._pending and not force and mono - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = mono
        rows = self._rows()
        lines = display.table(
            self.job, self.status, rows, self.progress, display.elapsed(started, self.now())
        )
        self.out.write(display.redraw(self.table_height, lines, self._pending))
        self.out.flush()
        self.table_height = len(lines)
        self._pending = []

    def _rows(self) -> list[display.ReplicaRow]:
        rows = []
        for key in self.job.replica_keys():
            record = self.status.record(key)
            child = self.children.get(key)
            state = record.state
            if child is not None and child.deleting and child.alive:
                state = "Stopping"
            rows.append(
                display.ReplicaRow(
                    key=key,
                    state=state,
                    attempt=record.attempt,
                    exit_code=record.exit_code,
                    pid=child.pid if child is not None and child.alive else None,
                )
            )
        return rows

    def _drain_lines(self) -> None:
        from trainjob.runtime import progress as progress_events

        while True:
            try:
                key, _attempt, text = self.lines.get_nowait()
            except queue.Empty:
                return
            event = progress_events.parse_line(text)
            if event is not None:
                self.progress[key] = display.fold(self.progress.get(key), event)
                if event.get("export") and event.get("chief"):
                    self.export = str(event["export"])
                if not self.tty:
                    self.emit(display.event_line(key, event, self.job))
                continue
            if self.show_logs:
                self.emit(display.prefix_line(key, text, self.width))

    # ----- processes -----
    def _start(self, key: ReplicaKey, attempt: int) -> None:
        process = self.plan.process(key)
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
            self.emit(display.prefix_line(key, message.strip(), self.width))
            self.children[key] = Child(
                process, attempt, None, None, EXEC_FAILED_EXIT_CODE, self.now()
            )
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
        self._write_processes()

    def _poll(self) -> None:
        mono = time.monotonic()
        for key, child in list(self.children.items()):
            if child.alive and child.popen is not None:
                code = child.popen.poll()
                if code is not None:
                    child.exit_code = exit_code_of(code)
                    child.finished_at = self.now()
                    # Whatever the leader left behind in its group goes with it.
                    _signal_group(child.popen.pid, signal.SIGKILL)
                    if child.reader is not None:
                        child.reader.join(timeout=5)
                    self._write_processes()
            if child.alive and child.kill_at is not None and mono >= child.kill_at:
                assert child.popen is not None
                _signal_group(child.popen.pid, signal.SIGKILL)
                child.kill_at = None
            if child.deleting and not child.alive:
                self._write_processes()
                del self.children[key]

    def _terminate(self, key: ReplicaKey) -> None:
        child = self.children.get(key)
        if child is None:
            return
        if not child.alive:
            del self.children[key]
            return
        if child.deleting:
            return
        child.deleting = True
        assert child.popen is not None
        _signal_group(child.popen.pid, signal.SIGTERM)
        child.kill_at = time.monotonic() + child.process.grace_seconds

    def _kill_all_now(self) -> None:
        for child in self.children.values():
            if child.alive and child.popen is not None:
                _signal_group(child.popen.pid, signal.SIGKILL)

    def _observed(self) -> dict[ReplicaKey, policy.ObservedReplica]:
        return {
            key: observed_replica(child.attempt, child.exit_code, child.deleting, child.finished_at)
            for key, child in self.children.items()
        }

    # ----- files -----
    def _write_json(self, path: str, data: Any) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)

    def _write_status(self) -> None:
        data = st.to_dict(self.job, self.status)
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
    def prepare_data(self) -> int:
        """Write the samples' offline MNIST into the shared data dir once (locked, idempotent)."""
        data_dir = self.plan.data_dir
        if not self.plan.prepare_mnist or data_dir is None:
            return 0
        if glob.glob(os.path.join(data_dir, "mnist", "*", "dataset_info.json")):
            return 0
        os.makedirs(data_dir, exist_ok=True)
        with open(os.path.join(data_dir, ".trainjob-prepare.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if glob.glob(os.path.join(data_dir, "mnist", "*", "dataset_info.json")):
                return 0
            self.emit(f"Preparing the offline MNIST dataset in {data_dir} (once per machine)")
            first = self.plan.processes[0]
            env = plan.process_env(first, self.environ)
            python = sys.executable
            result = subprocess.run(
                [python, "-m", "trainjob", "data", "prepare", "mnist", "--data-dir", data_dir],
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                self.emit(result.stdout + result.stderr)
                self.emit(f"trainjob run: preparing MNIST failed (exit {result.returncode})")
                return result.returncode
        return 0

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
            signum: signal.signal(signum, record) for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def run(self) -> display.Summary:
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
            code = 0 if self.stop_signal else self.prepare_data()
            if code != 0:
                return self._summary(started, "data preparation failed")
            stopping = False
            try:
                while True:
                    self._drain_lines()
                    self._poll()
                    if self.stop_signal is not None and not stopping:
                        stopping = True
                        self.emit(f"Stopping every replica ({self.stop_signal} received)")
                        for key in list(self.children):
                            self._terminate(key)
                    if stopping:
                        if not any(c.alive for c in self.children.values()):
                            break
                        self._flush_display(started)
                        time.sleep(POLL_SECONDS)
                        continue
                    decision = policy.reconcile(
                        self.job, self.status, self._observed(), keys, self.now()
                    )
                    self.status = decision.status
                    for event in decision.events:
                        self.emit(display.engine_event_line(event))
                    for key in decision.delete_pods:
                        self._terminate(key)
                    for rtype, index, attempt in decision.create_pods:
                        if (rtype, index) not in self.children:
                            self._start((rtype, index), attempt)
                    self._write_status()
                    if self.status.finished:
                        # Nothing may outlive `trainjob run`, whatever cleanPodPolicy says.
                        for key, child in list(self.children.items()):
                            if child.alive:
                                self._terminate(key)
                        if not any(c.alive for c in self.children.values()):
                            break
                    self._flush_display(started)
                    time.sleep(POLL_SECONDS)
            finally:
                self._kill_all_now()
                for child in self.children.values():
                    if child.popen is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.popen.wait(timeout=10)
                    if child.reader is not None:
                        child.reader.join(timeout=5)
                self._drain_lines()
                self._write_processes()
            self._flush_display(started, force=True)
        return self._summary(started, None)

    def _summary(self, started: datetime.datetime, _why: str | None) -> display.Summary:
        self._write_status()
        export = self.export
        if export is None:
            candidate = os.path.join(self.plan.checkpoint_dir, "export")
            if os.path.exists(candidate):
                export = candidate
        return display.Summary(
            job=self.job,
            status=self.status,
            interrupted=self.stop_signal,
            elapsed_seconds=display.elapsed(started, self.now()),
            run_dir=self.plan.run_dir,
            log_dir=self.plan.log_dir,
            checkpoint_dir=self.plan.checkpoint_dir,
            export=export,
            progress=self.progress,
        )
