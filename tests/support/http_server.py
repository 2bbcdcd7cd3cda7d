"""A plain-HTTP server on loopback that plays the part of an API server, well or badly, for
the cluster side's client (`trainjob.cluster.api` over the real `kubernetes` package and
urllib3): every byte goes over a real socket, so the client's own timeouts, retries and
argument checks are what is tested, never a fake of the client.

Each accepted connection is handed to `behaviour(connection, server)`; the server counts the
connections and the request lines it read. Behaviours for the ways a server misbehaves are
below (`silent`, `stalled_body`, `dribbling_body`, `reset`), and `Answers` serves a few
objects and followed Pod logs (chunked, line by line as the kubelet flushes them)."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from tests.support import ports

Behaviour = Callable[[socket.socket, "HttpServer"], None]
HEAD_END: Final = b"\r\n\r\n"


class HttpServer:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self._listener = socket.create_server((ports.LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self.stopped = threading.Event()
        self.connections = 0
        self.requests: list[str] = []  # request lines, as read
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, name="http-accept", daemon=True)
        accept.start()
        self._threads.append(accept)

    @property
    def url(self) -> str:
        return f"http://{ports.LOOPBACK}:{self.port}"

    def read_request(self, connection: socket.socket) -> str | None:
        """The request line of the next request on `connection` (its head read whole; GET
        requests have no body), or None when the client closed it."""
        head = b""
        while HEAD_END not in head:
            chunk = _recv(connection)
            if not chunk:
                return None
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        with self._lock:
            self.requests.append(line)
        return line

    def hold(self) -> None:
        """Keep the connection open and silent until the server stops."""
        self.stopped.wait()

    def close(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            held = list(self._held)
        for connection in held:
            with contextlib.suppress(OSError):
                connection.close()
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        self._listener.settimeout(0.1)  # to see `stopped`; not a wait for the client
        while not self.stopped.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._held.append(connection)
            thread = threading.Thread(
                target=self._serve, args=(connection,), name="http-conn", daemon=True
            )
            thread.start()
            with self._lock:
                self._threads.append(thread)

    def _serve(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.behaviour(connection, self)


def _recv(connection: socket.socket) -> bytes:
    try:
        return connection.recv(65536)
    except OSError:
        return b""


@contextlib.contextmanager
def serving(behaviour: Behaviour) -> Iterator[HttpServer]:
    server = HttpServer(behaviour)
    try:
        yield server
    finally:
        server.close()


def kubeconfig(server: str, namespace: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: c, cluster: {{server: "{server}"}}}}]\n'
        "users: [{name: u, user: {token: x}}]\n"
        f"contexts: [{{name: ctx, context: {{cluster: c, user: u, namespace: {namespace}}}}}]\n"
        "current-context: ctx\n"
    )


# ----- the ways a server misbehaves -----
def silent(connection: socket.socket, server: HttpServer) -> None:
    """Accepts the connection, reads the request, never answers."""
    server.read_request(connection)
    server.hold()


def stalled_body(connection: socket.socket, server: HttpServer) -> None:
    """Answers the headers and the start of the body at once, then never the rest."""
    if server.read_request(connection) is None:
        return
    body = b'{"kind": "List", "items": ['
    connection.sendall(_head(200, "application/json", length=len(body) + 1000) + body)
    server.hold()


def dribbling_body(connection: socket.socket, server: HttpServer) -> None:
    """Answers the headers at once, then a byte of the body every 0.3 s and never its end:
    no single read waits long, so only a deadline on the whole request ends it."""
    if server.read_request(connection) is None:
        return
    connection.sendall(_head(200, "application/json") + _chunk(b'{"kind": "List", "items": ['))
    while not server.stopped.wait(0.3):
        connection.sendall(_chunk(b" "))


def reset(connection: socket.socket, server: HttpServer) -> None:
    """Reads the request, then resets the connection (RST, not a clean close)."""
    server.read_request(connection)
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


# ----- a server that answers: a few objects and followed Pod logs -----
class Answers:
    """Serves GETs of the paths in `objects` (JSON) and followed Pod logs: each log request
    opens a stream of its own (`streams`, in order); `say` sends a line on the newest, as one
    chunk, as the kubelet flushes each write. Anything else is a 404 Status."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects = objects
        self.log_requests: list[str] = []  # the request lines of log requests
        self.streams: list[queue.Queue[str | None]] = []

    def say(self, line: str | None) -> None:
        """A line on the newest stream (None ends it)."""
        self.streams[-1].put(line)

    def __call__(self, connection: socket.socket, server: HttpServer) -> None:
        while (line := server.read_request(connection)) is not None:
            path = line.split(" ")[1]
            route = path.partition("?")[0]
            if route.endswith("/log"):
                stream: queue.Queue[str | None] = queue.Queue()
                self.streams.append(stream)
                self.log_requests.append(line)
                self._follow(connection, server, stream)
                return  # a followed log ends with its connection
            if route in self.objects:
                body = json.dumps(self.objects[route]).encode()
                connection.sendall(_head(200, "application/json", length=len(body)) + body)
            else:
                body = json.dumps(
                    {"kind": "Status", "status": "Failure", "code": 404, "message": "not found"}
                ).encode()
                connection.sendall(_head(404, "application/json", length=len(body)) + body)

    @staticmethod
    def _follow(
        connection: socket.socket, server: HttpServer, lines: queue.Queue[str | None]
    ) -> None:
        # As the kubelet: no head until the first line is written (a quiet container's
        # stream gives none), then a chunk per line.
        sent_head = False
        while not server.stopped.is_set():
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if not sent_head:
                connection.sendall(_head(200, "text/plain"))
                sent_head = True
            if line is None:
                connection.sendall(b"0\r\n\r\n")
                return
            connection.sendall(_chunk(line.encode() + b"\n"))


def _head(status: int, content_type: str, length: int | None = None) -> bytes:
    reason = {200: "OK", 404: "Not Found"}[status]
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n"
    ).encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"
