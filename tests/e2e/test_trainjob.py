"""The product end to end on real pods: the chart's operator, the runtime images, headless
Service DNS between pods, a shared checkpoint volume, checkpoints on an S3 server, restarts
after a pod is deleted or killed, and kubectl's view of it all. See conftest.py for the cluster
and namespaces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.controlplane import objectstore
from tests.controlplane.e2e_cluster import (
    CHECKPOINT_CLAIM,
    REPO_ROOT,
    Cluster,
    address_pods_reach,
    signal_training_process,
    wait_until,
)
from tests.e2e.conftest import IMAGE_TAG

pytestmark = pytest.mark.e2e

EXAMPLES: Final = REPO_ROOT / "examples"
RUNTIME_IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}"
# A job on 2 shared cores: pods start in seconds, TensorFlow imports in ~4 s per process.
JOB_TIMEOUT: Final = 600.0


def example(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def volume_listing(cluster: Cluster, namespace: str, path: str) -> list[str]:
    """The files under ``path`` on the namespace's checkpoint volume, read by a pod of its own
    (the same way on any cluster)."""
    script = (
        "import os, sys\n"
        "for d, _, fs in os.walk(sys.argv[1]):\n"
        "    for f in fs: print(os.path.relpath(os.path.join(d, f), sys.argv[1]))\n"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "volume-reader"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "reader",
                    "image": RUNTIME_IMAGE,
                    "command": ["python", "-c", script, f"/volume/{path}"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "ckpt", "mountPath": "/volume", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": CHECKPOINT_CLAIM}}],
        },
    }
    cluster.apply(namespace, json.dumps(pod))
    wait_until(
        lambda: (
            cluster.get_json("pod", "volume-reader", "-n", namespace).get("status", {}).get("phase")
            in ("Succeeded", "Failed")
        ),
        timeout=120,
        what="the volume reader pod",
    )
    return cluster.kubectl("logs", "volume-reader", "-n", namespace).split()


def test_multiworker_example_succeeds_exports_to_the_volume_and_kubectl_shows_it(
    cluster: Cluster, namespace: str
) -> None:
    job = "mnist-multiworker"
    cluster.apply(namespace, EXAMPLES / "mnist-multiworker.yaml")
    # What `kubectl get tj` shows in its Progress column while the job runs: worker 0 reports
    # over HTTPS (projected job-audience token, the chart's CA) and the operator writes it.
    seen: list[str] = []

    def finished() -> str | None:
        status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
        summary = (status.get("progress") or {}).get("summary")
        if summary and (not seen or seen[-1] != summary):
            seen.append(summary)
        for condition in status.get("conditions") or []:
            if condition.get("type") in ("Succeeded", "Failed") and condition["status"] == "True":
                return str(condition["type"])
        return None

    assert wait_until(finished, timeout=JOB_TIMEOUT, what=f"{job} to finish") == "Succeeded"
    final = wait_until(
        lambda: (
            (
                cluster.get_json("trainjob", job, "-n", namespace)["status"].get("progress") or {}
            ).get("summary")
            == "100% (3/3)"
            and "100% (3/3)"
        ),
        timeout=30,
        what="the final progress in status",
    )
    seen.append(final)
    running = [s for s in dict.fromkeys(seen) if not s.startswith("100%")]
    assert running, f"no progress seen while {job} ran: {seen}"

    status = cluster.get_json("trainjob", job, "-n", namespace)["status"]
    assert status["replicaStatuses"]["worker"]["succeeded"] >= 1, status
    # Each worker said what TensorFlow sees (worker 1 in its one report at start): no GPU here.
    devices = status["progress"]["replicaDevices"]
    assert sorted(devices) == ["worker-0", "worker-1"], devices
    assert all(d["gpus"] == 0 for d in devices.values()), devices
    assert status["progress"]["deviceSummary"] == "CPU", status["progress"]
    end = [e for e in cluster.progress(namespace, f"{job}-worker-0") if e["event"] == "end"]
    assert end and end[-1]["status"] == "succeeded", end
    assert end[-1]["step"] == 3 * 40, end  # epochs x steps_per_epoch

    files = volume_listing(cluster, namespace, job)
    assert "export/saved_model.pb" in files, files

    table = cluster.kubectl("get", "tj", "-n", namespace)
    header = table.splitlines()[0].split()
    assert header == [
        "NAME",
        "STATE",
        "READY",
        "RESTARTS",
        "REASON",
        "PROGRESS",
        "ETA",
        "LOSS",
        "DEVICES",
        "AGE",
    ]
    assert "Succeeded" in table.splitlines()[1], table
    assert " CPU " in table.splitlines()[1], table  # the node has no GPU: said, not silent
    assert "TrainJobSucceeded" in table.splitlines()[1], table  # the Running condition's reason
    assert "100% (3/3)" in table.splitlines()[1], table
    described = cluster.kubectl("describe", "tj", job, "-n", namespace)
    events = described.split("Events:", 1)[1]
    assert "Created" in events and "Succeeded" in events, described


@pytest.fixture
def store_for_pods(cluster: Cluster, tmp_path: Path) -> Iterator[objectstore.S3Server]:
    """The S3 server (versitygw) on an address of this machine that the cluster's pods reach,
    and nothing beyond it (e2e_cluster.address_pods_reach)."""
    address = address_pods_reach(cluster)
    if address is None:
        pytest.skip(f"no address of this machine is known that {cluster.name}'s pods reach")
    with objectstore.s3_server(tmp_path / "s3", address) as server:
        yield server


def test_worker_deleted_then_killed_resumes_from_the_s3_checkpoint_and_succeeds(
    cluster: Cluster, namespace: str, store_for_pods: objectstore.S3Server
) -> None:
    """The 2-worker example with its checkpoints on the S3 server (`s3://`, the keys in a
    Secret the job names, the endpoint in the template's env): a worker deleted, then one
    killed, and each time the group restarts and resumes from the newest complete snapshot
    it downloads from the store. A checkpoint on a shared volume is resumed in
    test_multinode.py's lost-node test (kind); the multiworker example test above writes its
    export to the volume."""
    store = store_for_pods
    job = "mnist-multiworker"
    bucket = store.make_bucket(f"ckpt-{namespace}")
    url = f"s3://{bucket}/{job}"
    secret = "store-keys"
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        secret,
        "-n",
        namespace,
        *(f"--from-literal={k}={v}" for k, v in store.admin.env().items()),
    )
    manifest = example("mnist-multiworker.yaml")
    # Long enough to lose a worker twice; the process namespace is shared so that a shell in
    # the pod can kill the training process (exit 137).
    manifest["spec"]["runtime"]["config"] = {"epochs": 6, "steps_per_epoch": 40, "batch_size": 64}
    manifest["spec"]["checkpoint"] = {"path": url, "credentialsSecret": secret}
    # The endpoint override (and region) in the template's env; the keys only in the Secret.
    endpoint = {k: v for k, v in store.env().items() if k not in store.admin.env()}
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {
            "shareProcessNamespace": True,
            "containers": [
                {
                    "name": "tensorflow",
                    "env": [{"name": k, "value": v} for k, v in endpoint.items()],
                }
            ],
        }
    }
    cluster.apply(namespace, json.dumps(manifest))
    applied = json.dumps(cluster.get_json("trainjob", job, "-n", namespace))
    assert store.admin.secret_key not in applied  # only the Secret's name is in the spec
    worker0, worker1 = f"{job}-worker-0", f"{job}-worker-1"

    def markers() -> list[str]:
        """The complete snapshots in the store: their `.complete` markers."""
        return sorted(k for k in store.keys(bucket, f"{job}/") if k.endswith(".complete"))

    def uid_of(pod: str) -> str | None:
        return (cluster.get_json("pod", pod, "-n", namespace).get("metadata") or {}).get("uid")

    def replaced(pod: str, old: str | None, *events: str) -> str | None:
        """The pod's uid once a pod other than ``old`` has logged one of ``events``; a job that
        failed (a store its pods cannot reach, say) ends the wait with its status."""
        status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        assert conditions.get("Failed") != "True", status
        current = uid_of(pod)
        ended = conditions.get("Succeeded") == "True"
        assert not (ended and current == old), f"{job} ended before {pod} was replaced: {status}"
        if not current or current == old:
            return None
        logged = cluster.progress(namespace, pod)
        return str(current) if any(e["event"] in events for e in logged) else None

    def resumed_from_the_store(pod: str) -> None:
        """The pod downloaded a snapshot past step 0 from the store, and its training (if any
        was left) started there."""
        logs = cluster.kubectl("logs", pod, "-n", namespace, "-c", "tensorflow")
        restored = [
            int(m[1])
            for m in re.finditer(rf"Restored {re.escape(url)}/backup .*\(step (\d+)\)", logs)
        ]
        assert restored and restored[0] > 0, logs[-3000:]
        starts = [e for e in cluster.progress(namespace, pod) if e["event"] == "start"]
        assert all(e["initial_step"] > 0 for e in starts), (restored, starts)

    first = wait_until(
        lambda: replaced(worker0, None, "checkpoint"), timeout=JOB_TIMEOUT, what="a checkpoint"
    )
    # worker-0 uploads each checkpoint before it reports it: the snapshot is complete now.
    uploaded = markers()
    assert uploaded and all(k.startswith(f"{job}/backup/") for k in uploaded), uploaded
    before = uid_of(worker1)
    assert cluster.conditions(namespace, job).get("Succeeded") != "True"
    cluster.kubectl("delete", "pod", worker1, "-n", namespace, "--wait=false")

    # All-reduce: the whole group restarts and resumes from the snapshot in the store. Each
    # replica's "start" comes once its snapshot is restored, the moment training goes on.
    second = wait_until(
        lambda: replaced(worker0, first, "start"), timeout=JOB_TIMEOUT, what="the group to restart"
    )
    wait_until(lambda: replaced(worker1, before, "start"), timeout=120, what="worker-1 to start")
    resumed_from_the_store(worker0)
    resumed_from_the_store(worker1)

    # Now a worker dies from inside: SIGKILL, exit 137, retryable under ExitCode. On a loaded
    # machine the job may have saved its last epoch by then: the group then restores that
    # snapshot and only ends, with no "start".
    assert cluster.conditions(namespace, job).get("Succeeded") != "True"
    signal_training_process(cluster, namespace, worker1, "SIGKILL")
    wait_until(
        lambda: replaced(worker0, second, "start", "end"),
        timeout=JOB_TIMEOUT,
        what="a second restart",
    )
    resumed_from_the_store(worker0)

    assert cluster.wait_finished(namespace, job, JOB_TIMEOUT) == "Succeeded"
    status = cluster.get_json("trainjob", job, "-n", namespace)["status"]
    assert status.get("restartCount", 0) >= 2, status
    end = [e for e in cluster.progress(namespace, worker0) if e["event"] == "end"]
    assert end and end[-1]["step"] == 6 * 40, end
    # The model was exported to the store too, and the secret never reached the status.
    assert f"{job}/export.complete" in store.keys(bucket, f"{job}/"), store.keys(bucket)
    assert store.admin.secret_key not in json.dumps(status)


def test_parameter_server_example_succeeds_and_stops_ps_and_workers(
    cluster: Cluster, namespace: str
) -> None:
    job = "mnist-parameter-server"
    cluster.apply(namespace, EXAMPLES / "mnist-parameter-server.yaml")
    assert cluster.wait_finished(namespace, job, JOB_TIMEOUT) == "Succeeded"

    def cleaned_up() -> bool:
        live = [
            p["metadata"]["name"]
            for p in cluster.job_pods(namespace, job)
            if (p.get("status") or {}).get("phase") in ("Pending", "Running")
        ]
        return not live

    wait_until(cleaned_up, timeout=120, what="ps and worker pods to stop")


@pytest.mark.parametrize(
    "name", ["mnist-estimator.yaml", "mnist-dtensor.yaml"], ids=["estimator", "dtensor"]
)
def test_estimator_on_the_legacy_image_and_dtensor_succeed(
    cluster: Cluster, namespace: str, name: str
) -> None:
    manifest = example(name)
    cluster.apply(namespace, EXAMPLES / name)
    assert cluster.wait_finished(namespace, manifest["metadata"]["name"], JOB_TIMEOUT) == (
        "Succeeded"
    )


# A Kubeflow TFJob whose pods run the user's own script: no trainjob runtime, only TF_CONFIG.
OWN_SCRIPT: Final = """
import json, os
import numpy as np
import tensorflow as tf
config = json.loads(os.environ["TF_CONFIG"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.rand(256, 4).astype("float32")
history = model.fit(x, x.sum(axis=1), epochs=2, batch_size=32, verbose=0)
print("own-script", config["task"], "workers", strategy.num_replicas_in_sync, flush=True)
"""


def tfjob_manifest() -> dict[str, Any]:
    template = {
        "spec": {
            # What a TFJob user in a "restricted" namespace already has in the template.
            "securityContext": {"runAsNonRoot": True},
            "containers": [
                {
                    "name": "tensorflow",
                    "image": RUNTIME_IMAGE,
                    "command": ["python", "-c", OWN_SCRIPT],
                    "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                }
            ],
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "own-command"},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 2},
            "tfReplicaSpecs": {
                "Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": template}
            },
        },
    }


def test_converted_tfjob_runs_its_own_command_and_succeeds(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    source = tmp_path / "tfjob.yaml"
    source.write_text(yaml.safe_dump(tfjob_manifest()), encoding="utf-8")
    converted = subprocess.run(
        [sys.executable, "-m", "trainjob", "convert", "-f", str(source)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "runtime:" not in converted, converted
    cluster.apply(namespace, converted)
    assert cluster.wait_finished(namespace, "own-command", JOB_TIMEOUT) == "Succeeded"
    logs = cluster.kubectl("logs", "own-command-worker-0", "-n", namespace, "-c", "tensorflow")
    assert "own-script {'type': 'worker', 'index': 0} workers 2" in logs, logs


SHIPPED_TRAIN = """import os


def main():
    print(f"shipped code ran: {__file__} as {os.environ['HOSTNAME']}", flush=True)
"""


def test_submit_code_runs_a_local_package_on_the_cluster_unchanged(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """`trainjob submit --code ./my_pkg`: the package on this machine is imported by the
    replica on the node, with no image build."""
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SHIPPED_TRAIN)
    template = {
        "spec": {
            "securityContext": {"runAsNonRoot": True},
            "containers": [
                {
                    "name": "tensorflow",
                    "image": RUNTIME_IMAGE,
                    "command": ["python", "-c", "from my_pkg import train; train.main()"],
                }
            ],
        }
    }
    job = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "shipped"},
        "spec": {
            "replicaSpecs": {
                "worker": {"replicas": 1, "restartPolicy": "Never", "template": template}
            }
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    out = cluster.run(
        sys.executable, "-m", "trainjob", "submit", "-f", path, "-n", namespace,
        "--code", package, timeout=120,
    )  # fmt: skip
    assert out == "trainjob.trainjob.dev/shipped created\n", out
    assert cluster.wait_finished(namespace, "shipped", JOB_TIMEOUT) == "Succeeded"
    logs = cluster.kubectl("logs", "shipped-worker-0", "-n", namespace, "-c", "tensorflow")
    assert "shipped code ran: /opt/trainjob/code/my_pkg/train.py as shipped-worker-0" in logs, logs
