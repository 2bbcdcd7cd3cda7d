"""A user's labels and annotations on a replica template, under the real operator (`--tfjob`,
so TrainJobs and TFJobs both) on a real API server, Pods driven by patching their status like
a kubelet: the Pods and Services keep the user's values (a platform such as Polyaxon finds a
run's Pods by `app.kubernetes.io/instance` and `managed-by`), while the operator, which
selects on its own labels only, still finds, runs, finishes and cleans up the job; a
template that sets a label the selectors rely on fails naming the field."""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.integration.conftest import TFJOB_CRD
from tests.integration.operator_harness import (
    NO_SCHEDULER,
    TEST_IMAGE,
    Cluster,
    meta,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.support import manifests, operator_process, waits
from trainjob import cli
from trainjob.core import tfjob

pytestmark = pytest.mark.integration

T = 30.0
PREFIX = "test-labels"
# As Polyaxon writes them on every Pod of a run.
RECOMMENDED = {
    "app.kubernetes.io/name": "my-model",
    "app.kubernetes.io/instance": "run-42",
    "app.kubernetes.io/managed-by": "my-platform",
}
USERS_SELECTOR = "app.kubernetes.io/instance=run-42,app.kubernetes.io/managed-by=my-platform"
TEMPLATE_METADATA = {
    "labels": {**RECOMMENDED, "team": "vision"},
    "annotations": {"polyaxon.com/run": "42"},
}
Obj = dict[str, Any]


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


def app_labels(obj: k8s.V1Pod | k8s.V1Service) -> dict[str, str]:
    return {k: v for k, v in (meta(obj).labels or {}).items() if k.startswith("app.kubernetes.io/")}


def selected_by_the_user(cluster: Cluster) -> set[str]:
    pods = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=USERS_SELECTOR)
    return {meta(p).name or "" for p in pods.items}


def test_labels_a_trainjob_keeps_the_users_labels_and_runs_to_its_end(
    cluster: Cluster, kubeconfig: Path
) -> None:
    job = trainjob("polyaxon", chief=1, workers=2)
    for replica in job["spec"]["replicaSpecs"].values():
        replica["template"]["metadata"] = copy.deepcopy(TEMPLATE_METADATA)
    cluster.create_job(job)
    names = {"polyaxon-chief-0", "polyaxon-worker-0", "polyaxon-worker-1"}
    pods = cluster.wait_pods("polyaxon", names)  # found by the operator's own label
    waits.wait_until(lambda: set(cluster.services("polyaxon")) == names, timeout=T, what="svcs")
    for pod in pods.values():
        assert app_labels(pod) == RECOMMENDED, meta(pod).labels
        assert (meta(pod).labels or {})["team"] == "vision"
        assert (meta(pod).annotations or {})["polyaxon.com/run"] == "42"
    for service in cluster.services("polyaxon").values():
        assert app_labels(service) == RECOMMENDED, meta(service).labels
        assert service.spec is not None and service.spec.selector is not None
        assert all(k.startswith("trainjob.dev/") for k in service.spec.selector)
    assert selected_by_the_user(cluster) == names

    cluster.run_all("polyaxon", names)
    cluster.wait_condition("polyaxon", "Running", T)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(
        ["describe", "polyaxon", "-n", cluster.namespace, "--kubeconfig", str(kubeconfig)],
        out=out,
        err=err,
    )
    assert code == 0, err.getvalue()
    assert "polyaxon-worker-1" in out.getvalue(), out.getvalue()

    cluster.set_exited("polyaxon-chief-0", 0)
    cluster.wait_condition("polyaxon", "Succeeded", T)
    # cleanPodPolicy Running (the default): the workers still running are stopped.
    waits.wait_until(
        lambda: set(cluster.pods("polyaxon")) == {"polyaxon-chief-0"},
        timeout=T,
        what="the running workers cleaned up",
    )
    assert selected_by_the_user(cluster) == {"polyaxon-chief-0"}


class TFJobs(Cluster):
    def create_job(self, body: Obj) -> Obj:
        return cast(
            Obj,
            self.custom.create_namespaced_custom_object(
                tfjob.GROUP, tfjob.VERSION, self.namespace, tfjob.PLURAL, body
            ),
        )

    def job(self, name: str) -> Obj | None:
        return cast(
            Obj,
            self.custom.get_namespaced_custom_object(
                tfjob.GROUP, tfjob.VERSION, self.namespace, tfjob.PLURAL, name
            ),
        )

    def conditions(self, name: str) -> list[tuple[str, str, str]]:
        status = (self.job(name) or {}).get("status") or {}
        return [(c["type"], c["status"], c["reason"]) for c in status.get("conditions") or []]

    def wait_conditions(self, name: str, wanted: list[tuple[str, str, str]]) -> None:
        try:
            waits.wait_until(
                lambda: self.conditions(name) == wanted, timeout=T, what=f"{name}: {wanted}"
            )
        except waits.WaitTimeoutError as exc:
            raise waits.WaitTimeoutError(f"{exc}; have {self.conditions(name)}") from None

    def kubeflow_pods(self, job: str) -> dict[str, k8s.V1Pod]:
        items = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{tfjob.LABEL_JOB_NAME}={job}"
        ).items
        return {meta(p).name or "": p for p in items}


def a_tfjob(name: str, labels: dict[str, str]) -> Obj:
    template = {
        "metadata": {"labels": labels, "annotations": {"polyaxon.com/run": "42"}},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [manifests.container(TEST_IMAGE, command=["python", "train.py"])],
        },
    }
    return {
        "apiVersion": tfjob.API_VERSION,
        "kind": tfjob.KIND,
        "metadata": {"name": name},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {"replicas": 2, "restartPolicy": "Never", "template": template}
            }
        },
    }


@pytest.fixture
def tfjobs(cluster: Cluster) -> TFJobs:
    return TFJobs(cluster.core.api_client, cluster.namespace)


def test_labels_a_tfjob_keeps_the_users_labels_as_training_operator_does(
    tfjobs: TFJobs,
) -> None:
    tfjobs.create_job(a_tfjob("polyaxon", {**RECOMMENDED, "team": "vision"}))
    names = {"polyaxon-worker-0", "polyaxon-worker-1"}
    waits.wait_until(
        lambda: set(tfjobs.kubeflow_pods("polyaxon")) == names, timeout=T, what="the pods"
    )
    for pod in tfjobs.kubeflow_pods("polyaxon").values():
        assert app_labels(pod) == RECOMMENDED, meta(pod).labels
        assert (meta(pod).annotations or {})["polyaxon.com/run"] == "42"
    assert selected_by_the_user(tfjobs) == names
    for name in sorted(names):
        tfjobs.set_running(name)
    tfjobs.wait_conditions(
        "polyaxon", [("Created", "True", "TFJobCreated"), ("Running", "True", "TFJobRunning")]
    )
    tfjobs.set_exited("polyaxon-worker-0", 0)
    tfjobs.wait_conditions(
        "polyaxon",
        [
            ("Created", "True", "TFJobCreated"),
            ("Running", "False", "TFJobRunning"),
            ("Succeeded", "True", "TFJobSucceeded"),
        ],
    )


def test_labels_a_tfjob_template_setting_a_kubeflow_label_fails_naming_the_field(
    tfjobs: TFJobs,
) -> None:
    tfjobs.create_job(a_tfjob("stolen", {"training.kubeflow.org/job-name": "other"}))
    tfjobs.wait_conditions(
        "stolen", [("Created", "True", "TFJobCreated"), ("Failed", "True", "TFJobFailed")]
    )
    message = ((tfjobs.job("stolen") or {})["status"]["conditions"][-1])["message"]
    field = "spec.tfReplicaSpecs[Worker].template.metadata.labels['training.kubeflow.org/job-name']"
    assert field in message, message
    assert tfjobs.kubeflow_pods("stolen") == {}
    assert tfjobs.pods("stolen") == {}
