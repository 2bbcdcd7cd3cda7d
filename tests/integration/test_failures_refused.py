"""Pods the API server refuses: the job's status and Events say so in the API server's words,
the operator retries with backoff while the refusal may clear, and --restricted-pod-defaults
lets images of one's own run in a namespace enforcing Pod Security "restricted".

Found by running Kubeflow's keras example (its own image and command) in a restricted
namespace: the operator logged `violates PodSecurity "restricted:latest": runAsNonRoot !=
true` every minute while the TrainJob's status and Events said nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.integration.operator_harness import Cluster, pod_spec, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 60.0


def failed_create(cluster: Cluster, job: str) -> dict[str, str] | None:
    for cond in ((cluster.job(job) or {}).get("status") or {}).get("conditions") or []:
        if (
            cond["type"] == "Running"
            and cond["status"] == "False"
            and cond["reason"] == "FailedCreate"
        ):
            return dict(cond)
    return None


def test_fail_pod_security_refusal_is_in_status_and_restricted_defaults_fix_it(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core = k8s.CoreV1Api(api_client)
    core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    cluster = Cluster(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig, tmp_path / "plain.log", f"--namespace={namespace}"
    ).start()
    try:
        cluster.create_job(trainjob("keras", chief=0, workers=2))
        cond = waits.wait_until(
            lambda: failed_create(cluster, "keras"), timeout=T, what="FailedCreate"
        )
        assert "violates PodSecurity" in cond["message"], cond
        assert "runAsNonRoot" in cond["message"], cond
        events = [e for e in cluster.events("keras") if e.reason == "FailedCreate"]
        assert len(events) == 1 and events[0].type == "Warning", events
        assert "violates PodSecurity" in (events[0].message or "")
        table = cluster.job("keras") or {}
        replica = table["status"]["replicaStatuses"]["worker"]["indexes"][0]
        assert replica.get("waitingReason") == "FailedCreate", replica
        assert not cluster.pods("keras")
    finally:
        operator.stop()

    # The platform team turns on the restricted defaults: the same job now runs.
    fixed = operator_process.Operator(
        kubeconfig, tmp_path / "fixed.log", f"--namespace={namespace}", "--restricted-pod-defaults"
    ).start()
    try:
        pods = cluster.wait_pods("keras", {"keras-worker-0", "keras-worker-1"}, timeout=T)
        for pod in pods.values():
            security = pod_spec(pod).security_context
            assert security is not None and security.run_as_non_root is True
        waits.wait_until(
            lambda: failed_create(cluster, "keras") is None,
            timeout=T,
            what="the FailedCreate condition cleared",
        )
    finally:
        fixed.stop()


def test_fail_quota_refusal_is_retried_until_the_quota_allows_it(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core = k8s.CoreV1Api(api_client)
    core.create_namespaced_resource_quota(
        namespace,
        k8s.V1ResourceQuota(
            metadata=k8s.V1ObjectMeta(name="pods"), spec=k8s.V1ResourceQuotaSpec(hard={"pods": "1"})
        ),
    )
    cluster = Cluster(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig, tmp_path / "operator.log", f"--namespace={namespace}"
    ).start()
    try:
        cluster.create_job(trainjob("quota", chief=0, workers=2))
        cond = waits.wait_until(
            lambda: failed_create(cluster, "quota"), timeout=T, what="FailedCreate"
        )
        assert "exceeded quota" in cond["message"], cond
        assert len(cluster.pods("quota")) == 1
        core.patch_namespaced_resource_quota("pods", namespace, {"spec": {"hard": {"pods": "4"}}})
        cluster.wait_pods("quota", {"quota-worker-0", "quota-worker-1"}, timeout=T)
        cluster.run_all("quota", {"quota-worker-0", "quota-worker-1"})
        cluster.wait_condition("quota", "Running", T)
        assert (cluster.job("quota") or {})["status"]["restartCount"] == 0
    finally:
        operator.stop()
