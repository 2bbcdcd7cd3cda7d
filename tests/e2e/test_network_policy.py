"""The cluster enforces NetworkPolicy: the premise of the operator's per-job policies.

The test bed's CNIs (the node's bridge, kind's ptp) enforce nothing on their own; kube-network-
policies does (tests/controlplane/node.py, kind.py; kindnetd on a stock kind). Plain Pods, no
operator: a server, and clients that try to reach it before and after a policy that admits only
pods with a label. Without the label a connection times out within seconds (the first packet is
dropped, no reset), with it the server answers, a pod of another namespace that copies the
label is refused too (a bare podSelector means this namespace), and kubelet's probes of the
selected server keep passing (node traffic stays allowed). Deleting the policy opens the port
again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import Cluster, create_namespace, wait_until
from tests.e2e.conftest import IMAGE_TAG

pytestmark = pytest.mark.e2e

IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}"
PORT: Final = 8080
ALLOWED_LABEL: Final = ("netpol-e2e/access", "server")
CONNECT_TIMEOUT: Final = 3.0

# An HTTP server that logs each request's path, source address and user agent: kubelet's
# probes show up as "/probe <node address> kube-probe/...".
SERVER: Final = f"""
import http.server
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from the server")
        print(self.path, self.client_address[0], self.headers.get("User-Agent"), flush=True)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", {PORT}), Handler).serve_forever()
"""

# One connection attempt from inside a client pod: "open <status line> <seconds>" or
# "closed <error> <seconds>".
CONNECT: Final = f"""
import socket, sys, time
start = time.monotonic()
try:
    with socket.create_connection((sys.argv[1], {PORT}), timeout={CONNECT_TIMEOUT}) as sock:
        sock.sendall(b"GET /client HTTP/1.0\\r\\n\\r\\n")
        reply = sock.recv(200).split(b"\\r\\n")[0].decode()
    print("open", reply.replace(" ", "_"), f"{{time.monotonic() - start:.2f}}")
except OSError as exc:
    print("closed", type(exc).__name__, f"{{time.monotonic() - start:.2f}}")
"""

IDLE: Final = "import signal; signal.pause()"


def pod_manifest(
    name: str, script: str, labels: dict[str, str], probe: bool = False
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "command": ["python", "-c", script],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if probe:
        check = {"httpGet": {"path": "/probe", "port": PORT}, "periodSeconds": 1}
        container["ports"] = [{"containerPort": PORT}]
        container["readinessProbe"] = {**check, "failureThreshold": 1}
        container["livenessProbe"] = {**check, "failureThreshold": 3}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
        },
    }


def run_pods(cluster: Cluster, namespace: str, *pods: dict[str, Any]) -> dict[str, str]:
    """Create the pods and wait until each is Ready; returns name -> pod IP."""
    for pod in pods:
        cluster.apply(namespace, json.dumps(pod))

    ips: dict[str, str] = {}
    for pod in pods:
        name = pod["metadata"]["name"]

        def ready_ip(name: str = name) -> str | None:
            status = pod_status(cluster, namespace, name)
            return status.get("podIP") if is_ready(status) else None

        ips[name] = wait_until(ready_ip, timeout=180, what=f"pod {namespace}/{name} to be Ready")
    return ips


def pod_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = cluster.get_json("pod", name, "-n", namespace).get("status")
    return status if isinstance(status, dict) else {}


def is_ready(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def connect(cluster: Cluster, namespace: str, client: str, address: str) -> tuple[bool, str]:
    """Whether ``client`` could talk to the server at ``address``, and what it printed."""
    out = cluster.kubectl(
        "exec", "-n", namespace, client, "--", "python", "-c", CONNECT, address
    ).strip()
    print(f"{namespace}/{client} -> {address}:{PORT}: {out}")
    return out.startswith("open HTTP/1.0_200"), out


def probes_seen(cluster: Cluster, namespace: str, server: str) -> int:
    log = cluster.kubectl("logs", "-n", namespace, server)
    return sum(
        1 for line in log.splitlines() if line.startswith("/probe ") and "kube-probe/" in line
    )


@pytest.fixture
def namespaces(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """The server's namespace and another one (both "restricted"), deleted after."""
    names = (f"netpol-{uuid.uuid4().hex[:6]}", f"netpol-other-{uuid.uuid4().hex[:6]}")
    for name in names:
        create_namespace(cluster, name)
    try:
        yield names
    finally:
        for name in names:
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_network_policy_admits_only_labelled_pods_and_kubelet_probes(
    cluster: Cluster, namespaces: tuple[str, str]
) -> None:
    namespace, other = namespaces
    key, value = ALLOWED_LABEL
    ips = run_pods(
        cluster,
        namespace,
        pod_manifest("server", SERVER, {"app": "netpol-server"}, probe=True),
        pod_manifest("client-denied", IDLE, {"app": "client"}),
        pod_manifest("client-allowed", IDLE, {"app": "client", key: value}),
    )
    run_pods(cluster, other, pod_manifest("client-other-ns", IDLE, {key: value}))
    server = ips["server"]
    clients = [
        (namespace, "client-denied"),
        (namespace, "client-allowed"),
        (other, "client-other-ns"),
    ]

    # The control: before any policy every client gets in, so a refusal below is the policy's.
    for ns, client in clients:
        opened, out = connect(cluster, ns, client, server)
        assert opened, f"{ns}/{client} could not reach the server without a policy: {out}"

    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "server-ingress"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "netpol-server"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {key: value}}}],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }
    cluster.apply(namespace, json.dumps(policy))

    # The controller judges by its informers' view: the first refusal shows the policy arrived.
    def refused() -> str | None:
        opened, out = connect(cluster, namespace, "client-denied", server)
        return None if opened else out

    denied = wait_until(refused, timeout=60, what="the unlabelled client to be refused")
    assert denied.startswith("closed TimeoutError"), denied
    assert float(denied.split()[-1]) < CONNECT_TIMEOUT + 2, denied

    opened, out = connect(cluster, namespace, "client-allowed", server)
    assert opened, f"the labelled client was refused: {out}"
    opened, out = connect(cluster, other, "client-other-ns", server)
    assert not opened and out.startswith("closed TimeoutError"), (
        f"a pod of another namespace with the label got in: {out}"
    )

    # kubelet (root on the node) keeps probing the selected server: new probe requests reach
    # it while the policy is in force, and it stays Ready without a restart.
    before = probes_seen(cluster, namespace, "server")
    wait_until(
        lambda: probes_seen(cluster, namespace, "server") >= before + 3,
        timeout=30,
        what="kubelet's probes to reach the selected server",
    )
    status = pod_status(cluster, namespace, "server")
    assert is_ready(status), status
    assert status["containerStatuses"][0]["restartCount"] == 0, status
    print(f"kubelet probes answered under the policy: {probes_seen(cluster, namespace, 'server')}")

    # Without the policy the port is open again.
    cluster.kubectl("delete", "networkpolicy", "server-ingress", "-n", namespace)
    wait_until(
        lambda: connect(cluster, namespace, "client-denied", server)[0],
        timeout=60,
        what="the unlabelled client to get in once the policy is deleted",
    )
