"""A TFJob and a TrainJob of the same name in one namespace would want the same Pod and
Service names (`<name>-<type>-<index>`: training-operator's names, which a TFJob keeps).
The operator (`--tfjob`) runs the one created first and refuses the other at once: it fails,
its status and an Event naming the job that holds the name, and it never touches the first
job's Pods. Pods are driven by patching their status like a kubelet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import (
    Cluster,
    module_cluster,
    module_operator,
    trainjob,
    uid_of,
)
from tests.integration.test_tfjob import TFJobs, a_tfjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 30.0
TFJOB_CRD = REPO_ROOT / "crds/kubeflow/kubeflow.org_tfjobs.yaml"
PREFIX: Final = "test-namesake"


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    control_plane.apply_crds([TFJOB_CRD])
    yield from module_operator(kubeconfig, tmp_path_factory, PREFIX, "--tfjob", timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, PREFIX)


def test_namesake_tfjob_beside_a_running_trainjob_is_refused_at_once(cluster: Cluster) -> None:
    trainjobs = cluster
    tfjobs = TFJobs(cluster.core.api_client, cluster.namespace)
    trainjobs.create_job(trainjob("twin", chief=0, workers=2))
    pods = trainjobs.wait_pods("twin", {"twin-worker-0", "twin-worker-1"}, timeout=T)
    owners = {name: uid_of(pod) for name, pod in pods.items()}
    trainjobs.run_all("twin", set(pods))
    trainjobs.wait_condition("twin", "Running", timeout=T)

    tfjobs.create_job(a_tfjob("twin", {"Worker": 1}))
    failed = waits.wait_until(
        lambda: next(
            (
                c
                for c in ((tfjobs.job("twin") or {}).get("status") or {}).get("conditions") or []
                if c["type"] == "Failed" and c["status"] == "True"
            ),
            None,
        ),
        timeout=T,
        what="the TFJob twin refused (Failed)",
        on_timeout=lambda: f"; the TFJob: {tfjobs.job('twin')}",
    )
    assert failed["reason"] == "TFJobFailed", failed
    assert "TrainJob twin" in failed["message"], failed
    events = [
        (e.involved_object.kind, e.type, e.reason, e.message or "")
        for e in cluster.events("twin")
        if e.involved_object.kind == "TFJob"
    ]
    assert any(
        kind == "TFJob" and etype == "Warning" and "TrainJob twin" in message
        for kind, etype, _, message in events
    ), events
    # The TrainJob keeps its Pods (the same objects) and runs on to its end.
    assert {n: uid_of(p) for n, p in trainjobs.pods("twin").items()} == owners
    assert trainjobs.condition("twin", "Failed") is None
    trainjobs.set_exited("twin-worker-0", 0)
    trainjobs.wait_condition("twin", "Succeeded", timeout=T)


def test_namesake_trainjob_beside_a_running_tfjob_is_refused_at_once(cluster: Cluster) -> None:
    trainjobs = cluster
    tfjobs = TFJobs(cluster.core.api_client, cluster.namespace)
    tfjobs.create_job(a_tfjob("twin", {"Worker": 1}))
    pods = tfjobs.wait_pods("twin", {"twin-worker-0"}, timeout=T)
    tfjobs.run_all("twin", set(pods))
    tfjobs.wait_conditions(
        "twin", [("Created", "True", "TFJobCreated"), ("Running", "True", "TFJobRunning")]
    )

    trainjobs.create_job(trainjob("twin", chief=0, workers=1))
    failed = trainjobs.wait_condition("twin", "Failed", timeout=T)
    assert failed["reason"] == "NameInUse", failed
    assert "TFJob twin" in failed["message"], failed
    reasons = [e.reason for e in cluster.events("twin") if e.involved_object.kind == "TrainJob"]
    assert "NameInUse" in reasons, reasons
    assert {n: uid_of(p) for n, p in tfjobs.pods("twin").items()} == {
        n: uid_of(p) for n, p in pods.items()
    }
    tfjobs.set_exited("twin-worker-0", 0)
    tfjobs.wait_conditions(
        "twin",
        [
            ("Created", "True", "TFJobCreated"),
            ("Running", "False", "TFJobRunning"),
            ("Succeeded", "True", "TFJobSucceeded"),
        ],
    )
