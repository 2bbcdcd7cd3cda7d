"""Kueue's objects for the Kueue tests: ResourceFlavors, ClusterQueues, LocalQueues,
WorkloadPriorityClasses, and reads of the Workloads Kueue admits (the real Kueue controller
of tests/controlplane/kueue.py runs beside the test control plane)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.kueue import Kueue
from tests.integration.operator_harness import Cluster, trainjob
from tests.support import waits

KUEUE: Final = "kueue.x-k8s.io"
KV: Final = "v1beta2"
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
# The PodsReady timeout the session's Kueue runs with (Kueue's default is 30 min).
KUEUE_PODS_READY_TIMEOUT: Final = 20

Obj = dict[str, Any]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Queues:
    """Kueue's objects of one test, removed afterwards (cluster-scoped ones included)."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.namespace = namespace
        self.cluster_scoped: list[tuple[str, str]] = []

    def flavor(
        self, node_labels: dict[str, str] | None = None, tolerations: list[Obj] | None = None
    ) -> str:
        name = unique("flavor")
        body: Obj = {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": {},
        }
        if node_labels:
            body["spec"]["nodeLabels"] = node_labels
        if tolerations:
            body["spec"]["tolerations"] = tolerations
        self.custom.create_cluster_custom_object(KUEUE, KV, "resourceflavors", body)
        self.cluster_scoped.append(("resourceflavors", name))
        return name

    def cluster_queue(self, flavor: str, cpu: str, preemption: Obj | None = None) -> str:
        name = unique("cq")
        body: Obj = {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "queueingStrategy": "StrictFIFO",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu}]}
                        ],
                    }
                ],
            },
        }
        if preemption:
            body["spec"]["preemption"] = preemption
        self.custom.create_cluster_custom_object(KUEUE, KV, "clusterqueues", body)
        self.cluster_scoped.append(("clusterqueues", name))
        return name

    def local_queue(self, cluster_queue: str, name: str = "team-queue") -> str:
        body = {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
        self.custom.create_namespaced_custom_object(KUEUE, KV, self.namespace, "localqueues", body)
        return name

    def priority_class(self, value: int) -> str:
        name = unique("prio")
        body = {
            "apiVersion": f"{KUEUE}/{KV}",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        self.custom.create_cluster_custom_object(KUEUE, KV, "workloadpriorityclasses", body)
        self.cluster_scoped.append(("workloadpriorityclasses", name))
        return name

    def cleanup(self) -> None:
        for plural, name in reversed(self.cluster_scoped):
            try:
                self.custom.delete_cluster_custom_object(KUEUE, KV, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    # -- reads ------------------------------------------------------------------------------

    def workloads(self, job: str | None = None) -> list[Obj]:
        selector = f"trainjob.dev/job-name={job}" if job else "trainjob.dev/job-name"
        result = cast(
            Obj,
            self.custom.list_namespaced_custom_object(
                KUEUE, KV, self.namespace, "workloads", label_selector=selector
            ),
        )
        return list(result.get("items") or [])

    def workload(self, job: str) -> Obj | None:
        items = self.workloads(job)
        return items[0] if len(items) == 1 else None

    def cluster_queue_status(self, name: str) -> Obj:
        result = cast(Obj, self.custom.get_cluster_custom_object(KUEUE, KV, "clusterqueues", name))
        status: Obj = result.get("status") or {}
        return status

    def patch_workload(self, name: str, patch: Obj) -> None:
        self.custom.patch_namespaced_custom_object(
            KUEUE, KV, self.namespace, "workloads", name, patch
        )

    def delete_workload(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(KUEUE, KV, self.namespace, "workloads", name)


def condition(obj: Obj | None, ctype: str) -> Obj | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            result: Obj = cond
            return result
    return None


def is_true(obj: Obj | None, ctype: str) -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == "True"


def queued_job(
    name: str,
    queue: str,
    *,
    cpu: str = "1",
    chief: int = 1,
    workers: int = 2,
    priority_class: str | None = None,
) -> Obj:
    """A TrainJob for `queue` whose every replica requests `cpu`."""
    body = trainjob(
        name,
        chief=chief,
        workers=workers,
        template_spec={
            "containers": [
                {
                    "name": "tensorflow",
                    "image": "example.com/trainjob:test",
                    "resources": {"requests": {"cpu": cpu}},
                }
            ]
        },
    )
    body["metadata"]["labels"] = {QUEUE_LABEL: queue}
    if priority_class:
        body["metadata"]["labels"][PRIORITY_LABEL] = priority_class
    return body


def suspended(cluster: Cluster, name: str) -> bool:
    job = cluster.job(name) or {}
    return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def wait_admitted(queues: Queues, job: str, timeout: float) -> Obj:
    def admitted() -> Obj | None:
        workload = queues.workload(job)
        return workload if is_true(workload, "Admitted") else None

    return waits.wait_until(admitted, timeout=timeout, what=f"the Workload of {job} to be Admitted")


@contextmanager
def queues_in(
    namespace: str,
    api_client: k8s.ApiClient,
    kueue: Kueue,
    workloads: Callable[[Queues], list[Obj]] | None = None,
) -> Iterator[Queues]:
    """A test's Kueue objects, removed after it; what the Workloads and Kueue said is printed
    (shown when the test fails). ``workloads``: how to list them (default: TrainJobs')."""
    objects = Queues(api_client, namespace)
    try:
        yield objects
    finally:
        for wl in (workloads or Queues.workloads)(objects):
            print(f"workload {wl['metadata']['name']}: {wl.get('status')}")
        print(f"kueue log, last lines:\n{kueue.log_tail(20)}")
        objects.cleanup()
