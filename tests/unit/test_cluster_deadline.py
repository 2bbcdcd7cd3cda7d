"""The cluster side's requests against a real local HTTP server that misbehaves, through the
real `kubernetes` client and urllib3 (no fake of either):

- every cluster command gives up within its `--request-timeout` plus a second, however the
  server misbehaves (accepts and never answers; answers the headers, then stalls the body;
  dribbles the body a byte at a time; resets the connection), after one request: no retry;
- a followed Pod log (`trainjob logs -f`, `TrainJobClient.logs(follow=True)`) streams
  through the client call our code makes (its timeout argument must be one the installed
  client accepts), from a container that is quiet at first (no head until its first line).

tests/run also runs this module with the lowest `kubernetes` release pyproject.toml allows
(tests/constraints/kubernetes-lowest.txt)."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import http_server, waits
from trainjob import cli

pytestmark = pytest.mark.unit

REQUEST_TIMEOUT = 2.0  # seconds
NS = "team-q"
MISBEHAVIOURS = {
    "never answers": http_server.silent,
    "answers the headers, then stalls the body": http_server.stalled_body,
    "dribbles the body": http_server.dribbling_body,
    "resets the connection": http_server.reset,
}


def trainjob(*argv: str) -> tuple[int, str, float]:
    err = io.StringIO()
    started = time.monotonic()
    code = cli.main(list(argv), out=io.StringIO(), err=err)
    return code, err.getvalue(), time.monotonic() - started


def _config(tmp_path: Path, server: http_server.HttpServer) -> str:
    path = tmp_path / "config"
    path.write_text(http_server.kubeconfig(server.url, NS))
    return str(path)


COMMANDS = [
    ["get"],
    ["describe", "j"],
    ["logs", "j", "--cluster"],
    ["wait", "j", "--timeout", "1h"],
]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each command once against a server that answers 404 at once: the kubernetes package
    imports its API classes and builds its argument checks on first use (seconds on a busy
    machine), which is this process's start-up, not a wait for the server."""
    with http_server.serving(http_server.Answers({})) as server:
        config = _config(tmp_path_factory.mktemp("warm"), server)
        for argv in COMMANDS:
            trainjob(*argv, "--kubeconfig", config)


@pytest.mark.usefixtures("warm")
@pytest.mark.parametrize("misbehaviour", list(MISBEHAVIOURS), ids=lambda m: m.replace(" ", "-"))
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_a_misbehaving_api_server_ends_the_command_within_its_request_timeout(
    tmp_path: Path, misbehaviour: str, argv: list[str]
) -> None:
    with http_server.serving(MISBEHAVIOURS[misbehaviour]) as server:
        config = _config(tmp_path, server)
        code, err, took = trainjob(*argv, "--kubeconfig", config, "--request-timeout", "2s")
        requests, connections = list(server.requests), server.connections
    print(f"{argv[0]}, a server that {misbehaviour}: {took:.2f}s")
    assert code == 1 and err.count("\n") == 1, err
    assert took < REQUEST_TIMEOUT + 1, took
    # One request: a retry would be a second connection (or a second request on it).
    assert connections == 1 and len(requests) == 1, (connections, requests)
    if misbehaviour == "resets the connection":
        assert "cannot reach the API server: " in err and "reset by peer" in err, err
        assert took < REQUEST_TIMEOUT, took  # at once, not after the timeout
    else:
        assert (
            f"no answer from the API server at {server.url} in 2s (--request-timeout, "
            "request_timeout in Python; 0 waits for ever)\n"
        ) in err, err
        assert took >= REQUEST_TIMEOUT - 0.05, took


@pytest.mark.usefixtures("warm")
def test_the_python_client_ends_a_dribbled_answer_within_its_request_timeout(
    tmp_path: Path,
) -> None:
    from trainjob.client import TrainJobClient, TrainJobError

    with http_server.serving(http_server.dribbling_body) as server:
        config = _config(tmp_path, server)
        with TrainJobClient(kubeconfig=config, request_timeout=REQUEST_TIMEOUT) as client:
            started = time.monotonic()
            with pytest.raises(TrainJobError) as raised:
                client.list()
            took = time.monotonic() - started
    assert f"no answer from the API server at {server.url} in 2s" in str(raised.value)
    assert REQUEST_TIMEOUT - 0.05 <= took < REQUEST_TIMEOUT + 1, took


# ----- following a Pod's log through the real client -----
JOB = "j"
POD = "j-worker-0"


def _running_job() -> dict[str, Any]:
    trainjobs = f"/apis/trainjob.dev/v1alpha1/namespaces/{NS}/trainjobs"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": NS,
            "uid": "u-1",
            "labels": {
                "trainjob.dev/job-name": JOB,
                "trainjob.dev/replica-type": "worker",
                "trainjob.dev/replica-index": "0",
            },
        },
        "spec": {"nodeName": "n", "containers": [{"name": "tensorflow", "image": "i"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "tensorflow",
                    "image": "i",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        },
    }
    return {
        f"{trainjobs}/{JOB}": {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": JOB, "namespace": NS},
            "spec": {},
            "status": {"conditions": [{"type": "Running", "status": "True"}]},
        },
        f"/api/v1/namespaces/{NS}/pods": {"kind": "PodList", "apiVersion": "v1", "items": [pod]},
    }


@pytest.fixture
def log_server() -> Iterator[tuple[http_server.HttpServer, http_server.Answers]]:
    answers = http_server.Answers(_running_job())
    with http_server.serving(answers) as server:
        yield server, answers


def _collect(iterator: Iterator[Any], into: list[Any]) -> threading.Thread:
    """Reads `iterator` into `into` in a thread of its own (a followed log blocks until its
    next line); it ends when the server goes at the test's end (the next request fails)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            for item in iterator:
                into.append(item)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _log_requests(answers: http_server.Answers, count: int) -> list[str]:
    waits.wait_until(
        lambda: len(answers.log_requests) >= count, timeout=15, what=f"{count} log request(s)"
    )
    return answers.log_requests


def test_following_a_pod_log_streams_its_lines_through_the_real_client(
    tmp_path: Path, log_server: tuple[http_server.HttpServer, http_server.Answers]
) -> None:
    from trainjob.cluster import api

    server, answers = log_server
    cluster = api.Cluster(api.connect(_config(tmp_path, server), request_timeout=REQUEST_TIMEOUT))
    got: list[tuple[str, str]] = []
    _collect(cluster.follow_logs(JOB, tail=10), got)
    # The container is quiet longer than the request timeout before its first line: the
    # stream's head comes with that line, and following must not give up before it.
    request = _log_requests(answers, 1)[0]
    assert "follow=true" in request.lower() and "taillines=10" in request.lower(), request

    def first_lines() -> None:
        answers.say("a")
        answers.say("b")

    quiet = threading.Timer(REQUEST_TIMEOUT + 0.5, first_lines)
    quiet.start()
    waits.wait_until(lambda: len(got) >= 2, timeout=15, what=f"two lines (got {got})")
    assert got == [(POD, "a"), (POD, "b")], got
    assert len(answers.log_requests) == 1, answers.log_requests
    cluster.close()


def test_a_stream_quiet_for_its_read_timeout_is_opened_again_from_then(
    tmp_path: Path,
    log_server: tuple[http_server.HttpServer, http_server.Answers],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainjob.cluster import api

    monkeypatch.setattr(api, "FOLLOW_QUIET_SECONDS", 2.0)
    server, answers = log_server
    cluster = api.Cluster(api.connect(_config(tmp_path, server), request_timeout=REQUEST_TIMEOUT))
    got: list[tuple[str, str]] = []
    _collect(cluster.follow_logs(JOB, tail=10), got)
    _log_requests(answers, 1)
    answers.say("before")
    waits.wait_until(lambda: got, timeout=15, what="the first line")
    # Quiet for 2 s: the stream is opened again, from then, not from its last 10 lines.
    again = _log_requests(answers, 2)[1]
    assert "sinceSeconds=" in again and "tailLines" not in again, again
    answers.say("after")
    waits.wait_until(lambda: len(got) >= 2, timeout=15, what=f"the second line (got {got})")
    assert got == [(POD, "before"), (POD, "after")], got
    cluster.close()


def test_the_python_clients_followed_logs_stream_through_the_real_client(
    tmp_path: Path, log_server: tuple[http_server.HttpServer, http_server.Answers]
) -> None:
    from trainjob.client import TrainJobClient

    server, answers = log_server
    with TrainJobClient(
        kubeconfig=_config(tmp_path, server), request_timeout=REQUEST_TIMEOUT
    ) as client:
        got: list[str] = []
        _collect(client.logs(JOB, follow=True), got)
        _log_requests(answers, 1)
        answers.say("loss 0.5")
        answers.say("loss 0.25")
        waits.wait_until(lambda: len(got) >= 2, timeout=15, what=f"two lines (got {got})")
    assert got == ["worker-0 | loss 0.5", "worker-0 | loss 0.25"], got


def test_a_quiet_stream_is_opened_again_from_when_it_went_quiet() -> None:
    from trainjob.cluster import api

    assert api.since_quiet(100.0, 100.2) == 2  # a second more than the time since
    assert api.since_quiet(100.0, 104.5) == 6
    again = api.follow_arguments(tail=10, since_seconds=2, request_timeout=30.0)
    assert again["since_seconds"] == 2 and "tail_lines" not in again
    assert again["_request_timeout"] == (30.0, api.FOLLOW_QUIET_SECONDS)
    assert "_request_timeout" not in api.follow_arguments(None, None, None)  # 0: for ever
