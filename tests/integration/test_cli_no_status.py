"""A TrainJob and a TFJob that no operator has written a status for (just created, or the
operator down), on the real API server with no operator watching the namespace: every view says
Pending, none prints an error or an empty state.

Before: `trainjob get` and `get -o wide` showed `<none>` in STATE, `kubectl get tj` an empty
STATE cell (the printer column reads .status.state, which nothing had written), and the
Python client's `get` returned the job with no status at all."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.integration.conftest import TFJOB_CRD
from tests.integration.operator_harness import GROUP, trainjob
from tests.integration.test_tfjob import a_tfjob
from trainjob import cli, client
from trainjob.core import tfjob

pytestmark = pytest.mark.integration

NO_STATUS = "no status from the TrainJob operator yet"


@pytest.fixture
def unserved(
    control_plane: ControlPlane, custom_objects: k8s.CustomObjectsApi, namespace: str
) -> Iterator[str]:
    """A namespace no operator watches (no test operator's --namespace pattern matches
    `test-no-status-*`), holding TrainJob `fresh` and TFJob `fresh-tf`, both just created."""
    assert namespace.startswith("test-no-status"), namespace
    control_plane.apply_crds([TFJOB_CRD])
    custom_objects.create_namespaced_custom_object(
        GROUP, "v1alpha1", namespace, "trainjobs", trainjob("fresh", chief=1, workers=1)
    )
    group, version = tfjob.API_VERSION.split("/")
    custom_objects.create_namespaced_custom_object(
        group, version, namespace, "tfjobs", a_tfjob("fresh-tf", {"Worker": 2})
    )
    yield namespace


def trainjob_cli(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*argv, "--kubeconfig", str(kubeconfig)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_no_status_get_says_pending_for_both_kinds(kubeconfig: Path, unserved: str) -> None:
    code, out, err = trainjob_cli(kubeconfig, "get", "-n", unserved)
    assert (code, err) == (0, ""), err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["fresh"][1] == "Pending", out
    assert rows["tfjob/fresh-tf"][1] == "Pending", out

    code, out, err = trainjob_cli(kubeconfig, "get", "-n", unserved, "-o", "wide")
    assert (code, err) == (0, ""), err
    header, *lines = out.splitlines()
    message_at = header.index("MESSAGE")
    by_name = {line.split()[0]: line for line in lines}
    assert by_name["fresh"].split()[1] == "Pending"
    assert by_name["fresh"][message_at:].startswith(NO_STATUS), out
    assert by_name["tfjob/fresh-tf"].split()[1] == "Pending"
    # A TFJob's note says what serves TFJobs.
    assert "--tfjob" in by_name["tfjob/fresh-tf"][message_at:], out

    code, out, err = trainjob_cli(kubeconfig, "get", "tfjob/fresh-tf", "-n", unserved)
    assert (code, err) == (0, "") and out.splitlines()[1].split()[1] == "Pending", out


def test_no_status_kubectl_get_tj_says_pending(control_plane: ControlPlane, unserved: str) -> None:
    """The CRD defaults status.state to Pending: the API server's own table (kubectl get tj,
    its printer columns) and a status read by any client say so, and nothing errs."""
    done = control_plane.kubectl("get", "tj", "-n", unserved, "-o", "wide", check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "STATE"]
    assert row.split()[:2] == ["fresh", "Pending"], done.stdout
    state = control_plane.kubectl(
        "get", "tj", "fresh", "-n", unserved, "-o", "jsonpath={.status.state}"
    )
    assert state.stdout == "Pending"
    # kubectl wait reads .status.conditions: absent, it waits (and times out) without an error
    # about their type.
    waited = control_plane.kubectl(
        "wait", "--for=condition=Running", "tj/fresh", "-n", unserved, "--timeout=1s", check=False
    )
    assert waited.returncode == 1 and "accessor error" not in waited.stderr, waited.stderr
    assert "timed out waiting for the condition" in waited.stderr, waited.stderr


def test_no_status_python_client_and_wait_say_pending(kubeconfig: Path, unserved: str) -> None:
    with client.TrainJobClient(namespace=unserved, kubeconfig=str(kubeconfig)) as jobs:
        assert jobs.get("fresh")["status"] == {"state": "Pending"}
        assert [job["status"]["state"] for job in jobs.list()] == ["Pending"]
        result = jobs.wait("fresh", timeout=0.5)
    assert (result.state, result.timed_out, result.succeeded) == ("Pending", True, False)
    code, _, err = trainjob_cli(kubeconfig, "wait", "fresh", "-n", unserved, "--timeout", "1s")
    assert code == 124
    assert err == (
        "trainjob wait: timed out after 1s waiting for TrainJob fresh to be succeeded; it is "
        f"Pending ({NO_STATUS}: the job was just created, or the operator is not running)\n"
    ), err
