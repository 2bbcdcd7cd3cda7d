"""Each job's NetworkPolicy on a real API server: made before any of the job's Pods, owned by
the job, open to the job's own Pods on every port and to everyone on every port but the
TensorFlow ones; none for a job that opts out (spec.networkIsolation: None, immutable) or
under --no-network-policy; and a policy the API server refuses (here a ResourceQuota of zero
NetworkPolicies, enforced by the real quota admission) keeps the job's Pods from being made,
with the API server's words in the job's status and Events, until the refusal clears.
Enforcement itself is the e2e tier's (a real node with an enforcing network plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.integration.operator_harness import (
    Cluster,
    meta,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 60.0
PREFIX = "test-np"


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(kubeconfig, tmp_path_factory, PREFIX)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, PREFIX)


def policy(api_client: k8s.ApiClient, namespace: str, name: str) -> k8s.V1NetworkPolicy | None:
    try:
        found: k8s.V1NetworkPolicy = k8s.NetworkingV1Api(api_client).read_namespaced_network_policy(
            name, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def rv(obj: Any) -> int:
    return int(meta(obj).resource_version or 0)


def test_np_job_policy_comes_before_its_pods_and_closes_only_the_tf_port(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    body = trainjob("iso", chief=1, workers=2)
    tf = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    tf["ports"] = [
        {"name": "tfjob-port", "containerPort": 3333},
        {"name": "metrics", "containerPort": 9090},
    ]
    job = cluster.create_job(body)
    pods = cluster.wait_pods("iso", {"iso-chief-0", "iso-worker-0", "iso-worker-1"}, timeout=T)
    made = policy(api_client, cluster.namespace, "iso")
    assert made is not None, "no NetworkPolicy for the job"
    assert all(rv(made) < rv(pod) for pod in pods.values()), "a Pod was made before its policy"
    owners = meta(made).owner_references or []
    assert [(o.kind, o.uid, o.controller) for o in owners] == [
        ("TrainJob", job["metadata"]["uid"], True)
    ]
    spec = made.spec
    assert spec is not None
    assert spec.pod_selector is not None
    assert spec.pod_selector.match_labels == {"trainjob.dev/job-name": "iso"}
    assert spec.policy_types == ["Ingress"]
    own, others = spec.ingress or []
    assert own.ports is None
    assert [p.pod_selector and p.pod_selector.match_labels for p in own._from or []] == [
        {"trainjob.dev/job-name": "iso"}
    ]
    assert others._from is None  # from anywhere ...
    tcp = [(p.port, p.end_port) for p in others.ports or [] if p.protocol == "TCP"]
    # ... on every TCP port but the two TensorFlow ports (chief 2222, worker 3333).
    assert tcp == [(1, 2221), (2223, 3332), (3334, 65535)], tcp
    assert {p.protocol for p in others.ports or [] if p.port is None} == {"UDP", "SCTP"}


def test_np_a_job_that_opts_out_gets_no_policy_and_cannot_change_its_mind(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    body = trainjob("open", chief=0, workers=1)
    body["spec"]["networkIsolation"] = "None"
    cluster.create_job(body)
    cluster.wait_pods("open", {"open-worker-0"}, timeout=T)
    assert policy(api_client, cluster.namespace, "open") is None
    with pytest.raises(ApiException) as refused:
        cluster.patch_job("open", {"spec": {"networkIsolation": "Job"}})
    assert "spec.networkIsolation: immutable" in str(refused.value.body)
    body = trainjob("typo", chief=0, workers=1)
    body["spec"]["networkIsolation"] = "Off"
    with pytest.raises(ApiException) as invalid:
        cluster.create_job(body)
    assert "spec.networkIsolation" in str(invalid.value.body)


def test_np_a_refused_policy_keeps_the_pods_from_being_made_and_says_why(
    cluster: Cluster, api_client: k8s.ApiClient
) -> None:
    core = k8s.CoreV1Api(api_client)
    quota = k8s.V1ResourceQuota(
        metadata=k8s.V1ObjectMeta(name="no-policies"),
        spec=k8s.V1ResourceQuotaSpec(hard={"count/networkpolicies.networking.k8s.io": "0"}),
    )
    core.create_namespaced_resource_quota(cluster.namespace, quota)

    def counted() -> bool:
        status = core.read_namespaced_resource_quota("no-policies", cluster.namespace).status
        return status is not None and bool(status.hard)

    waits.wait_until(counted, timeout=T, what="the quota controller to count the namespace")
    cluster.create_job(trainjob("held", chief=0, workers=2))

    def refused() -> dict[str, Any] | None:
        for cond in ((cluster.job("held") or {}).get("status") or {}).get("conditions") or []:
            if cond["type"] == "Running" and cond.get("reason") == "FailedCreate":
                return dict(cond)
        return None

    cond = waits.wait_until(refused, timeout=T, what="the job saying its policy was refused")
    assert "NetworkPolicy refused" in cond["message"], cond
    assert "exceeded quota" in cond["message"], cond
    assert "spec.networkIsolation: None" in cond["message"], cond
    events = [e for e in cluster.events("held") if e.reason == "FailedCreate"]
    assert events and "NetworkPolicy refused" in (events[0].message or ""), events
    assert not cluster.pods("held"), "a Pod was made without its NetworkPolicy"

    core.delete_namespaced_resource_quota("no-policies", cluster.namespace)
    cluster.wait_pods("held", {"held-worker-0", "held-worker-1"}, timeout=T)
    assert policy(api_client, cluster.namespace, "held") is not None
    waits.wait_until(lambda: refused() is None, timeout=T, what="FailedCreate cleared")


def test_no_network_policy_flag_makes_none(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster = Cluster(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig, tmp_path / "operator.log", f"--namespace={namespace}", "--no-network-policy"
    ).start()
    try:
        cluster.create_job(trainjob("plain", chief=0, workers=1))
        cluster.wait_pods("plain", {"plain-worker-0"}, timeout=T)
        assert policy(api_client, namespace, "plain") is None
    finally:
        operator.stop()
