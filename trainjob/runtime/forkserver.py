"""``python -m trainjob.runtime.forkserver FD``: import TensorFlow once, then fork each replica
of `trainjob run` from this process (`trainjob.core.forkwire` says why, and the rules).

Started by the supervisor with the environment of the first replica it serves and a
SOCK_SEQPACKET socket on file descriptor FD. It prepares that environment as the runtime does
before its import (`entry.prepare_process_env`), imports TensorFlow, says ``ready``, then
serves requests one at a time: each a replica's command line, environment and working
directory, with its output's file descriptor. A replica whose prepared environment differs
from this one in anything read at start-up is refused (the supervisor starts it as a process
of its own). Otherwise the child forked for it becomes the replica: its own session, the
output on fds 1 and 2, the environment and sys.path of the replica, and the runtime's module
run as ``__main__``, exactly as ``python -m trainjob train`` runs it; it exits as that would.
The server reaps its children and reports each exit; it ends when the supervisor closes the
socket (the replicas go on: they are the supervisor's to stop).

Forking after `import tensorflow` is safe here: the import starts no thread of TensorFlow's
own, only OpenBLAS's (numpy's), which OpenBLAS stops before a fork and starts again when next
needed. The runtime creates TensorFlow's threads later, in the child, after it blocked
SIGTERM for them (`preemption.StopWatcher`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import runpy
import select
import signal
import socket
import sys
from collections.abc import Mapping

from trainjob.core import forkwire
from trainjob.runtime import entry, exitcodes
from trainjob.runtime import settings as settings_mod

# How long one select waits before looking for exited children again; a SIGCHLD ends it
# sooner (its wake-up fd is among those selected).
IDLE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Request:
    """What a child forked for a replica runs."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    output_fd: int


def prepared(env: Mapping[str, str]) -> dict[str, str] | str:
    """The environment the runtime would have when it imports TensorFlow; why it cannot be
    told (the runtime, started on its own, reports a bad configuration itself)."""
    result = dict(env)
    try:
        settings = settings_mod.from_env(result)
    except exitcodes.ConfigError as error:
        return f"its configuration is refused: {error}"
    entry.prepare_process_env(result, settings)
    return result


def _reap(sock: socket.socket) -> None:
    """Report every child that has exited (Popen's returncode: -N for signal N)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _send(sock, forkwire.exited(pid, code))


def _send(sock: socket.socket, message: Mapping[str, object]) -> None:
    with contextlib.suppress(OSError):  # the supervisor is gone; the next read says so
        sock.send(forkwire.encode(message))


def _request(
    message: Mapping[str, object], fds: list[int], env: Mapping[str, str]
) -> Request | str:
    """The request in a message, or why it is refused."""
    argv, replica_env, cwd = message.get("argv"), message.get("env"), message.get("cwd")
    if (
        not isinstance(argv, list)
        or not all(isinstance(a, str) for a in argv)
        or not isinstance(replica_env, dict)
        or not isinstance(cwd, str)
        or len(fds) != 1
    ):
        return "the request is malformed"
    module = forkwire.forkable_module(argv, sys.executable)
    if module is None:
        return "not the runtime's train command run by this Python"
    env_of_replica = {str(k): str(v) for k, v in replica_env.items()}
    theirs = prepared(env_of_replica)
    if isinstance(theirs, str):
        return theirs
    difference = forkwire.env_difference(env, theirs)
    if difference is not None:
        return difference
    return Request(module, argv[3:], theirs, cwd, fds[0])


def serve(sock: socket.socket, env: Mapping[str, str]) -> Request | None:
    """Answer requests until the supervisor closes the socket (None); in a forked child,
    return its request."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_read], [], [], IDLE_SECONDS)
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
        _reap(sock)
        if sock.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, forkwire.MAX_MESSAGE_BYTES, 1)
        if not data:
            return None
        message = forkwire.decode(data)
        number = message.get("id")
        request = _request(message, fds, env)
        if isinstance(request, str):
            for fd in fds:
                os.close(fd)
            _send(sock, forkwire.refused(number, request))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # Closed by the child once it leads its own process group: the pid is answered only
        # then, so that a signal to the group reaches it at once, as after Popen's start.
        in_group_read, in_group_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()  # its own session and process group, as the supervisor's Popen gives
            os.close(in_group_read)
            os.close(in_group_write)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_read)
            os.close(wake_write)
            sock.close()
            return request
        os.close(in_group_write)
        os.read(in_group_read, 1)  # b"" once the child closed its end (or died)
        os.close(in_group_read)
        os.close(request.output_fd)
        _send(sock, forkwire.started(number, pid))


def become(request: Request, server_python_path: str | None) -> None:
    """In the forked child (its own process group already): turn into the replica, then run
    it as ``python -m`` would."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(request.output_fd, 1)
    os.dup2(request.output_fd, 2)
    os.close(request.output_fd)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request.cwd)
    for key in [k for k in os.environ if forkwire.late(k) or k == forkwire.PYTHONPATH]:
        del os.environ[key]
    os.environ.update(request.env)
    sys.path[:] = forkwire.child_sys_path(
        [os.getcwd(), *sys.path[1:]], server_python_path, request.env.get(forkwire.PYTHONPATH)
    )
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Its global generator was seeded once, in the server: each replica gets its own, as
        # a process of its own would.
        numpy.random.seed()
    sys.argv = [request.module, *request.args]
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


def preload(env: Mapping[str, str]) -> None:
    """What nearly every replica imports after TensorFlow, imported once here as well (a module
    that fails to import is left to the replica, which reports it); then every object so far
    is kept out of the garbage collector's passes, whose writes to each object would copy the
    server's memory into each child page by page (measured: a forked replica of the
    multi-worker example used 3.6 CPU-seconds with both, 5.2 without, 6.5 as its own process)."""
    modules = ["tensorflow_datasets", "trainjob.cli", "trainjob.runtime.keras_runner"]
    if env.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True"):
        modules.insert(0, "tf_keras")  # what tf.keras is then; Keras 3 jobs import their own
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m trainjob.runtime.forkserver FD", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    server_python_path = os.environ.get(forkwire.PYTHONPATH)
    env = prepared(dict(os.environ))
    if isinstance(env, str):
        _send(sock, forkwire.refused(None, env))
        return 1
    os.environ.clear()
    os.environ.update(env)
    entry.configure_logging()  # as the runtime does before its import: the same log format
    import tensorflow  # noqa: F401  # the point of this process: once, for every replica

    preload(env)
    _send(sock, {forkwire.READY: os.getpid()})
    request = serve(sock, env)
    if request is None:
        return 0
    become(request, server_python_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
