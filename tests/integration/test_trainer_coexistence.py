"""Our TrainJob beside Kubeflow Trainer v2's TrainJob on one cluster.

Trainer (what most platform teams run for PyTorch and JAX) defines `trainer.kubeflow.org/
v1alpha1` kind `TrainJob`, plural `trainjobs`, no short name: its real CRDs and torch runtime
are on this control plane (tests/controlplane/trainer.py), and the session's Kueue has both
TrainJob integrations on: ours (`TrainJob.v1alpha1.trainjob.dev`, an external framework whose
Workloads the operator keeps) and Kueue's own `trainer.kubeflow.org/trainjob`, its webhooks
registered. No Trainer controller runs: nothing here needs one, and anything that changes
Trainer's objects is then Kueue's doing or ours.

What users see: kubectl resolves a bare `trainjobs` by the API groups' order (equal priority:
by name, and `trainer.kubeflow.org` sorts before `trainjob.dev`), so `kubectl get trainjobs`
means Trainer's; `tj` and `trainjobs.trainjob.dev` mean ours. Two jobs named alike, one of each
kind, in one namespace under one LocalQueue: each gets its own Workload from Kueue, ours runs,
and nothing of ours is written on theirs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from tests.controlplane import trainer
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.kueue import Kueue
from tests.integration.kueue_harness import (
    KUEUE,
    KV,
    QUEUE_LABEL,
    Queues,
    is_true,
    queued_job,
    queues_in,
    wait_admitted,
)
from tests.integration.operator_harness import GROUP, Cluster, trainjob
from tests.integration.test_cli_cluster import run
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 60.0  # per step, on 2 loaded cores
Obj = dict[str, Any]
OUR_PREFIX = "trainjob.dev/"


@pytest.fixture(scope="module")
def operator(
    kueue: Kueue, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(kubeconfig, log, "--namespace=test-trainer-*", "--kueue")
    op.start()
    try:
        yield op.wait_serving(T)
    finally:
        op.stop()


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    assert namespace.startswith("test-trainer-"), namespace
    yield Cluster(api_client, namespace)
    print(f"operator log, last lines:\n{operator.log_tail(30)}")


@pytest.fixture
def queues(cluster: Cluster, api_client: k8s.ApiClient, kueue: Kueue) -> Iterator[Queues]:
    with queues_in(cluster.namespace, api_client, kueue, all_workloads) as objects:
        yield objects


def all_workloads(queues: Queues) -> list[Obj]:
    found = cast(
        Obj, queues.custom.list_namespaced_custom_object(KUEUE, KV, queues.namespace, "workloads")
    )
    return list(found.get("items") or [])


def their_trainjob(name: str, queue: str | None = None) -> Obj:
    """A Kubeflow Trainer TrainJob on Trainer's own torch runtime."""
    metadata: Obj = {"name": name}
    if queue:
        metadata["labels"] = {QUEUE_LABEL: queue}
    return {
        "apiVersion": f"{trainer.GROUP}/{trainer.VERSION}",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": trainer.RUNTIME}},
    }


def create_theirs(cluster: Cluster, body: Obj) -> Obj:
    created = cluster.custom.create_namespaced_custom_object(
        trainer.GROUP, trainer.VERSION, cluster.namespace, trainer.PLURAL, body
    )
    return cast(Obj, created)


def read_theirs(cluster: Cluster, name: str) -> Obj:
    found = cluster.custom.get_namespaced_custom_object(
        trainer.GROUP, trainer.VERSION, cluster.namespace, trainer.PLURAL, name
    )
    return cast(Obj, found)


def names(plane: ControlPlane, namespace: str, resource: str) -> list[str]:
    """`kubectl get RESOURCE -o name` in `namespace`: kubectl's own resolution of the name."""
    out = plane.kubectl("get", resource, "-n", namespace, "-o", "name").stdout
    return out.split()


def ours_on(obj: Obj) -> list[str]:
    """Whatever of ours is written on `obj`: our labels, annotations, finalizers, or a field
    manager of the operator."""
    meta = obj["metadata"]
    found = [k for k in (meta.get("labels") or {}) if k.startswith(OUR_PREFIX)]
    found += [k for k in (meta.get("annotations") or {}) if k.startswith(OUR_PREFIX)]
    found += [f for f in meta.get("finalizers") or [] if f.startswith(OUR_PREFIX)]
    found += [
        m["manager"]
        for m in meta.get("managedFields") or []
        if "trainjob" in m.get("manager", "") and "kueue" not in m.get("manager", "")
    ]
    return found


def test_trainer_kubectl_names_resolve_to_the_documented_kind(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("twin", chief=1, workers=0))
    create_theirs(cluster, their_trainjob("twin"))
    create_theirs(cluster, their_trainjob("theirs-only"))

    # A bare `trainjobs` is Trainer's, on any cluster that has both (the docs say so:
    # operations/install.md).
    assert names(control_plane, ns, "trainjobs") == [
        "trainjob.trainer.kubeflow.org/theirs-only",
        "trainjob.trainer.kubeflow.org/twin",
    ]
    assert names(control_plane, ns, "trainjob") == names(control_plane, ns, "trainjobs")
    # Ours by its short name and by its full name.
    ours = ["trainjob.trainjob.dev/twin"]
    assert names(control_plane, ns, "tj") == ours
    assert names(control_plane, ns, "trainjobs.trainjob.dev") == ours
    assert len(names(control_plane, ns, "trainjobs.trainer.kubeflow.org")) == 2
    # `trainjob` asks for ours by group, whatever kubectl would resolve.
    code, out, err = run(control_plane.kubeconfig, "get", "-n", ns)
    assert code == 0, err
    listed = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert listed == ["twin"], out


def test_trainer_twin_jobs_under_one_queue_each_get_their_own_workload_and_ours_runs(
    cluster: Cluster, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(), "10")
    lq = queues.local_queue(cq)
    theirs = create_theirs(cluster, their_trainjob("twin", lq))
    ours = cluster.create_job(queued_job("twin", lq, chief=1, workers=1))

    # Kueue's own webhook suspended theirs at creation, as it does for every queued TrainJob.
    assert theirs["spec"].get("suspend") is True, theirs["spec"]
    wait_admitted(queues, "twin", T)  # ours: the Workload our operator keeps
    for pod in cluster.wait_pods("twin", {"twin-chief-0", "twin-worker-0"}, timeout=T):
        cluster.set_running(pod)  # as the kubelet would: Kueue waits for its Pods ready
    cluster.wait_condition("twin", "Running", timeout=T)

    def their_workload() -> Obj | None:
        for workload in all_workloads(queues):
            owners = workload["metadata"].get("ownerReferences") or []
            if any(o["uid"] == theirs["metadata"]["uid"] for o in owners):
                return workload
        return None

    workload = waits.wait_until(their_workload, timeout=T, what="Kueue's Workload for theirs")
    owner = workload["metadata"]["ownerReferences"][0]
    assert owner["apiVersion"] == f"{trainer.GROUP}/{trainer.VERSION}", owner
    ours_workload = queues.workload("twin")
    assert ours_workload is not None
    assert ours_workload["metadata"]["name"] != workload["metadata"]["name"]
    assert ours_workload["metadata"]["ownerReferences"][0]["uid"] == ours["metadata"]["uid"]
    waits.wait_until(
        lambda: is_true(their_workload(), "Admitted"), timeout=T, what="theirs admitted"
    )
    # Kueue unsuspends what it admitted; no Trainer controller runs here to start it.
    waits.wait_until(
        lambda: read_theirs(cluster, "twin")["spec"].get("suspend") is False,
        timeout=T,
        what="Kueue to unsuspend theirs",
    )

    # Nothing of ours on theirs: no label, annotation, finalizer, status or field manager.
    after = read_theirs(cluster, "twin")
    assert ours_on(after) == [], after["metadata"]
    assert "conditions" not in (after.get("status") or {}), after.get("status")
    # Deleting ours leaves theirs.
    cluster.custom.delete_namespaced_custom_object(
        GROUP, "v1alpha1", cluster.namespace, "trainjobs", "twin"
    )
    waits.wait_until(lambda: cluster.job("twin") is None, timeout=T, what="ours deleted")
    assert read_theirs(cluster, "twin")["metadata"]["uid"] == theirs["metadata"]["uid"]
