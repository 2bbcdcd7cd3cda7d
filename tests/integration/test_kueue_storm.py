"""A storm of TrainJobs through one ClusterQueue under the real Kueue, with the operator
SIGKILLed at random and restarted: the quota is never over-committed by running Pods, no
job's Pod exists without its Workload's admission, and every job ends.

Pods run on kwok's fake nodes (kube-scheduler binds them, kwok plays the kubelet): each
chief exits 0 after a short run, so jobs finish by themselves and the queue drains.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Final, cast

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import Component
from tests.controlplane.kueue import Kueue
from tests.integration.kueue_harness import QUEUE_LABEL, Queues
from tests.integration.operator_harness import Cluster, Obj, meta, pod_status, trainjob, uid_of
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

JOBS: Final = int(os.environ.get("TRAINJOB_KUEUE_STORM_JOBS", "50"))
KILLS: Final = 5
QUOTA_CPU: Final = 9  # three jobs of three 1-CPU replicas at a time
SEED: Final = int(os.environ.get("TRAINJOB_KUEUE_STORM_SEED", "20"))


def storm_job(name: str, queue: str) -> dict[str, Any]:
    body = trainjob(name, chief=1, workers=2)
    for replica in body["spec"]["replicaSpecs"].values():
        template = replica["template"]
        template["spec"].pop("schedulerName", None)  # kube-scheduler binds, kwok runs
        template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    chief = body["spec"]["replicaSpecs"]["chief"]["template"]
    chief["metadata"] = {
        "annotations": {
            "trainjob.dev/kwok-exit-code": "0",
            "trainjob.dev/kwok-run-duration": "1500ms",
        }
    }
    body["metadata"]["labels"] = {QUEUE_LABEL: queue}
    return body


class Watcher(threading.Thread):
    """Checks the invariants every few hundred milliseconds until stopped."""

    def __init__(self, core: k8s.CoreV1Api, queues: Queues, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core = core
        self.queues = queues
        self.namespace = namespace
        self.stopped = threading.Event()
        self.violations: list[str] = []
        self.peak_cpu = 0
        self.checks = 0

    def live_pods(self) -> dict[str, k8s.V1Pod]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector="trainjob.dev/job-name"
        ).items
        return {
            uid_of(p): p
            for p in pods
            if meta(p).deletion_timestamp is None
            and pod_status(p).phase in (None, "Pending", "Running")
        }

    def check(self) -> None:
        pods = self.live_pods()
        workloads = {
            (w["metadata"].get("labels") or {}).get("trainjob.dev/job-name"): w
            for w in self.queues.workloads()
        }
        counted: set[str] = set()  # live Pods of jobs whose quota is held (not Finished)
        suspects: set[str] = set()  # ... of those, Pods whose Workload has no admission
        for uid, pod in pods.items():
            job = (meta(pod).labels or {})["trainjob.dev/job-name"]
            status = (workloads.get(job) or {}).get("status") or {}
            finished = any(
                c.get("type") == "Finished" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if finished:
                continue  # quota released; its leftover Pods are being cleaned up
            counted.add(uid)
            if not status.get("admission"):
                suspects.add(uid)
        if suspects or len(counted) > QUOTA_CPU:
            # Pods and Workloads were read one after the other: a Pod deleted in between
            # (before its admission was cleared) is no violation. Only Pods still alive in a
            # second read count.
            again = set(self.live_pods())
            for uid in sorted(suspects & again):
                self.violations.append(
                    f"Pod {meta(pods[uid]).name} runs while its Workload has no admission"
                )
            if len(counted & again) > QUOTA_CPU:
                self.violations.append(
                    f"{len(counted & again)} one-CPU Pods run on a quota of {QUOTA_CPU}"
                )
        self.peak_cpu = max(self.peak_cpu, len(counted))
        self.checks += 1

    def run(self) -> None:
        while not self.stopped.wait(0.3):
            try:
                self.check()
            except Exception as exc:  # an API hiccup is not a violation; note it
                self.violations.append(f"watcher error: {exc!r}")
                return


def trainjobs(cluster: Cluster) -> list[Obj]:
    listing = cast(
        Obj,
        cluster.custom.list_namespaced_custom_object(
            "trainjob.dev", "v1alpha1", cluster.namespace, "trainjobs"
        ),
    )
    items: list[Obj] = listing["items"]
    return items


def test_kueue_storm_with_operator_kills_keeps_quota_and_admission(
    kueue: Kueue,
    kwok: Component,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    cluster = Cluster(api_client, namespace)
    queues = Queues(api_client, namespace)
    log = tmp_path / "operator.log"
    operator = operator_process.Operator(
        kubeconfig, log, f"--namespace={namespace}", "--kueue"
    ).start()
    watcher = Watcher(k8s.CoreV1Api(api_client), queues, namespace)
    try:
        operator.wait_serving(60)
        flavor = queues.flavor()
        cq = queues.cluster_queue(flavor, str(QUOTA_CPU))
        lq = queues.local_queue(cq)
        watcher.start()
        started = time.monotonic()
        kill_at = sorted(rng.uniform(2, 40) for _ in range(KILLS))
        kills = 0
        for i in range(JOBS):
            cluster.create_job(storm_job(f"s{i:03d}", lq))
            while kill_at and time.monotonic() - started >= kill_at[0]:
                kill_at.pop(0)
                operator.kill()
                kills += 1
                operator.start()
            time.sleep(rng.uniform(0, 0.2))
        while kill_at:
            time.sleep(max(0.0, kill_at[0] - (time.monotonic() - started)))
            kill_at.pop(0)
            operator.kill()
            kills += 1
            operator.start()

        def all_done() -> bool:
            jobs = trainjobs(cluster)
            return len(jobs) == JOBS and all(
                (j.get("status") or {}).get("state") in ("Succeeded", "Failed") for j in jobs
            )

        waits.wait_until(
            all_done, timeout=60 + JOBS * 6, what=f"all {JOBS} jobs to end", interval=1
        )
        elapsed = time.monotonic() - started
        watcher.stopped.set()
        watcher.join(10)
        jobs = trainjobs(cluster)
        states = sorted({str((j.get("status") or {}).get("state")) for j in jobs})
        print(
            f"{JOBS} jobs through a {QUOTA_CPU}-CPU ClusterQueue in {elapsed:.0f}s, operator "
            f"killed {kills} times; peak CPUs of live Pods {watcher.peak_cpu}; "
            f"{watcher.checks} checks"
        )
        assert kills == KILLS
        assert states == ["Succeeded"], states
        assert watcher.checks > 10
        assert watcher.violations == [], watcher.violations[:10]
        waits.wait_until(
            lambda: queues.cluster_queue_status(cq).get("admittedWorkloads") == 0,
            timeout=60,
            what="the quota released",
        )
    finally:
        watcher.stopped.set()
        operator.stop()
        print(f"operator log, last lines:\n{operator.log_tail(30)}")
        queues.cleanup()


def test_kueue_job_deleted_while_the_operator_is_down_releases_its_workload(
    kueue: Kueue,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster = Cluster(api_client, namespace)
    queues = Queues(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig, tmp_path / "operator.log", f"--namespace={namespace}", "--kueue"
    )
    try:
        operator.start().wait_serving(60)
        cq = queues.cluster_queue(queues.flavor(), "10")
        lq = queues.local_queue(cq)
        cluster.create_job(storm_job("orphan", lq))
        waits.wait_until(
            lambda: (
                (wl := queues.workload("orphan")) is not None
                and (wl.get("status") or {}).get("admission")
            ),
            timeout=60,
            what="the Workload admitted",
        )
        operator.kill()
        cluster.delete_job("orphan")  # held by the operator's finalizer until it is back
        operator.start().wait_serving(60)
        waits.wait_until(lambda: cluster.job("orphan") is None, timeout=60, what="the job gone")
        waits.wait_until(
            lambda: not queues.workloads("orphan"), timeout=60, what="the Workload gone"
        )
        waits.wait_until(
            lambda: queues.cluster_queue_status(cq).get("admittedWorkloads") == 0,
            timeout=60,
            what="the quota released",
        )
    finally:
        operator.stop()
        print(f"operator log, last lines:\n{operator.log_tail(30)}")
        queues.cleanup()
