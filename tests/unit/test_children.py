"""The operator's in-memory index of each job's Pods and Services: events, and the seed that
a restarted operator takes with one list call while events keep arriving."""

from __future__ import annotations

from typing import Any

from trainjob_operator.children import ChildIndex

JOB = ("ns", "mnist")
OTHER = ("ns", "other")


def pod(name: str, rtype: str, index: int, phase: str = "Running", uid: str = "") -> Any:
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "labels": {
                "trainjob.dev/job-name": "mnist",
                "trainjob.dev/replica-type": rtype,
                "trainjob.dev/replica-index": str(index),
            },
            "ownerReferences": [{"controller": True, "uid": "job-uid"}],
        },
        "status": {"phase": phase},
    }


def service(name: str, rtype: str, index: int) -> Any:
    body = pod(name, rtype, index)
    del body["status"]
    return body


def phases(index: ChildIndex, job: tuple[str, str] = JOB) -> dict[tuple[str, int], str]:
    return {child.key: child.observed.phase for child in index.pods(job)}


def test_events_add_update_and_remove_children_per_job() -> None:
    index = ChildIndex()
    index.pod_event(JOB, "mnist-worker-0", pod("mnist-worker-0", "worker", 0, "Pending"))
    index.pod_event(JOB, "mnist-worker-0", pod("mnist-worker-0", "worker", 0, "Running"))
    index.pod_event(OTHER, "other-worker-0", pod("other-worker-0", "worker", 0, "Failed"))
    index.service_event(JOB, "mnist-worker-0", service("mnist-worker-0", "worker", 0))
    assert phases(index) == {("worker", 0): "Running"}
    assert [s.owner_uid for s in index.services(JOB)] == ["job-uid"]
    assert phases(index, OTHER) == {("worker", 0): "Failed"}

    index.pod_event(JOB, "mnist-worker-0", None)
    index.service_event(JOB, "mnist-worker-0", None)
    assert index.pods(JOB) == [] and index.services(JOB) == []
    assert phases(index, OTHER) == {("worker", 0): "Failed"}


def test_a_pod_without_replica_labels_is_not_a_child() -> None:
    index = ChildIndex()
    body = pod("stray", "worker", 0)
    del body["metadata"]["labels"]["trainjob.dev/replica-index"]
    index.pod_event(JOB, "stray", body)
    assert index.pods(JOB) == []


def test_seed_fills_what_the_watch_has_not_shown_yet() -> None:
    index = ChildIndex()
    index.begin_seed(JOB)
    index.finish_seed(
        JOB,
        [pod("mnist-chief-0", "chief", 0), pod("mnist-worker-0", "worker", 0, "Succeeded")],
        [service("mnist-chief-0", "chief", 0)],
    )
    assert phases(index) == {("chief", 0): "Running", ("worker", 0): "Succeeded"}
    assert [s.key for s in index.services(JOB)] == [("chief", 0)]


def test_events_during_the_seed_win_over_the_list() -> None:
    index = ChildIndex()
    index.pod_event(JOB, "mnist-ps-0", pod("mnist-ps-0", "ps", 0))
    index.begin_seed(JOB)
    # While the list is in flight: the worker finishes, the chief's Pod is deleted.
    index.pod_event(JOB, "mnist-worker-0", pod("mnist-worker-0", "worker", 0, "Succeeded"))
    index.pod_event(JOB, "mnist-chief-0", None)
    index.finish_seed(
        JOB,
        [
            pod("mnist-chief-0", "chief", 0),  # older than its DELETED event: not revived
            pod("mnist-worker-0", "worker", 0, "Running"),  # older than its event
            pod("mnist-worker-1", "worker", 1, "Pending"),  # no event yet: from the list
        ],
        [],
    )
    # The ps Pod is gone from the list and got no event since: it was deleted before.
    assert phases(index) == {("worker", 0): "Succeeded", ("worker", 1): "Pending"}


def test_an_abandoned_seed_stops_tracking_and_a_later_one_starts_clean() -> None:
    index = ChildIndex()
    index.begin_seed(JOB)
    index.pod_event(JOB, "mnist-worker-0", pod("mnist-worker-0", "worker", 0, "Failed"))
    index.abandon_seed(JOB)
    index.begin_seed(JOB)
    index.finish_seed(JOB, [pod("mnist-worker-0", "worker", 0, "Running")], [])
    assert phases(index) == {("worker", 0): "Running"}
