"""trainjob.cluster.api without a cluster: kubeconfig problems and an unreachable API server
end in one line naming the cause (never a traceback), as every cluster command shows them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from trainjob import cli

pytestmark = pytest.mark.unit

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: ctx, context: {cluster: c, user: u, namespace: team-z}}]
current-context: ctx
"""


def trainjob(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = cli.main(list(argv), out=io.StringIO(), err=err)
    return code, err.getvalue()


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    code, err = trainjob("get", "--kubeconfig", str(config))
    assert code == 1
    assert err.startswith(
        "trainjob get: list TrainJobs in namespace team-z: cannot reach the API server: "
    )
    assert "Connection refused" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("foo: [\n", "cannot be used: while parsing a flow node"),
        ("", "cannot be used: "),
        (KUBECONFIG.replace("current-context: ctx", "current-context: gone"), "name gone in"),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_is_named(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    code, err = trainjob("describe", "x", "--kubeconfig", str(config))
    assert code == 1 and err.startswith(f"trainjob describe: kubeconfig {config}"), err
    assert expected in err and err.count("\n") == 1, err


def test_a_missing_kubeconfig_says_where_it_looked(tmp_path: Path) -> None:
    code, err = trainjob("wait", "x", "--kubeconfig", str(tmp_path / "none"))
    assert code == 1
    assert err == (
        f"trainjob wait: no kubeconfig: {tmp_path / 'none'} does not exist (give --kubeconfig, "
        "set KUBECONFIG, or run inside a Pod with a service account)\n"
    )


# ----- following logs across restarts (the API objects faked: no kubelet here) -----
class FakeResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    def stream(self, _size: int) -> list[bytes]:
        return self.chunks

    def close(self) -> None:
        self.closed = True


def _pod(uid: str, restarts: int, state: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "j-worker-0", "uid": uid},
        "spec": {"nodeName": "n"},
        "status": {
            "containerStatuses": [
                {"name": "tensorflow", "restartCount": restarts, "state": {state: {}}}
            ]
        },
    }


class FakeCore:
    """Each list of Pods is the next poll's; each log request gets the next response."""

    def __init__(self, polls: list[list[dict[str, Any]]], logs: list[Any]) -> None:
        self.polls = polls
        self.logs = logs
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def list_namespaced_pod(self, *_args: Any, **_kwargs: Any) -> Any:
        pods = self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]
        return types.SimpleNamespace(items=pods)

    def read_namespaced_pod_log(self, name: str, _namespace: str, **kwargs: Any) -> Any:
        self.requests.append((name, kwargs))
        response = self.logs.pop(0)
        if isinstance(response, Exception):
            raise response
        return response


class FakeCustom:
    def __init__(self, running_polls: int) -> None:
        self.left = running_polls

    def get_namespaced_custom_object(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        self.left -= 1
        done = [{"type": "Succeeded", "status": "True"}] if self.left < 0 else []
        return {"metadata": {"name": "j"}, "status": {"conditions": done}}


def _cluster(core: FakeCore, custom: FakeCustom) -> Any:
    from trainjob.cluster import api

    fake_client = types.SimpleNamespace(sanitize_for_serialization=lambda x: x, close=lambda: None)
    cluster = api.Cluster(api.Connection(fake_client, "ns", None))
    cluster._core = core
    cluster._custom = custom
    return cluster


def test_following_goes_across_restarts_and_recreated_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    from trainjob.cluster import api

    monkeypatch.setattr(api, "LOG_POLL_SECONDS", 0.05)
    polls = [
        [_pod("a", 0, "running")],
        [_pod("a", 1, "running")],  # the container restarted in place
        [_pod("b", 0, "running")],  # the Pod was recreated under the same name
        [_pod("c", 0, "terminated")],  # and once more; its log request fails
    ]
    refused = ApiException(status=400, reason="Bad Request")
    refused.body = '{"message": "container tensorflow is terminated"}'
    logs = [
        FakeResponse([b"line 1\nli", b"ne 2\n"]),
        FakeResponse([b"line 3\n"]),
        FakeResponse([b"line 4"]),  # no newline at the end: still a line
        refused,
    ]
    core = FakeCore(polls, logs)
    lines = list(_cluster(core, FakeCustom(running_polls=3)).follow_logs("j", tail=10))
    assert lines == [
        ("j-worker-0", "line 1"),
        ("j-worker-0", "line 2"),
        ("j-worker-0", "line 3"),
        ("j-worker-0", "line 4"),
        ("j-worker-0", "\x00note: log of Pod j-worker-0: container tensorflow is terminated"),
    ]
    assert all(kwargs["follow"] and kwargs["tail_lines"] == 10 for _, kwargs in core.requests)


def test_a_reader_that_stops_early_closes_the_open_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainjob.cluster import api

    monkeypatch.setattr(api, "LOG_POLL_SECONDS", 0.05)
    response = FakeResponse([b"first\n"])
    follower = _cluster(FakeCore([[_pod("a", 0, "running")]], [response]), FakeCustom(99))
    lines = follower.follow_logs("j")
    assert next(lines) == ("j-worker-0", "first")
    lines.close()
    assert response.closed


def test_without_the_kubernetes_package_the_cluster_commands_say_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['kubernetes'] = None  # as if it were not installed\n"
        "from trainjob import cli\n"
        "sys.exit(cli.main(['get']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("trainjob get: talking to a cluster needs the kubernetes")
    assert result.stderr.endswith(": pip install 'trainjob[cluster]'\n")
