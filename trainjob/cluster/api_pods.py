"""Pods of one's own and port-forwards (`trainjob tensorboard` on a cluster): create, read
and delete a single Pod, and carry local connections to one of its ports through the API
server's portforward subresource, as `kubectl port-forward` does.

With `trainjob.cluster.api` the only modules that call the API server (import-linter keeps it
so). The connection, the request timeout and the error mapping are `api`'s (`Cluster.core`,
`Cluster.call`, `Cluster.translate`, `network_cause`): every failure is one `ClusterError` in
the API server's words, as there.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import threading
import time
import weakref
from typing import Any, Final

from kubernetes import stream as _k8s_stream
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from trainjob.cluster.api import Cluster, Obj, k8s, network_cause
from trainjob.cluster.errors import ClusterError

k8s_stream: Any = _k8s_stream  # partly typed, as in `api`

# How long a finished connection waits for the proxy thread to close its side (`_end_gently`):
# it answers at once, unless the API server's WebSocket is stuck.
GENTLE_END_SECONDS: Final = 2.0
# How long `Forwarder.close` waits for the carried connections' streams to end before the
# caller goes on (and deletes the Pod): each ends within GENTLE_END_SECONDS and twice that
# for the proxy thread's last write, unless the API server is stuck.
CLOSE_SECONDS: Final = 5.0
# The kubernetes package names the thread that copies a port-forward's bytes so
# (kubernetes.stream.ws_client.PortForward); its failures are ours to word (`proxy_failure`).
PROXY_THREAD_PREFIX: Final = "Kubernetes port forward proxy"


def proxy_failure(thread_name: str | None, error: BaseException | None) -> str | None:
    """What to tell of an exception that ended a thread (pure): for the kubernetes package's
    port-forward proxy, which dies on a write to a stream the API server or the kubelet has
    ended (the Pod stopped, the connection dropped), one line with the cause; None for any
    other thread or a programming error, whose traceback Python prints as usual."""
    if not (thread_name or "").startswith(PROXY_THREAD_PREFIX):
        return None
    if not isinstance(error, OSError):  # a socket's or TLS's failure (SSLEOFError seen)
        return None
    return f"the stream to the Pod ended: {network_cause(error) or type(error).__name__}"


# The open forwarders, told of their proxy threads' failures by `_install_proxy_excepthook`'s
# hook.
_OPEN: weakref.WeakSet[Forwarder] = weakref.WeakSet()
_HOOK_LOCK = threading.Lock()


def _install_proxy_excepthook() -> None:
    """Once per process: a proxy thread's failure becomes a line in each open forwarder's
    `errors` instead of a traceback on the user's terminal (the thread is the kubernetes
    package's: nothing else catches what it raises)."""
    with _HOOK_LOCK:
        previous = threading.excepthook
        if getattr(previous, "trainjob_port_forward", False):
            return

        def hook(args: threading.ExceptHookArgs) -> None:
            name = args.thread.name if args.thread is not None else None
            told = proxy_failure(name, args.exc_value)
            if told is None:
                previous(args)
                return
            for forwarder in list(_OPEN):
                forwarder.errors.put(
                    f"port-forward to Pod {forwarder.namespace}/{forwarder.pod}: {told}"
                )

        hook.trainjob_port_forward = True  # type: ignore[attr-defined]
        threading.excepthook = hook


class Pods:
    """Create, read and delete single Pods in the cluster's namespace, and forward a local port
    to one of them (`trainjob tensorboard`)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.namespace = cluster.namespace

    def create(self, body: Obj) -> Obj:
        """Create the Pod; ClusterError with the API server's words when it is refused (Pod
        Security admission, a quota, RBAC)."""
        name = body["metadata"]["name"]
        created = self.cluster.call(
            f"create Pod {self.namespace}/{name}",
            lambda: self.cluster.core.create_namespaced_pod(self.namespace, body),
        )
        result: Obj = self.cluster.connection.api.sanitize_for_serialization(created)
        return result

    def read(self, name: str) -> Obj | None:
        """The Pod, or None when it is gone."""
        try:
            pod = self.cluster.core.read_namespaced_pod(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise self.cluster.translate(f"read Pod {self.namespace}/{name}", error) from error
        except (HTTPError, OSError) as error:
            raise self.cluster.translate(f"read Pod {self.namespace}/{name}", error) from error
        result: Obj = self.cluster.connection.api.sanitize_for_serialization(pod)
        return result

    def delete(self, name: str) -> None:
        """Delete the Pod at once (no grace: it serves nobody any more); gone is fine."""
        what = f"delete Pod {self.namespace}/{name}"
        try:
            self.cluster.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise self.cluster.translate(what, error) from error
        except (HTTPError, OSError) as error:
            raise self.cluster.translate(what, error) from error

    def forward(self, pod: str, remote_port: int, address: str, port: int | None) -> Forwarder:
        """Listen on address:port (None: `remote_port` if free, else any free port) and carry
        every connection to the Pod's `remote_port`, as `kubectl port-forward` does."""
        listener = _listen(address, port, remote_port)
        # An ApiClient of its own: the kubernetes package's websocket calls swap the client's
        # call_api for their duration, which would send concurrent API calls astray.
        api = k8s.ApiClient(configuration=self.cluster.connection.api.configuration)
        return Forwarder(listener, k8s.CoreV1Api(api), api, pod, self.namespace, remote_port)


def _listen(address: str, port: int | None, preferred: int) -> socket.socket:
    candidates = [preferred, 0] if port is None else [port]
    for candidate in candidates:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((address, candidate))
        except OSError as error:
            listener.close()
            if candidate == candidates[-1]:
                raise ClusterError(
                    f"cannot listen on {address}:{candidate}: {error.strerror}"
                ) from error
            continue
        listener.listen(32)
        return listener
    raise AssertionError("unreachable")  # the loop returns or raises


class Forwarder:
    """A local listener whose connections each open a port-forward stream to the Pod (the
    API server's portforward subresource over a WebSocket) and copy bytes both ways."""

    def __init__(
        self,
        listener: socket.socket,
        core: Any,
        api: Any,
        pod: str,
        namespace: str,
        remote_port: int,
    ) -> None:
        self._listener = listener
        self._core = core
        self._api = api
        self.pod = pod
        self.namespace = namespace
        self.remote_port = remote_port
        self.address, self.port = listener.getsockname()[:2]
        self.errors: queue.Queue[str] = queue.Queue()  # why a connection could not be carried
        self._closed = threading.Event()
        self._carries: dict[threading.Thread, socket.socket] = {}  # each with its client
        self._carries_lock = threading.Lock()
        _install_proxy_excepthook()
        _OPEN.add(self)
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="port-forward")
        self._acceptor.start()

    def close(self) -> None:
        """Stop accepting, end every carried connection and wait (at most CLOSE_SECONDS)
        until its stream to the Pod has ended. The caller deletes the Pod next: a stream still
        open then is cut by the API server while the proxy thread writes to it, which printed
        a traceback on the user's terminal (4 of 16 `trainjob tensorboard` stopped after a
        page load, on kind)."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close alone may not
        with contextlib.suppress(OSError):
            self._listener.close()
        deadline = time.monotonic() + CLOSE_SECONDS
        self._acceptor.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._carries_lock:
            carries = dict(self._carries)
        for client in carries.values():
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)  # its carry sees the end at once
        for thread in carries:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        _OPEN.discard(self)
        with contextlib.suppress(Exception):
            self._api.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                # Opened one at a time, in this thread: see Pods.forward about call_api.
                forward = k8s_stream.portforward(
                    self._core.connect_get_namespaced_pod_portforward,
                    self.pod,
                    self.namespace,
                    ports=str(self.remote_port),
                )
            except Exception as error:  # ApiException(status=0) for a refused WebSocket
                self.errors.put(
                    f"port-forward to Pod {self.namespace}/{self.pod}: {network_cause(error)}"
                )
                client.close()
                continue
            carry = threading.Thread(
                target=self._carry, args=(client, forward), daemon=True, name="port-forward-io"
            )
            with self._carries_lock:
                self._carries[carry] = client
            carry.start()

    def _carry(self, client: socket.socket, forward: Any) -> None:
        remote = forward.socket(self.remote_port)
        remote.setblocking(True)
        ends = [client, remote]
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select(ends, [], [], 1.0)
                for end in readable:
                    data = end.recv(65536)
                    if not data:
                        return
                    (remote if end is client else client).sendall(data)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                client.close()
            _end_gently(remote)
            _wait_stream_ended(forward)
            error = forward.error(self.remote_port)
            if error:
                self.errors.put(f"port-forward to Pod {self.namespace}/{self.pod}: {error}")
            with contextlib.suppress(Exception):
                forward.close()
            with self._carries_lock:
                self._carries.pop(threading.current_thread(), None)


def _wait_stream_ended(forward: Any) -> None:
    """Until the proxy thread has sent what it still held and closed the WebSocket (it does
    so once our side of its socket pair is closed), at most GENTLE_END_SECONDS."""
    deadline = time.monotonic() + GENTLE_END_SECONDS
    while time.monotonic() < deadline:
        try:
            if not forward.connected:
                return
        except Exception:  # a WebSocket already torn down: ended too
            return
        time.sleep(0.02)


def _end_gently(remote: Any) -> None:
    """End our side of the kubernetes package's socket pair so that its proxy thread reads an
    end, not a reset: shut our writing side, then read (and drop) what it still sends until it
    closes its side, a moment later. Closed with unread bytes in it, our side would reset the
    pair and the proxy thread would die on ConnectionResetError, printing a traceback on the
    user's terminal (3 of 4 `trainjob tensorboard` stopped after a page load printed one)."""
    deadline = time.monotonic() + GENTLE_END_SECONDS
    with contextlib.suppress(OSError):
        remote.shutdown(socket.SHUT_WR)
        remote.settimeout(GENTLE_END_SECONDS)
        while remote.recv(65536) and time.monotonic() < deadline:
            pass
