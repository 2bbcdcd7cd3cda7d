"""The operator's API layer (kube.py, plain aiohttp with kopf's kubeconfig login) and its child
informer (informer.py) against the real API server, in-process: the initial list, the
watch that follows from the list's resourceVersion, and stopping a namespace. (410 Gone
cannot be caused here: a young cluster's watch cache serves every resourceVersion since
it started, even after an etcd compaction; tests/unit/test_informer.py covers the relist.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s

from tests.integration.operator_harness import JOB_LABEL, NO_SCHEDULER, meta
from trainjob_operator import children, informer, kube

logger = logging.getLogger(__name__)


def child_metadata(name: str, job: str, rtype: str, index: int) -> k8s.V1ObjectMeta:
    labels = {
        JOB_LABEL: job,
        "trainjob.dev/replica-type": rtype,
        "trainjob.dev/replica-index": str(index),
    }
    return k8s.V1ObjectMeta(name=name, labels=labels)


def labelled_pod(name: str, job: str, rtype: str, index: int) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=child_metadata(name, job, rtype, index),
        spec=k8s.V1PodSpec(
            scheduler_name=NO_SCHEDULER,
            containers=[k8s.V1Container(name="tensorflow", image="trainjob:test")],
        ),
    )


def labelled_service(name: str, job: str, rtype: str, index: int) -> k8s.V1Service:
    return k8s.V1Service(
        metadata=child_metadata(name, job, rtype, index),
        spec=k8s.V1ServiceSpec(cluster_ip="None", selector={JOB_LABEL: job}),
    )


async def eventually(probe: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def api(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> kube.Kube:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    return kube.Kube(lambda: kube.login(kopf.OperatorSettings(), logger), connections=4)


def test_informer_lists_then_follows_only_labelled_children(
    api: kube.Kube, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    job = (namespace, "mnist")
    core_v1.create_namespaced_pod(namespace, labelled_pod("mnist-chief-0", "mnist", "chief", 0))
    core_v1.create_namespaced_service(
        namespace, labelled_service("mnist-chief-0", "mnist", "chief", 0)
    )
    stray = labelled_pod("stray", "mnist", "chief", 0)
    assert stray.metadata is not None
    stray.metadata.labels = {"app": "not-a-trainjob"}
    core_v1.create_namespaced_pod(namespace, stray)

    async def scenario() -> None:
        index = children.ChildIndex()
        woken: list[children.JobKey] = []
        watcher = informer.ChildInformer(
            api, index, woken.append, one_watch_for_all_namespaces=False
        )
        try:
            listed = watcher.acquire(namespace)
            await asyncio.wait_for(listed.wait(), 30)
            # The list: what existed before the informer started, the stray Pod not at all.
            assert [p.key for p in index.pods(job)] == [("chief", 0)]
            assert [s.key for s in index.services(job)] == [("chief", 0)]
            assert job in woken

            # The watch: a new child, then a deletion.
            woken.clear()
            await asyncio.to_thread(
                core_v1.create_namespaced_pod,
                namespace,
                labelled_pod("mnist-worker-0", "mnist", "worker", 0),
            )
            await eventually(lambda: len(index.pods(job)) == 2, "the new worker Pod")
            assert job in woken
            await asyncio.to_thread(
                core_v1.delete_namespaced_pod, "mnist-chief-0", namespace, grace_period_seconds=0
            )
            await eventually(
                lambda: [p.key for p in index.pods(job)] == [("worker", 0)],
                "the chief Pod's deletion",
            )

            # The last job of the namespace is gone: its watch stops, its children go.
            watcher.release(namespace)
            assert index.pods(job) == [] and index.services(job) == []
        finally:
            await watcher.close()
            await api.close()

    asyncio.run(scenario())


def test_a_watch_from_the_lists_version_sees_the_next_change(
    api: kube.Kube, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_pod(namespace, labelled_pod("mnist-ps-0", "mnist", "ps", 0))

    async def scenario() -> None:
        try:
            listing = await api.list_labelled(namespace, "pods", JOB_LABEL)
            assert [item["metadata"]["name"] for item in listing.items] == ["mnist-ps-0"]
            assert listing.resource_version
            await asyncio.to_thread(
                core_v1.delete_namespaced_pod, "mnist-ps-0", namespace, grace_period_seconds=0
            )
            stream = api.watch_labelled(namespace, "pods", JOB_LABEL, listing.resource_version)
            async for event in stream:
                if event["type"] == "DELETED":
                    assert event["object"]["metadata"]["name"] == "mnist-ps-0"
                    break
            await stream.aclose()  # type: ignore[attr-defined]
        finally:
            await api.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_requests_classify_the_servers_answers(
    api: kube.Kube, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """409 on create and 404 on delete are success; 422 is RejectedError naming the field;
    a delete whose uid precondition fails leaves the newer object alone."""
    pod = k8s.ApiClient().sanitize_for_serialization(
        labelled_pod("mnist-worker-0", "mnist", "worker", 0)
    )
    pod.update(apiVersion="v1", kind="Pod")
    pod["metadata"]["namespace"] = namespace

    async def scenario() -> None:
        try:
            assert await api.create("Pod", namespace, "mnist-worker-0", lambda: pod) is True
            assert await api.create("Pod", namespace, "mnist-worker-0", lambda: pod) is False
            await api.delete_pod(namespace, "mnist-worker-0", uid="not-its-uid")
            assert await api.get_trainjob(namespace, "missing") is None
            bad = {**pod, "metadata": {**pod["metadata"], "name": "Not_A_Name"}}
            with pytest.raises(kube.RejectedError, match=r"metadata\.name"):
                await api.create("Pod", namespace, "Not_A_Name", lambda: bad)
        finally:
            await api.close()

    asyncio.run(scenario())
    # The precondition failed: the Pod is still there.
    assert meta(core_v1.read_namespaced_pod("mnist-worker-0", namespace)).name
