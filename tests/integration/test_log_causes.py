"""Issue 32 on a real API server: a replica of one's own command fails while Keras' progress
bar fills the kubelet's 2 KiB termination-message tail; the operator reads the Pod's log through
the API server (GET pods/<name>/log, bounded) and the job's status, its Event, `kubectl
describe` and `trainjob wait` quote the exception, with the fsGroup hint for the volume.

The log is served by a kwok node of this module's own: kwok answers the API server's kubelet
requests with the kubelet's own log reader (tailLines and limitBytes as a real node applies
them) over a log file in the CRI format, here a real tf-keras run's (tests/corpus/logs). The
Pod is bound to that node; its status is played by patching it, as elsewhere in this tier."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client as k8s

from tests.controlplane.cluster import KWOK_CONFIG, ControlPlane, ControlPlaneError
from tests.controlplane.tools import Tools
from tests.integration.operator_harness import (
    TEST_IMAGE,
    Cluster,
    module_cluster,
    module_operator,
    trainjob,
)
from tests.support import kubelet, operator_process, ports, waits
from trainjob import cli

pytestmark = pytest.mark.integration

T = 30.0
PREFIX: Final = "test-logcause"
NODE: Final = "trainjob-logs-node"
KERAS_LOG: Final = Path(__file__).parents[1] / "corpus" / "logs" / "keras-permission-denied.log"
CAUSE: Final = "PermissionDeniedError: /train/checkpoint_temp; Permission denied [Op:SaveV2]"
HINT: Final = "/train is a volume the container's user may not write"


def kwok_config(port: int, logs_file: Path, *, cert: Path, key: Path) -> list[dict[str, Any]]:
    """The session kwok's configuration narrowed to one node (kept Ready, its kubelet port
    this kwok's server) and to deleting Pods; plus every container's log from `logs_file`."""
    documents = list(yaml.safe_load_all(KWOK_CONFIG.read_text()))
    options = dict(documents[0]["options"])
    options.pop("manageNodesWithAnnotationSelector", None)
    options.update(
        manageSingleNode=NODE,
        nodePort=port,
        serverAddress=f"{ports.LOOPBACK}:{port}",
        tlsCertFile=str(cert),
        tlsPrivateKeyFile=str(key),
        # The kubelet's API (containerLogs): off unless asked for when a config file is given.
        enableDebuggingHandlers=True,
    )
    stages = {d["metadata"]["name"]: d for d in documents[1:] if d.get("kind") == "Stage"}
    ready = stages["node-ready"]
    # The API server reaches a node's kubelet at its InternalIP and this port.
    ready["spec"]["next"]["statusTemplate"] += (
        f"daemonEndpoints:\n  kubeletEndpoint:\n    Port: {port}\n"
    )
    logs = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": "every-container"},
        "spec": {"logs": [{"logsFile": str(logs_file)}]},
    }
    return [{**documents[0], "options": options}, ready, stages["pod-delete"], logs]


@pytest.fixture(scope="module")
def logs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The log every container on the node has: the real Keras run's."""
    path = tmp_path_factory.mktemp("kwok-logs") / "container.log"
    path.write_bytes(KERAS_LOG.read_bytes())
    return path


@pytest.fixture(scope="module")
def log_node(control_plane: ControlPlane, logs_file: Path) -> Iterator[str]:
    port = ports.free_port()
    config = logs_file.parent / "kwok.yaml"
    pki = control_plane.pki
    documents = kwok_config(port, logs_file, cert=pki.serving_cert, key=pki.serving_key)
    config.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    kwok = control_plane.spawn(
        "kwok-logs",
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


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    yield from module_operator(kubeconfig, tmp_path_factory, PREFIX, timeout=T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    yield from module_cluster(operator, api_client, namespace, PREFIX)


def keras_job(name: str, node: str) -> dict[str, Any]:
    """Kubeflow's keras-API example's shape: two workers of one's own command (no runtime)
    that checkpoint to a claim mounted at /train; bound to the node that serves logs."""
    body = trainjob(
        name,
        chief=0,
        workers=2,
        template_spec={
            "nodeName": node,
            "volumes": [
                {"name": "training", "persistentVolumeClaim": {"claimName": "strategy-volume"}}
            ],
        },
    )
    for replica in body["spec"]["replicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        container["command"] = ["python", "/app/multi_worker_strategy.py"]
        container["volumeMounts"] = [{"name": "training", "mountPath": "/train"}]
    return body


def fail_with_message(cluster: Cluster, pod: str, message: str) -> None:
    """The kubelet's report of a container that exited 1 with `message` as its termination
    message (FallbackToLogsOnError: the log's tail)."""
    container = kubelet.exited(TEST_IMAGE, 1, kubelet.now())
    container["state"]["terminated"]["message"] = message
    cluster.core.patch_namespaced_pod_status(
        pod, cluster.namespace, kubelet.pod_status("Failed", container)
    )


def test_logcause_a_keras_failure_quotes_the_exception_from_the_log(
    cluster: Cluster,
    control_plane: ControlPlane,
    kubeconfig: Path,
    log_node: str,
    operator: operator_process.Operator,
) -> None:
    ns = cluster.namespace
    cluster.create_job(keras_job("keras", log_node))
    pods = {"keras-worker-0", "keras-worker-1"}
    cluster.run_all("keras", pods)
    pod = cluster.pod("keras-worker-1")
    assert pod is not None and pod.spec is not None
    # Item 1 too: the template's own claim is writable by a non-root user through fsGroup.
    assert pod.spec.security_context is not None
    assert pod.spec.security_context.fs_group == 1000
    assert pod.spec.security_context.fs_group_change_policy == "OnRootMismatch"
    # What the kubelet made of that log: only the progress bar (no exception) in 2 KiB.
    message = kubelet.termination_message_from_log(KERAS_LOG.read_bytes())
    assert "Error" not in message
    fail_with_message(cluster, "keras-worker-1", message)

    failed = cluster.wait_condition("keras", "Failed", timeout=T)
    message = failed["message"]
    print(f"Failed condition: {message}")
    assert f"cause: worker-1: {CAUSE} (hint: {HINT}; set spec.replicaSpecs.worker" in message
    assert "template.spec.securityContext.fsGroup to a group that may write it" in message
    status = (cluster.job("keras") or {})["status"]
    record = status["replicaStatuses"]["worker"]["indexes"][1]
    assert record["message"].startswith(CAUSE)
    events = [e.message or "" for e in cluster.events("keras") if e.type == "Warning"]
    assert any(CAUSE in text for text in events), events
    # As users read it: `kubectl describe`, `trainjob wait`, `trainjob describe`.
    described = control_plane.kubectl("describe", "tj", "keras", "-n", ns).stdout
    assert CAUSE in described
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(
        ["wait", "keras", "-n", ns, "--timeout", "10s", "--kubeconfig", str(kubeconfig)],
        out=out,
        err=err,
    )
    assert code == 1 and CAUSE in out.getvalue(), (out.getvalue(), err.getvalue())
    out = io.StringIO()
    cli.main(["describe", "keras", "-n", ns, "--kubeconfig", str(kubeconfig)], out=out, err=err)
    assert f"cause: worker-1: {CAUSE}" in out.getvalue()
    # One read of the log, however many reconciles the failure took.
    read = f"Read the cause of Pod {ns}/keras-worker-1 from its log"
    assert operator.log.read_text().count(read) == 1
