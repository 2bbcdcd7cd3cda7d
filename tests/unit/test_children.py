"""The operator's in-memory index of each job's Pods and Services: watch events, and a fresh
list that replaces what the index had in its namespace (or everywhere)."""

from __future__ import annotations

from typing import Any

from trainjob_operator.children import PODS, SERVICES, ChildIndex

JOB = ("ns", "mnist")
OTHER = ("ns", "other")
ELSEWHERE = ("team-b", "mnist")


def pod(
    name: str,
    rtype: str,
    index: int,
    phase: str = "Running",
    job: tuple[str, str] = JOB,
) -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": job[0],
            "uid": f"uid-{job[0]}-{name}",
            "labels": {
                "trainjob.dev/job-name": job[1],
                "trainjob.dev/replica-type": rtype,
                "trainjob.dev/replica-index": str(index),
            },
            "ownerReferences": [{"controller": True, "uid": "job-uid"}],
        },
        "status": {"phase": phase},
    }


def service(name: str, rtype: str, index: int, job: tuple[str, str] = JOB) -> Any:
    body = pod(name, rtype, index, job=job)
    del body["status"]
    return body


def phases(index: ChildIndex, job: tuple[str, str] = JOB) -> dict[tuple[str, int], str]:
    return {child.key: child.observed.phase for child in index.pods(job)}


def test_events_add_update_and_remove_children_per_job() -> None:
    index = ChildIndex()
    assert index.event(PODS, pod("mnist-worker-0", "worker", 0, "Pending")) == JOB
    index.event(PODS, pod("mnist-worker-0", "worker", 0, "Running"))
    assert index.event(PODS, pod("other-worker-0", "worker", 0, "Failed", job=OTHER)) == OTHER
    index.event(SERVICES, service("mnist-worker-0", "worker", 0))
    assert phases(index) == {("worker", 0): "Running"}
    assert [s.owner_uid for s in index.services(JOB)] == ["job-uid"]
    assert phases(index, OTHER) == {("worker", 0): "Failed"}

    assert index.event(PODS, pod("mnist-worker-0", "worker", 0), deleted=True) == JOB
    index.event(SERVICES, service("mnist-worker-0", "worker", 0), deleted=True)
    assert index.pods(JOB) == [] and index.services(JOB) == []
    assert phases(index, OTHER) == {("worker", 0): "Failed"}


def test_the_same_job_name_in_two_namespaces_is_two_jobs() -> None:
    index = ChildIndex()
    index.event(PODS, pod("mnist-chief-0", "chief", 0, "Running"))
    index.event(PODS, pod("mnist-chief-0", "chief", 0, "Failed", job=ELSEWHERE))
    assert phases(index) == {("chief", 0): "Running"}
    assert phases(index, ELSEWHERE) == {("chief", 0): "Failed"}


def test_a_pod_without_replica_labels_is_not_a_child() -> None:
    index = ChildIndex()
    body = pod("stray", "worker", 0)
    del body["metadata"]["labels"]["trainjob.dev/replica-index"]
    index.event(PODS, body)
    assert index.pods(JOB) == []
    unlabelled = pod("unlabelled", "worker", 0)
    del unlabelled["metadata"]["labels"]["trainjob.dev/job-name"]
    assert index.event(PODS, unlabelled) is None


def test_a_list_replaces_the_namespace_and_names_every_job_to_wake() -> None:
    index = ChildIndex()
    index.event(PODS, pod("mnist-ps-0", "ps", 0))  # deleted while the watch was down
    index.event(PODS, pod("mnist-worker-0", "worker", 0, "Running"))
    index.event(PODS, pod("mnist-chief-0", "chief", 0, job=ELSEWHERE))
    woken = index.replace(
        PODS,
        "ns",
        [
            pod("mnist-worker-0", "worker", 0, "Succeeded"),
            pod("other-worker-0", "worker", 0, "Pending", job=OTHER),
        ],
    )
    assert woken == {JOB, OTHER}
    assert phases(index) == {("worker", 0): "Succeeded"}
    assert phases(index, OTHER) == {("worker", 0): "Pending"}
    # Another namespace is not part of that list and stays as it was.
    assert phases(index, ELSEWHERE) == {("chief", 0): "Running"}
    # Services are a kind of their own.
    assert index.services(JOB) == []


def test_a_cluster_wide_list_replaces_everything() -> None:
    index = ChildIndex()
    index.event(SERVICES, service("mnist-ps-0", "ps", 0))
    index.event(SERVICES, service("mnist-ps-0", "ps", 0, job=ELSEWHERE))
    woken = index.replace(SERVICES, None, [service("mnist-ps-1", "ps", 1, job=ELSEWHERE)])
    assert woken == {JOB, ELSEWHERE}
    assert index.services(JOB) == []
    assert [s.key for s in index.services(ELSEWHERE)] == [("ps", 1)]


def test_forgetting_a_namespace_drops_its_children_only() -> None:
    index = ChildIndex()
    index.event(PODS, pod("mnist-ps-0", "ps", 0))
    index.event(SERVICES, service("mnist-ps-0", "ps", 0))
    index.event(PODS, pod("mnist-ps-0", "ps", 0, job=ELSEWHERE))
    index.forget_namespace("ns")
    assert index.pods(JOB) == [] and index.services(JOB) == []
    assert phases(index, ELSEWHERE) == {("ps", 0): "Running"}


def test_a_pods_node_is_kept_and_finds_the_jobs_on_a_node() -> None:
    index = ChildIndex()
    bound = pod("mnist-worker-0", "worker", 0)
    bound["spec"] = {"nodeName": "n3"}
    index.event(PODS, bound)
    index.event(PODS, pod("other-worker-0", "worker", 0, job=OTHER))  # not bound yet
    assert [p.node_name for p in index.pods(JOB)] == ["n3"]
    assert [p.node_name for p in index.pods(OTHER)] == [""]
    assert index.jobs_on_nodes({"n3"}) == {JOB}
    assert index.jobs_on_nodes({"n4"}) == set()


def test_a_pods_words_about_the_nodes_outlive_the_gangs_echo_of_them() -> None:
    """The index sees every event of a Pod; a reconcile reads only the latest, which under a
    gang soon says only that the gang failed recently."""

    def pending(message: str, uid: str | None = None) -> Any:
        body = pod("mnist-worker-0", "worker", 0, "Pending")
        if uid is not None:
            body["metadata"]["uid"] = uid
        body["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
        return body

    nodes_say = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    index = ChildIndex()
    index.event(PODS, pending(nodes_say))
    index.event(PODS, pending('0/4 nodes are available: podGroup "ns/mnist" failed recently.'))
    assert [p.observed.waiting_message for p in index.pods(JOB)] == [nodes_say]
    # A new Pod of the same name (another uid) starts afresh.
    index.event(PODS, pending("optimistic rejection in PostFilter", uid="another"))
    assert [p.observed.waiting_message for p in index.pods(JOB)] == [
        "optimistic rejection in PostFilter"
    ]
