"""Issue 21 part 4, lost nodes, on a real API server and kube-controller-manager: a replica
whose node is NotReady or unreachable is shown as such (status, Event, `kubectl get tj`), its
Pod is left to Kubernetes, and once the pod GC removes it (the Node deleted) the replica is
recreated, counted as a disruption, not a failure.

The nodes here are our own, not kwok's: kwok's node-ready stage would set a managed node
Ready again at once, so their status is written by the test as a silent kubelet's would be
left by the node lifecycle controller (disabled in the test control plane). The replica's
Pod is bound with the binding subresource, as the scheduler binds it."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.integration.operator_harness import (
    Cluster,
    attempt,
    meta,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 30.0  # generous per-step deadline on a 2-core machine; steps take well under a second
# The pod GC controller looks every 20 s and removes a Pod of a deleted Node once that Node
# has been gone for 40 s (its quarantine): about a minute, on a loaded machine more.
POD_GC = 150.0


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(kubeconfig, tmp_path_factory, "test-nodes", timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, "test-nodes")


@pytest.fixture
def node(cluster: Cluster) -> Iterator[str]:
    """A Node nobody manages (no kubelet, no kwok): Ready until the test says otherwise."""
    name = f"lost-{uuid.uuid4().hex[:6]}"
    cluster.core.create_node(
        k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name, labels={"type": "trainjob-test"}))
    )
    set_ready(cluster, name, "True", now())
    try:
        yield name
    finally:
        try:
            cluster.core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_ready(cluster: Cluster, node: str, status: str, since: str) -> None:
    reasons = {"True": "KubeletReady", "False": "KubeletNotReady", "Unknown": "NodeStatusUnknown"}
    cluster.core.patch_node_status(
        node,
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": status,
                        "reason": reasons[status],
                        "message": f"set by the test: {status}",
                        "lastHeartbeatTime": since,
                        "lastTransitionTime": since,
                    }
                ]
            }
        },
    )


def bind(cluster: Cluster, pod: str, node: str) -> None:
    """What the scheduler does: the Pod's binding subresource sets its spec.nodeName."""
    body = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=pod),
        target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # The client cannot read back the Status this call returns: don't make it try.
    cluster.core.create_namespaced_pod_binding(pod, cluster.namespace, body, _preload_content=False)


def running_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    for condition in ((cluster.job(name) or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Running":
            return dict(condition)
    return {}


def waiting_on_node(cluster: Cluster, name: str, reason: str) -> dict[str, Any] | None:
    condition = running_condition(cluster, name)
    if condition.get("status") == "False" and condition.get("reason") == reason:
        return condition
    return None


def printed_reason(control_plane: ControlPlane, namespace: str, name: str) -> str:
    """The REASON column of `kubectl get tj`, from the CRD's printer columns."""
    result = control_plane.kubectl("get", "tj", name, "-n", namespace)
    header, row = result.stdout.splitlines()[:2]
    return row[header.index("REASON") :].split()[0]


def test_nodes_a_lost_node_is_shown_then_its_replica_is_recreated_as_a_disruption(
    cluster: Cluster, node: str, control_plane: ControlPlane
) -> None:
    """restartPolicy Never, backoffLimit 0: a counted failure would end the job."""
    names = {"lost-worker-0", "lost-worker-1"}
    cluster.create_job(trainjob("lost", chief=0, workers=2, run_policy={"backoffLimit": 0}))
    cluster.wait_pods("lost", names, timeout=T)
    # worker 1 on the node that will be lost; worker 0 stays unbound (deleted at once).
    bind(cluster, "lost-worker-1", node)
    cluster.run_all("lost", names)
    cluster.wait_condition("lost", "Running", T)

    # The kubelet reports its node not ready: NodeNotReady, in the node's words.
    since = now()
    set_ready(cluster, node, "False", since)
    condition = waits.wait_until(
        lambda: waiting_on_node(cluster, "lost", "NodeNotReady"), timeout=T, what="NodeNotReady"
    )
    assert condition["message"] == f"worker 1: node {node} not ready since {since}", condition

    # Then the kubelet goes silent: unreachable. Measured: the patch to the job's status.
    since = now()
    started = time.monotonic()
    set_ready(cluster, node, "Unknown", since)
    condition = waits.wait_until(
        lambda: waiting_on_node(cluster, "lost", "NodeUnreachable"),
        timeout=T,
        what="NodeUnreachable",
        interval=0.02,
    )
    print(f"node unreachable -> job status in {time.monotonic() - started:.2f} s")
    assert condition["message"] == f"worker 1: node {node} unreachable since {since}", condition
    assert printed_reason(control_plane, cluster.namespace, "lost") == "NodeUnreachable"
    status = (cluster.job("lost") or {})["status"]
    assert status["ready"] == "1/2", status
    entry = status["replicaStatuses"]["worker"]["indexes"][1]
    assert (entry["waitingReason"], entry["state"]) == ("NodeUnreachable", "Running"), entry
    assert entry["waitingMessage"] == f"node {node} unreachable since {since}", entry
    events = waits.wait_until(
        lambda: (
            [e for e in cluster.events("lost") if e.reason in ("NodeNotReady", "NodeUnreachable")]
            if len([e for e in cluster.events("lost") if e.reason == "NodeUnreachable"]) == 1
            else None
        ),
        timeout=T,
        what="the node Events",
    )
    assert sorted(e.reason or "" for e in events) == ["NodeNotReady", "NodeUnreachable"], events
    assert all(e.type == "Warning" and node in (e.message or "") for e in events), events
    # Kubernetes decides the Pod's end, not the operator: it is still there, not deleting.
    pod = cluster.pod("lost-worker-1")
    assert pod is not None and meta(pod).deletion_timestamp is None
    assert attempt(pod) == 0

    # The Node is deleted: the pod GC removes its Pod; the replica comes back elsewhere.
    cluster.core.delete_node(node)
    waits.wait_until(
        lambda: (p := cluster.pod("lost-worker-1")) is not None and attempt(p) == 1,
        timeout=POD_GC,
        what="the pod GC to remove worker 1's Pod and worker 1 recreated as attempt 1",
        interval=0.5,
    )
    status = (cluster.job("lost") or {})["status"]
    assert (status["restartCount"], status["disruptionCount"]) == (0, 1), status
    assert not cluster.condition("lost", "Failed")
    evicted = waits.wait_until(
        lambda: next((e for e in cluster.events("lost") if e.reason == "Evicted"), None),
        timeout=T,
        what="an Evicted Event",
    )
    print(f"Evicted Event: {evicted.message}")
    assert evicted.message is not None
    assert "worker 1 was evicted" in evicted.message, evicted.message
    assert "not counted toward backoffLimit" in evicted.message
    # Never two live Pods for one replica: one Pod per name, by construction of the names,
    # and the new one came only after the old one was gone (attempt 1 under the same name).
    cluster.run_all("lost", names)
    cluster.wait_condition("lost", "Running", T)
    assert running_condition(cluster, "lost")["reason"] == "AllReplicasRunning"


def test_nodes_a_pod_force_deleted_from_a_lost_node_without_a_condition_is_a_disruption(
    cluster: Cluster, node: str, control_plane: ControlPlane
) -> None:
    """Someone force-deletes the Pod of an unreachable node (what `kubectl delete pod --force`
    or a node-repair tool does; no DisruptionTarget): the replica was known to be on a lost
    node, so its loss is a disruption, not a failure that backoffLimit 0 would end the job on."""
    names = {"gone-worker-0"}
    cluster.create_job(trainjob("gone", chief=0, workers=1, run_policy={"backoffLimit": 0}))
    cluster.wait_pods("gone", names, timeout=T)
    bind(cluster, "gone-worker-0", node)
    cluster.run_all("gone", names)
    cluster.wait_condition("gone", "Running", T)
    since = now()
    set_ready(cluster, node, "Unknown", since)
    waits.wait_until(
        lambda: waiting_on_node(cluster, "gone", "NodeUnreachable"), timeout=T, what="unreachable"
    )
    print(control_plane.kubectl("get", "tj", "gone", "-n", cluster.namespace).stdout)
    print(control_plane.kubectl("describe", "tj", "gone", "-n", cluster.namespace).stdout)
    cluster.core.delete_namespaced_pod("gone-worker-0", cluster.namespace, grace_period_seconds=0)
    waits.wait_until(
        lambda: (p := cluster.pod("gone-worker-0")) is not None and attempt(p) == 1,
        timeout=T,
        what="worker 0 recreated as attempt 1",
    )
    status = (cluster.job("gone") or {})["status"]
    assert (status["restartCount"], status["disruptionCount"]) == (0, 1), status
    assert not cluster.condition("gone", "Failed")
    restarting = cluster.wait_condition("gone", "Restarting", T)
    assert restarting["reason"] == "Evicted", restarting
    assert f"NodeUnreachable: node {node} unreachable since {since}" in restarting["message"]


def test_nodes_a_peer_failing_after_its_node_was_lost_restarts_uncounted(
    cluster: Cluster, node: str
) -> None:
    """All-reduce: worker 0 exits 1 once worker 1's node is unreachable (the collective broke).
    The lost node is the cause, uncounted; worker 1's Pod is left to Kubernetes (not deleted
    by the operator), and its new attempt comes only once that Pod is gone."""
    names = {"peer-worker-0", "peer-worker-1"}
    cluster.create_job(trainjob("peer", chief=0, workers=2, run_policy={"backoffLimit": 0}))
    cluster.wait_pods("peer", names, timeout=T)
    bind(cluster, "peer-worker-1", node)
    cluster.run_all("peer", names)
    cluster.wait_condition("peer", "Running", T)
    set_ready(cluster, node, "Unknown", now())
    waits.wait_until(
        lambda: waiting_on_node(cluster, "peer", "NodeUnreachable"), timeout=T, what="unreachable"
    )
    cluster.set_exited("peer-worker-0", 1)
    waits.wait_until(
        lambda: (p := cluster.pod("peer-worker-0")) is not None and attempt(p) == 1,
        timeout=T,
        what="worker 0 recreated as attempt 1",
    )
    status = (cluster.job("peer") or {})["status"]
    assert (status["restartCount"], status["disruptionCount"]) == (0, 1), status
    restarting = cluster.condition("peer", "Restarting")
    assert restarting is not None and restarting["reason"] == "Evicted", restarting
    old = cluster.pod("peer-worker-1")
    assert old is not None and attempt(old) == 0 and meta(old).deletion_timestamp is None
    # What the pod GC does once the Node is deleted (without waiting a minute for it).
    cluster.core.delete_namespaced_pod("peer-worker-1", cluster.namespace, grace_period_seconds=0)
    waits.wait_until(
        lambda: (p := cluster.pod("peer-worker-1")) is not None and attempt(p) == 1,
        timeout=T,
        what="worker 1 recreated as attempt 1",
    )
    status = (cluster.job("peer") or {})["status"]
    assert (status["restartCount"], status["disruptionCount"]) == (0, 1), status
    assert not cluster.condition("peer", "Failed")
