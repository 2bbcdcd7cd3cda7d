"""Kueue v0.19.2's own TFJob integration (`kubeflow.org/tfjob`, its webhooks registered; no
training-operator) against our operator's `--tfjob`: Kueue suspends a queued TFJob at
creation and makes its Workload, admits it by writing the templates and unsuspending it,
reads PodsReady from the Running condition and Finished from Succeeded, and preempts it by
suspending it again, clearing the admission only once `active` is 0. Also the Kubeflow SDK's
`create_job(..., queue_name=...)`. Pods are driven by patching their status like a kubelet."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from tests.controlplane import kubeflow_sdk
from tests.controlplane.kueue import Kueue
from tests.controlplane.tools import REPO_ROOT
from tests.integration.kueue_harness import (
    KUEUE,
    KV,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    Queues,
    queues_in,
)
from tests.integration.test_tfjob import TFJobs, a_tfjob, kubeflow_pods
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 30.0
Obj = dict[str, Any]
POOL = {"trainjob.dev/test-pool": "tfjobs"}


@pytest.fixture(scope="module")
def operator(
    kueue: Kueue, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    # No --kueue: a TFJob's Workload is Kueue's own integration's, not ours.
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(
        kubeconfig, log, "--namespace=test-kueue-tfjob-*", "--tfjob"
    ).start()
    try:
        yield op.wait_serving(T)
    finally:
        op.stop()


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[TFJobs]:
    assert namespace.startswith("test-kueue-tfjob-"), namespace
    yield TFJobs(api_client, namespace)
    print(f"operator log, last lines:\n{operator.log_tail(40)}")


@pytest.fixture
def queues(cluster: TFJobs, api_client: k8s.ApiClient, kueue: Kueue) -> Iterator[Queues]:
    with queues_in(cluster.namespace, api_client, kueue, workloads) as objects:
        yield objects


def workloads(queues: Queues) -> list[Obj]:
    found = cast(
        Obj, queues.custom.list_namespaced_custom_object(KUEUE, KV, queues.namespace, "workloads")
    )
    return list(found.get("items") or [])


def workload_of(queues: Queues, job: str) -> Obj | None:
    for wl in workloads(queues):
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "TFJob" and o.get("name") == job for o in owners):
            return wl
    return None


def workload_condition(queues: Queues, job: str, ctype: str) -> str | None:
    wl = workload_of(queues, job) or {}
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return str(cond.get("status"))
    return None


def queued(name: str, queue: str, cpu: str, labels: dict[str, str] | None = None) -> Obj:
    body = a_tfjob(name, {"Worker": 1})
    body["metadata"]["labels"] = {QUEUE_LABEL: queue, **(labels or {})}
    (container,) = body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    container["resources"] = {"requests": {"cpu": cpu}}
    return body


def spec_of(cluster: TFJobs, name: str) -> Obj:
    return dict((cluster.job(name) or {}).get("spec") or {})


def test_kueue_tfjob_admitted_runs_and_finishes_served_by_us(
    cluster: TFJobs, queues: Queues
) -> None:
    cq = queues.cluster_queue(queues.flavor(node_labels=POOL), cpu="2")
    queue = queues.local_queue(cq)
    cluster.create_job(queued("mnist", queue, "1"))
    # Kueue's webhook suspended it at creation; its Workload admitted, Kueue writes the
    # flavor's nodeSelector into the template and unsuspends it; we create the Pod from it.
    waits.wait_until(lambda: workload_of(queues, "mnist"), timeout=T, what="the Workload")
    pods = waits.wait_until(
        lambda: kubeflow_pods(cluster, "mnist") or None, timeout=T, what="the Pod after admission"
    )
    pod = pods["mnist-worker-0"]
    assert pod.spec is not None and pod.spec.node_selector == POOL
    assert pod.metadata is not None and "kueue.x-k8s.io/podset" in (pod.metadata.labels or {})
    # Suspended (as Kueue's webhook created it), then resumed: the one Suspended condition
    # moved last, False (unless Kueue admitted it before we first looked). The TFJob's status
    # is written after its Pods: wait for it rather than read it the moment the Pod appears.
    resumed = (
        [("Created", "True", "TFJobCreated"), ("Suspended", "False", "TFJobResumed")],
        [("Created", "True", "TFJobCreated")],
    )
    waits.wait_until(
        lambda: cluster.conditions("mnist") in resumed,
        timeout=T,
        what="the TFJob's status to say it was resumed",
        on_timeout=lambda: f"; conditions: {cluster.conditions('mnist')}",
    )
    assert workload_condition(queues, "mnist", "PodsReady") != "True"

    cluster.set_running("mnist-worker-0")
    waits.wait_until(
        lambda: workload_condition(queues, "mnist", "PodsReady") == "True",
        timeout=T,
        what="Kueue's PodsReady from our Running condition",
    )
    cluster.set_exited("mnist-worker-0", 0)
    waits.wait_until(
        lambda: workload_condition(queues, "mnist", "Finished") == "True",
        timeout=T,
        what="Kueue's Finished from our Succeeded condition",
    )
    assert cluster.conditions("mnist")[-1] == ("Succeeded", "True", "TFJobSucceeded")


def test_kueue_tfjob_preempted_is_admitted_again_when_room_is_back(
    cluster: TFJobs, queues: Queues
) -> None:
    cq = queues.cluster_queue(
        queues.flavor(),
        cpu="1",
        preemption={"withinClusterQueue": "LowerPriority"},
    )
    queue = queues.local_queue(cq)
    low, high = queues.priority_class(10), queues.priority_class(1000)
    cluster.create_job(queued("low", queue, "1", {PRIORITY_LABEL: low}))
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "low")) == {"low-worker-0"}, timeout=T, what="low runs"
    )
    cluster.set_running("low-worker-0")
    waits.wait_until(
        lambda: cluster.conditions("low")[-1] == ("Running", "True", "TFJobRunning"),
        timeout=T,
        what="low Running",
    )

    cluster.create_job(queued("high", queue, "1", {PRIORITY_LABEL: high}))
    # Kueue evicts low by suspending it: its Pod goes, active is 0 at once, and Kueue clears
    # its admission, then admits high.
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "high")) == {"high-worker-0"},
        timeout=T,
        what="high admitted after low was preempted",
    )
    low_job = cluster.job("low") or {}
    assert low_job["spec"]["runPolicy"]["suspend"] is True
    assert low_job["status"]["replicaStatuses"] == {"Worker": {}}
    assert kubeflow_pods(cluster, "low") == {}
    assert cluster.conditions("low")[-2:] == [
        ("Running", "False", "TFJobSuspended"),
        ("Suspended", "True", "TFJobSuspended"),
    ]
    evicted = workload_of(queues, "low") or {}
    assert "admission" not in (evicted.get("status") or {}), evicted.get("status")

    cluster.set_running("high-worker-0")
    cluster.set_exited("high-worker-0", 0)
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "low")) == {"low-worker-0"},
        timeout=T,
        what="low admitted again once high finished",
    )
    # The TFJob's own status is written after its Pods (as training-operator does): it may
    # follow them by a moment.
    waits.wait_until(
        lambda: cluster.conditions("low")[-1] == ("Suspended", "False", "TFJobResumed"),
        timeout=T,
        what="low's TFJob status says it resumed",
    )
    assert spec_of(cluster, "low")["runPolicy"]["suspend"] is False


def test_kueue_tfjob_from_the_sdks_create_job_with_a_queue_name(
    cluster: TFJobs, queues: Queues, kubeconfig: Path
) -> None:
    """A user's script: the Kubeflow SDK's create_job(..., queue_name=...), in the SDK's own
    venv (tests/controlplane/kubeflow_sdk.py)."""
    cq = queues.cluster_queue(queues.flavor(), cpu="4")
    queue = queues.local_queue(cq)
    result = subprocess.run(
        [
            str(kubeflow_sdk.python()),
            str(REPO_ROOT / "tests" / "support" / "kubeflow_sdk_driver.py"),
            "queued",
            "sdk",
            cluster.namespace,
            "example.com/trainjob:test",
            queue,
            "2",
        ],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'RESULT {"created": true}' in result.stdout, result.stdout[-3000:]
    created = cluster.job("sdk") or {}
    assert created["metadata"]["labels"][QUEUE_LABEL] == queue
    waits.wait_until(lambda: workload_of(queues, "sdk"), timeout=T, what="the SDK job's Workload")
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "sdk")) == {"sdk-worker-0", "sdk-worker-1"},
        timeout=T,
        what="the SDK job's Pods once admitted",
    )
