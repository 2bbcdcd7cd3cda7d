"""`trainjob logs JOB -f` and `TrainJobClient.logs(follow=True)` on a real running Pod's log,
served through the real API server by a kwok node of this module's own (kwok answers the API
server's kubelet requests with the kubelet's own log reader, which follows a CRI log file as
the kubelet does: test_log_causes.py). Lines written to the container's log while the command
follows appear as they are written, also after the container was quiet for longer than the
request timeout; Ctrl-C ends the command with 130 and no traceback.

Found broken with kubernetes 37: every stream's thread died on the client's argument check
(`_request_timeout=(30.0, None)`), nothing was streamed. A restart of the container is not
played here (kwok serves one log file for every container run): tests/e2e/test_cli.py follows
one across a real restart."""

from __future__ import annotations

import datetime
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane, ControlPlaneError
from tests.controlplane.tools import REPO_ROOT, Tools
from tests.integration.operator_harness import TEST_IMAGE, Cluster, trainjob
from tests.integration.test_log_causes import NODE, kwok_config
from tests.support import kubelet, ports, waits

pytestmark = pytest.mark.integration

T: Final = 30.0
REQUEST_TIMEOUT: Final = 2  # seconds: the container is quiet for longer than this
JOB: Final = "follow"
POD: Final = "follow-worker-0"


def cri_line(text: str) -> bytes:
    """One full line of a container's log as containerd writes it (the kubelet reads it)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} stdout F {text}\n".encode()


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kwok-follow") / "container.log"
    path.write_bytes(cri_line("started"))
    return path


@pytest.fixture(scope="module")
def log_node(control_plane: ControlPlane, log_file: Path) -> Iterator[str]:
    """A node whose kubelet (kwok) serves `log_file` as every container's log."""
    port = ports.free_port()
    config = log_file.parent / "kwok.yaml"
    pki = control_plane.pki
    documents = kwok_config(port, log_file, cert=pki.serving_cert, key=pki.serving_key)
    config.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    kwok = control_plane.spawn(
        "kwok-follow",
        [
            Tools.locate().require().kwok,
            f"--kubeconfig={control_plane.kubeconfig}",
            f"--config={config}",
            "--v=WARN",
        ],
        stopped_with_plane=False,
    )
    try:
        try:
            control_plane.wait_healthy(
                kwok, lambda: waits.http_ok(f"http://{ports.LOOPBACK}:{port}/healthz")
            )
        except ControlPlaneError as exc:
            pytest.fail(f"kwok (logs) did not start: {exc}", pytrace=False)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        }
        control_plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(node))
        control_plane.kubectl(
            "wait", "--for=condition=Ready", f"--timeout={int(T)}s", f"node/{NODE}", timeout=T + 10
        )
        yield NODE
    finally:
        control_plane.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
        kwok.stop()


@pytest.fixture
def running_pod(api_client: k8s.ApiClient, namespace: str, log_node: str) -> Iterator[Cluster]:
    """The TrainJob (no operator: nothing else touches it) and its worker's Pod, bound to the
    log node and running there, as its kubelet would report it."""
    cluster = Cluster(api_client, namespace)
    cluster.create_job(trainjob(JOB, chief=0, workers=1))
    labels = {
        "trainjob.dev/job-name": JOB,
        "trainjob.dev/replica-type": "worker",
        "trainjob.dev/replica-index": "0",
    }
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "labels": labels},
        "spec": {
            "nodeName": log_node,
            "containers": [{"name": "tensorflow", "image": TEST_IMAGE}],
        },
    }
    cluster.core.create_namespaced_pod(namespace, pod)
    status = kubelet.pod_status(
        "Running", kubelet.running(TEST_IMAGE, kubelet.now()), startTime=kubelet.now()
    )
    cluster.core.patch_namespaced_pod_status(POD, namespace, status)
    yield cluster


def _write(log_file: Path, *texts: str) -> None:
    with log_file.open("ab") as handle:
        for text in texts:
            handle.write(cri_line(text))


def _read_until(process: subprocess.Popen[bytes], text: str) -> str:
    """What the process printed until `text`, within T seconds."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + T
    seen = b""
    while text.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{text!r} not printed within {T}s: {seen.decode()}"
        chunk = os.read(fd, 65536)
        assert chunk, f"it ended before printing {text!r}: {seen.decode()}"
        seen += chunk
    return seen.decode()


def test_logs_follow_streams_a_running_pods_lines_until_ctrl_c(
    running_pod: Cluster, kubeconfig: Path, log_file: Path
) -> None:
    ns = running_pod.namespace
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    process = subprocess.Popen(
        [sys.executable, "-m", "trainjob", "logs", JOB, "-f", "-n", ns,
         "--request-timeout", f"{REQUEST_TIMEOUT}s"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        printed = _read_until(process, "started")
        # Quiet for longer than the request timeout: following goes on.
        threading.Timer(REQUEST_TIMEOUT + 1, _write, (log_file, "epoch 1", "epoch 2")).start()
        printed += _read_until(process, "epoch 2")
        assert "worker-0 | started" in printed and "worker-0 | epoch 1" in printed, printed
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=T)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, (out, err)
    assert b"Traceback" not in err and b"ValidationError" not in err, err.decode()


def test_the_python_client_follows_a_running_pods_log(
    running_pod: Cluster, kubeconfig: Path, log_file: Path
) -> None:
    from trainjob.client import TrainJobClient

    got: list[str] = []
    with TrainJobClient(
        running_pod.namespace, kubeconfig=str(kubeconfig), request_timeout=REQUEST_TIMEOUT
    ) as client:
        lines = client.logs(JOB, follow=True, tail=1)

        def read_two() -> None:
            for line in lines:
                got.append(line)
                if len(got) == 2:
                    return

        reader = threading.Thread(target=read_two, daemon=True)
        reader.start()
        waits.wait_until(lambda: got, timeout=T, what="the last line written before following")
        threading.Timer(REQUEST_TIMEOUT + 1, _write, (log_file, "loss 0.25")).start()
        reader.join(T)
        assert not reader.is_alive(), got
    assert got[1] == "worker-0 | loss 0.25", got
