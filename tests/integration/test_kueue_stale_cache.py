"""Kueue's quota is never given back while Pods it paid for may run, even when the operator's
child index has not yet seen the Pods it just created — the window in which Kueue evicted a
job right after admitting it, the operator read "no Pods" from its watch cache, cleared the
admission, and Kueue gave the quota to another job while three Pods started.

The window is sub-second in a running operator; here it is held open deterministically:
the real reconcile (reconciler.reconcile) runs in this process against the real API
server and the real Kueue, and its child index is fed by the test instead of a watch, so
the test decides what the operator "has seen": the Workloads (as a watch would show them)
but not the Pods it has just created. A second OperatorContext stands for a new incarnation
after a kill in that window (nothing of its predecessor in memory). Kueue's eviction is a
real one: the Workload deactivated (`spec.active: false`), which Kueue turns into
Evicted=True, the same branch of the protocol as a preemption.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client as k8s

from tests.controlplane.kueue import Kueue
from tests.integration.kueue_harness import Queues, condition, is_true, queued_job, wait_admitted
from tests.integration.operator_harness import Cluster, name_of
from tests.support import waits
from trainjob_operator import (
    children,
    config,
    kube,
    manager,
    metrics,
    reconciler,
    writes,
)

pytestmark = pytest.mark.integration

T = 60.0
JOB = "stale"
REPLICAS = {f"{JOB}-chief-0", f"{JOB}-worker-0", f"{JOB}-worker-1"}

Obj = dict[str, Any]


class Incarnation:
    """One operator's memory (its context, child index and job loop memory) driving real
    reconciles of one job; the index holds what the test says the watches have shown."""

    def __init__(self, kubeconfig: Path, namespace: str, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        info = kopf.login_with_kubeconfig(
            settings=kopf.OperatorSettings(), logger=logging.getLogger("test")
        )
        assert info is not None
        self.namespace = namespace
        self.api = kube.Kube(lambda: info, connections=4)
        self.ctx = manager.build(
            config.Settings(namespaces=(namespace,), kueue=True),
            self.api,
            metrics.Metrics(),
        ).ctx
        self.seen = writes.Seen()

    async def show(self, plural: str) -> None:
        """The index sees every object of `plural` that exists now (a watch caught up)."""
        group, version = (
            ("kueue.x-k8s.io", "v1beta2") if plural == children.WORKLOADS else ("", "v1")
        )
        listing = await self.api.list_labelled(
            self.namespace, plural, "trainjob.dev/job-name", group, version
        )
        self.ctx.child_index.replace(plural, self.namespace, listing.items)

    async def reconcile(self) -> reconciler.Outcome:
        key = (self.namespace, JOB)
        for _ in range(5):  # a conflicting status write is decided again, as the loop does
            try:
                now = datetime.datetime.now(datetime.timezone.utc)
                return await reconciler.reconcile(
                    self.ctx, reconciler.Request(key, None, self.seen, now)
                )
            except kube.ConflictError:
                # The job or a Workload changed since the index's copy (Kueue writes often):
                # the Workload watch would have caught up, as it does here.
                self.seen = writes.Seen()
                await self.show(children.WORKLOADS)
        raise AssertionError("the reconcile kept conflicting")

    async def close(self) -> None:
        await self.api.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def admission_held(queues: Queues) -> bool:
    workload = queues.workload(JOB)
    return bool(((workload or {}).get("status") or {}).get("admission")) and is_true(
        workload, "QuotaReserved"
    )


def test_kueue_eviction_before_the_index_sees_new_pods_keeps_the_admission_until_they_are_gone(
    kueue: Kueue,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(api_client, namespace)
    queues = Queues(api_client, namespace)
    cq = queues.cluster_queue(queues.flavor(), "3")
    lq = queues.local_queue(cq)
    cluster.create_job(queued_job(JOB, lq))

    async def scenario() -> None:
        first = Incarnation(kubeconfig, namespace, monkeypatch)
        try:
            await first.reconcile()  # suspends the job, makes its Workload
            await asyncio.to_thread(wait_admitted, queues, JOB, T)
            await first.show(children.WORKLOADS)
            await first.reconcile()  # admitted: unsuspends the job
            await first.reconcile()  # creates Services and Pods
            pods = await asyncio.to_thread(cluster.wait_pods, JOB, REPLICAS, T)
            assert set(pods) == REPLICAS
            assert first.ctx.child_index.pods((namespace, JOB)) == []  # not seen yet

            # Kueue evicts the job now, before the operator's Pod watch shows the Pods.
            workload = queues.workload(JOB)
            assert workload is not None
            queues.patch_workload(workload["metadata"]["name"], {"spec": {"active": False}})
            await asyncio.to_thread(
                waits.wait_until,
                lambda: is_true(queues.workload(JOB), "Evicted"),
                timeout=T,
                what="Kueue evicting the Workload",
            )
            await first.show(children.WORKLOADS)
            await first.reconcile()
            job = cluster.job(JOB) or {}
            assert job["spec"]["runPolicy"]["suspend"] is True, "the evicted job is stopped"
            assert set(cluster.pods(JOB)) == REPLICAS, "its Pods, unseen, still exist"
            assert admission_held(queues), (
                "the admission was cleared while the job's Pods exist: "
                f"{condition(queues.workload(JOB), 'QuotaReserved')}"
            )
        finally:
            await first.close()

        # Killed in that window: a new incarnation knows nothing of the creates above, and
        # its index (say its Pod list is slow) has not shown the Pods either.
        second = Incarnation(kubeconfig, namespace, monkeypatch)
        try:
            await second.show(children.WORKLOADS)
            await second.reconcile()
            assert set(cluster.pods(JOB)) == REPLICAS
            assert admission_held(queues), "a new incarnation cleared the admission"

            # Once the index shows the Pods, the suspended job deletes them (unbound test
            # Pods go at once); then, and only then, the admission is cleared.
            await second.show(children.PODS)
            await second.reconcile()
            await asyncio.to_thread(
                waits.wait_until, lambda: not cluster.pods(JOB), timeout=T, what="Pods gone"
            )
            await second.show(children.PODS)
            await second.show(children.WORKLOADS)
            await second.reconcile()
            assert not admission_held(queues), "the admission is cleared once the Pods are gone"
        finally:
            await second.close()

    try:
        run(scenario())
        held = cluster.condition(JOB, "Suspended") or {}
        assert held.get("reason") == "EvictedByKueue", held
        print(f"Pods {sorted(name_of(p) for p in cluster.pods(JOB).values())}; held: {held}")
    finally:
        queues.cleanup()
