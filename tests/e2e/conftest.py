"""The e2e tier: the whole product on a real cluster, with real containers.

The cluster is a parameter (``TRAINJOB_E2E_CLUSTER``, see tests/controlplane/e2e_cluster.py):
the node built on this machine (default; ``bash tests/run -m e2e`` installs and starts it) or
the current kubeconfig context, e.g. kind (.github/workflows/e2e.yaml). The tier runs only
with ``--e2e`` or ``TRAINJOB_E2E=1`` (tests/conftest.py); otherwise it is deselected, neither
passed nor skipped.

The operator is installed with its Helm chart into ``trainjob-system``, and every test gets a
fresh namespace; both enforce the Pod Security Standard "restricted", as a careful platform
team would.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane.e2e_cluster import (
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    RELEASE,
    Cluster,
    ClusterError,
    create_job_namespace,
    install_operator,
    open_cluster,
)

OPERATOR_IMAGE = os.environ.get(
    "TRAINJOB_E2E_OPERATOR_IMAGE", "docker.io/trainjob/trainjob-operator"
)
IMAGE_TAG = os.environ.get("TRAINJOB_E2E_IMAGE_TAG", "0.1.0")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    from tests.controlplane.cluster import ControlPlaneError
    from tests.controlplane.tools import ToolsMissingError

    workdir = os.environ.get("TRAINJOB_E2E_WORKDIR")
    try:
        with open_cluster(Path(workdir) if workdir else None) as opened:
            yield opened
    except (ToolsMissingError, ClusterError) as exc:
        pytest.fail(str(exc), pytrace=False)
    except ControlPlaneError as exc:
        pytest.fail(f"the e2e cluster failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[str]:
    """The chart installed with the operator image built from images/operator."""
    install_operator(cluster, OPERATOR_IMAGE, IMAGE_TAG)
    try:
        yield OPERATOR_NAMESPACE
    finally:
        print(
            cluster.kubectl(
                "logs",
                "-n",
                OPERATOR_NAMESPACE,
                OPERATOR_DEPLOYMENT,
                "--tail=200",
                check=False,
            )
        )
        if cluster.name == "current":
            cluster.helm("uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}")


@pytest.fixture
def namespace(cluster: Cluster, operator: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace enforcing "restricted", with an empty 1Gi checkpoint volume."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    create_job_namespace(cluster, name)
    try:
        yield name
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            print(cluster.kubectl("describe", "trainjob", "-n", name, check=False))
            print(cluster.kubectl("get", "pods,events", "-n", name, "-o", "wide", check=False))
            for pod in cluster.kubectl(
                "get", "pods", "-n", name, "-o", "name", check=False
            ).split():
                print(f"--- {pod}")
                print(cluster.kubectl("logs", "-n", name, pod, "--tail=40", check=False))
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``kind`` (several nodes) are deselected on the one-node cluster:
    deselected, not skipped, unless ``-m`` names that marker (the command line chose). Those
    marked ``loses_a_node`` run last: the node they stop is gone for the rest of the session."""
    from tests.controlplane.e2e_cluster import cluster_kind

    def marked(item: pytest.Item, marker: str) -> bool:
        return item.get_closest_marker("e2e") is not None and bool(item.get_closest_marker(marker))

    items.sort(key=lambda item: marked(item, "loses_a_node"))  # stable: else as collected
    if cluster_kind() != "node" or "kind" in (config.getoption("-m") or ""):
        return
    deselected = [i for i in items if marked(i, "kind")]
    selected = [i for i in items if i not in deselected]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{getattr(report, 'when', '')}", report)
    return report
