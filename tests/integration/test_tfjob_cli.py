"""The `trainjob` cluster commands for Kubeflow TFJobs that the operator serves (`--tfjob`), on
a real API server with the v1.9.4 TFJob CRD, Pods played by patching their status: `tfjob/NAME`
in get, describe, wait, logs, attach, delete and tensorboard, TFJobs listed beside TrainJobs,
and a TFJob another controller runs refused in words."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import (
    NO_SCHEDULER,
    TEST_IMAGE,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.integration.test_tfjob import TFJOB_CRD, TFJobs, a_tfjob
from tests.support import operator_process, waits
from trainjob import cli
from trainjob.core import tfjob

pytestmark = pytest.mark.integration

T = 30.0
PREFIX = "test-tfjob-cli"


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


def run(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    """`trainjob ARGV --kubeconfig KUBECONFIG` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*argv, "--kubeconfig", str(kubeconfig)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def trainjob_process(kubeconfig: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainjob", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(process: subprocess.Popen[str]) -> str:
    """The first line a process prints, within T seconds."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], T)
    assert ready, "it printed nothing"
    return process.stdout.readline()


def test_tfjob_cli_get_describe_wait_logs_attach_delete(cluster: TFJobs, kubeconfig: Path) -> None:
    ns = cluster.namespace
    cluster.create_job(a_tfjob("mnist", {"Worker": 2, "PS": 1}))
    cluster.custom.create_namespaced_custom_object(
        "trainjob.dev", "v1alpha1", ns, "trainjobs", trainjob("plain", chief=1, workers=0)
    )
    names = {"mnist-worker-0", "mnist-worker-1", "mnist-ps-0"}
    cluster.wait_pods("mnist", names)
    cluster.wait_conditions("mnist", [("Created", "True", "TFJobCreated")])

    code, out, err = run(kubeconfig, "get", "-n", ns)
    assert (code, err) == (0, "")
    rows = [line.split()[:2] for line in out.splitlines()[1:]]
    assert rows[0][0] == "plain" and rows[1][0] == "tfjob/mnist", out
    code, out, _ = run(kubeconfig, "get", "tfjobs", "-n", ns, "-o", "name")
    assert (code, out) == (0, "tfjob.kubeflow.org/mnist\n")

    for name in sorted(names):
        cluster.set_running(name)
    code, out, err = run(kubeconfig, "wait", "tfjob/mnist", "-n", ns, "--for", "running")
    assert code == 0 and out.startswith("TFJob mnist Running ("), out + err

    code, out, _ = run(kubeconfig, "describe", "tfjob/mnist", "-n", ns)
    assert code == 0
    assert "Kind:         TFJob (kubeflow.org/v1), run by the TrainJob operator\n" in out
    assert "State:        Running\n" in out
    conditions = out.split("Conditions:\n")[1].split("Replicas:")[0].splitlines()
    assert [line.split()[:3] for line in conditions[1:]] == [
        ["Created", "True", "TFJobCreated"],
        ["Running", "True", "TFJobRunning"],
    ]
    replicas = out.split("Replicas:\n")[1].split("Events:")[0].splitlines()[1:]
    assert sorted(line.split()[0] for line in replicas) == ["ps-0", "worker-0", "worker-1"]
    assert "mnist-worker-1" in out and "TFJob/mnist" in out.split("Events:\n")[1]

    # No kubelet here: the log cannot be read, and the answer says why, naming the replica.
    code, out, err = run(kubeconfig, "logs", "tfjob/mnist", "worker-1", "-n", ns)
    assert (code, out) == (1, "")
    assert err == (
        "trainjob logs: no log for worker-1: Pod mnist-worker-1 is on no node yet (Running, "
        "not scheduled), so it has no log\n"
    )

    following = trainjob_process(kubeconfig, "attach", "tfjob/mnist", "-n", ns, "--no-tty")
    try:
        first = first_line(following)  # the first Event: attach is in its loop
        cluster.set_exited("mnist-worker-0", 0)
        out, err = following.communicate(timeout=T)
    finally:
        if following.poll() is None:
            following.kill()
            following.wait()
    out = first + out
    assert following.returncode == 0, out + err
    assert "TFJob mnist Succeeded after" in out
    assert f"logs:       trainjob logs tfjob/mnist -n {ns} --cluster" in out

    code, out, _ = run(kubeconfig, "wait", "tfjob/mnist", "-n", ns, "--timeout", "30s")
    assert code == 0 and out.startswith("TFJob mnist Succeeded"), out
    code, out, _ = run(kubeconfig, "get", "tfjob/mnist", "-n", ns, "-o", "yaml")
    stored = yaml.safe_load(out)
    assert (stored["kind"], stored["status"]["conditions"][-1]["reason"]) == (
        "TFJob",
        "TFJobSucceeded",
    )
    code, out, _ = run(kubeconfig, "delete", "tfjob/mnist", "-n", ns)
    assert (code, out) == (0, 'tfjob.kubeflow.org "mnist" deleted\n')
    waits.wait_until(lambda: cluster.job("mnist") is None, timeout=T, what="the TFJob deleted")
    code, _, err = run(kubeconfig, "describe", "tfjob/mnist", "-n", ns)
    assert (code, err) == (1, f"trainjob describe: TFJob mnist not found in namespace {ns}\n")


def test_tfjob_cli_a_tfjob_another_controller_runs_is_refused_in_words(
    cluster: TFJobs, kubeconfig: Path
) -> None:
    ns = cluster.namespace
    cluster.create_job(a_tfjob("theirs", {"Worker": 1}, {"managedBy": tfjob.MULTIKUEUE}))
    for argv in (["describe", "tfjob/theirs"], ["wait", "tfjob/theirs"]):
        code, _, err = run(kubeconfig, *argv, "-n", ns)
        assert code == 1 and err == (
            f"trainjob {argv[0]}: tfjob/theirs is run by kueue.x-k8s.io/multikueue "
            "(spec.runPolicy.managedBy), not by the TrainJob operator: kubectl describe tfjob "
            f"theirs -n {ns} shows it\n"
        )
    code, out, err = run(kubeconfig, "get", "tfjobs", "-n", ns)
    assert (code, out) == (0, "")
    assert err == (
        f"Not shown: 1 TFJob another controller runs ({ns}/theirs); kubectl get tfjobs shows "
        f"them\nNo TFJobs found in {ns} namespace.\n"
    )


def _tensorboard_pod(cluster: TFJobs, job: str) -> Any:
    pods = cluster.core.list_namespaced_pod(
        cluster.namespace, label_selector=f"trainjob.dev/tensorboard-for={job}"
    ).items
    return pods[0] if pods else None


def test_tfjob_cli_tensorboard_mounts_its_claims_and_is_owned_by_the_tfjob(
    cluster: TFJobs, kubeconfig: Path
) -> None:
    """Kubeflow's mnist_with_summaries mounts a claim at /train and logs to /train/logs: the
    TensorBoard Pod mounts it read-only at /logs/train. It is owned by the TFJob itself: the
    garbage collector keeps it while the TFJob lives (an owner of another kind, as a
    TrainJob's would be, it removes at once: see the witness Pod); the command deletes it when
    it ends."""
    ns = cluster.namespace
    body = a_tfjob("summaries", {"Worker": 1})
    pod_spec = body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "training", "persistentVolumeClaim": {"claimName": "tfevents"}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "training", "mountPath": "/train"}]
    uid = cluster.create_job(body)["metadata"]["uid"]
    process = trainjob_process(kubeconfig, "tensorboard", "tfjob/summaries", "-n", ns)
    try:
        pod = waits.wait_until(
            lambda: _tensorboard_pod(cluster, "summaries"), timeout=T, what="the TensorBoard Pod"
        )
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.api_version, owner.uid) == ("TFJob", "kubeflow.org/v1", uid)
        (container,) = pod.spec.containers
        assert [(m.mount_path, m.read_only) for m in container.volume_mounts] == [
            ("/logs/train", True)
        ]
        assert [v.persistent_volume_claim.claim_name for v in pod.spec.volumes] == ["tfevents"]

        wrong = {"apiVersion": "trainjob.dev/v1alpha1", "kind": "TrainJob", "name": "summaries",
                 "uid": uid}  # fmt: skip
        witness = {
            "metadata": {"name": "witness", "ownerReferences": [wrong]},
            "spec": {"schedulerName": NO_SCHEDULER,
                     "containers": [{"name": "c", "image": TEST_IMAGE}]},
        }  # fmt: skip
        cluster.core.create_namespaced_pod(ns, witness)  # type: ignore[arg-type, unused-ignore]
        waits.wait_until(
            lambda: cluster.pod("witness") is None, timeout=T, what="the garbage collector"
        )
        assert _tensorboard_pod(cluster, "summaries") is not None

        process.send_signal(signal.SIGTERM)  # as a closed terminal or `kill` would
        out, err = process.communicate(timeout=T)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out.startswith("Stopped TensorBoard; deleted Pod summaries-tensorboard-"), out
    waits.wait_until(
        lambda: _tensorboard_pod(cluster, "summaries") is None, timeout=T, what="the Pod deleted"
    )
