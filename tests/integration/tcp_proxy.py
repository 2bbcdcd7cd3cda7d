"""A TCP proxy on loopback between the operator and the API server, to break its connections
the way networks do: `cut` closes every connection and refuses new ones (a partition),
`heal` accepts again, `stall` freezes the connections open now without closing them (a
load balancer or NAT entry that silently stops forwarding) while new ones work.

TLS passes through untouched: the operator still verifies the API server's certificate,
issued for 127.0.0.1, which is where the proxy listens too.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Final

CHUNK: Final = 65536


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._refusing = False
        self._closed = False
        self.accepted = 0
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    # -- faults ---------------------------------------------------------------------------

    def cut(self) -> None:
        """Close every connection and refuse new ones until `heal`."""
        with self._lock:
            self._refusing = True
            pairs, self._open = self._open, []
        for client, upstream, _ in pairs:
            _close(client)
            _close(upstream)

    def heal(self) -> None:
        with self._lock:
            self._refusing = False

    def stall(self) -> int:
        """Stop forwarding on every connection open now, leaving it open; returns how many."""
        with self._lock:
            pairs = list(self._open)
        for _, _, frozen in pairs:
            frozen.set()
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        _close(self._listener)
        self.cut()

    # -- plumbing -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            frozen = threading.Event()
            with self._lock:
                self._open.append((client, upstream, frozen))
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=_pump, args=(source, sink, frozen), name="proxy-pump", daemon=True
                ).start()


def _pump(source: socket.socket, sink: socket.socket, frozen: threading.Event) -> None:
    """Copy bytes one way; once `frozen`, read nothing more and never close (a stall)."""
    try:
        while not frozen.is_set():
            data = source.recv(CHUNK)
            if not data or frozen.is_set():
                break
            sink.sendall(data)
    except OSError:
        pass
    if frozen.is_set():
        return
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
