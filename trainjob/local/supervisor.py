"""The replicas' processes: started, watched, stopped. The only module of local mode that
starts processes or sends them signals.

A "pod" created is a process started in its own process group, a "pod" deleted is that group
sent SIGTERM, then SIGKILL after the grace period. Observations map to Pod phases: running ->
Running, exit 0 -> Succeeded, exit n -> Failed(n), killed by signal N -> Failed(128 + N), as the
kubelet reports containers. Each replica's output is copied to its log file and, line by line,
to `Supervisor.lines` for the terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Final

from trainjob.core import forkwire, policy
from trainjob.core.naming import ReplicaKey
from trainjob.local import netns, plan, usernet

EXEC_FAILED_EXIT_CODE: Final = 127  # what a shell reports for a command it cannot run
# A Python start and two system calls, and pasta's start (about 0.1 s here): seconds only on a
# machine that is very busy.
NETWORK_START_SECONDS: Final = 30.0

Line = tuple[ReplicaKey, int, str]  # replica, attempt, the line without its end


def container_exit_code(returncode: int) -> int:
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


def port_in_use(port: int) -> bool:
    """Whether another process listens on `port` (on any interface, as a TF task binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


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


def _wait_or_kill(process: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait up to `seconds` for a process asked to stop; SIGKILL it after that, then reap it."""
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Server:
    """A long-running helper process of one's own (TensorBoard), its output in a log file."""

    def __init__(self, argv: list[str], log_path: str) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self._popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    def exit_code(self) -> int | None:
        returncode = self._popen.poll()
        return None if returncode is None else container_exit_code(returncode)

    def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after the grace period; returns once it has exited."""
        if self._popen.poll() is not None:
            return
        self._popen.terminate()
        _wait_or_kill(self._popen, grace_seconds)


# The fork server's TensorFlow import: a few seconds, a minute only on a machine very busy.
FORK_SERVER_START_SECONDS: Final = 60.0
FORK_SERVER_ANSWER_SECONDS: Final = 30.0


class ForkedProcess:
    """A replica forked by the fork server: the part of a Popen the supervisor uses (the
    server, its parent, reaps it and reports its exit)."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, server: ForkServer) -> None:
        self.pid = pid
        self.stdout = stdout
        self._server = server

    @property
    def returncode(self) -> int | None:
        return self._server.returncode_of(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_for(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One process that imported TensorFlow once and forks the runtime's replicas from itself
    (`trainjob.runtime.forkserver`; `trainjob.core.forkwire` says why and what it accepts)."""

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self._popen = popen
        self._sock = sock
        self._replies: queue.Queue[dict[str, object]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        self._gone = False
        self._lock = threading.Lock()  # one request at a time
        self._requests = 0  # the number of the latest request; its answer carries it
        self._reader = threading.Thread(target=self._read, name="trainjob-forkserver", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        env: Mapping[str, str],
        cwd: str,
        preexec_fn: Callable[[], None] | None = None,
        timeout: float = FORK_SERVER_START_SECONDS,
    ) -> ForkServer | str:
        """A server started with the environment of the first replica it serves, once it has
        imported TensorFlow; why not otherwise."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "trainjob.runtime.forkserver", str(theirs.fileno())],
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # Ctrl-C reaches the supervisor, which closes it
                preexec_fn=preexec_fn,  # noqa: PLW1509  # the run's namespaces, as a replica's
            )
        except (OSError, subprocess.SubprocessError) as error:
            ours.close()
            return f"cannot start the fork server: {error}"
        finally:
            theirs.close()
        server = cls(popen, ours)
        answer = server._reply(timeout)
        if forkwire.READY not in answer:
            server.close()
            return str(answer.get("refused") or "the fork server did not start")
        return server

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(forkwire.MAX_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                with self._changed:
                    self._gone = True
                    self._changed.notify_all()
                self._replies.put({})
                return
            message = forkwire.decode(data)
            pid, code = message.get("exited"), message.get("returncode")
            if isinstance(pid, int) and isinstance(code, int):
                with self._changed:
                    self._exits[pid] = code
                    self._changed.notify_all()
            elif message.get("id") in (None, self._requests):
                self._replies.put(message)
            elif isinstance(late := message.get("started"), int) and late > 0:
                # The answer to a request given up on (it waited past its time): nobody would
                # stop a replica started for it, so it is stopped now.
                _signal_group(late, signal.SIGKILL)

    def _reply(self, timeout: float) -> dict[str, object]:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return {}

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str, output_fd: int
    ) -> int | str:
        """Fork a replica writing to `output_fd` (the caller closes its own copy): its pid, or
        why the server would not (then it is started as a process of its own)."""
        with self._lock:
            if self._gone:
                return "the fork server has exited"
            self._requests += 1
            message = forkwire.encode(forkwire.request(self._requests, argv, env, cwd))
            try:
                socket.send_fds(self._sock, [message], [output_fd])
            except OSError as error:
                return f"the fork server cannot be reached: {error}"
            answer = self._reply(FORK_SERVER_ANSWER_SECONDS)
            if not answer:
                self._requests += 1  # a late answer to this one is not taken for the next
        pid = answer.get("started")
        if isinstance(pid, int):
            return pid
        return str(answer.get("refused") or "the fork server did not answer")

    def returncode_of(self, pid: int) -> int | None:
        with self._changed:
            code = self._exits.get(pid)
            if code is None and self._gone and not _exists(pid):
                code = -signal.SIGKILL  # its parent, the server, was killed: no status left
            return code

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                code = self.returncode_of(pid)
                if code is not None:
                    return code
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                # Woken by each exit; a server gone is checked again every second.
                self._changed.wait(1.0 if remaining is None else min(remaining, 1.0))

    def close(self) -> None:
        """Stop the server (its replicas go on: they are the supervisor's to stop)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        _wait_or_kill(self._popen, 5)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_pasta(environ: Mapping[str, str]) -> str | None:
    """pasta's path on the caller's PATH (Debian package passt), else None."""
    return shutil.which(usernet.PASTA, path=environ.get("PATH", os.defpath))


class PrivateNetwork:
    """The run's own network namespace (see `trainjob.local.netns` for why and how): held by a
    helper process, joined by every replica before its exec; with pasta attached
    (`trainjob.local.usernet`) when it is installed, for outbound connections."""

    def __init__(self, holder: subprocess.Popen[bytes], namespaces: list[tuple[int, int]]):
        self._holder = holder
        self._namespaces = namespaces  # (open fd, CLONE_NEW*), the user namespace first
        self._setns = netns.joiner()
        self._pasta: subprocess.Popen[bytes] | None = None
        # Why the replicas have no way out (no pasta, or it failed); None once pasta is up.
        self.outbound_problem: str | None = "pasta is not started"

    @classmethod
    def start(
        cls,
        environ: Mapping[str, str],
        expose: Sequence[int] = (),
        timeout: float = NETWORK_START_SECONDS,
    ) -> PrivateNetwork | str:
        """The namespace, or why there is none (in words for the user); its way out through
        pasta when pasta is installed (`outbound_problem` says why not otherwise)."""
        env = dict(environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root(), environ.get("PYTHONPATH")) if p
        )
        try:
            holder = subprocess.Popen(
                [sys.executable, "-m", "trainjob.local.netns"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the supervisor, which closes it
            )
        except OSError as error:
            return f"cannot start {sys.executable}: {error}"
        answer = _first_line(holder, timeout)
        if answer != netns.READY:
            _stop_holder(holder)
            if answer.startswith(netns.UNAVAILABLE):
                return answer[len(netns.UNAVAILABLE) :]
            return f"its helper process failed: {answer or 'no answer'}"
        namespaces: list[tuple[int, int]] = []
        try:
            for kind, flag in (("user", netns.CLONE_NEWUSER), ("net", netns.CLONE_NEWNET)):
                ours, theirs = f"/proc/self/ns/{kind}", f"/proc/{holder.pid}/ns/{kind}"
                if os.path.samestat(os.stat(ours), os.stat(theirs)):
                    continue  # root made no user namespace: nothing to join there
                namespaces.append((os.open(theirs, os.O_RDONLY | os.O_CLOEXEC), flag))
        except OSError as error:
            for fd, _ in namespaces:
                os.close(fd)
            _stop_holder(holder)
            return f"cannot open the namespace: {error}"
        network = cls(holder, namespaces)
        pasta = find_pasta(environ)
        if pasta is None:
            network.outbound_problem = usernet.NOT_INSTALLED
        else:
            network.outbound_problem = network._attach_pasta(pasta, expose, timeout)
        return network

    def _attach_pasta(self, pasta: str, expose: Sequence[int], timeout: float) -> str | None:
        """Start pasta on the namespace and wait for its default route (and the exposed ports
        listening inside); why that failed, else None."""
        # pasta opens the namespaces by path once it runs as the user it will stay: ours,
        # inherited, as /proc/self/fd/N (the holder's /proc/<pid>/ns/* are refused to it).
        paths = {flag: f"/proc/self/fd/{fd}" for fd, flag in self._namespaces}
        argv = usernet.pasta_argv(
            pasta,
            paths[netns.CLONE_NEWNET],
            paths.get(netns.CLONE_NEWUSER),
            uid=os.geteuid(),
            gid=os.getegid(),
            expose=expose,
        )
        with tempfile.TemporaryFile() as output:
            try:
                self._pasta = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C reaches the supervisor, which stops it
                    pass_fds=[fd for fd, _ in self._namespaces],
                )
            except OSError as error:
                return f"cannot start {pasta}: {error}"
            assert self._holder.stdin is not None
            with contextlib.suppress(OSError):  # the holder stops pasta if we cannot
                self._holder.stdin.write(f"{self._pasta.pid}\n".encode())
                self._holder.stdin.flush()
            deadline = time.monotonic() + timeout
            while self._pasta.poll() is None and time.monotonic() < deadline:
                if self._routed() and all(self.port_in_use(port) for port in expose):
                    return None
                time.sleep(0.02)
            code = self._pasta.poll()
            self._stop_pasta()
            output.seek(0)
            words = output.read().decode("utf-8", errors="replace")
        return usernet.pasta_problem(words, code)

    def _routed(self) -> bool:
        tables = []
        for name in ("route", "ipv6_route"):
            try:
                with open(f"/proc/{self._holder.pid}/net/{name}", encoding="ascii") as table:
                    tables.append(table.read())
            except OSError:
                tables.append("")
        return usernet.routed(tables[0], tables[1])

    def enter(self) -> None:
        """Join the namespaces: run in the forked child before exec (the fds are still open
        there; close_fds and O_CLOEXEC close them after)."""
        for fd, flag in self._namespaces:
            self._setns(fd, flag)

    def port_in_use(self, port: int) -> bool:
        """Whether something in the namespace listens on `port` (only the run's replicas, and
        pasta on the ports exposed to them, can)."""
        return netns.listening(self._holder.pid, port)

    def _stop_pasta(self) -> None:
        if self._pasta is None:
            return
        if self._pasta.poll() is None:
            self._pasta.terminate()
            _wait_or_kill(self._pasta, 5)
        self._pasta = None

    def close(self) -> None:
        for fd, _ in self._namespaces:
            os.close(fd)
        self._namespaces = []
        self._stop_pasta()
        _stop_holder(self._holder)


def _first_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    """The holder's one-line answer; when it writes something else (a traceback), the end of
    what it wrote before exiting or before `timeout` seconds passed."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    text = b""
    deadline = time.monotonic() + timeout
    while True:
        first, newline, _ = text.decode("utf-8", errors="replace").partition("\n")
        if newline and first.startswith((netns.READY, netns.UNAVAILABLE)):
            return first.strip()
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        text += chunk
    return " / ".join(text.decode("utf-8", errors="replace").strip().splitlines()[-3:])


def _stop_holder(holder: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits then); SIGKILL if it does not within seconds."""
    for stream in (holder.stdin, holder.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    _wait_or_kill(holder, 5)


@dataclasses.dataclass(frozen=True)
class ProcessRecord:
    """The latest process of a replica, as processes.json shows it."""

    pid: int | None
    attempt: int
    port: int
    exit_code: int | None  # None while it runs; 128 + N when a signal ended it

    @property
    def alive(self) -> bool:
        return self.exit_code is None


@dataclasses.dataclass(frozen=True)
class Exit:
    """A replica's process that ended by itself (not one we were stopping)."""

    key: ReplicaKey
    exit_code: int


@dataclasses.dataclass
class _Child:
    process: plan.ProcessPlan
    attempt: int
    popen: subprocess.Popen[bytes] | ForkedProcess | None
    reader: threading.Thread | None
    exit_code: int | None = None  # set once exited (already 128+N for signals)
    finished_at: datetime.datetime | None = None
    deleting: bool = False
    kill_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.exit_code is None


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _read_output(
    key: ReplicaKey, attempt: int, stream: IO[bytes], log: IO[bytes], lines: queue.Queue[Line]
) -> None:
    """Copy a child's output to its log file and to the terminal queue, line by line."""
    with log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            lines.put((key, attempt, raw.decode("utf-8", errors="replace").rstrip("\r\n")))
    stream.close()


class Supervisor:
    """Every replica's current process, and the ones waiting for their port."""

    def __init__(
        self,
        environ: Mapping[str, str],
        cwd: str,
        now: Callable[[], datetime.datetime],
    ) -> None:
        self._environ = dict(environ)
        self._cwd = cwd
        self._now = now
        self._children: dict[ReplicaKey, _Child] = {}
        self._waiting_port: dict[ReplicaKey, int] = {}  # key -> attempt waiting for its port
        self._stopped_attempts: set[tuple[ReplicaKey, int]] = set()
        self.lines: queue.Queue[Line] = queue.Queue()
        self.records: dict[ReplicaKey, ProcessRecord] = {}
        self.network: PrivateNetwork | None = None  # None: replicas use this machine's network
        self._forking = forkwire.enabled(environ)
        self._fork_server: ForkServer | None = None
        # Why the latest replica of the runtime was started as a process of its own (None: forked).
        self.fork_problem: str | None = None if self._forking else f"{forkwire.SWITCH_ENV} is off"

    def use_private_network(self, expose: Sequence[int] = ()) -> str | None:
        """Start every later replica in a network of the run's own (its way out, if any, in
        `network.outbound_problem`); why that cannot be done here, else None."""
        network = PrivateNetwork.start(self._environ, expose)
        if isinstance(network, str):
            return network
        self.network = network
        return None

    def port_in_use(self, port: int) -> bool:
        """Whether another process listens on `port` where the replicas will bind it."""
        if self.network is not None:
            return self.network.port_in_use(port)
        return port_in_use(port)

    # ----- what is running -----
    def any_alive(self) -> bool:
        return any(child.alive for child in self._children.values())

    def stopping(self, key: ReplicaKey) -> bool:
        """Whether we asked this replica's process to stop and it has not exited yet."""
        child = self._children.get(key)
        return child is not None and child.deleting and child.alive

    def waiting_for_port(self, key: ReplicaKey) -> bool:
        return key in self._waiting_port

    def stopped_by_us(self, key: ReplicaKey, attempt: int) -> bool:
        return (key, attempt) in self._stopped_attempts

    def pid(self, key: ReplicaKey) -> int | None:
        """The pid of the replica's live process, None when none runs."""
        child = self._children.get(key)
        if child is None or not child.alive or child.popen is None:
            return None
        return child.popen.pid

    def observed(self) -> dict[ReplicaKey, policy.ObservedReplica]:
        """The processes as the policy engine sees Pods (a replica waiting for its port is a
        Pending Pod)."""
        observed = {
            key: observed_replica(child.attempt, child.exit_code, child.deleting, child.finished_at)
            for key, child in self._children.items()
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

    def _record(self, key: ReplicaKey, child: _Child) -> None:
        pid = child.popen.pid if child.popen is not None else None
        self.records[key] = ProcessRecord(pid, child.attempt, child.process.port, child.exit_code)

    # ----- actions -----
    def start(self, process: plan.ProcessPlan, attempt: int, log: IO[bytes]) -> str | None:
        """Start a replica's process writing to `log` (which it then owns); the reason it could
        not start (also written to the log), else None."""
        key = process.key
        self._waiting_port.pop(key, None)
        env = plan.process_env(process, self._environ)
        popen: subprocess.Popen[bytes] | ForkedProcess | None = self._forked(process, env)
        try:
            popen = popen or subprocess.Popen(
                list(process.argv),
                env=env,
                cwd=self._cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole
                # Safe with our reader threads: it takes no lock they could hold at the fork
                # (no import, no I/O, no queue), only setns through a function looked up before.
                preexec_fn=None if self.network is None else self.network.enter,  # noqa: PLW1509
            )
        except (OSError, subprocess.SubprocessError) as error:
            message = f"=== trainjob: cannot start {process.argv[0]!r}: {error}"
            log.write(f"{message}\n".encode())
            log.close()
            child = _Child(process, attempt, None, None, EXEC_FAILED_EXIT_CODE, self._now())
            self._children[key] = child
            self._record(key, child)
            return message
        assert popen.stdout is not None
        reader = threading.Thread(
            target=_read_output,
            args=(key, attempt, popen.stdout, log, self.lines),
            name=f"trainjob-{process.label}",
            daemon=True,
        )
        reader.start()
        self._children[key] = _Child(process, attempt, popen, reader)
        self._record(key, self._children[key])
        return None

    def _forked(self, process: plan.ProcessPlan, env: dict[str, str]) -> ForkedProcess | None:
        """The replica forked by the fork server, when it runs the runtime and the server
        takes it; None: start it as a process of its own (`fork_problem` says why)."""
        if not self._forking or forkwire.forkable_module(process.argv, sys.executable) is None:
            return None
        if self._fork_server is None:
            enter = None if self.network is None else self.network.enter
            server = ForkServer.start(env, self._cwd, enter)
            if isinstance(server, str):
                self._forking = False  # not tried again for this run
                self.fork_problem = server
                return None
            self._fork_server = server
        read_fd, write_fd = os.pipe()
        try:
            pid = self._fork_server.spawn(process.argv, env, self._cwd, write_fd)
        finally:
            os.close(write_fd)
        if isinstance(pid, str):
            os.close(read_fd)
            self.fork_problem = pid
            return None
        self.fork_problem = None
        return ForkedProcess(pid, os.fdopen(read_fd, "rb"), self._fork_server)

    def wait_for_port(self, key: ReplicaKey, attempt: int) -> bool:
        """Note that the replica waits for its port (like a Pod that cannot get its host port:
        Pending until the port is free); True the first time for this attempt."""
        first = self._waiting_port.get(key) != attempt
        self._waiting_port[key] = attempt
        return first

    def waiting(self) -> list[tuple[ReplicaKey, int]]:
        return list(self._waiting_port.items())

    def started(self, key: ReplicaKey) -> bool:
        return key in self._children

    def poll(self) -> list[Exit]:
        """Reap processes that exited, SIGKILL those past their grace period, forget the
        stopped ones; the processes that ended by themselves with a failure."""
        failures: list[Exit] = []
        mono = time.monotonic()
        for key, child in list(self._children.items()):
            if child.alive and child.popen is not None:
                code = child.popen.poll()
                if code is not None:
                    child.exit_code = container_exit_code(code)
                    child.finished_at = self._now()
                    self._record(key, child)
                    # Whatever the leader left behind in its group goes with it.
                    _signal_group(child.popen.pid, signal.SIGKILL)
                    if child.reader is not None:
                        child.reader.join(timeout=5)  # its last lines are in `lines` now
                    if child.exit_code != 0 and not child.deleting:
                        failures.append(Exit(key, child.exit_code))
            if child.alive and child.kill_at is not None and mono >= child.kill_at:
                assert child.popen is not None
                _signal_group(child.popen.pid, signal.SIGKILL)
                child.kill_at = None
            if child.deleting and not child.alive:
                del self._children[key]
        return failures

    def terminate(self, key: ReplicaKey) -> None:
        """Stop a replica: SIGTERM to its group now, SIGKILL after its grace period."""
        if self._waiting_port.pop(key, None) is not None:
            return
        child = self._children.get(key)
        if child is None:
            return
        if not child.alive:
            del self._children[key]
            return
        if child.deleting:
            return
        child.deleting = True
        self._stopped_attempts.add((key, child.attempt))
        assert child.popen is not None
        _signal_group(child.popen.pid, signal.SIGTERM)
        child.kill_at = time.monotonic() + child.process.grace_seconds

    def terminate_all(self) -> None:
        """Stop every replica; none waiting for its port will start."""
        for key in list(self._children):
            self.terminate(key)
        self._waiting_port.clear()

    def terminate_alive(self) -> None:
        """Stop every replica still running (the job is over); forget the waiting ones."""
        self._waiting_port.clear()
        for key, child in list(self._children.items()):
            if child.alive:
                self.terminate(key)

    def kill_all_now(self) -> None:
        for child in self._children.values():
            if child.alive and child.popen is not None:
                _signal_group(child.popen.pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """SIGKILL whatever is left, then reap it and collect the last of its output."""
        self.kill_all_now()
        for key, child in self._children.items():
            if child.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.popen.wait(timeout=10)
                if child.popen.returncode is not None and child.exit_code is None:
                    child.exit_code = container_exit_code(child.popen.returncode)
                    self._record(key, child)
            if child.reader is not None:
                child.reader.join(timeout=5)
        if self._fork_server is not None:
            self._fork_server.close()
            self._fork_server = None
        if self.network is not None:
            self.network.close()
            self.network = None
