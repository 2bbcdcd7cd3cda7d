"""A real Kueue controller beside the test control plane (the Kueue tests' queue manager).

The `kueue` binary is built from Kueue's Go module by install.sh (wrapper module
tests/controlplane/kueue), which also copies the module's CRDs and webhook manifests next to
it. Here Kueue runs as a host process against the test API server:

- its CRDs are applied server-side (the Workload CRD is too large for a client-side apply);
- leader election and internal certificate management are off; the webhook server and the
  metrics server use the control plane's serving certificate (its SANs include 127.0.0.1).
  Kueue reads its metrics certificate from a fixed path, /etc/kueue/metrics/certs, whatever
  its configuration says, so that path gets the same pair (root; created if missing);
- the aggregated visibility API server is off (it needs in-cluster paths);
- its webhooks for its own kinds (Workload, ClusterQueue, ResourceFlavor, Cohort, ...) are
  registered by URL on loopback, so the API server checks our operator's Workload writes
  exactly as in a cluster (the Workload validating webhook also covers `workloads/status`);
- Kueue is configured with `integrations.externalFrameworks: ["TrainJob.v1alpha1.trainjob.dev"]`
  and, for MultiKueue, `multiKueue.externalFrameworks` with the same kind.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from tests.controlplane.cluster import Component, ControlPlane, ControlPlaneError
from tests.controlplane.tools import (
    HERE,
    INSTALL_COMMAND,
    ToolsMissingError,
    go_mod_version,
    tools_dir,
)
from tests.support import ports, waits

KUEUE_NAMESPACE: Final = "kueue-system"
EXTERNAL_FRAMEWORK: Final = "TrainJob.v1alpha1.trainjob.dev"
METRICS_CERT_DIR: Final = Path("/etc/kueue/metrics/certs")
KUEUE_GROUP: Final = "kueue.x-k8s.io"


def kueue_version() -> str:
    return go_mod_version(HERE / "kueue" / "go.mod", "sigs.k8s.io/kueue")


def kueue_dir() -> Path:
    """Where install.sh put the binary, the CRDs (crds/) and the webhooks (webhooks.yaml)."""
    return tools_dir() / f"kueue-{kueue_version()}"


def require_kueue() -> Path:
    directory = kueue_dir()
    if not os.access(directory / "kueue", os.X_OK):
        raise ToolsMissingError(
            f"Kueue is missing: {directory / 'kueue'}\nBuild it (with the other test tools, "
            f"cached afterwards) with:\n  {INSTALL_COMMAND}"
        )
    return directory


def configuration(
    *,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    cert_dir: Path,
    pods_ready_timeout: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for a host process."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": ports.LOOPBACK, "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"{ports.LOOPBACK}:{metrics_port}"},
        "health": {"healthProbeBindAddress": f"{ports.LOOPBACK}:{health_port}"},
        "integrations": {
            # No "pod" framework: no cluster-wide Pod webhook on every test's Pods.
            "frameworks": ["batch/job"],
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
        "multiKueue": {"externalFrameworks": [{"name": EXTERNAL_FRAMEWORK}]},
        "waitForPodsReady": {"timeout": pods_ready_timeout},
    }
    if extra:
        config.update(extra)
    return config


def webhook_configurations(
    manifests: Sequence[Mapping[str, Any]],
    url: str,
    ca_bundle: str,
    suffix: str,
    groups: Sequence[str] = (KUEUE_GROUP,),
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, reduced to the webhooks of the API `groups` (Kueue's
    own kinds; kubeflow.org too when its TFJob integration is on) and pointed at `url` (the
    host process) instead of the in-cluster Service."""
    result: list[dict[str, Any]] = []
    for manifest in manifests:
        if not manifest or manifest.get("kind") not in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            continue
        hooks = []
        for hook in manifest.get("webhooks") or []:
            groups_of = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups_of or not groups_of <= set(groups):
                continue
            path = (hook.get("clientConfig") or {}).get("service", {}).get("path", "")
            local = {**hook, "clientConfig": {"url": f"{url}{path}", "caBundle": ca_bundle}}
            local.pop("namespaceSelector", None)
            hooks.append(local)
        name = f"kueue-{suffix}-{manifest['kind'].lower()}"
        result.append({**manifest, "metadata": {"name": name}, "webhooks": hooks})
    return result


@dataclasses.dataclass
class Kueue:
    """A running Kueue controller for `plane`."""

    plane: ControlPlane
    component: Component
    health_port: int

    def stop(self) -> None:
        self.component.stop()
        if self.component in self.plane.components:
            self.plane.components.remove(self.component)

    def log_tail(self, lines: int = 60) -> str:
        return self.component.log_tail(lines)


def _metrics_certs(serving_cert: Path, serving_key: Path) -> None:
    """Kueue reads its metrics certificate from /etc/kueue/metrics/certs (hard-coded when
    internal certificate management is off) and exits without it."""
    if (METRICS_CERT_DIR / "tls.crt").exists() and (METRICS_CERT_DIR / "tls.key").exists():
        return
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(serving_cert, METRICS_CERT_DIR / "tls.crt")
        shutil.copyfile(serving_key, METRICS_CERT_DIR / "tls.key")
    except OSError as exc:
        raise ControlPlaneError(
            f"Kueue needs a certificate in {METRICS_CERT_DIR} (a path it hard-codes): {exc}; "
            "run the Kueue tests as root once, or create tls.crt and tls.key there"
        ) from exc


def start_kueue(
    plane: ControlPlane,
    *,
    pods_ready_timeout: str = "5m",
    extra_config: Mapping[str, Any] | None = None,
    name: str = "kueue",
    webhook_groups: Sequence[str] = (KUEUE_GROUP,),
) -> Kueue:
    """Apply Kueue's CRDs, start Kueue against `plane` and register its webhooks; returns
    once it reports ready and its webhooks answer."""
    directory = require_kueue()
    plane.apply_crds(sorted((directory / "crds").glob("*.yaml")))
    plane.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
    pki = plane.pki
    cert_dir = plane.root / f"{name}-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki.serving_cert, cert_dir / "tls.crt")
    shutil.copyfile(pki.serving_key, cert_dir / "tls.key")
    _metrics_certs(pki.serving_cert, pki.serving_key)
    webhook_port, health_port, metrics_port = (
        ports.free_port(),
        ports.free_port(),
        ports.free_port(),
    )
    config_file = plane.root / f"{name}-config.yaml"
    config_file.write_text(
        yaml.safe_dump(
            configuration(
                webhook_port=webhook_port,
                health_port=health_port,
                metrics_port=metrics_port,
                cert_dir=cert_dir,
                pods_ready_timeout=pods_ready_timeout,
                extra=extra_config,
            )
        ),
        encoding="utf-8",
    )
    component = plane.spawn(
        name,
        [
            directory / "kueue",
            f"--config={config_file}",
            f"--kubeconfig={plane.kubeconfig}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ],
    )
    plane.wait_healthy(
        component, lambda: waits.http_ok(f"http://{ports.LOOPBACK}:{health_port}/readyz")
    )
    manifests = list(yaml.safe_load_all((directory / "webhooks.yaml").read_text()))
    ca_bundle = base64.b64encode(pki.ca_cert.read_bytes()).decode("ascii")
    configs = webhook_configurations(
        manifests, f"https://{ports.LOOPBACK}:{webhook_port}", ca_bundle, name, webhook_groups
    )
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(configs))
    return Kueue(plane=plane, component=component, health_port=health_port)
