"""The one free-port picker of the tests and benchmarks: every server they start (control
plane components, operators, TensorFlow servers) gets a port of its own."""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import Final

# Where the tests' servers listen (the node's API server excepted: its pods reach it elsewhere).
LOOPBACK: Final = "127.0.0.1"
# Ports this process has handed out: never handed out twice.
_HANDED_OUT_PORTS: set[int] = set()
# Ports handed out by any test process on this machine: one lock file per port, locked by the
# process that handed it out until it exits (the kernel drops the lock). The pytest-xdist
# workers and the run beside them pick from one range, and a port is free when picked but
# bound only when its server starts (a TensorFlow server 20 s later on loaded cores): a second
# process could pick it meanwhile. Seen in CI: a ps failed with "Could not start gRPC server"
# on its port.
RESERVATIONS: Final = Path(tempfile.gettempdir()) / "trainjob-test-ports"
_RESERVATION_FDS: dict[int, int] = {}
# Listening ports for the tests come from below the kernel's ephemeral range (and below
# Kubernetes' NodePort range, 30000-32767). A port asked of the kernel with bind(0) comes
# from the ephemeral range, where (a) two consecutive asks can return the same port (3 in
# 20,000 pairs here: an operator got one port for metrics and liveness and died on it) and
# (b) every outgoing connection also takes its local port, so a port free when chosen can be
# taken before its server binds.
_LISTEN_PORTS = range(10000, 30000)


class NoFreePortError(RuntimeError):
    """Every port tried was taken or handed out before."""


@functools.cache
def ephemeral_ports() -> range:
    """The kernel's range for the local ports of outgoing connections and bind(0)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def _bindable_everywhere(port: int) -> bool:
    """Whether nothing listens on `port` on any address (TF servers bind all interfaces)."""
    families = [(socket.AF_INET, "")] + ([(socket.AF_INET6, "::")] if socket.has_ipv6 else [])
    for family, host in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            # No IPv6 on this machine (EADDRNOTAVAIL, EAFNOSUPPORT): IPv4 decides.
    return True


def _reserve(port: int) -> bool:
    """Whether this process now holds `port` for good (False: another live process does)."""
    if not RESERVATIONS.is_dir():
        RESERVATIONS.mkdir(exist_ok=True)
        os.chmod(RESERVATIONS, 0o1777)  # any user's tests, as /tmp itself
    fd = os.open(RESERVATIONS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _RESERVATION_FDS[port] = fd  # held open: closing it would release the lock
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, outside the kernel's ephemeral range,
    and never handed out before by this process nor by another test process still running."""
    for _ in range(1000):
        port = random.choice(_LISTEN_PORTS)
        if port in _HANDED_OUT_PORTS or port in ephemeral_ports() or not _bindable_everywhere(port):
            continue
        if not _reserve(port):
            continue
        _HANDED_OUT_PORTS.add(port)
        return port
    raise NoFreePortError("no free TCP port below the ephemeral range on 127.0.0.1")
