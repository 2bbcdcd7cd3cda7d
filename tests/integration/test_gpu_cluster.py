"""The GPU example (examples/mnist-gpu-parameter-server.yaml) on a cluster with GPUs: kwok
nodes that advertise `nvidia.com/gpu` beside CPU-only ones, the real kube-scheduler, the real
Kueue and scheduler-plugins' Coscheduling, the operator in the loop (--kueue and
--gang-scheduler=scheduler-plugins). No GPU is used: the scheduler and Kueue count
`nvidia.com/gpu` as any extended resource, which is what is tested here.

- Kueue counts the workers' GPUs (their templates carry limits only) against a GPU flavor's
  quota: queued, saying so in Kueue's words naming nvidia.com/gpu, while the quota is short;
  admitted once it fits, the workers then bound to the flavor's GPU nodes.
- The gang's PodGroup asks for the job's GPUs (minResources) and the whole job is placed,
  the workers on GPU nodes.
- A worker asking more GPUs than any node has waits, and the job says why in the
  scheduler's words ("Insufficient nvidia.com/gpu"); under the gang no Pod of it is bound.
  Both run once nodes with GPUs enough appear.

Each test gets kwok nodes of its own (labelled and tainted with its namespace, as in
test_gang_scheduling.py), and the example keeps its shared checkpoint claim (a PVC bound to a
PV made for the test: the scheduler would not place a Pod whose claim is unbound).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import Component
from tests.controlplane.gang import PODGROUP_GROUP, PODGROUP_VERSION, SCHEDULER_NAME, GangScheduler
from tests.controlplane.kueue import Kueue
from tests.controlplane.tools import REPO_ROOT
from tests.integration.kueue_harness import (
    KUEUE,
    KV,
    QUEUE_LABEL,
    Queues,
    condition,
    is_true,
    queues_in,
)
from tests.integration.kueue_harness import wait_admitted as kueue_wait_admitted
from tests.integration.operator_harness import (
    Cluster,
    Obj,
    meta,
    module_cluster,
    module_operator,
    pod_spec,
    pod_status,
    running_operator,
)
from tests.integration.test_gang_scheduling import pod_group
from tests.support import operator_process, waits
from trainjob.core import observe

pytestmark = pytest.mark.integration

PREFIX: Final = "test-gpu"
EXAMPLE: Final = REPO_ROOT / "examples" / "mnist-gpu-parameter-server.yaml"
GPU: Final = "nvidia.com/gpu"
# The label NVIDIA's GPU feature discovery puts on GPU nodes; the GPU flavor selects it.
GPU_NODE_LABEL: Final = "nvidia.com/gpu.present"
POOL_LABEL: Final = "trainjob.dev/test-pool"
GPUS_PER_NODE: Final = 2
T: Final = 60.0  # per step; the machine has 2 cores


@pytest.fixture(scope="module")
def operator(
    kueue: Kueue,
    gang_scheduler: GangScheduler,
    kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[operator_process.Operator]:
    yield from module_operator(
        kubeconfig,
        tmp_path_factory,
        PREFIX,
        "--kueue",
        "--gang-scheduler=scheduler-plugins",
        timeout=T,
    )


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, PREFIX)


@pytest.fixture
def space(api_client: k8s.ApiClient, namespace: str) -> Cluster:
    """The test's namespace, whoever serves it (the module's operator or one of the test's)."""
    return Cluster(api_client, namespace)


class Nodes:
    """kwok nodes that only this test's Pods use (its namespace labels and taints them):
    some advertise GPUs, the others are CPU-only."""

    def __init__(self, cluster: Cluster) -> None:
        self.core = cluster.core
        self.pool = cluster.namespace
        self.gpus: dict[str, int] = {}  # node -> the GPUs it advertises (0: CPU-only)

    @property
    def gpu(self) -> list[str]:
        return [node for node, gpus in self.gpus.items() if gpus]

    def add(self, count: int, gpus: int = 0) -> list[str]:
        added = []
        for _ in range(count):
            node = f"{self.pool}-n{len(self.gpus)}-{'gpu' if gpus else 'cpu'}"
            labels = {POOL_LABEL: self.pool, "kubernetes.io/hostname": node}
            resources = {"cpu": "8", "memory": "64Gi", "pods": "110"}
            if gpus:
                labels[GPU_NODE_LABEL] = "true"
                resources[GPU] = str(gpus)
            self.core.create_node(
                k8s.V1Node(
                    api_version="v1",
                    kind="Node",
                    metadata=k8s.V1ObjectMeta(
                        name=node, annotations={"kwok.x-k8s.io/node": "fake"}, labels=labels
                    ),
                    spec=k8s.V1NodeSpec(
                        taints=[k8s.V1Taint(key=POOL_LABEL, value=self.pool, effect="NoSchedule")]
                    ),
                    status=k8s.V1NodeStatus(allocatable=resources, capacity=resources),
                )
            )
            self.gpus[node] = gpus
            added.append(node)
        waits.wait_until(lambda: all(map(self.ready, added)), timeout=T, what=f"{added} Ready")
        return added

    def ready(self, node: str) -> bool:
        status = self.core.read_node(node).status
        assert status is not None
        # What the scheduler sees: kwok keeps the GPUs the node was created with.
        allocatable = status.allocatable or {}
        assert allocatable.get(GPU) == (str(self.gpus[node]) if self.gpus[node] else None), node
        return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])

    def remove(self) -> None:
        for node in self.gpus:
            try:
                self.core.delete_node(node)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def nodes(space: Cluster, kwok: Component) -> Iterator[Nodes]:
    """Two GPU nodes with two GPUs each and two CPU-only nodes."""
    pool = Nodes(space)
    try:
        pool.add(2, gpus=GPUS_PER_NODE)
        pool.add(2)
        yield pool
    finally:
        pool.remove()


@pytest.fixture
def checkpoints(space: Cluster, example: Obj) -> Iterator[str]:
    """The example's checkpoint claim, bound to a PV of its own (the PV controller binds
    them), so the scheduler can place its Pods."""
    claim = example["spec"]["checkpoint"]["claimName"]
    volume = f"{space.namespace}-ckpt"
    access = ["ReadWriteMany"]
    space.core.create_persistent_volume(
        k8s.V1PersistentVolume(
            metadata=k8s.V1ObjectMeta(name=volume),
            spec=k8s.V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"},
                access_modes=access,
                storage_class_name="",
                host_path=k8s.V1HostPathVolumeSource(path=f"/tmp/{volume}"),
                claim_ref=k8s.V1ObjectReference(namespace=space.namespace, name=claim),
            ),
        )
    )
    try:
        space.core.create_namespaced_persistent_volume_claim(
            space.namespace,
            k8s.V1PersistentVolumeClaim(
                metadata=k8s.V1ObjectMeta(name=claim),
                spec=k8s.V1PersistentVolumeClaimSpec(
                    access_modes=access,
                    storage_class_name="",
                    volume_name=volume,
                    resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
                ),
            ),
        )
        nudges = itertools.count()

        def bound() -> bool:
            pvc = space.core.read_namespaced_persistent_volume_claim(claim, space.namespace)
            if pvc.status is not None and pvc.status.phase == "Bound":
                return True
            # The PV controller's first try at the binding sometimes fails (measured here: 1
            # in 2) and it tries again only at its 15 s resync, or when the claim changes:
            # change it (an annotation of no meaning).
            note = {"trainjob.dev/test-nudge": str(next(nudges))}
            space.core.patch_namespaced_persistent_volume_claim(
                claim, space.namespace, {"metadata": {"annotations": note}}
            )
            return False

        waits.wait_until(bound, timeout=T, what=f"PVC {claim} Bound", interval=0.5)
        yield claim
    finally:
        try:
            space.core.delete_persistent_volume(volume)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def example() -> Obj:
    loaded: Obj = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture
def queues(cluster: Cluster, api_client: k8s.ApiClient, kueue: Kueue) -> Iterator[Queues]:
    with queues_in(cluster.namespace, api_client, kueue) as objects:
        yield objects


def on_pool(example: Obj, nodes: Nodes, name: str, **labels: str) -> Obj:
    """The example as written, named `name`, its Pods kept to this test's nodes."""
    body = copy.deepcopy(example)
    body["metadata"] = {"name": name, "labels": labels}
    for replica in body["spec"]["replicaSpecs"].values():
        template = replica["template"]["spec"]
        template["nodeSelector"] = {POOL_LABEL: nodes.pool}
        template["tolerations"] = [
            {"key": POOL_LABEL, "operator": "Equal", "value": nodes.pool, "effect": "NoSchedule"}
        ]
    return body


def worker_gpus(body: Obj) -> int:
    (tf,) = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"]
    return int(tf["resources"]["limits"][GPU])


def pod_names(body: Obj) -> set[str]:
    name = body["metadata"]["name"]
    return {
        f"{name}-{rtype}-{i}"
        for rtype, replica in body["spec"]["replicaSpecs"].items()
        for i in range(replica["replicas"])
    }


def placed(
    cluster: Cluster, job: str, names: set[str], *, only: bool = False
) -> dict[str, k8s.V1Pod] | None:
    """The job's Pods once they are `names` (`only`: these among others), all of these bound
    and running (kwok plays them)."""
    pods = cluster.pods(job)
    if not names <= set(pods) or (set(pods) != names and not only):
        return None
    chosen = [pods[name] for name in names]
    if all(pod_spec(p).node_name and pod_status(p).phase == "Running" for p in chosen):
        return pods
    return None


def wait_placed(cluster: Cluster, body: Obj) -> dict[str, k8s.V1Pod]:
    job, names = body["metadata"]["name"], pod_names(body)
    return waits.wait_until(
        lambda: placed(cluster, job, names),
        timeout=T,
        what=f"the Pods of {job} bound and running",
        on_timeout=lambda: "; " + describe(cluster, job),
    )


def describe(cluster: Cluster, job: str) -> str:
    """Where the job's Pods are and what the scheduler said: for a failed wait."""
    parts = []
    for name, pod in sorted(cluster.pods(job).items()):
        told = [c.message for c in pod_status(pod).conditions or [] if c.type == "PodScheduled"]
        parts.append(f"{name} on {pod_spec(pod).node_name}: {pod_status(pod).phase} {told}")
    return "; ".join(parts) + f"; job status: {(cluster.job(job) or {}).get('status')}"


def assert_workers_on_gpu_nodes(pods: dict[str, k8s.V1Pod], nodes: Nodes, job: str) -> None:
    where = {name: pod_spec(pod).node_name for name, pod in pods.items()}
    workers = {name: node for name, node in where.items() if name.startswith(f"{job}-worker-")}
    assert len(workers) == 2 and set(workers.values()) <= set(nodes.gpu), where


def running_condition(cluster: Cluster, name: str) -> Obj:
    return condition(cluster.job(name), "Running") or {}


# -- Kueue ------------------------------------------------------------------------------------


def gpu_cluster_queue(queues: Queues, flavor: str, gpus: str) -> str:
    """A ClusterQueue whose one flavor (the GPU nodes) has `gpus` GPUs and room for the rest."""
    name = f"cq-{queues.namespace}"[:63]
    body: Obj = {
        "apiVersion": f"{KUEUE}/{KV}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": gpu_groups(flavor, gpus)},
    }
    queues.custom.create_cluster_custom_object(KUEUE, KV, "clusterqueues", body)
    queues.cluster_scoped.append(("clusterqueues", name))
    return name


def gpu_groups(flavor: str, gpus: str) -> list[Obj]:
    quotas = {"cpu": "100", "memory": "100Gi", GPU: gpus}
    return [
        {
            "coveredResources": list(quotas),
            "flavors": [
                {
                    "name": flavor,
                    "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()],
                }
            ],
        }
    ]


def podset_gpus(workload: Obj) -> dict[str, tuple[int, str | None]]:
    """Each podSet's (count, GPUs of one Pod) as the Workload's spec carries them."""
    found = {}
    for podset in workload["spec"]["podSets"]:
        (tf,) = podset["template"]["spec"]["containers"]
        limits = (tf.get("resources") or {}).get("limits") or {}
        gpus = limits.get(GPU)  # as the example wrote it: 1, a number
        found[podset["name"]] = (podset["count"], None if gpus is None else str(gpus))
    return found


def test_gpu_kueue_admits_the_example_once_its_gpu_quota_fits(
    cluster: Cluster, queues: Queues, nodes: Nodes, checkpoints: str, example: Obj
) -> None:
    flavor = queues.flavor({GPU_NODE_LABEL: "true"})
    cq = gpu_cluster_queue(queues, flavor, "1")  # one GPU: the two workers need two
    lq = queues.local_queue(cq)
    body = on_pool(example, nodes, "mnist-gpu", **{QUEUE_LABEL: lq})
    assert worker_gpus(body) == 1
    cluster.create_job(body)

    def queued_for_gpus() -> Obj | None:
        held = cluster.condition("mnist-gpu", "Suspended")
        return held if held and held["reason"] == "Queued" and GPU in held["message"] else None

    held = waits.wait_until(
        queued_for_gpus,
        timeout=T,
        what="the job queued in Kueue's words naming nvidia.com/gpu",
        on_timeout=lambda: f"; status: {(cluster.job('mnist-gpu') or {}).get('status')}",
    )
    # Kueue's own words: the worker podSet's 2 GPUs against the flavor's 1.
    assert "pod set worker" in held["message"], held
    assert f"insufficient quota for {GPU} in flavor {flavor}" in held["message"], held
    assert "current podset request (2)" in held["message"], held
    assert "maximum capacity (1)" in held["message"], held
    # The job's Events say it too: its first Queued Event came before Kueue had looked at the
    # Workload; Kueue's first words get one of their own.
    waits.wait_until(
        lambda: any(
            e.reason == "Queued" and f"insufficient quota for {GPU}" in (e.message or "")
            for e in cluster.events("mnist-gpu")
        ),
        timeout=T,
        what="the job's Queued Event naming nvidia.com/gpu",
    )
    workload = waits.wait_until(
        lambda: (
            (wl := queues.workload("mnist-gpu"))
            and (wl.get("status") or {}).get("resourceRequests")
            and wl
        ),
        timeout=T,
        what="Kueue's count of the Workload's requests",
    )
    assert not is_true(workload, "Admitted")
    # Kueue's Event on the Workload says the same.
    waits.wait_until(
        lambda: [
            e
            for e in cluster.events(workload["metadata"]["name"])
            if f"insufficient quota for {GPU}" in (e.message or "")
        ],
        timeout=T,
        what="Kueue's Event naming nvidia.com/gpu on the Workload",
    )
    # The podSets carry the templates' GPUs (limits only: Kueue takes them as requests) and
    # Kueue counted 2 for the workers, none for the chief and the ps.
    assert podset_gpus(workload) == {"chief": (1, None), "ps": (1, None), "worker": (2, "1")}
    requests = {
        r["name"]: r.get("resources", {}).get(GPU)
        for r in (workload.get("status") or {}).get("resourceRequests") or []
    }
    assert requests.get("worker") == "2", workload.get("status")
    assert requests.get("chief") is None and requests.get("ps") is None, requests
    assert not cluster.pods("mnist-gpu")

    queues.custom.patch_cluster_custom_object(
        KUEUE, KV, "clusterqueues", cq, {"spec": {"resourceGroups": gpu_groups(flavor, "2")}}
    )
    admitted = kueue_wait_admitted(queues, "mnist-gpu", T)
    assignments = {a["name"]: a for a in admitted["status"]["admission"]["podSetAssignments"]}
    assert assignments["worker"]["flavors"] == {GPU: flavor}, assignments
    assert assignments["worker"]["resourceUsage"] == {GPU: "2"}, assignments

    def reserved_gpus() -> str | None:
        for reserved in queues.cluster_queue_status(cq).get("flavorsReservation") or []:
            if reserved["name"] == flavor:
                for resource in reserved["resources"]:
                    if resource["name"] == GPU and resource["total"] != "0":
                        return str(resource["total"])
        return None

    # The ClusterQueue's books: the flavor's 2 GPUs reserved (its status follows the
    # admission a moment later).
    assert waits.wait_until(reserved_gpus, timeout=T, what="the GPUs reserved") == "2"

    pods = wait_placed(cluster, body)
    for name, pod in pods.items():
        selector = pod_spec(pod).node_selector or {}
        # The flavor's node labels go to the Pods that use it: the workers.
        assert (selector.get(GPU_NODE_LABEL) == "true") == ("-worker-" in name), (name, selector)
    assert_workers_on_gpu_nodes(pods, nodes, "mnist-gpu")
    cluster.wait_condition("mnist-gpu", "Running", T)


# -- the gang ---------------------------------------------------------------------------------


def test_gpu_gang_asks_for_the_jobs_gpus_and_places_the_workers_on_gpu_nodes(
    cluster: Cluster, nodes: Nodes, checkpoints: str, example: Obj
) -> None:
    body = on_pool(example, nodes, "gang-gpu")
    cluster.create_job(body)
    group = waits.wait_until(lambda: pod_group(cluster, "gang-gpu"), timeout=T, what="the PodGroup")
    assert group["spec"]["minMember"] == 4
    # Only the workers ask for GPUs (and nothing else asks for anything).
    assert group["spec"]["minResources"] == {GPU: "2"}, group["spec"]

    pods = wait_placed(cluster, body)
    assert {pod_spec(p).scheduler_name for p in pods.values()} == {SCHEDULER_NAME}
    assert {(meta(p).labels or {}).get("scheduling.x-k8s.io/pod-group") for p in pods.values()} == {
        "gang-gpu"
    }
    assert_workers_on_gpu_nodes(pods, nodes, "gang-gpu")
    cluster.wait_condition("gang-gpu", "Running", T)


# -- more GPUs than any node has --------------------------------------------------------------


def said(cluster: Cluster, job: str, words: str) -> Obj | None:
    """The job's Running condition once both it and an Unschedulable Event carry `words`."""
    waiting = running_condition(cluster, job)
    if waiting.get("reason") != "Unschedulable" or words not in waiting.get("message", ""):
        return None
    events = [e.message or "" for e in cluster.events(job) if e.reason == "Unschedulable"]
    return waiting if any(words in m for m in events) else None


def greedy_job(example: Obj, nodes: Nodes, workers: int) -> Obj:
    """The example with `workers` workers that each want a GPU more than any node has."""
    body = on_pool(example, nodes, "greedy")
    worker = body["spec"]["replicaSpecs"]["worker"]
    worker["replicas"] = workers
    (tf,) = worker["template"]["spec"]["containers"]
    tf["resources"]["limits"][GPU] = str(GPUS_PER_NODE + 1)
    return body


def room_for_the_workers(cluster: Cluster, nodes: Nodes, body: Obj) -> None:
    """Two nodes with GPUs enough for a worker each: the job runs, its workers there."""
    big = set(nodes.add(2, gpus=worker_gpus(body)))
    pods = wait_placed(cluster, body)
    workers = {name: pod for name, pod in pods.items() if "-worker-" in name}
    assert workers and all(pod_spec(p).node_name in big for p in workers.values()), describe(
        cluster, body["metadata"]["name"]
    )
    cluster.wait_condition(body["metadata"]["name"], "Running", T)


def test_no_gang_gpu_worker_wanting_more_gpus_than_any_node_has_waits_and_says_why(
    space: Cluster,
    nodes: Nodes,
    checkpoints: str,
    example: Obj,
    kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """kube-scheduler, Pod by Pod (an operator of the test's own, without a gang): the chief
    and the ps run, the workers wait, and the job says why in the scheduler's words."""
    cluster = space
    body = greedy_job(example, nodes, workers=2)
    log = tmp_path / "operator.log"
    with running_operator(kubeconfig, log, f"--namespace={cluster.namespace}") as operator:
        operator.wait_serving(T)
        cluster.create_job(body)
        words = f"Insufficient {GPU}"

        def both_workers_said() -> Obj | None:
            waiting = said(cluster, "greedy", words)
            lines = ("worker 0: Unschedulable: 0/", "worker 1: Unschedulable: 0/")
            return waiting if waiting and all(x in waiting["message"] for x in lines) else None

        waiting = waits.wait_until(
            both_workers_said,
            timeout=T,
            what=f"the job's condition (both workers) and an Event to say {words!r}",
            on_timeout=lambda: f"; {describe(cluster, 'greedy')}\n{operator.log_tail(20)}",
        )
        assert waiting["status"] == "False", waiting
        # "worker 0: Unschedulable: 0/6 nodes are available: 2 node(s) didn't match Pod's
        # node affinity/selector, 4 Insufficient nvidia.com/gpu. ...; worker 1: ..."
        assert waiting["message"].startswith("worker 0: Unschedulable: 0/"), waiting
        assert "chief" not in waiting["message"] and "ps 0" not in waiting["message"], waiting
        # Pod by Pod: the chief and the ps (no GPU) take nodes meanwhile; the workers none.
        waits.wait_until(
            lambda: placed(cluster, "greedy", {"greedy-chief-0", "greedy-ps-0"}, only=True),
            timeout=T,
            what="the chief and the ps placed",
            on_timeout=lambda: "; " + describe(cluster, "greedy"),
        )
        pods = cluster.pods("greedy")
        assert not any(pod_spec(pods[f"greedy-worker-{i}"]).node_name for i in range(2))
        assert (cluster.job("greedy") or {})["status"]["state"] != "Running"

        room_for_the_workers(cluster, nodes, body)


def test_gpu_a_gang_with_a_worker_no_node_can_take_binds_no_pod_then_runs(
    cluster: Cluster, nodes: Nodes, checkpoints: str, example: Obj
) -> None:
    """The gang: the cluster has GPUs enough for the one 3-GPU worker (the PodGroup's
    minResources pass Coscheduling's cluster-wide check), no node has: no Pod is bound, the
    chief and ps included, and the job says that its gang waits; nodes with room come, the
    operator has the scheduler retry the gang, and it runs whole.

    The scheduler's own words ("Insufficient nvidia.com/gpu") are on the worker Pod's
    FailedScheduling Event and in the job's condition: within a second the Pods' conditions
    carry only the gang's echo of them ("podGroup ... failed recently", "optimistic rejection
    in PostFilter"), and the operator keeps the words the echo replaced."""
    body = greedy_job(example, nodes, workers=1)
    cluster.create_job(body)
    group = waits.wait_until(lambda: pod_group(cluster, "greedy"), timeout=T, what="the PodGroup")
    assert group["spec"]["minResources"] == {GPU: str(GPUS_PER_NODE + 1)}, group["spec"]

    lead = "Gang greedy waits until all 3 Pods fit at once"
    waiting = waits.wait_until(
        lambda: (c := running_condition(cluster, "greedy")).get("reason") == "Unschedulable" and c,
        timeout=T,
        what="the job to say its gang waits",
        on_timeout=lambda: "; " + describe(cluster, "greedy"),
    )
    assert waiting["status"] == "False" and waiting["message"].startswith(lead), waiting
    waits.wait_until(
        lambda: any(e.reason == "Unschedulable" for e in cluster.events("greedy")),
        timeout=T,
        what="the job's Unschedulable Event",
    )

    def scheduler_said() -> list[str]:
        return [
            e.message or ""
            for e in cluster.events("greedy-worker-0")
            if e.reason == "FailedScheduling" and f"Insufficient {GPU}" in (e.message or "")
        ]

    waits.wait_until(scheduler_said, timeout=T, what="the scheduler's words on the worker")

    pokes = itertools.count()

    def worker_hears_only_the_echo() -> bool:
        # Each touch of the PodGroup has the scheduler try the gang again (the operator does
        # the same when room may have appeared): a try inside the gang's backoff is answered
        # with the echo alone.
        cluster.custom.patch_namespaced_custom_object(
            PODGROUP_GROUP,
            PODGROUP_VERSION,
            cluster.namespace,
            "podgroups",
            "greedy",
            {"metadata": {"annotations": {"test.trainjob.dev/poke": str(next(pokes))}}},
        )
        pod = cluster.pods("greedy").get("greedy-worker-0")
        conditions = (pod.status.conditions or []) if pod is not None and pod.status else []
        return any(
            c.type == "PodScheduled" and observe.is_gang_echo(c.message or "") for c in conditions
        )

    def job_words() -> str:
        return str(running_condition(cluster, "greedy").get("message", ""))

    waits.wait_until(
        worker_hears_only_the_echo,
        timeout=T,
        what="the gang's echo in the worker Pod's condition",
        on_timeout=lambda: "; " + describe(cluster, "greedy"),
    )
    # The Pod now says only that its gang failed; the job keeps what the worker lacks, over
    # the reconciles that follow (without the kept words it loses them within a second).
    waits.wait_until(
        lambda: f"Insufficient {GPU}" in job_words(), timeout=T, what="the GPUs in the job"
    )
    with pytest.raises(waits.WaitTimeoutError):
        waits.wait_until(
            lambda: f"Insufficient {GPU}" not in job_words(),
            timeout=5,
            what="the job to lose the scheduler's words about the GPUs",
        )
    assert job_words().startswith(lead), job_words()
    assert not any(pod_spec(p).node_name for p in cluster.pods("greedy").values()), describe(
        cluster, "greedy"
    )
    assert (cluster.job("greedy") or {})["status"]["state"] != "Running"

    room_for_the_workers(cluster, nodes, body)
