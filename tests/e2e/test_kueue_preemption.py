"""Kueue on real pods: a low-priority 2-worker job trains; a high-priority job preempts it
through Kueue (the real controller, beside the node's control plane); the high one succeeds;
the low one is admitted again and resumes at the step it saved at SIGTERM, then succeeds.

It runs on the kind cluster (`bash tests/run`: Kueue installed there with its own Helm chart,
tests/controlplane/kind.py) and, when chosen, on the node cluster (Kueue as a host process,
tests/controlplane/kueue.py). The chart is upgraded with kueue.enabled=true for this module
(and back afterwards). On another cluster (TRAINJOB_E2E_CLUSTER=current) Kueue must already be
installed there, configured with externalFrameworks: ["TrainJob.v1alpha1.trainjob.dev"].
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import (
    CHART,
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    RELEASE,
    Cluster,
    wait_until,
)
from tests.e2e.test_trainjob import JOB_TIMEOUT, example

# On kind, Kueue is installed in the cluster with its own chart (tests/controlplane/kind.py).
# alone: the operator follows Kueue (a Helm upgrade), and the queues fill both nodes
pytestmark = [pytest.mark.e2e, pytest.mark.kind, pytest.mark.alone]

QUEUE: Final = "team-queue"
# Each job's two workers request half a CPU each: the ClusterQueue fits one job at a time.
QUOTA: Final = "1"
PROGRESS_PREFIX: Final = "TRAINJOB_PROGRESS "


@pytest.fixture(scope="module")
def kueue_operator(cluster: Cluster, operator: str) -> Iterator[str]:
    """Kueue (a host process on the node cluster) and the operator upgraded to follow it."""
    controller = None
    if cluster.plane is not None:
        from tests.controlplane.kueue import start_kueue

        controller = start_kueue(cluster.plane, pods_ready_timeout="10m")
    else:
        found = cluster.kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False)
        if "workloads" not in found:
            pytest.fail(
                "Kueue is not installed in this cluster: install it with "
                'externalFrameworks: ["TrainJob.v1alpha1.trainjob.dev"]',
                pytrace=False,
            )
    upgrade: list[str | Path] = [
        "upgrade",
        RELEASE,
        CHART,
        f"--namespace={OPERATOR_NAMESPACE}",
        "--reuse-values",
    ]
    cluster.helm(*upgrade, "--set=kueue.enabled=true", "--wait", "--timeout=5m")
    cluster.kubectl("rollout", "status", OPERATOR_DEPLOYMENT, "-n", OPERATOR_NAMESPACE)
    try:
        yield operator
    finally:
        cluster.helm(*upgrade, "--set=kueue.enabled=false", "--wait", "--timeout=5m")
        if controller is not None:
            print(f"kueue log, last lines:\n{controller.log_tail(30)}")
            controller.stop()


def queue_objects(namespace: str) -> str:
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"{namespace}-flavor"},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"{namespace}-cq"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": f"{namespace}-flavor",
                                "resources": [{"name": "cpu", "nominalQuota": QUOTA}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": f"{namespace}-cq"},
        },
    ]
    for name, value in ((f"{namespace}-low", 10), (f"{namespace}-high", 1000)):
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    return "\n---\n".join(json.dumps(o) for o in objects)


def queued_mnist(name: str, namespace: str, priority: str, epochs: int) -> dict[str, Any]:
    manifest = example("mnist-multiworker.yaml")
    manifest["metadata"] = {
        "name": name,
        "labels": {
            "kueue.x-k8s.io/queue-name": QUEUE,
            "kueue.x-k8s.io/priority-class": f"{namespace}-{priority}",
        },
    }
    manifest["spec"]["runtime"]["config"] = {
        "epochs": epochs,
        "steps_per_epoch": 40,
        "batch_size": 64,
    }
    manifest["spec"]["checkpoint"]["subPath"] = name
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {"containers": [{"name": "tensorflow", "resources": {"requests": {"cpu": "500m"}}}]}
    }
    return manifest


class LogFollower(threading.Thread):
    """`kubectl logs -f` of one Pod into a file, so the lines a container writes while it is
    stopped (the SIGTERM save) are kept after the Pod is gone."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str, path: Path) -> None:
        super().__init__(daemon=True)
        self.argv = [
            cluster.kubectl_path,
            "logs",
            "-f",
            pod,
            "-n",
            namespace,
            "-c",
            "tensorflow",
        ]
        self.env = dict(cluster.env)
        self.path = path

    def run(self) -> None:
        with self.path.open("wb") as out:
            subprocess.run(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=JOB_TIMEOUT,
                check=False,
            )

    def events(self) -> list[dict[str, Any]]:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        return [
            json.loads(line[len(PROGRESS_PREFIX) :])
            for line in text.splitlines()
            if line.startswith(PROGRESS_PREFIX)
        ]


def suspended_reason(cluster: Cluster, namespace: str, job: str) -> str | None:
    status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Suspended" and cond.get("status") == "True":
            return str(cond.get("reason"))
    return None


@pytest.fixture
def queues(cluster: Cluster, kueue_operator: str, namespace: str) -> Iterator[str]:
    """The namespace's LocalQueue, its ClusterQueue, flavor and priority classes."""
    objects = queue_objects(namespace)
    cluster.kubectl("apply", "-f", "-", stdin=objects)
    try:
        yield QUEUE
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", stdin=objects, check=False)


def test_high_priority_job_preempts_through_kueue_and_the_low_one_resumes_where_it_saved(
    cluster: Cluster, queues: str, namespace: str, tmp_path: Path
) -> None:
    low, high = "low", "high"
    # 6 epochs (240 steps): still training when the high job preempts it, a few seconds after
    # its first step; what is left after it resumes is what the wait costs.
    cluster.apply(namespace, json.dumps(queued_mnist(low, namespace, "low", epochs=6)))
    worker0 = f"{low}-worker-0"

    def training(pod: str) -> bool:
        return any(
            e["event"] == "step" or e["event"] == "epoch" for e in cluster.progress(namespace, pod)
        )

    wait_until(lambda: training(worker0), timeout=JOB_TIMEOUT, what="the low job training")
    first_uid = cluster.get_json("pod", worker0, "-n", namespace)["metadata"]["uid"]
    follower = LogFollower(cluster, namespace, worker0, tmp_path / "low-worker-0.log")
    follower.start()

    cluster.apply(namespace, json.dumps(queued_mnist(high, namespace, "high", epochs=1)))
    wait_until(
        lambda: suspended_reason(cluster, namespace, low) == "EvictedByKueue",
        timeout=JOB_TIMEOUT,
        what="the low job evicted by Kueue",
    )
    follower.join(JOB_TIMEOUT)
    saved = [
        e
        for e in follower.events()
        if e["event"] == "checkpoint" and e.get("reason") == "preempted"
    ]
    assert saved, f"no save at SIGTERM in the low job's log: {follower.events()[-5:]}"
    saved_step = int(saved[-1]["step"])
    assert saved_step > 0, saved

    assert cluster.wait_finished(namespace, high, JOB_TIMEOUT) == "Succeeded"

    # Admitted again: a new attempt resumes at the step saved at SIGTERM, nothing counted.
    def resumed_start() -> dict[str, Any] | None:
        pod = cluster.get_json("pod", worker0, "-n", namespace, "--ignore-not-found")
        if not pod or pod["metadata"]["uid"] == first_uid:
            return None
        starts = [e for e in cluster.progress(namespace, worker0) if e["event"] == "start"]
        return starts[-1] if starts else None

    start = wait_until(resumed_start, timeout=JOB_TIMEOUT, what="the low job to resume")
    assert int(start["initial_step"]) == saved_step, (start, saved[-1])
    assert cluster.wait_finished(namespace, low, JOB_TIMEOUT) == "Succeeded"
    status = cluster.get_json("trainjob", low, "-n", namespace)["status"]
    assert status.get("restartCount", 0) == 0, status
    described = cluster.kubectl("describe", "tj", low, "-n", namespace)
    assert "Evicted" in described and "Admitted" in described, described
    print(f"low job: preempted at step {saved_step}, resumed at step {start['initial_step']}")
