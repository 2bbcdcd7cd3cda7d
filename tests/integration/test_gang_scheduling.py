"""Gang scheduling against a real gang scheduler: scheduler-plugins' Coscheduling (built from
its Go module, tests/controlplane/gang.py), the operator in the loop with
--gang-scheduler=scheduler-plugins, kwok nodes with little CPU.

Each test gets a pool of kwok nodes of its own (labelled and tainted with its namespace, so
no other test's Pod lands there and its Pods land nowhere else) and watches where the
scheduler binds its Pods: a gang is placed whole or not at all, two gangs that fit one at a
time run one after the other, and the same two under the default scheduler split (the
control: why gangs exist). kwok plays the Pods: a chief annotated with an exit code succeeds
after its run time, then the operator deletes the job's still-running workers.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import Component
from tests.controlplane.gang import PODGROUP_GROUP, PODGROUP_VERSION, GangScheduler
from tests.integration.operator_harness import (
    Cluster,
    container,
    meta,
    module_cluster,
    module_operator,
    pod_spec,
    pod_status,
    trainjob,
)
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

PREFIX = "test-gang"
POOL_LABEL = "trainjob.dev/test-pool"
PRIORITY_HIGH = "trainjob-test-gang-high"
PRIORITY_LOW = "trainjob-test-gang-low"
REQUEUE_ANNOTATION = "trainjob.dev/room-appeared-at"


@pytest.fixture(scope="module")
def operator(
    gang_scheduler: GangScheduler, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(
        kubeconfig, tmp_path_factory, PREFIX, "--gang-scheduler=scheduler-plugins"
    )


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, PREFIX)


class Pool:
    """kwok nodes that only this test's Pods use (its namespace labels and taints them)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.name = cluster.namespace
        self.nodes: list[str] = []

    def add(self, count: int, cpu: int) -> None:
        for _ in range(count):
            node = f"{self.name}-n{len(self.nodes)}"
            self.cluster.core.create_node(
                k8s.V1Node(
                    api_version="v1",
                    kind="Node",
                    metadata=k8s.V1ObjectMeta(
                        name=node,
                        annotations={"kwok.x-k8s.io/node": "fake"},
                        labels={POOL_LABEL: self.name, "kubernetes.io/hostname": node},
                    ),
                    spec=k8s.V1NodeSpec(
                        taints=[k8s.V1Taint(key=POOL_LABEL, value=self.name, effect="NoSchedule")]
                    ),
                    status=k8s.V1NodeStatus(
                        allocatable={"cpu": str(cpu), "memory": "64Gi", "pods": "110"},
                        capacity={"cpu": str(cpu), "memory": "64Gi", "pods": "110"},
                    ),
                )
            )
            self.nodes.append(node)
        waits.wait_until(self._all_ready, timeout=30, what=f"nodes {self.nodes} Ready")

    def _all_ready(self) -> bool:
        for node in self.nodes:
            status = self.cluster.core.read_node(node).status
            assert status is not None
            conditions = status.conditions or []
            if not any(c.type == "Ready" and c.status == "True" for c in conditions):
                return False
        return True

    def remove(self) -> None:
        for node in self.nodes:
            try:
                self.cluster.core.delete_node(node)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def template(self, cpu: str) -> dict[str, Any]:
        """A replica template whose Pods fit only this pool."""
        return {
            "spec": {
                "nodeSelector": {POOL_LABEL: self.name},
                "tolerations": [
                    {
                        "key": POOL_LABEL,
                        "operator": "Equal",
                        "value": self.name,
                        "effect": "NoSchedule",
                    }
                ],
                "containers": [container(resources={"requests": {"cpu": cpu}})],
            }
        }


@pytest.fixture
def pool(cluster: Cluster, kwok: Component) -> Iterator[Pool]:
    nodes = Pool(cluster)
    try:
        yield nodes
    finally:
        nodes.remove()


@pytest.fixture(scope="module")
def priority_classes(operator: operator_process.Operator, api_client: k8s.ApiClient) -> None:
    """Chiefs outrank workers, so that a scheduler that takes Pods one by one takes both
    jobs' chiefs first: the interleaving that splits two jobs (as many Pods created at
    once do in a busy cluster). The classes never preempt: a chief would otherwise evict the
    other job's running worker to make room for itself (seen in half of the runs on loaded
    cores; the victim's job restarted, its gang placed twice), which is the scheduler's
    preemption, not what these tests are about."""
    scheduling = k8s.SchedulingV1Api(api_client)
    for name, value in ((PRIORITY_HIGH, 1000), (PRIORITY_LOW, 10)):
        try:
            scheduling.create_priority_class(
                k8s.V1PriorityClass(
                    api_version="scheduling.k8s.io/v1",
                    kind="PriorityClass",
                    metadata=k8s.V1ObjectMeta(name=name),
                    value=value,
                    preemption_policy="Never",
                )
            )
        except ApiException as exc:
            if exc.status != 409:
                raise


def gang_job(
    name: str,
    pool: Pool,
    *,
    workers: int,
    cpu: str,
    run: str | None = "3s",
    scheduler: str | None = None,
    prioritised: bool = False,
) -> dict[str, Any]:
    """A chief and `workers` workers on `pool`; the chief succeeds after `run` (None: runs
    until deleted). `scheduler`: a schedulerName of the template's own (the gang is then
    bypassed: the control)."""
    body = trainjob(name, chief=1, workers=workers)
    for rtype, replica in body["spec"]["replicaSpecs"].items():
        template = copy.deepcopy(pool.template(cpu))
        if scheduler is not None:
            template["spec"]["schedulerName"] = scheduler
        if prioritised:
            template["spec"]["priorityClassName"] = (
                PRIORITY_HIGH if rtype == "chief" else PRIORITY_LOW
            )
        if rtype == "chief" and run is not None:
            template["metadata"] = {
                "annotations": {
                    "trainjob.dev/kwok-exit-code": "0",
                    "trainjob.dev/kwok-run-duration": run,
                }
            }
        replica["template"] = template
    return body


def bound(cluster: Cluster, job: str) -> tuple[int, int]:
    """(Pods of `job` bound to a node, Pods of `job`), not counting Pods that are done."""
    pods = [
        p
        for p in cluster.pods(job).values()
        if pod_status(p).phase not in ("Succeeded", "Failed") and not meta(p).deletion_timestamp
    ]
    return sum(1 for p in pods if pod_spec(p).node_name), len(pods)


def pod_group(cluster: Cluster, name: str) -> dict[str, Any] | None:
    try:
        found = cast(
            dict[str, Any],
            cluster.custom.get_namespaced_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, cluster.namespace, "podgroups", name
            ),
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def running_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    job = cluster.job(name) or {}
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Running":
            result: dict[str, Any] = condition
            return result
    return {}


def waiting_for_room(cluster: Cluster, name: str) -> Callable[[], bool]:
    """A probe: whether job `name` says the scheduler found no room for it."""
    return lambda: running_condition(cluster, name).get("reason") == "Unschedulable"


def test_gang_larger_than_the_cluster_binds_no_pod_says_why_then_runs_when_room_appears(
    cluster: Cluster, pool: Pool
) -> None:
    pool.add(2, cpu=4)  # room for two 3-CPU Pods; the job has four
    cluster.create_job(gang_job("big", pool, workers=3, cpu="3"))
    group = waits.wait_until(lambda: pod_group(cluster, "big"), timeout=30, what="the PodGroup")
    assert group["spec"]["minMember"] == 4
    assert group["spec"]["minResources"] == {"cpu": "12"}
    cluster.wait_pods("big", {"big-chief-0", "big-worker-0", "big-worker-1", "big-worker-2"})

    waiting = waits.wait_until(
        lambda: (c := running_condition(cluster, "big")).get("reason") == "Unschedulable" and c,
        timeout=60,
        what="the job to say it is unschedulable",
    )
    assert waiting["message"].startswith("Gang big waits until all 4 Pods fit at once")
    assert "nodes are available" in waiting["message"]  # the scheduler's own words
    # Two of the four would fit: the default scheduler binds them. The gang binds none,
    # through at least one Permit timeout of the scheduler (10 s).
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        assert bound(cluster, "big")[0] == 0, "a gang Pod was bound while the gang cannot fit"
        time.sleep(0.5)
    assert (cluster.job("big") or {})["status"]["state"] == "Created"
    assert any(e.reason == "Unschedulable" for e in cluster.events("big"))

    pool.add(2, cpu=4)  # room for all four
    waits.wait_until(
        lambda: bound(cluster, "big") == (4, 4), timeout=60, what="the whole gang bound"
    )
    cluster.wait_condition("big", "Succeeded", timeout=60)
    # Its Pods gone (cleanPodPolicy Running), the PodGroup goes after them.
    waits.wait_until(
        lambda: pod_group(cluster, "big") is None, timeout=30, what="the PodGroup gone"
    )


def watch_placement(cluster: Cluster, jobs: list[str], until: float) -> list[dict[str, int]]:
    """Bound Pods per job, sampled every 0.3 s until every job Succeeded or `until`."""
    samples = []
    while time.monotonic() < until:
        samples.append({job: bound(cluster, job)[0] for job in jobs})
        if all(cluster.condition(job, "Succeeded") for job in jobs):
            break
        time.sleep(0.3)
    return samples


def preempted(cluster: Cluster) -> list[str]:
    """The scheduler's words for every Pod of the test's namespace it preempted."""
    events = cluster.core.list_namespaced_event(
        cluster.namespace, field_selector="reason=Preempted"
    ).items
    return [f"{e.involved_object.name}: {e.message}" for e in events]


def longest_partial(samples: list[dict[str, int]], job: str, size: int) -> int:
    """The most consecutive samples in which `job` had some but not all Pods bound."""
    longest = streak = 0
    for sample in samples:
        streak = streak + 1 if 0 < sample[job] < size else 0
        longest = max(longest, streak)
    return longest


def test_gang_two_jobs_that_fit_one_at_a_time_run_one_after_the_other(
    cluster: Cluster, pool: Pool, priority_classes: None
) -> None:
    jobs = ["first", "second"]
    for name in jobs:
        cluster.create_job(gang_job(name, pool, workers=3, cpu="2", run="4s", prioritised=True))
    for name in jobs:
        waits.wait_until(
            waiting_for_room(cluster, name), timeout=60, what=f"{name} waiting for room"
        )
    pool.add(2, cpu=4)  # room for one job's four 2-CPU Pods, not for both
    samples = watch_placement(cluster, jobs, time.monotonic() + 150)
    assert not preempted(cluster), preempted(cluster)
    for name in jobs:
        assert cluster.condition(name, "Succeeded"), f"{name} did not succeed: {compress(samples)}"
        # A gang's Pods are bound in one burst of binds; a sample may catch it mid-burst,
        # never two samples in a row (0.3 s apart).
        assert longest_partial(samples, name, 4) <= 1, (name, samples)
    # One after the other: one job whole while the other had nothing.
    assert any(s["first"] == 4 and s["second"] == 0 for s in samples) or any(
        s["second"] == 4 and s["first"] == 0 for s in samples
    ), samples


def test_gang_control_the_same_two_jobs_under_the_default_scheduler_split(
    cluster: Cluster, pool: Pool, priority_classes: None
) -> None:
    """Why gangs: placed Pod by Pod, two jobs that fit one at a time each get part of the
    cluster and (as TensorFlow jobs) wait for their missing peers for ever."""
    jobs = ["first", "second"]
    for name in jobs:
        body = gang_job(
            name,
            pool,
            workers=3,
            cpu="2",
            run=None,
            scheduler="default-scheduler",
            prioritised=True,
        )
        cluster.create_job(body)
    for name in jobs:
        waits.wait_until(
            waiting_for_room(cluster, name), timeout=60, what=f"{name} waiting for room"
        )
    # The default scheduler retries an unschedulable Pod after a backoff of up to 10 s; past
    # it, the new room is offered to the Pods by priority: both chiefs first.
    time.sleep(11)
    pool.add(2, cpu=4)
    waits.wait_until(
        lambda: sum(bound(cluster, n)[0] for n in jobs) == 4,
        timeout=60,
        what="the pool full",
    )
    split = {name: bound(cluster, name)[0] for name in jobs}
    assert all(0 < count < 4 for count in split.values()), split
    # The operator said that these templates leave the gang.
    assert any(e.reason == "GangBypassed" for e in cluster.events("first"))
    time.sleep(3)  # and so it stays: neither job can ever start
    assert {name: bound(cluster, name)[0] for name in jobs} == split


def test_gang_suspend_deletes_the_podgroup_after_the_pods_and_resume_makes_a_new_one(
    cluster: Cluster, pool: Pool
) -> None:
    pool.add(1, cpu=4)
    cluster.create_job(gang_job("pausing", pool, workers=1, cpu="1", run=None))
    waits.wait_until(lambda: bound(cluster, "pausing") == (2, 2), timeout=60, what="the gang bound")
    cluster.wait_condition("pausing", "Running", timeout=60)
    before = pod_group(cluster, "pausing")
    assert before is not None

    cluster.patch_job("pausing", {"spec": {"runPolicy": {"suspend": True}}})
    waits.wait_until(
        lambda: pod_group(cluster, "pausing") is None, timeout=30, what="PodGroup gone"
    )
    assert not cluster.pods("pausing"), "the PodGroup went before the Pods"

    cluster.patch_job("pausing", {"spec": {"runPolicy": {"suspend": False}}})
    waits.wait_until(lambda: bound(cluster, "pausing") == (2, 2), timeout=60, what="bound again")
    after = pod_group(cluster, "pausing")
    assert after is not None
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["spec"]["minMember"] == 2


def compress(samples: list[dict[str, int]]) -> list[tuple[dict[str, int], int]]:
    """Runs of equal samples: (sample, how many in a row), for a readable failure."""
    runs: list[tuple[dict[str, int], int]] = []
    for sample in samples:
        if runs and runs[-1][0] == sample:
            runs[-1] = (sample, runs[-1][1] + 1)
        else:
            runs.append((sample, 1))
    return runs


def test_gang_restart_keeps_its_podgroup_and_places_the_new_pods_as_a_gang(
    cluster: Cluster, pool: Pool
) -> None:
    """A replica that fails is restarted (OnFailure, backoffLimit 1): its new Pods join the
    same PodGroup and are placed; the job then fails for good and the group goes."""
    pool.add(1, cpu=4)
    body = gang_job("flaky", pool, workers=1, cpu="1", run="2s")
    body["spec"]["replicaSpecs"]["chief"]["template"]["metadata"]["annotations"][
        "trainjob.dev/kwok-exit-code"
    ] = "1"
    for replica in body["spec"]["replicaSpecs"].values():
        replica["restartPolicy"] = "OnFailure"
    body["spec"]["runPolicy"] = {"backoffLimit": 1}
    cluster.create_job(body)
    first = waits.wait_until(lambda: pod_group(cluster, "flaky"), timeout=30, what="the PodGroup")
    waits.wait_until(
        lambda: ((cluster.job("flaky") or {}).get("status") or {}).get("restartCount") == 1,
        timeout=60,
        what="a restart",
    )
    waits.wait_until(lambda: bound(cluster, "flaky") == (2, 2), timeout=60, what="restarted, bound")
    kept = pod_group(cluster, "flaky")
    assert kept is not None and kept["metadata"]["uid"] == first["metadata"]["uid"]
    cluster.wait_condition("flaky", "Failed", timeout=60)
    waits.wait_until(
        lambda: pod_group(cluster, "flaky") is None, timeout=30, what="the PodGroup gone"
    )


def test_gang_a_refused_podgroup_is_told_in_status_then_created_when_allowed(
    cluster: Cluster, pool: Pool
) -> None:
    """The API server refuses the PodGroup (here a ResourceQuota of zero PodGroups; RBAC or a
    webhook alike): no Pod is made, the job says why in its status and Events in the API
    server's words, and the group and Pods come once the quota is gone."""
    pool.add(1, cpu=4)
    quota = k8s.V1ResourceQuota(
        metadata=k8s.V1ObjectMeta(name="no-podgroups"),
        spec=k8s.V1ResourceQuotaSpec(hard={f"count/podgroups.{PODGROUP_GROUP}": "0"}),
    )
    cluster.core.create_namespaced_resource_quota(cluster.namespace, quota)

    def quota_enforced() -> bool:
        found = cluster.core.read_namespaced_resource_quota("no-podgroups", cluster.namespace)
        return bool(found.status and found.status.hard)

    waits.wait_until(quota_enforced, timeout=30, what="the quota counted")
    cluster.create_job(gang_job("quota", pool, workers=1, cpu="1", run=None))
    refused = waits.wait_until(
        lambda: (c := running_condition(cluster, "quota")).get("reason") == "FailedCreate" and c,
        timeout=60,
        what="the job to say its PodGroup was refused",
    )
    assert "PodGroup quota:" in refused["message"], refused
    assert "forbidden" in refused["message"] and "no-podgroups" in refused["message"], refused
    assert any(e.reason == "FailedCreate" for e in cluster.events("quota"))
    assert not cluster.pods("quota") and pod_group(cluster, "quota") is None

    cluster.core.delete_namespaced_resource_quota("no-podgroups", cluster.namespace)
    waits.wait_until(lambda: pod_group(cluster, "quota"), timeout=90, what="the PodGroup made")
    waits.wait_until(lambda: bound(cluster, "quota") == (2, 2), timeout=60, what="the gang bound")


def test_gang_whose_min_available_is_lowered_is_placed_without_waiting_for_the_flush(
    cluster: Cluster, pool: Pool
) -> None:
    """A gang asking for more Pods than the job has (minAvailable 5 of 2) is rejected;
    lowering minAvailable to 2 places it at once, not at the scheduler's periodic flush of
    unschedulable Pods (5 minutes): upstream Kubeflow's gang e2e does exactly this. The
    operator touches the changed PodGroup again (gang_sync.Requeue.group_changed), so that
    Coscheduling, whose own cache may not hold the new minMember when the change's event
    requeues the Pods, gets another look."""
    pool.add(1, cpu=4)
    body = gang_job("lowered", pool, workers=1, cpu="1", run=None)
    body["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 5}}
    cluster.create_job(body)
    waits.wait_until(
        waiting_for_room(cluster, "lowered"), timeout=60, what="the gang waiting for room"
    )
    # Past the scheduler's longest Pod backoff (10 s), a Pod that an event requeues is tried
    # at once: the moment that the PodGroup's new minMember may not have reached
    # Coscheduling's own cache yet.
    time.sleep(11)
    assert bound(cluster, "lowered")[0] == 0
    cluster.patch_job("lowered", {"spec": {"runPolicy": {"schedulingPolicy": {"minAvailable": 2}}}})
    waits.wait_until(
        lambda: bound(cluster, "lowered") == (2, 2), timeout=45, what="the lowered gang bound"
    )
    group = pod_group(cluster, "lowered") or {}
    assert group["spec"]["minMember"] == 2
    annotations = group["metadata"].get("annotations") or {}
    assert REQUEUE_ANNOTATION in annotations, group["metadata"]
