"""`trainjob tensorboard`'s port-forward when its stream ends under it: the kubernetes
package's proxy thread dies on a write to a stream the API server has cut (the Pod deleted,
the connection dropped). That is told as one line to the forwarder, never as a traceback on
the user's terminal; any other thread's exception is printed as Python always does."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

from trainjob.cluster import api_pods

PROXY = "Kubernetes port forward proxy: 6006"


def test_a_proxy_threads_socket_failure_is_one_line_with_its_cause() -> None:
    cut = ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:2427)")
    assert api_pods.proxy_failure(PROXY, cut) == (
        "the stream to the Pod ended: EOF occurred in violation of protocol (_ssl.c:2427)"
    )
    assert api_pods.proxy_failure(PROXY, ConnectionResetError(104, "Connection reset by peer"))


@pytest.mark.parametrize(
    ("thread", "error"),
    [
        ("Kubernetes port forward proxy: 6006", RuntimeError("Unexpected websocket opcode: 9")),
        ("Kubernetes port forward proxy: 6006", AttributeError("'NoneType' has no 'send'")),
        ("port-forward-io", ssl.SSLEOFError(8, "EOF")),
        ("Thread-3 (serve)", ConnectionResetError(104, "reset")),
        (None, OSError("no thread")),
    ],
)
def test_other_threads_and_programming_errors_keep_their_traceback(
    thread: str | None, error: BaseException
) -> None:
    assert api_pods.proxy_failure(thread, error) is None


@contextlib.contextmanager
def open_forwarder() -> Iterator[api_pods.Forwarder]:
    """A real Forwarder on a real loopback listener; nothing connects, so its API client is
    never called."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    forwarder = api_pods.Forwarder(listener, None, None, "tb-1", "team-a", 6006)
    try:
        yield forwarder
    finally:
        forwarder.close()


def crash_in_thread(name: str, error: BaseException) -> None:
    """Raise `error` in a thread named `name`, as an uncaught exception."""

    def run() -> None:
        raise error

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What reached the hook that was in place before (Python's own prints the traceback):
    the thread's name and the exception, for each uncaught exception passed on to it."""
    reached: list[str] = []

    def previous(args: threading.ExceptHookArgs) -> None:
        reached.append(f"{args.thread.name if args.thread else None}: {args.exc_value!r}")

    monkeypatch.setattr(threading, "excepthook", previous)
    return reached


def test_a_cut_stream_is_told_to_the_forwarder_not_printed(printed: list[str]) -> None:
    with open_forwarder() as forwarder:
        crash_in_thread(PROXY, ssl.SSLEOFError(8, "EOF occurred"))
        assert printed == []
        assert forwarder.errors.get_nowait() == (
            "port-forward to Pod team-a/tb-1: the stream to the Pod ended: EOF occurred"
        )


def test_any_other_threads_exception_is_still_printed(printed: list[str]) -> None:
    with open_forwarder() as forwarder:
        crash_in_thread("Thread-9 (worker)", ValueError("a bug of ours"))
        crash_in_thread(PROXY, RuntimeError("Unexpected websocket opcode: 9"))
        assert printed == [
            "Thread-9 (worker): ValueError('a bug of ours')",
            f"{PROXY}: RuntimeError('Unexpected websocket opcode: 9')",
        ]
        assert forwarder.errors.empty()


def test_close_stops_listening_at_once() -> None:
    with open_forwarder() as forwarder:
        address = (forwarder.address, forwarder.port)
    with pytest.raises(OSError), socket.create_connection(address, timeout=2):
        pass
