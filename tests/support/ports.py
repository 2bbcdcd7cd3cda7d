"""The one free-port picker of the tests and benchmarks: every server they start (control
plane components, operators, TensorFlow servers) gets a port of its own."""

from __future__ import annotations

import errno
import functools
import random
import socket
from pathlib import Path
from typing import Final

# Where the tests' servers listen (the node's API server excepted: its pods reach it elsewhere).
LOOPBACK: Final = "127.0.0.1"
# Ports this process has handed out: never handed out twice.
_HANDED_OUT_PORTS: set[int] = set()
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, outside the kernel's ephemeral range,
    and never handed out before by this process."""
    for _ in range(1000):
        port = random.choice(_LISTEN_PORTS)
        if port in _HANDED_OUT_PORTS or port in ephemeral_ports() or not _bindable_everywhere(port):
            continue
        _HANDED_OUT_PORTS.add(port)
        return port
    raise NoFreePortError("no free TCP port below the ephemeral range on 127.0.0.1")
