"""Kubeflow's training-operator v1 beside the test control plane (the TFJob reference).

`bash bench/kubeflow/install.sh` builds `training-operator` from its Go module (the version
bench/kubeflow/go.mod requires) and copies the module's TFJob CRD next to it. Here it runs as a
host process against the test API server, serving TFJobs only (`--enable-scheme=tfjob`):

- leader election is off (its default), the metrics server is off, the health probe and the
  webhook server listen on free loopback ports;
- its certificate rotator (pkg/cert) insists on a Secret to fill, in the namespace
  MY_POD_NAMESPACE names, and on finding the certificate files in a hard-coded directory,
  /tmp/k8s-webhook-server/serving-certs, where its Deployment mounts that Secret: the test
  plays the kubelet and writes the files once the Secret is filled (files left there by an
  earlier run, or by bench/operator_bench.py's training-operator, are overwritten, never
  removed: no webhook is registered, so whose certificate it is does not matter);
- its validating webhook is NOT registered with the API server: the TFJobs the tests create
  are valid, and the operator compared with it runs without one too.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Final

from tests.controlplane.cluster import Component, ControlPlane, ControlPlaneError
from tests.controlplane.tools import REPO_ROOT, ToolsMissingError, go_mod_version, tools_dir
from tests.support import ports, waits

MODULE: Final = "github.com/kubeflow/training-operator"
INSTALL_COMMAND: Final = "bash bench/kubeflow/install.sh"
SYSTEM_NAMESPACE: Final = "training-operator-system"
WEBHOOK_SECRET: Final = "training-operator-webhook-cert"
# Hard-coded in training-operator's pkg/cert (certDir).
CERT_DIR: Final = Path("/tmp/k8s-webhook-server/serving-certs")


def version() -> str:
    return go_mod_version(REPO_ROOT / "bench" / "kubeflow" / "go.mod", MODULE)


def directory() -> Path:
    """Where install.sh caches the binary and the TFJob CRD."""
    return tools_dir() / f"training-operator-{version()}"


def tfjob_crd() -> Path:
    """The TFJob CRD of that training-operator version (kubeflow.org_tfjobs.yaml)."""
    crd = directory() / "kubeflow.org_tfjobs.yaml"
    if not crd.is_file():
        raise ToolsMissingError(f"{crd} is missing: build it once with\n  {INSTALL_COMMAND}")
    return crd


def binary() -> Path:
    path = directory() / "training-operator"
    if not os.access(path, os.X_OK):
        raise ToolsMissingError(f"{path} is missing: build it once with\n  {INSTALL_COMMAND}")
    return path


def mount_webhook_certs(plane: ControlPlane, namespace: str = SYSTEM_NAMESPACE) -> bool:
    """Play the kubelet for training-operator's webhook Secret in `namespace` (its
    MY_POD_NAMESPACE): write the rotator's certificate where training-operator reads it;
    False until the rotator has filled the Secret."""
    out = plane.kubectl(
        "get", "secret", WEBHOOK_SECRET, "-n", namespace, "-o", "json", check=False
    ).stdout
    data = (json.loads(out).get("data") or {}) if out.strip() else {}
    files = ("tls.crt", "tls.key", "ca.crt")
    if not all(data.get(name) for name in files):
        return False
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name in files:
        target = CERT_DIR / name
        target.write_bytes(base64.b64decode(data[name]))
        target.chmod(0o600)
    return True


def start_training_operator(
    plane: ControlPlane, *args: str, name: str = "training-operator", timeout: float = 120.0
) -> Component:
    """Apply the TFJob CRD and start training-operator (TFJobs only, every namespace) against
    `plane`; returns once it reports ready (certificates in place, controllers set up). The
    caller stops it (`stop()`), before starting another."""
    executable = binary()
    plane.apply_crds([tfjob_crd()])
    plane.kubectl("create", "namespace", SYSTEM_NAMESPACE, check=False)
    plane.wait_service_account(SYSTEM_NAMESPACE)
    # A fresh Secret each start: the rotator fills it with a CA and a serving certificate.
    plane.kubectl("delete", "secret", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE, check=False)
    plane.kubectl("create", "secret", "generic", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE)
    probe = ports.free_port()
    component = plane.spawn(
        name,
        [
            "env",
            f"MY_POD_NAMESPACE={SYSTEM_NAMESPACE}",
            executable,
            f"--kubeconfig={plane.kubeconfig}",
            "--enable-scheme=tfjob",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address={ports.LOOPBACK}:{probe}",
            f"--webhook-server-port={ports.free_port()}",
            *args,
        ],
        stopped_with_plane=False,
    )
    mounted: list[bool] = []

    def ready() -> bool:
        if not mounted:
            mounted.extend([True] if mount_webhook_certs(plane) else [])
            return False
        return waits.http_ok(f"http://{ports.LOOPBACK}:{probe}/readyz")

    try:
        plane.wait_healthy(component, ready, what=f"{name} to become ready", timeout=timeout)
    except ControlPlaneError:
        component.stop()
        raise
    return component
