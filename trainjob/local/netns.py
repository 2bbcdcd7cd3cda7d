"""A network of the run's own (Linux): nothing outside the run reaches the replicas'
TensorFlow servers.

Why: a TensorFlow task's gRPC server listens on every interface. ``GrpcServer::Init``
(tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc) calls
``builder.AddListeningPort(strings::StrCat("0.0.0.0:", requested_port), ...)``, which gRPC turns
into one dual-stack ``[::]`` socket (``ss -ltn`` shows ``*:<port>``). The host part of the task's
own address is never used for the bind, and nothing chooses it: ``ServerDef.port`` overrides only
the port, and no ConfigProto field or environment variable names a host. Such a server "accepts
connections from anywhere, and executes the graphs it is sent without performing any checks"
(TensorFlow's SECURITY.md), so anyone who reaches this machine could run code as the user through
a local run's replicas.

So the replicas share one network namespace of their own, made with only ``lo``: their TF_CONFIG
addresses (``127.0.0.1:<port>``) reach each other, nothing outside the namespace reaches them.
Making a network namespace needs CAP_SYS_ADMIN, which an ordinary user has inside a user
namespace of their own (their uid and gid map to themselves, so files keep their owner); root
makes only the network namespace. A holder process (``python -m trainjob.local.netns``, started
by the supervisor) makes them and waits; each replica joins them before its exec (setns: the
forked child is single-threaded, as joining a user namespace requires), and the supervisor reads
the holder's ``/proc/<pid>/net/tcp*`` to see which ports are taken inside.

A user-mode network (pasta, trainjob.local.usernet) attached to the namespace gives the replicas
outbound connections, and this machine's loopback on the ports the user names, while nothing
comes in; without pasta they have only the loopback. ``spec.networkIsolation: None`` or
``trainjob run --host-network`` runs them on this machine's network instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Final

CLONE_NEWNET: Final = 0x40000000
CLONE_NEWUSER: Final = 0x10000000
READY: Final = "ready"
UNAVAILABLE: Final = "unavailable: "
_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1
_IFREQ: Final = "16sH22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union
_TCP_LISTEN: Final = "0A"  # st column of /proc/net/tcp


def _syscall(name: str) -> Callable[..., int]:
    """libc's `name` as a function that raises OSError (Python 3.10/3.11 have no os.setns)."""
    function = getattr(ctypes.CDLL(None, use_errno=True), name)

    def call(*args: int) -> int:
        if function(*args) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return 0

    return call


def joiner() -> Callable[[int, int], int]:
    """setns(fd, nstype), looked up before any fork: a forked child only calls it."""
    return _syscall("setns")


def why_not(error: OSError) -> str:
    """A namespace the kernel refused, in the user's words."""
    if error.errno in (errno.EPERM, errno.EACCES):
        cause = (
            "this system does not let ordinary users make user namespaces (sysctl "
            "kernel.unprivileged_userns_clone, AppArmor's restrict_unprivileged_userns, or a "
            "container's seccomp profile)"
        )
    elif error.errno == errno.ENOSPC:
        cause = (
            "the limit on user or network namespaces is 0 or reached (sysctl "
            "user.max_user_namespaces, user.max_net_namespaces)"
        )
    elif error.errno in (errno.EINVAL, errno.ENOSYS):
        cause = "this kernel has no user or network namespaces"
    else:
        cause = "the kernel refused"
    return f"{cause}: {error.strerror or error}"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def loopback_up() -> None:
    """`ip link set lo up` (a new network namespace's lo is down; up, it has 127.0.0.1 and ::1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def make() -> str | None:
    """Move this process into a new network namespace (and a user namespace of its own unless
    it is root) with lo up; why it could not, else None. This process must be single-threaded."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    try:
        unshare = _syscall("unshare")
    except AttributeError:
        return "this C library has no unshare()"
    uid, gid = os.geteuid(), os.getegid()
    try:
        if uid == 0:
            try:
                unshare(CLONE_NEWNET)
            except OSError:
                # Root without CAP_SYS_ADMIN (a container): a user namespace may still grant it.
                unshare(CLONE_NEWUSER | CLONE_NEWNET)
                _map_self(uid, gid)
        else:
            unshare(CLONE_NEWUSER | CLONE_NEWNET)
            _map_self(uid, gid)
        loopback_up()
    except OSError as error:
        return why_not(error)
    return None


def _map_self(uid: int, gid: int) -> None:
    """Map the user to themselves: replicas see their own uid, their files keep their owner.
    An unprivileged process may map only its own ids, and its gid only once setgroups is off."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def listening(pid: int, port: int) -> bool:
    """Whether a TCP socket listens on `port` in the network namespace of process `pid`."""
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    if state == _TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue  # no IPv6 here, or the holder is gone: nothing listens that we can see
    return False


def main() -> int:
    """The holder: make the namespaces, say whether it worked, then wait for the supervisor to
    close our stdin (or to die, which closes it too). Each line it writes before that is the
    pid of a helper attached to the namespace (pasta, trainjob.local.usernet), stopped when
    the holder goes: a helper would otherwise keep the namespace, and itself, alive after a
    supervisor killed with SIGKILL."""
    problem = make()
    print(READY if problem is None else f"{UNAVAILABLE}{problem}", flush=True)
    if problem is None:
        helpers = [_pidfd(line) for line in sys.stdin.buffer]
        for fd in helpers:
            if fd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGTERM)
    return 0


def _pidfd(line: bytes) -> int | None:
    """The helper as a pidfd, taken when the supervisor names it: a pid number could name
    another process by the time the holder signals it."""
    try:
        return os.pidfd_open(int(line))
    except (ValueError, OSError):
        return None


if __name__ == "__main__":
    sys.exit(main())
