"""A job's TensorFlow port, attacked as TensorFlow's security policy says it can be: while a
2-worker job trains, a Pod opens a TensorFlow session to `grpc://<job>-worker-0...:2222`
and runs a graph on `/job:worker/task:0` that reads a file inside the worker.

- With isolation opted out (spec.networkIsolation: None), the control: a Pod of another
  namespace reads the worker's /etc/hostname through the worker's own TensorFlow server.
- With isolation (the default: the job's NetworkPolicy, enforced by
  kube-network-policies), a Pod of another namespace and a Pod of another job in the same
  namespace cannot even connect (a 5 s TCP connect times out), and the job, whose replicas
  talk to each other through the same port, trains to success.

Both jobs train side by side and the three attacks run at once: each attack is a Pod that
waits on the network, and one after another they made this the e2e tier's slowest test
(163 s in CI).
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
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
        # The control opted out (no policy for it); the other isolated (the default).
        cluster.apply(namespace, json.dumps(training_job("open-door", "None", epochs=30)))
        # 12 epochs: the attacks end within about 5 of them (all three at once), and the
        # job must still train then and succeed after.
        cluster.apply(namespace, json.dumps(training_job("closed-door", None, epochs=12)))
        wait_training(cluster, namespace, "open-door")
        wait_training(cluster, namespace, "closed-door")
        policies = cluster.kubectl("get", "networkpolicy", "-n", namespace, "-o", "name")
        assert policies.split() == ["networkpolicy.networking.k8s.io/closed-door"], policies
        # The control: a Pod of another namespace runs code in the open job's worker 0.
        # Isolated: the same attack from another namespace, and from a Pod of another job in
        # the job's own namespace, cannot connect (a timeout: the packets are dropped, where
        # a port nobody listens on would refuse at once); the job trains on.
        closed = f"closed-door-worker-0.{namespace}.svc"
        neighbour = {"trainjob.dev/job-name": "another-job"}
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            opened = pool.submit(
                attack, cluster, outside, "thief", f"open-door-worker-0.{namespace}.svc"
            )
            from_outside = pool.submit(attack, cluster, outside, "thief-2", closed)
            next_door = pool.submit(
                attack, cluster, namespace, "thief-next-door", closed, neighbour
            )
            phase, log = opened.result()
            assert phase == "Succeeded" and "STOLE open-door-worker-0" in log, log
            phase, log = from_outside.result()
            assert phase == "Failed" and "CONNECT-FAILED TimeoutError" in log, log
            phase, log = next_door.result()
            assert phase == "Failed" and "CONNECT-FAILED TimeoutError" in log, log
        assert cluster.conditions(namespace, "closed-door").get("Succeeded") != "True", (
            "the job ended before the attacks: they proved nothing"
        )
        cluster.kubectl("delete", "trainjob", "open-door", "-n", namespace, "--wait=false")
        assert cluster.wait_finished(namespace, "closed-door", JOB_TIMEOUT) == "Succeeded"
    finally:
        cluster.kubectl("delete", "namespace", outside, "--wait=false", check=False)
