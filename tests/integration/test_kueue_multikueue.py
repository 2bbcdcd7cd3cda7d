"""MultiKueue: a TrainJob with `spec.managedBy: kueue.x-k8s.io/multikueue` on a manager
cluster runs on a worker cluster. Two real control planes, a real Kueue on each (the
manager's with a MultiKueue AdmissionCheck pointing at the worker), our operator on each:

- on the manager the operator keeps the job's Workload and nothing else (no Pods, Services or
  status writes); Kueue's MultiKueue copies the job to the worker with its Workload prebuilt;
- on the worker the operator runs that copy under the prebuilt Workload (adopted, not made);
- the worker's status is mirrored back to the manager's job until it Succeeds, and the
  manager's Workload finishes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.controlplane import trainer
from tests.controlplane.cluster import ControlPlane, ControlPlaneError
from tests.controlplane.kueue import KUEUE_NAMESPACE, Kueue, start_kueue
from tests.integration.conftest import TFJOB_CRD, started_control_plane
from tests.integration.kueue_harness import KUEUE, KV, Queues, is_true, queued_job
from tests.integration.operator_harness import Cluster, Obj
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 90.0
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


@pytest.fixture(scope="module")
def worker_plane() -> Iterator[ControlPlane]:
    for plane in started_control_plane():
        # The manager's Kueue has Kueue's own TFJob and Kubeflow Trainer integrations on
        # (conftest.kueue): MultiKueue counts a worker Active only when it serves every enabled
        # kind, TFJob and Trainer's TrainJob (with its JobSet) included.
        plane.apply_crds([TFJOB_CRD, *trainer.crd_files()])
        yield plane


@pytest.fixture(scope="module")
def worker_kueue(worker_plane: ControlPlane) -> Iterator[Kueue]:
    try:
        controller = start_kueue(worker_plane, name="kueue-worker")
    except ControlPlaneError as exc:
        pytest.fail(f"the worker's Kueue did not start: {exc}", pytrace=False)
    try:
        yield controller
    finally:
        print(f"worker kueue log:\n{controller.log_tail(30)}")
        controller.stop()


@pytest.fixture
def worker_api(worker_plane: ControlPlane) -> Iterator[k8s.ApiClient]:
    api = k8s_config.new_client_from_config(config_file=str(worker_plane.kubeconfig))
    try:
        yield api
    finally:
        api.close()


def multikueue_objects(queues: Queues, worker_kubeconfig: Path, suffix: str) -> str:
    """The manager's side: the worker's kubeconfig Secret, a MultiKueueCluster and Config,
    the MultiKueue AdmissionCheck and a ClusterQueue that requires it; returns its name."""
    core = k8s.CoreV1Api(queues.custom.api_client)
    secret = f"worker-{suffix}"
    core.create_namespaced_secret(
        KUEUE_NAMESPACE,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=secret),
            data={"kubeconfig": base64.b64encode(worker_kubeconfig.read_bytes()).decode()},
        ),
    )
    custom = queues.custom
    cluster_name, config_name, check = f"worker-{suffix}", f"mk-{suffix}", f"mk-check-{suffix}"
    custom.create_cluster_custom_object(
        KUEUE,
        KV,
        "multikueueclusters",
        {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "MultiKueueCluster",
            "metadata": {"name": cluster_name},
            "spec": {
                "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}
            },
        },
    )
    queues.cluster_scoped.append(("multikueueclusters", cluster_name))
    custom.create_cluster_custom_object(
        KUEUE,
        KV,
        "multikueueconfigs",
        {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "MultiKueueConfig",
            "metadata": {"name": config_name},
            "spec": {"clusters": [cluster_name]},
        },
    )
    queues.cluster_scoped.append(("multikueueconfigs", config_name))
    custom.create_cluster_custom_object(
        KUEUE,
        KV,
        "admissionchecks",
        {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {
                "controllerName": MULTIKUEUE,
                "parameters": {"apiGroup": KUEUE, "kind": "MultiKueueConfig", "name": config_name},
            },
        },
    )
    queues.cluster_scoped.append(("admissionchecks", check))
    waits.wait_until(
        lambda: is_true(
            cast(
                Obj, custom.get_cluster_custom_object(KUEUE, KV, "multikueueclusters", cluster_name)
            ),
            "Active",
        ),
        timeout=T,
        what="the MultiKueueCluster Active (the manager's Kueue reaches the worker)",
    )
    cq = queues.cluster_queue(queues.flavor(), "10")
    custom.patch_cluster_custom_object(
        KUEUE,
        KV,
        "clusterqueues",
        cq,
        {"spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": check}]}}},
    )
    return cq


def test_kueue_multikueue_runs_the_job_on_the_worker_and_mirrors_its_status(
    kueue: Kueue,
    worker_kueue: Kueue,
    worker_plane: ControlPlane,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    worker_api: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    worker_plane.kubectl("create", "namespace", namespace)
    worker_plane.wait_service_account(namespace)
    manager, worker = Cluster(api_client, namespace), Cluster(worker_api, namespace)
    manager_queues, worker_queues = Queues(api_client, namespace), Queues(worker_api, namespace)
    operators = [
        operator_process.Operator(
            kubeconfig, tmp_path / "manager.log", f"--namespace={namespace}", "--kueue"
        ),
        operator_process.Operator(
            worker_plane.kubeconfig, tmp_path / "worker.log", f"--namespace={namespace}", "--kueue"
        ),
    ]
    try:
        for operator in operators:
            operator.start().wait_serving(T)
        cq = multikueue_objects(manager_queues, worker_plane.kubeconfig, namespace[-6:])
        lq = manager_queues.local_queue(cq)
        worker_queues.local_queue(worker_queues.cluster_queue(worker_queues.flavor(), "10"), lq)

        body = queued_job("mk", lq)
        body["spec"]["managedBy"] = MULTIKUEUE
        manager.create_job(body)

        # The worker gets the copy, under the Workload MultiKueue built for it.
        copy = waits.wait_until(
            lambda: worker.job("mk"), timeout=T, what="the job copied to the worker"
        )
        annotations = copy["metadata"].get("annotations") or {}
        prebuilt = annotations.get("kueue.x-k8s.io/prebuilt-workload-name")
        assert prebuilt, copy["metadata"]
        assert "managedBy" not in copy["spec"]
        names = {"mk-chief-0", "mk-worker-0", "mk-worker-1"}
        worker.wait_pods("mk", names, timeout=T)
        (worker_workload,) = worker_queues.workloads("mk")
        assert worker_workload["metadata"]["name"] == prebuilt
        (owner,) = worker_workload["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("TrainJob", copy["metadata"]["uid"])

        worker.run_all("mk", names)
        waits.wait_until(
            lambda: ((manager.job("mk") or {}).get("status") or {}).get("state") == "Running",
            timeout=T,
            what="the worker's Running status mirrored to the manager",
        )
        # Nothing of the job runs on the manager.
        assert not manager.pods("mk") and not manager.services("mk")

        worker.set_exited("mk-chief-0", 0)
        waits.wait_until(
            lambda: ((manager.job("mk") or {}).get("status") or {}).get("state") == "Succeeded",
            timeout=T,
            what="Succeeded mirrored to the manager",
        )
        waits.wait_until(
            lambda: (wl := manager_queues.workload("mk")) is not None and is_true(wl, "Finished"),
            timeout=T,
            what="the manager's Workload Finished",
        )
        assert not manager.pods("mk") and not manager.services("mk")
    finally:
        for operator in operators:
            operator.stop()
            print(f"{operator.log}:\n{operator.log_tail(25)}")
        manager_queues.cleanup()
        worker_queues.cleanup()
