"""Issue 21 on a real API server: a job that goes wrong says why. One operator subprocess for
the module, watching these tests' namespaces (`test-fail-*`); Pods are driven by patching
their status as the kubelet, the scheduler or an evicting controller would."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.integration.operator_harness import (
    TEST_IMAGE,
    Cluster,
    attempt,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.support import kubelet, operator_process, waits

pytestmark = pytest.mark.integration

T = 30.0  # generous per-step deadline on a 2-core machine; steps take well under a second


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(kubeconfig, tmp_path_factory, "test-fail", timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, "test-fail")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    """The Running condition whatever its status ({} while there is none)."""
    job = cluster.job(name) or {}
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Running":
            return dict(condition)
    return {}


def printed_reason(control_plane: ControlPlane, namespace: str, name: str) -> str:
    """The REASON column of `kubectl get tj`, from the CRD's printer columns."""
    result = control_plane.kubectl("get", "tj", name, "-n", namespace)
    header, row = result.stdout.splitlines()[:2]
    start = header.index("REASON")
    return row[start:].split()[0]


def test_fail_image_pull_backoff_shows_in_status_event_and_column(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    cluster.create_job(trainjob("pull", chief=0, workers=2))
    cluster.wait_pods("pull", {"pull-worker-0", "pull-worker-1"})
    cluster.set_running("pull-worker-0")
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}
    container = kubelet.container_status({"waiting": waiting}, image="nope:1", ready=False)
    cluster.core.patch_namespaced_pod_status(
        "pull-worker-1", cluster.namespace, kubelet.pod_status("Pending", container)
    )
    condition = waits.wait_until(
        lambda: (c := running_condition(cluster, "pull")).get("reason") == "ImagePullBackOff" and c,
        timeout=T,
        what="Running=False with reason ImagePullBackOff",
    )
    assert condition["status"] == "False"
    assert condition["message"] == 'worker 1: ImagePullBackOff: Back-off pulling image "nope:1"'
    event = waits.wait_until(
        lambda: next((e for e in cluster.events("pull") if e.reason == "ImagePullBackOff"), None),
        timeout=T,
        what="an ImagePullBackOff Event",
    )
    assert event.type == "Warning" and 'Back-off pulling image "nope:1"' in (event.message or "")
    assert printed_reason(control_plane, cluster.namespace, "pull") == "ImagePullBackOff"
    status = (cluster.job("pull") or {})["status"]
    assert status["replicaStatuses"]["worker"]["indexes"][1]["waitingReason"] == "ImagePullBackOff"

    # The image is fixed (pulled): the replica runs and so does the job.
    cluster.set_running("pull-worker-1")
    cluster.wait_condition("pull", "Running")
    assert printed_reason(control_plane, cluster.namespace, "pull") == "AllReplicasRunning"
    # One Event for the cause, however many reconciles saw it.
    assert [e.reason for e in cluster.events("pull")].count("ImagePullBackOff") == 1


def test_fail_a_disruption_restarts_without_counting_toward_backoff(cluster: Cluster) -> None:
    """The Eviction API's way: DisruptionTarget on the Pod, then its deletion. restartPolicy
    Never and backoffLimit 0: a counted failure would end the job."""
    cluster.create_job(trainjob("evict", chief=0, workers=1, run_policy={"backoffLimit": 0}))
    cluster.run_all("evict", {"evict-worker-0"})
    cluster.wait_condition("evict", "Running")
    cluster.core.patch_namespaced_pod_status(
        "evict-worker-0",
        cluster.namespace,
        {
            "status": {
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                        # The disruption controller resets a condition older than 2 min on a
                        # Pod that is not terminating (without a time: at once) to False.
                        "lastTransitionTime": now(),
                    }
                ]
            }
        },
    )

    def recorded() -> bool:
        status = (cluster.job("evict") or {}).get("status") or {}
        indexes = status.get("replicaStatuses", {}).get("worker", {}).get("indexes") or [{}]
        return bool(indexes[0].get("disruptionReason") == "EvictionByEvictionAPI")

    waits.wait_until(recorded, timeout=T, what="the disruption recorded in status")
    cluster.core.delete_namespaced_pod("evict-worker-0", cluster.namespace)
    waits.wait_until(
        lambda: (p := cluster.pod("evict-worker-0")) is not None and attempt(p) == 1,
        timeout=T,
        what="the worker recreated as attempt 1",
    )
    status = (cluster.job("evict") or {})["status"]
    assert (status["restartCount"], status["disruptionCount"]) == (0, 1)
    assert not cluster.condition("evict", "Failed")
    event = waits.wait_until(
        lambda: next((e for e in cluster.events("evict") if e.reason == "Evicted"), None),
        timeout=T,
        what="an Evicted Event",
    )
    assert "not counted toward backoffLimit" in (event.message or "")
    assert not any(e.reason == "Restarting" for e in cluster.events("evict"))

    cluster.set_running("evict-worker-0")
    cluster.wait_condition("evict", "Running")
    # A user's `kubectl delete pod` (no DisruptionTarget) still counts: backoffLimit 0 ends it.
    cluster.core.delete_namespaced_pod("evict-worker-0", cluster.namespace)
    failed = cluster.wait_condition("evict", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "worker 0 was deleted" in failed["message"]


def test_fail_the_failed_condition_quotes_the_termination_message(cluster: Cluster) -> None:
    cluster.create_job(trainjob("cause", chief=0, workers=1))
    cluster.run_all("cause", {"cause-worker-0"})
    cluster.wait_condition("cause", "Running")
    terminated = {
        "exitCode": 1,
        "reason": "Error",
        "message": "Traceback (most recent call last):\nValueError: learning rate must be > 0\n",
    }
    container = kubelet.container_status({"terminated": terminated}, image=TEST_IMAGE, ready=False)
    cluster.core.patch_namespaced_pod_status(
        "cause-worker-0", cluster.namespace, kubelet.pod_status("Failed", container)
    )
    failed = cluster.wait_condition("cause", "Failed")
    assert failed["message"].endswith("; cause: worker-0: ValueError: learning rate must be > 0")
    # In status, not only in the Pod: cleanPodPolicy All deleting it loses nothing.
    index = (cluster.job("cause") or {})["status"]["replicaStatuses"]["worker"]["indexes"][0]
    assert index["message"] == "ValueError: learning rate must be > 0"


def test_fail_a_store_that_refuses_is_named_in_status_event_and_column(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    """Exit 7 is the runtime's verdict on the checkpoint store: the reason says so, the message
    says what to check, and the replica's own line (its termination message) names the bucket."""
    cluster.create_job(trainjob("store", chief=0, workers=1))
    cluster.run_all("store", {"store-worker-0"})
    cluster.wait_condition("store", "Running")
    line = "CheckpointStorageError: cannot write s3://ckpt/job: access denied (AccessDenied)"
    terminated = {"exitCode": 7, "reason": "Error", "message": f'{{"trainjobError": "{line}"}}'}
    container = kubelet.container_status({"terminated": terminated}, image=TEST_IMAGE, ready=False)
    cluster.core.patch_namespaced_pod_status(
        "store-worker-0", cluster.namespace, kubelet.pod_status("Failed", container)
    )
    failed = cluster.wait_condition("store", "Failed")
    assert failed["reason"] == "CheckpointStorageRefused"
    assert "the bucket of spec.checkpoint.path exists" in failed["message"]
    assert "spec.checkpoint.credentialsSecret" in failed["message"]
    assert failed["message"].endswith(f"; cause: worker-0: {line}")
    events = waits.wait_until(
        lambda: [e for e in cluster.events("store") if e.reason == "CheckpointStorageRefused"],
        timeout=T,
        what="a CheckpointStorageRefused Event",
    )
    assert events[0].type == "Warning" and line in (events[0].message or "")
    assert printed_reason(control_plane, cluster.namespace, "store") == "CheckpointStorageRefused"


def test_fail_an_estimator_job_on_s3_is_invalid_naming_the_field(cluster: Cluster) -> None:
    """The CRD lets it in (its rule checks the URL alone); the operator's validation refuses
    s3:// for framework Estimator (trainjob.core.storage.framework_problem) before any Pod."""
    body = trainjob("est-s3", chief=1, workers=1)
    body["spec"]["runtime"] = {
        "framework": "Estimator",
        "entrypoint": "trainjob.samples.mnist_estimator:build",
    }
    body["spec"]["checkpoint"] = {"path": "s3://ckpt/estimator"}
    cluster.create_job(body)
    failed = cluster.wait_condition("est-s3", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.checkpoint.path: s3:// does not work with framework Estimator" in failed["message"]
    assert not cluster.pods("est-s3")
