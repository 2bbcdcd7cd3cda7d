"""TrainJobs under a real Kueue: queued, admitted, preempted, deactivated, timed out and
resumed, with the operator (--kueue) keeping each job's Workload as Kueue's protocol asks.
Kueue is the real controller built from its Go module (tests/controlplane/kueue.py), with
its webhooks checking our Workload writes; Pods are played by patching their status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.controlplane.kueue import Kueue
from tests.integration.kueue_harness import (
    KUEUE_PODS_READY_TIMEOUT,
    QUEUE_LABEL,
    Queues,
    condition,
    is_true,
    queued_job,
    queues_in,
    suspended,
    wait_admitted,
)
from tests.integration.operator_harness import Cluster, Obj, attempt, pod_spec
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 60.0  # per step; Kueue admits within a second or two, the machine has 2 cores
PODS_READY_TIMEOUT = KUEUE_PODS_READY_TIMEOUT


@pytest.fixture(scope="module")
def operator(
    kueue: Kueue, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(kubeconfig, log, "--namespace=test-kq-*", "--kueue").start()
    try:
        yield op.wait_serving(T)
    finally:
        op.stop()


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    assert namespace.startswith("test-kq-"), namespace
    yield Cluster(api_client, namespace)
    print(f"operator log, last lines:\n{operator.log_tail(40)}")


@pytest.fixture
def queues(cluster: Cluster, api_client: k8s.ApiClient, kueue: Kueue) -> Iterator[Queues]:
    with queues_in(cluster.namespace, api_client, kueue) as objects:
        yield objects


CHIEF_AND_WORKERS = {"chief-0", "worker-0", "worker-1"}


def names(job: str, replicas: set[str] = CHIEF_AND_WORKERS) -> set[str]:
    return {f"{job}-{r}" for r in replicas}


def test_kq_admitted_job_runs_with_its_flavor_and_releases_quota(
    cluster: Cluster, queues: Queues
) -> None:
    toleration = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    flavor = queues.flavor({"pool": "spot"}, [toleration])
    cq = queues.cluster_queue(flavor, "10")
    lq = queues.local_queue(cq)
    created = cluster.create_job(queued_job("mnist", lq))

    workload = wait_admitted(queues, "mnist", T)
    meta = workload["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/job-uid"] == created["metadata"]["uid"]
    assert "kueue.x-k8s.io/resource-in-use" in meta["finalizers"]
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", "mnist", True)
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [
        ("chief", 1),
        ("worker", 2),
    ]
    assert workload["spec"]["queueName"] == lq

    pods = cluster.wait_pods("mnist", names("mnist"), timeout=T)
    worker = pods["mnist-worker-0"]
    assert pod_spec(worker).node_selector == {"pool": "spot"}
    # (The API server adds its own default tolerations beside the flavor's.)
    assert "spot" in [t.key for t in pod_spec(worker).tolerations or []]
    assert worker.metadata is not None and worker.metadata.labels is not None
    assert worker.metadata.labels["kueue.x-k8s.io/podset"] == "worker"
    assert worker.metadata.labels["kueue.x-k8s.io/cluster-queue-name"] == cq
    assert not suspended(cluster, "mnist")

    cluster.run_all("mnist", names("mnist"))
    cluster.wait_condition("mnist", "Running", T)
    waits.wait_until(
        lambda: is_true(queues.workload("mnist"), "PodsReady"),
        timeout=T,
        what="PodsReady on the Workload",
    )
    cluster.set_exited("mnist-chief-0", 0)
    cluster.wait_condition("mnist", "Succeeded", T)

    def finished_workload() -> Obj | None:
        workload = queues.workload("mnist")
        return workload if is_true(workload, "Finished") else None

    finished = waits.wait_until(finished_workload, timeout=T, what="the Workload Finished")
    assert (condition(finished, "Finished") or {}).get("reason") == "Succeeded"
    waits.wait_until(
        lambda: (
            "kueue.x-k8s.io/resource-in-use"
            not in ((queues.workload("mnist") or {}).get("metadata") or {}).get("finalizers", [])
        ),
        timeout=T,
        what="the Workload's finalizer removed",
    )
    waits.wait_until(
        lambda: queues.cluster_queue_status(cq).get("admittedWorkloads") == 0,
        timeout=T,
        what="the ClusterQueue's quota released",
    )
    reasons = [e.reason for e in cluster.events("mnist")]
    assert "Queued" in reasons and "Admitted" in reasons, reasons


def test_kq_second_job_waits_in_the_queue_until_the_first_ends(
    cluster: Cluster, queues: Queues
) -> None:
    flavor = queues.flavor()
    cq = queues.cluster_queue(flavor, "3")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("first", lq))
    wait_admitted(queues, "first", T)
    cluster.run_all("first", names("first"))
    cluster.create_job(queued_job("second", lq))

    def queued_message() -> str | None:
        # Kueue's own words, once Kueue looked at the Workload.
        cond = cluster.condition("second", "Suspended")
        if cond and cond["reason"] == "Queued" and "insufficient unused quota" in cond["message"]:
            return str(cond["message"])
        return None

    message = waits.wait_until(
        queued_message, timeout=T, what="second job Queued with Kueue's reason"
    )
    assert f"LocalQueue {lq}" in message, message
    job = cluster.job("second") or {}
    assert job["status"]["state"] == "Queued"
    assert suspended(cluster, "second")
    assert not cluster.pods("second")

    cluster.set_exited("first-chief-0", 0)
    cluster.wait_condition("first", "Succeeded", T)
    wait_admitted(queues, "second", T)
    cluster.wait_pods("second", names("second"), timeout=T)
    cluster.run_all("second", names("second"))
    cluster.wait_condition("second", "Running", T)


def test_kq_higher_priority_job_preempts_and_the_preempted_one_resumes_uncounted(
    cluster: Cluster, queues: Queues
) -> None:
    flavor = queues.flavor()
    cq = queues.cluster_queue(flavor, "3", {"withinClusterQueue": "LowerPriority"})
    lq = queues.local_queue(cq)
    low, high = queues.priority_class(10), queues.priority_class(1000)
    cluster.create_job(queued_job("low", lq, priority_class=low))
    assert (wait_admitted(queues, "low", T)["spec"]).get("priority") == 10
    cluster.run_all("low", names("low"))
    cluster.wait_condition("low", "Running", T)

    cluster.create_job(queued_job("high", lq, priority_class=high))
    evicted = waits.wait_until(
        lambda: (
            (cond := cluster.condition("low", "Suspended"))
            and cond["reason"] == "EvictedByKueue"
            and cond
        ),
        timeout=T,
        what="the low-priority job evicted by Kueue",
    )
    assert "Preempted" in evicted["message"], evicted
    waits.wait_until(lambda: not cluster.pods("low"), timeout=T, what="the low job's pods gone")

    def unadmitted_low() -> Obj | None:
        workload = queues.workload("low")
        if workload is None or (workload.get("status") or {}).get("admission"):
            return None
        return workload

    low_workload = waits.wait_until(
        unadmitted_low, timeout=T, what="the low job's admission cleared"
    )
    assert is_true(low_workload, "Requeued")
    wait_admitted(queues, "high", T)
    cluster.run_all("high", names("high"))
    cluster.set_exited("high-chief-0", 0)
    cluster.wait_condition("high", "Succeeded", T)

    # Re-admitted once the quota is free again: a new attempt, nothing counted.
    wait_admitted(queues, "low", T)
    pods = cluster.wait_pods("low", names("low"), timeout=T)
    assert all(attempt(p) >= 1 for p in pods.values())
    cluster.run_all("low", names("low"))
    cluster.wait_condition("low", "Running", T)
    assert (cluster.job("low") or {})["status"]["restartCount"] == 0
    reasons = [e.reason for e in cluster.events("low")]
    assert "Evicted" in reasons, reasons


def test_kq_deactivated_workload_stops_the_job_and_says_so(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "10")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("deact", lq))
    workload = wait_admitted(queues, "deact", T)
    cluster.run_all("deact", names("deact"))
    queues.patch_workload(workload["metadata"]["name"], {"spec": {"active": False}})
    waits.wait_until(lambda: suspended(cluster, "deact"), timeout=T, what="the job suspended")
    waits.wait_until(lambda: not cluster.pods("deact"), timeout=T, what="its pods gone")

    def deactivated() -> Obj | None:
        held = cluster.condition("deact", "Suspended")
        return held if held and "Deactivated" in held["message"] else None

    cond = waits.wait_until(deactivated, timeout=T, what="the job saying it is deactivated")
    assert cond["reason"] == "EvictedByKueue"
    # The same Workload stays (deleting it would break deactivation: kueue#4342).
    (still,) = queues.workloads("deact")
    assert still["metadata"]["uid"] == workload["metadata"]["uid"]
    queues.patch_workload(workload["metadata"]["name"], {"spec": {"active": True}})
    wait_admitted(queues, "deact", T)
    cluster.wait_pods("deact", names("deact"), timeout=T)


def test_kq_pods_that_never_start_are_evicted_at_the_pods_ready_timeout(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "10")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("stuck", lq))
    wait_admitted(queues, "stuck", T)
    cluster.wait_pods("stuck", names("stuck"), timeout=T)
    # Nobody plays the kubelet: the Pods stay Pending, PodsReady stays False.
    cond = waits.wait_until(
        lambda: (
            (c := cluster.condition("stuck", "Suspended")) and c["reason"] == "EvictedByKueue" and c
        ),
        timeout=PODS_READY_TIMEOUT + T,
        what="the job evicted at the PodsReady timeout",
    )
    assert "PodsReadyTimeout" in cond["message"], cond
    waits.wait_until(lambda: not cluster.pods("stuck"), timeout=T, what="its pods gone")
    assert (cluster.job("stuck") or {})["status"]["restartCount"] == 0


def test_kq_a_deleted_workload_stops_the_job_and_a_new_one_is_made(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "10")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("wl", lq))
    first = wait_admitted(queues, "wl", T)
    cluster.run_all("wl", names("wl"))
    queues.delete_workload(first["metadata"]["name"])
    second = waits.wait_until(
        lambda: (
            (wl := queues.workload("wl")) is not None
            and wl["metadata"]["uid"] != first["metadata"]["uid"]
            and is_true(wl, "Admitted")
            and wl
        ),
        timeout=T,
        what="a new Workload admitted",
    )
    assert second["metadata"]["name"] == first["metadata"]["name"]
    cluster.wait_pods("wl", names("wl"), timeout=T)


def test_kq_a_deleted_job_finishes_and_releases_its_workload(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "10")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("gone", lq))
    wait_admitted(queues, "gone", T)
    cluster.delete_job("gone")
    waits.wait_until(lambda: not queues.workloads("gone"), timeout=T, what="the Workload deleted")
    waits.wait_until(
        lambda: queues.cluster_queue_status(cq).get("admittedWorkloads") == 0,
        timeout=T,
        what="the quota released",
    )


def test_kq_a_spec_change_while_queued_replaces_the_workload(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "2")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job("resize", lq))  # 3 CPUs: never fits
    waits.wait_until(
        lambda: (c := cluster.condition("resize", "Suspended")) and c["reason"] == "Queued",
        timeout=T,
        what="the job queued",
    )
    first = waits.wait_until(lambda: queues.workload("resize"), timeout=T, what="its Workload")
    cluster.patch_job("resize", {"spec": {"replicaSpecs": {"worker": {"replicas": 1}}}})
    second = wait_admitted(queues, "resize", T)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert [(p["name"], p["count"]) for p in second["spec"]["podSets"]] == [
        ("chief", 1),
        ("worker", 1),
    ]
    cluster.wait_pods("resize", names("resize", {"chief-0", "worker-0"}), timeout=T)


def test_kq_a_job_without_a_queue_label_runs_as_before(cluster: Cluster, queues: Queues) -> None:
    body = queued_job("plain", "nowhere")
    del body["metadata"]["labels"][QUEUE_LABEL]
    cluster.create_job(body)
    cluster.wait_pods("plain", names("plain"), timeout=T)
    assert not queues.workloads("plain")


def test_kueue_manage_jobs_without_queue_name_in_selected_namespaces(
    kueue: Kueue,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Kueue's manageJobsWithoutQueueName: every job of a selected namespace goes through
    its LocalQueue named "default"; other namespaces run as before."""
    core = k8s.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {"trainjob-test/queued": "yes"}}})
    other = f"{namespace[:50]}-free"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=other)))
    queues = Queues(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig,
        tmp_path / "operator.log",
        f"--namespace={namespace}",
        f"--namespace={other}",
        "--kueue",
        "--kueue-manage-jobs-without-queue-name",
        "--kueue-managed-namespaces=trainjob-test/queued=yes",
    ).start()
    try:
        operator.wait_serving(T)
        queues.local_queue(queues.cluster_queue(queues.flavor(), "10"), "default")
        managed, free = Cluster(api_client, namespace), Cluster(api_client, other)
        body = queued_job("nolabel", "unused")
        del body["metadata"]["labels"][QUEUE_LABEL]
        managed.create_job(body)
        workload = wait_admitted(queues, "nolabel", T)
        assert workload["spec"]["queueName"] == "default"
        managed.wait_pods("nolabel", names("nolabel"), timeout=T)
        free.create_job(body)
        free.wait_pods("nolabel", names("nolabel"), timeout=T)
        assert not Queues(api_client, other).workloads("nolabel")
    finally:
        operator.stop()
        queues.cleanup()
        core.delete_namespace(other)
