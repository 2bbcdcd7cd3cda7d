"""trainjob.cluster.api without a cluster: kubeconfig problems and an unreachable API server
end in one line naming the cause (never a traceback), as every cluster command shows them."""

from __future__ import annotations

import io
from pathlib import Path

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
