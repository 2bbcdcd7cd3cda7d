"""The operator on a real API server: one operator subprocess for the module, watching the
namespaces of these tests (`test-op-*`), Pods driven by patching their status like a kubelet."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.integration.operator_harness import (
    Cluster,
    attempt,
    env_of,
    meta,
    module_cluster,
    module_operator,
    pod_spec,
    pod_status,
    trainjob,
)
from tests.support import operator_process, waits
from trainjob_operator import writes

pytestmark = pytest.mark.integration

T = 30.0  # generous per-step deadline on a 2-core machine; steps take well under a second


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(kubeconfig, tmp_path_factory, "test-op", timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, "test-op")


def test_op_a_job_with_an_earlier_releases_finalizer_loses_it_and_can_be_deleted(
    cluster: Cluster,
) -> None:
    job = trainjob("legacy", chief=1, workers=0)
    job["metadata"]["finalizers"] = ["trainjob.dev/finalizer"]
    cluster.create_job(job)
    cluster.wait_pods("legacy", {"legacy-chief-0"})
    assert not (cluster.job("legacy") or {})["metadata"].get("finalizers")
    cluster.custom.delete_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", cluster.namespace, "trainjobs", "legacy"
    )
    waits.wait_until(lambda: cluster.job("legacy") is None, timeout=T, what="the job deleted")


def test_op_create_then_running(cluster: Cluster, operator: operator_process.Operator) -> None:
    created = cluster.create_job(trainjob("mnist", chief=1, workers=2))
    names = {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1"}
    pods = cluster.wait_pods("mnist", names)
    waits.wait_until(lambda: set(cluster.services("mnist")) == names, timeout=T, what="services")
    cluster.wait_condition("mnist", "Created")

    worker = pods["mnist-worker-1"]
    tf_config_json = env_of(worker)["TF_CONFIG"]
    assert tf_config_json is not None
    tf_config = json.loads(tf_config_json)
    ns = cluster.namespace
    assert tf_config == {
        "cluster": {
            "chief": [f"mnist-chief-0.{ns}.svc:2222"],
            "worker": [f"mnist-worker-0.{ns}.svc:2222", f"mnist-worker-1.{ns}.svc:2222"],
        },
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    labels = meta(worker).labels
    assert labels is not None
    assert labels["trainjob.dev/job-name"] == "mnist"
    assert labels["trainjob.dev/replica-type"] == "worker"
    assert labels["trainjob.dev/replica-index"] == "1"
    assert attempt(worker) == 0
    assert pod_spec(worker).restart_policy == "Never"
    owned: list[k8s.V1Pod | k8s.V1Service] = [*pods.values(), *cluster.services("mnist").values()]
    for obj in owned:
        references = meta(obj).owner_references
        assert references is not None
        (ref,) = references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == (
            "TrainJob",
            "mnist",
            created["metadata"]["uid"],
            True,
        )
    service = cluster.services("mnist")["mnist-worker-1"]
    assert service.spec is not None and service.spec.selector is not None
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector["trainjob.dev/replica-index"] == "1"

    job = cluster.job("mnist") or {}
    # No finalizer: nothing has to run before a TrainJob may go (children go by ownerReference).
    assert not job["metadata"].get("finalizers"), job["metadata"]
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    # kopf's bookkeeping uses our prefix, and nothing but our status lands in status.
    annotations = job["metadata"].get("annotations") or {}
    assert not [k for k in annotations if k.startswith("kopf.")], annotations
    assert set(job["status"]) <= set(writes.STATUS_KEYS), job["status"]

    for name in sorted(names):
        cluster.set_running(name)
    cluster.wait_condition("mnist", "Running")
    status = (cluster.job("mnist") or {})["status"]
    assert status["replicaStatuses"]["worker"]["running"] == 2
    assert status["ready"] == "3/3"
    reasons = {e.reason for e in cluster.events("mnist")}
    assert {"Created", "Running"} <= reasons, reasons

    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics") as resp:
        metrics = resp.read().decode()
    assert f'trainjob_jobs_created_total{{namespace="{ns}"}} 1.0' in metrics
    assert "trainjob_reconcile_duration_seconds_count" in metrics


def test_op_exit_code_137_restarts_the_group_then_exit_1_fails(cluster: Cluster) -> None:
    cluster.create_job(trainjob("ec", chief=1, workers=1, restart_policy="ExitCode"))
    names = {"ec-chief-0", "ec-worker-0"}
    cluster.run_all("ec", names)
    cluster.wait_condition("ec", "Running")

    cluster.set_exited("ec-worker-0", 137, "OOMKilled")
    # All-reduce: the whole group restarts, under the same names, as attempt 1.

    def recreated() -> dict[str, k8s.V1Pod] | None:
        p = cluster.pods("ec")
        return p if p and set(p) == names and all(attempt(x) == 1 for x in p.values()) else None

    pods = waits.wait_until(recreated, timeout=T, what="both pods recreated as attempt 1")
    assert all(pod_status(p).phase in (None, "Pending") for p in pods.values())
    job = cluster.job("ec") or {}
    assert job["status"]["restartCount"] == 1
    worker = job["status"]["replicaStatuses"]["worker"]["indexes"][0]
    assert worker["attempt"] == 1
    assert any(e.reason == "Restarting" for e in cluster.events("ec"))

    cluster.run_all("ec", names)
    cluster.wait_condition("ec", "Running")
    cluster.set_exited("ec-worker-0", 1)
    failed = cluster.wait_condition("ec", "Failed")
    assert failed["reason"] == "ReplicaFailed"
    assert "exited with code 1" in failed["message"]
    status = (cluster.job("ec") or {})["status"]
    assert status["replicaStatuses"]["worker"]["indexes"][0]["exitCode"] == 1
    # cleanPodPolicy Running (default): the chief still running is stopped.
    waits.wait_until(lambda: cluster.pod("ec-chief-0") is None, timeout=T, what="chief deleted")


def test_op_backoff_limit_exhausted(cluster: Cluster) -> None:
    cluster.create_job(
        trainjob(
            "bo", chief=0, workers=1, restart_policy="OnFailure", run_policy={"backoffLimit": 1}
        )
    )
    cluster.run_all("bo", {"bo-worker-0"})
    cluster.set_exited("bo-worker-0", 2)
    waits.wait_until(
        lambda: (p := cluster.pod("bo-worker-0")) is not None and attempt(p) == 1,
        timeout=T,
        what="worker recreated as attempt 1",
    )
    cluster.set_running("bo-worker-0")
    cluster.set_exited("bo-worker-0", 2)
    failed = cluster.wait_condition("bo", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert (cluster.job("bo") or {})["status"]["restartCount"] == 1


def test_op_chief_succeeds_and_running_replicas_are_removed(cluster: Cluster) -> None:
    cluster.create_job(trainjob("ok", chief=1, workers=1, ps=1))
    names = {"ok-chief-0", "ok-worker-0", "ok-ps-0"}
    cluster.run_all("ok", names)
    cluster.wait_condition("ok", "Running")
    cluster.set_exited("ok-chief-0", 0)
    cluster.wait_condition("ok", "Succeeded")
    # cleanPodPolicy Running: ps and worker (still running) go, the finished chief stays.
    waits.wait_until(
        lambda: set(cluster.pods("ok")) == {"ok-chief-0"},
        timeout=T,
        what="ps and worker deleted",
    )
    status = (cluster.job("ok") or {})["status"]
    assert status["completionTime"]
    assert status["replicaStatuses"]["chief"]["succeeded"] == 1


def test_op_active_deadline_fires_without_events(cluster: Cluster) -> None:
    cluster.create_job(trainjob("dl", chief=1, workers=0, run_policy={"activeDeadlineSeconds": 3}))
    cluster.run_all("dl", {"dl-chief-0"})
    cluster.wait_condition("dl", "Running")
    failed = cluster.wait_condition("dl", "Failed", timeout=15)
    assert failed["reason"] == "DeadlineExceeded"
    waits.wait_until(lambda: not cluster.pods("dl"), timeout=T, what="pods deleted")


def test_op_ttl_deletes_the_finished_job(cluster: Cluster) -> None:
    cluster.create_job(
        trainjob("ttl", chief=1, workers=0, run_policy={"ttlSecondsAfterFinished": 2})
    )
    cluster.run_all("ttl", {"ttl-chief-0"})
    cluster.set_exited("ttl-chief-0", 0)
    cluster.wait_condition("ttl", "Succeeded")
    waits.wait_until(lambda: cluster.job("ttl") is None, timeout=15, what="TrainJob deleted by TTL")
    waits.wait_until(lambda: not cluster.pods("ttl"), timeout=T, what="children garbage-collected")


def test_op_suspend_deletes_and_resume_recreates(cluster: Cluster) -> None:
    cluster.create_job(trainjob("sus", chief=1, workers=1))
    names = {"sus-chief-0", "sus-worker-0"}
    cluster.run_all("sus", names)
    cluster.wait_condition("sus", "Running")
    first_start = (cluster.job("sus") or {})["status"]["startTime"]

    cluster.patch_job("sus", {"spec": {"runPolicy": {"suspend": True}}})
    cluster.wait_condition("sus", "Suspended")
    waits.wait_until(
        lambda: not cluster.pods("sus") and not cluster.services("sus"),
        timeout=T,
        what="pods and services deleted",
    )

    cluster.patch_job("sus", {"spec": {"runPolicy": {"suspend": False}}})
    pods = cluster.wait_pods("sus", names)
    assert all(attempt(p) == 1 for p in pods.values())
    waits.wait_until(lambda: set(cluster.services("sus")) == names, timeout=T, what="services")
    status = (cluster.job("sus") or {})["status"]
    assert not any(c["type"] == "Suspended" and c["status"] == "True" for c in status["conditions"])
    assert status["startTime"] >= first_start
    assert status["restartCount"] == 0
    cluster.run_all("sus", names)
    cluster.wait_condition("sus", "Running")


def test_op_invalid_job_fails_and_others_still_run(cluster: Cluster) -> None:
    # The CRD keeps pod templates open (any PodTemplateSpec), so a malformed resource
    # quantity gets past admission; the API server rejects the Pod the operator renders.
    bad = trainjob(
        "bad",
        chief=1,
        workers=0,
        template_spec={
            "containers": [
                {
                    "name": "tensorflow",
                    "image": "example.com/trainjob:test",
                    "resources": {"limits": {"cpu": "lots"}},
                }
            ]
        },
    )
    cluster.create_job(bad)
    # The CRD does not check container names; the spec parser does (DNS-1123 label).
    unparsable = trainjob(
        "unparsable",
        chief=1,
        workers=0,
        template_spec={"containers": [{"name": "Tensor_Flow", "image": "example.com/x:1"}]},
    )
    cluster.create_job(unparsable)
    cluster.create_job(trainjob("good", chief=1, workers=0))
    failed = cluster.wait_condition("bad", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "bad-chief-0" in failed["message"]
    failed = cluster.wait_condition("unparsable", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.replicaSpecs.chief.template.spec.containers[0].name" in failed["message"]
    assert not cluster.pods("unparsable")
    cluster.run_all("good", {"good-chief-0"})
    cluster.wait_condition("good", "Running")
    assert any(e.reason == "InvalidSpec" for e in cluster.events("bad"))


def test_op_deleting_the_job_removes_children(cluster: Cluster) -> None:
    cluster.create_job(trainjob("gc", chief=1, workers=1))
    cluster.wait_pods("gc", {"gc-chief-0", "gc-worker-0"})
    waits.wait_until(lambda: len(cluster.services("gc")) == 2, timeout=T, what="services")
    cluster.delete_job("gc")
    waits.wait_until(lambda: cluster.job("gc") is None, timeout=T, what="TrainJob gone")
    waits.wait_until(
        lambda: not cluster.pods("gc") and not cluster.services("gc"),
        timeout=T,
        what="children garbage-collected",
    )
