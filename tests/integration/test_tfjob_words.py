"""A TFJob is told about in TFJob's words, as training-operator v1.9.4 tells it: a TFJob's
whole life (created, a worker failing once and restarted, succeeded) read the way its user
reads it, with `kubectl describe tfjob` and `kubectl get events`, says "TFJob" and never
"TrainJob", gives every Event a reason of training-operator's vocabulary, and says an unset
backoffLimit as "no limit" (not the number the engine holds it as). Pods are driven by
patching their status like a kubelet."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import attempt, module_cluster, module_operator
from tests.integration.test_tfjob import TFJobs, a_tfjob, kubeflow_pods
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

T = 30.0
TFJOB_CRD = REPO_ROOT / "crds/kubeflow/kubeflow.org_tfjobs.yaml"
PREFIX: Final = "test-tfjob-words"

# Every reason training-operator v1.9.4 gives an Event or a condition of a TFJob
# (pkg/util/status.go NewReason(TFJobKind, ...); pkg/controller.v1/common/pod.go,
# control/pod_control.go, control/service_control.go, tensorflow/tfjob_controller.go).
TRAINING_OPERATOR_REASONS: Final = frozenset(
    {
        "TFJobCreated",
        "TFJobRunning",
        "TFJobRestarting",
        "TFJobSucceeded",
        "TFJobFailed",
        "TFJobSuspended",
        "TFJobResumed",
        "ExitedWithCode",
        "SetPodTemplateRestartPolicy",
        "SetPodTemplateSchedulerName",
        "SuccessfulCreatePod",
        "FailedCreatePod",
        "SuccessfulDeletePod",
        "FailedDeletePod",
        "SuccessfulCreateService",
        "FailedCreateService",
        "SuccessfulDeleteService",
        "FailedDeleteService",
        "SuccessfulDeleteJob",
        "FailedDeleteJob",
        "SuccessfulDeletePodGroup",
    }
)


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    control_plane.apply_crds([TFJOB_CRD])
    yield from module_operator(kubeconfig, tmp_path_factory, PREFIX, "--tfjob", timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[TFJobs]:
    for plain in module_cluster(operator, api_client, namespace, PREFIX):
        yield TFJobs(api_client, plain.namespace)


def test_tfjob_words_a_whole_life_in_tfjob_words_and_training_operator_reasons(
    cluster: TFJobs, control_plane: ControlPlane
) -> None:
    body = a_tfjob("words", {"Worker": 2})
    for replica in body["spec"]["tfReplicaSpecs"].values():
        replica["restartPolicy"] = "OnFailure"  # backoffLimit left unset: no limit
    cluster.create_job(body)
    names = {"words-worker-0", "words-worker-1"}
    waits.wait_until(lambda: set(kubeflow_pods(cluster, "words")) == names, timeout=T, what="pods")
    for name in sorted(names):
        cluster.set_running(name)
    cluster.wait_conditions(
        "words", [("Created", "True", "TFJobCreated"), ("Running", "True", "TFJobRunning")]
    )

    # Worker 1 fails once: the group is restarted (a new attempt of each Pod).
    cluster.set_exited("words-worker-1", 1)
    waits.wait_until(
        lambda: (
            set(pods := kubeflow_pods(cluster, "words")) == names
            and all(attempt(p) == 1 for p in pods.values())
        ),
        timeout=T,
        what="the restarted Pods",
    )
    for name in sorted(names):
        cluster.set_running(name)
    cluster.set_exited("words-worker-0", 0)
    waits.wait_until(
        lambda: ("Succeeded", "True", "TFJobSucceeded") in cluster.conditions("words"),
        timeout=T,
        what="words Succeeded",
    )
    # Every Event of the life is posted before the status that records it (Succeeded).

    ns = cluster.namespace
    described = control_plane.kubectl("describe", "tfjob", "words", "-n", ns).stdout
    events = control_plane.kubectl(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=words"
    ).stdout
    told = described + events
    assert "TrainJob" not in told, told
    reasons = {str(e.reason) for e in cluster.events("words")}
    assert reasons <= TRAINING_OPERATOR_REASONS, sorted(reasons - TRAINING_OPERATOR_REASONS)
    assert {"TFJobRestarting", "TFJobSucceeded"} <= reasons, reasons
    # The unset backoffLimit is said as such, never as the engine's stand-in number.
    assert "no limit" in events, events
    assert not re.search(r"\b2147483647\b", told), told
