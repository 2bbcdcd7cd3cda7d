"""What only several nodes show (TRAINJOB_E2E_CLUSTER=kind: 2 worker nodes): replicas on
different nodes train together over the pod network and find each other through their
headless Services' DNS; checkpoints on storage every node mounts survive a lost node; a lost
node is named in the job's status and its replica comes back on the other node as a
disruption, not a failure.

The jobs spread their replicas the way a user would: a topologySpreadConstraint on the job's
own label, one node apart at most (the tainted control-plane node not counted)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import OPERATOR_NAMESPACE, Cluster, wait_until
from tests.e2e.test_kubeflow_sdk import helm_upgrade, require_gang_scheduler
from tests.e2e.test_trainjob import JOB_TIMEOUT, example

# alone: placement over both nodes needs their free capacity; the gang test upgrades the operator
pytestmark = [pytest.mark.e2e, pytest.mark.kind, pytest.mark.alone]

HOSTNAME: Final = "kubernetes.io/hostname"
# What a cloud does once a node's machine is gone: it deletes the Node (the cloud node
# lifecycle controller); the pod GC then removes the Pods bound to it.
NODE_GONE_TIMEOUT: Final = 240.0


def spread(manifest: dict[str, Any], *, tolerate_lost_node_s: int | None = None) -> None:
    """Every replica type's Pods spread over the worker nodes, one apart at most."""
    job = manifest["metadata"]["name"]
    for replica in manifest["spec"]["replicaSpecs"].values():
        pod_spec = replica.setdefault("template", {}).setdefault("spec", {})
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME,
                "whenUnsatisfiable": "DoNotSchedule",
                "nodeTaintsPolicy": "Honor",
                "labelSelector": {"matchLabels": {"trainjob.dev/job-name": job}},
            }
        ]
        if tolerate_lost_node_s is not None:
            # Evicted from a lost node after this long, not the default 5 minutes.
            pod_spec["tolerations"] = [
                {
                    "key": f"node.kubernetes.io/{taint}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": tolerate_lost_node_s,
                }
                for taint in ("unreachable", "not-ready")
            ]


def nodes_of(cluster: Cluster, namespace: str, job: str) -> dict[str, str]:
    """Pod name -> the node it runs on, for the job's Pods."""
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in cluster.job_pods(namespace, job)
    }


def worker_nodes(cluster: Cluster) -> list[str]:
    nodes = cluster.get_json("nodes").get("items") or []
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})
    )


def run_spread(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> dict[str, str]:
    """Apply the job, note where its Pods ran, wait for it to succeed; -> pod -> node."""
    job = manifest["metadata"]["name"]
    cluster.apply(namespace, json.dumps(manifest))
    total = sum(int(r.get("replicas", 1)) for r in manifest["spec"]["replicaSpecs"].values())

    def all_placed() -> dict[str, str] | None:
        placed = nodes_of(cluster, namespace, job)
        return placed if len(placed) == total and all(placed.values()) else None

    placed = wait_until(all_placed, timeout=180, what=f"all {total} Pods of {job} placed")
    assert cluster.wait_finished(namespace, job, JOB_TIMEOUT) == "Succeeded"
    return placed


def test_four_multiworker_replicas_on_both_nodes_train_together(
    cluster: Cluster, namespace: str
) -> None:
    manifest = example("mnist-multiworker.yaml")
    manifest["spec"]["replicaSpecs"]["worker"]["replicas"] = 4
    manifest["spec"]["runtime"]["config"] = {"epochs": 2, "steps_per_epoch": 20, "batch_size": 64}
    spread(manifest)
    placed = run_spread(cluster, namespace, manifest)

    workers = worker_nodes(cluster)
    assert len(workers) >= 2, workers
    assert Counter(placed.values()) == dict.fromkeys(workers[:2], 2), placed
    job = manifest["metadata"]["name"]
    status = cluster.get_json("trainjob", job, "-n", namespace)["status"]
    assert sorted(status["progress"]["replicaDevices"]) == [f"worker-{i}" for i in range(4)]
    # All four were one all-reduce group: worker 0 trained every step and saw 4 workers.
    end = [e for e in cluster.progress(namespace, f"{job}-worker-0") if e["event"] == "end"]
    assert end and end[-1]["status"] == "succeeded" and end[-1]["step"] == 2 * 20, end


def test_parameter_server_replicas_on_both_nodes_succeed(cluster: Cluster, namespace: str) -> None:
    manifest = example("mnist-parameter-server.yaml")
    manifest["spec"]["runtime"]["config"] = {"epochs": 2, "steps_per_epoch": 20, "batch_size": 64}
    spread(manifest)
    placed = run_spread(cluster, namespace, manifest)

    # chief, ps and 2 workers over 2 nodes, one apart at most: 2 on each, so the chief and the
    # workers reach the ps across nodes.
    assert sorted(Counter(placed.values()).values()) == [2, 2], placed
    job = manifest["metadata"]["name"]
    status = cluster.get_json("trainjob", job, "-n", namespace)["status"]
    assert status["replicaStatuses"]["chief"]["succeeded"] == 1, status


def with_cpu(manifest: dict[str, Any], workers: int, cpu: str) -> dict[str, Any]:
    manifest["spec"]["replicaSpecs"]["worker"]["replicas"] = workers
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {
            "containers": [
                {"name": "tensorflow", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}
            ]
        }
    }
    return manifest


@pytest.fixture
def gang(cluster: Cluster, operator: str) -> Iterator[None]:
    """The operator gangs its jobs through scheduler-plugins' Coscheduling, installed in the
    cluster with its own chart (tests/controlplane/kind.py)."""
    require_gang_scheduler(cluster)
    helm_upgrade(cluster, "gangScheduler.type=scheduler-plugins")
    try:
        yield
    finally:
        helm_upgrade(cluster, "gangScheduler.type=none")


def test_a_gang_that_fits_only_across_both_nodes_is_placed_whole(
    cluster: Cluster, namespace: str, gang: None
) -> None:
    # Each worker node has 2 CPUs: two of these workers fit on a node, three do not.
    cpu = "800m"
    manifest = example("mnist-multiworker.yaml")
    manifest["spec"]["runtime"]["config"] = {"epochs": 1, "steps_per_epoch": 20, "batch_size": 64}

    # Five never fit at once: the gang places none of them (the default scheduler would place
    # four and leave one waiting, holding the CPUs of the four).
    too_big = with_cpu(json.loads(json.dumps(manifest)), 5, cpu)
    too_big["metadata"]["name"] = "too-big"
    cluster.apply(namespace, json.dumps(too_big))

    def waits_whole() -> str | None:
        status = cluster.get_json("trainjob", "too-big", "-n", namespace).get("status") or {}
        pods = nodes_of(cluster, namespace, "too-big")
        text = json.dumps(status.get("conditions") or [])
        return text if len(pods) == 5 and "all 5 Pods" in text else None

    why = wait_until(waits_whole, timeout=120, what="too-big to wait as a whole gang")
    assert not any(nodes_of(cluster, namespace, "too-big").values()), why
    cluster.kubectl("delete", "trainjob", "too-big", "-n", namespace, "--wait=true")

    fits = with_cpu(manifest, 4, cpu)
    placed = run_spread(cluster, namespace, fits)
    assert sorted(Counter(placed.values()).values()) == [2, 2], placed
    pods = cluster.job_pods(namespace, "mnist-multiworker")
    assert {p["spec"].get("schedulerName") for p in pods} == {"scheduler-plugins-scheduler"}


@pytest.mark.loses_a_node
def test_lost_node_names_the_cause_and_the_job_resumes_on_the_other_node(
    cluster: Cluster, namespace: str
) -> None:
    job = "mnist-multiworker"
    manifest = example("mnist-multiworker.yaml")
    # The node is lost right after the first checkpoint (epoch 1 of 4): the other 3 epochs are
    # the margin for that, and what the job trains once it resumes on the other node.
    manifest["spec"]["runtime"]["config"] = {"epochs": 4, "steps_per_epoch": 40, "batch_size": 64}
    spread(manifest, tolerate_lost_node_s=5)
    cluster.apply(namespace, json.dumps(manifest))

    def checkpointed() -> str | None:
        pod = cluster.get_json("pod", f"{job}-worker-0", "-n", namespace)
        events = cluster.progress(namespace, f"{job}-worker-0")
        return pod["metadata"]["uid"] if any(e["event"] == "checkpoint" for e in events) else None

    wait_until(checkpointed, timeout=JOB_TIMEOUT, what="a first checkpoint")
    placed = nodes_of(cluster, namespace, job)
    assert len(set(placed.values())) == 2, placed
    # Lose the node that holds a worker but not the operator (the operator's own Pod would
    # wait out its default 5-minute toleration).
    operator_nodes = {
        p["spec"].get("nodeName")
        for p in cluster.get_json("pods", "-n", OPERATOR_NAMESPACE).get("items") or []
    }
    lost = next(n for n in sorted(set(placed.values())) if n not in operator_nodes)
    lost_pod = next(p for p, n in placed.items() if n == lost)
    cluster.run("docker", "stop", "--time=1", lost)

    # The Node's kubelet stops reporting: the job says which node, and what brings the
    # replica back (its old Pod hangs Terminating there).
    def named() -> str | None:
        status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
        text = json.dumps(status.get("conditions") or [])
        return text if f"node {lost} unreachable" in text else None

    wait_until(named, timeout=NODE_GONE_TIMEOUT, what=f"the job's status to name {lost}")
    events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json")
    assert lost in events, "no Event names the lost node"

    # The machine is gone for good: the cloud deletes its Node, the pod GC its Pods.
    cluster.kubectl("delete", "node", lost, "--wait=false")

    def recreated_elsewhere() -> str | None:
        node = nodes_of(cluster, namespace, job).get(lost_pod)
        return node if node and node != lost else None

    wait_until(recreated_elsewhere, timeout=NODE_GONE_TIMEOUT, what=f"{lost_pod} on another node")
    assert cluster.wait_finished(namespace, job, JOB_TIMEOUT) == "Succeeded"
    starts = [e for e in cluster.progress(namespace, f"{job}-worker-0") if e["event"] == "start"]
    assert starts and starts[0]["initial_step"] > 0, starts  # resumed from the checkpoint
    status = cluster.get_json("trainjob", job, "-n", namespace)["status"]
    # One counted restart at most: the surviving worker's collective breaks within seconds,
    # before the node lifecycle controller calls the node lost (30 s, kind.cluster_config), so
    # that restart counts; had the node been known lost first, it would not have (a disruption).
    # The lost replica's Pod, left Terminating on the unreachable node by that restart, may be
    # recreated once the Node is deleted and also be counted as a disruption (seen once,
    # 2026-11-28): at most one of each, and only the restart counts toward backoffLimit.
    assert status.get("restartCount", 0) <= 1, status
    assert status.get("disruptionCount", 0) <= 1, status
