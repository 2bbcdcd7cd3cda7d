"""The informer's recovery: a dropped watch resumes from the last resourceVersion seen
(bookmarks included), and 410 Gone lists again, the list replacing the index's content.

The API is scripted here because 410 cannot be caused on the test control plane (its watch
cache serves every resourceVersion of a young cluster); list and watch against the real API
server are in tests/integration/test_informer.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from tests.unit.test_children import JOB, pod
from trainjob_operator import children, informer, kube

Script = list[dict[str, Any] | Exception]


class ScriptedApi:
    """Answers list/watch calls from scripts, one entry per call; records the calls. A watch
    whose script runs out stays open, as a quiet watch does."""

    def __init__(self, lists: dict[str, list[kube.Listing]], watches: dict[str, list[Script]]):
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, ...]] = []

    async def list_labelled(
        self, namespace: str | None, plural: str, selector: str, keep: kube.Keep | None = None
    ) -> Any:
        """As kube.Kube does: only what `keep` returns of each object is handed on."""
        self.calls.append(("list", plural))
        listing = self.lists[plural].pop(0)
        if keep is None:
            return listing
        return kube.Listing([keep(item) for item in listing.items], listing.resource_version)

    async def watch_labelled(
        self, namespace: str | None, plural: str, selector: str, version: str
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(("watch", plural, version))
        script = self.watches[plural].pop(0) if self.watches[plural] else []
        for step in script:
            if isinstance(step, Exception):
                raise step
            yield step
        await asyncio.Event().wait()


def with_version(body: dict[str, Any], version: str) -> dict[str, Any]:
    body["metadata"]["resourceVersion"] = version
    return body


def bookmark(version: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}


async def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_resume_from_the_last_version_then_relist_after_gone() -> None:
    worker = with_version(pod("mnist-worker-0", "worker", 0, "Pending"), "11")
    api = ScriptedApi(
        lists={
            "pods": [
                kube.Listing([pod("mnist-chief-0", "chief", 0)], "10"),
                # After 410: the chief's Pod was deleted meanwhile, the worker runs.
                kube.Listing([pod("mnist-worker-0", "worker", 0, "Running")], "20"),
            ],
            "services": [kube.Listing([], "10")],
        },
        watches={
            "pods": [
                [{"type": "ADDED", "object": worker}, bookmark("15"), kube.TransientError("EOF")],
                [kube.GoneError("too old resource version")],
            ],
            "services": [],
        },
    )
    index = children.ChildIndex()
    woken: list[children.JobKey] = []

    async def scenario() -> None:
        watcher = informer.ChildInformer(cast(kube.Kube, api), index, woken.append, True)
        try:
            await asyncio.wait_for(watcher.acquire("ns").wait(), 5)
            await until(lambda: ("watch", "pods", "20") in api.calls)
        finally:
            await watcher.close()

    asyncio.run(scenario())
    pod_calls = [call for call in api.calls if call[1] == "pods"]
    assert pod_calls == [
        ("list", "pods"),
        ("watch", "pods", "10"),
        ("watch", "pods", "15"),  # after the dropped stream: from the bookmark's version
        ("list", "pods"),  # 410: list again
        ("watch", "pods", "20"),
    ]
    assert phases(index) == {("worker", 0): "Running"}
    assert JOB in woken


def phases(index: children.ChildIndex) -> dict[tuple[str, int], str]:
    return {child.key: child.observed.phase for child in index.pods(JOB)}


def test_the_scope_is_ready_only_when_both_kinds_are_listed() -> None:
    gate = asyncio.Event()

    class SlowServices(ScriptedApi):
        async def list_labelled(
            self, namespace: str | None, plural: str, selector: str, keep: kube.Keep | None = None
        ) -> Any:
            if plural == "services":
                await gate.wait()
            return await super().list_labelled(namespace, plural, selector, keep)

    api = SlowServices(
        lists={"pods": [kube.Listing([], "1")], "services": [kube.Listing([], "1")]},
        watches={"pods": [], "services": []},
    )

    async def scenario() -> None:
        watcher = informer.ChildInformer(
            cast(kube.Kube, api), children.ChildIndex(), lambda job: None, False
        )
        try:
            ready = watcher.acquire("ns")
            await until(lambda: ("watch", "pods", "1") in api.calls)
            assert not ready.is_set()
            gate.set()
            await asyncio.wait_for(ready.wait(), 5)
            # A second job of the namespace shares the scope: no second list.
            assert watcher.acquire("ns").is_set()
            assert api.calls.count(("list", "pods")) == 1
        finally:
            await watcher.close()

    asyncio.run(scenario())


def test_backoff_doubles_and_is_capped() -> None:
    assert [informer.backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert informer.backoff(50) == informer.BACKOFF_MAX


def test_a_refusal_that_says_when_to_come_back_is_retried_then() -> None:
    # What the API server answers every watch while its cache fills after a restart.
    reinitializing = kube._classify(
        429,
        b'{"kind":"Status","message":"storage is (re)initializing",'
        b'"reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}',
        "watching pods",
    )
    assert isinstance(reinitializing, kube.TransientError)
    assert reinitializing.retry_after == 1.0
    # The tenth refusal in a row is still retried after the second asked for, not 30 s.
    assert kube.retry_after_failure(10, reinitializing, 0.5, 30.0) == 1.0
    # Asking for more than the cap gets the cap; no word from the server: the backoff.
    patient = kube._classify(429, b'{"details":{"retryAfterSeconds":600}}', "listing")
    assert kube.retry_after_failure(1, patient, 0.5, 30.0) == 30.0
    silent = kube._classify(503, b"upstream connect error", "listing")
    assert isinstance(silent, kube.TransientError) and silent.retry_after is None
    assert kube.retry_after_failure(10, silent, 0.5, 30.0) == 30.0
    assert kube.retry_after_failure(2, RuntimeError("a bug"), 0.5, 30.0) == 1.0
