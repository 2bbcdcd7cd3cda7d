"""A real gang scheduler beside the test control plane: scheduler-plugins' Coscheduling.

install.sh builds the `scheduler` (a kube-scheduler with the scheduler-plugins, Coscheduling
among them) and the `controller` (which writes PodGroup status) from the scheduler-plugins Go
module (wrapper module tests/controlplane/scheduler-plugins, the test bed's Kubernetes
packages), and copies the module's PodGroup and ElasticQuota CRDs next to them. Here they run
as host processes against the test API server, as a *second* scheduler beside the plane's
kube-scheduler: Pods with `schedulerName: scheduler-plugins-scheduler` (the name of its Helm
chart) are its, every other Pod stays the default scheduler's. Leader election is off (with it
on it would take the default scheduler's lease).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Final

import yaml

from tests.controlplane.cluster import Component, ControlPlane
from tests.controlplane.tools import (
    HERE,
    INSTALL_COMMAND,
    ToolsMissingError,
    go_mod_version,
    tools_dir,
)
from tests.support import ports

SCHEDULER_NAME: Final = "scheduler-plugins-scheduler"
PODGROUP_GROUP: Final = "scheduling.x-k8s.io"
PODGROUP_VERSION: Final = "v1alpha1"
# How long a gang's first placed Pods wait at Permit for their siblings (the plugin's default
# is 60 s; a PodGroup's scheduleTimeoutSeconds overrides it).
PERMIT_WAITING_SECONDS: Final = 10


def plugins_version() -> str:
    return go_mod_version(HERE / "scheduler-plugins" / "go.mod", "sigs.k8s.io/scheduler-plugins")


def plugins_dir() -> Path:
    """Where install.sh put `scheduler`, `controller` and the CRDs (crds/)."""
    return tools_dir() / f"scheduler-plugins-{plugins_version()}"


def require_plugins() -> Path:
    directory = plugins_dir()
    for binary in ("scheduler", "controller"):
        if not os.access(directory / binary, os.X_OK):
            raise ToolsMissingError(
                f"scheduler-plugins is missing: {directory / binary}\nBuild it (with the other "
                f"test tools, cached afterwards) with:\n  {INSTALL_COMMAND}"
            )
    return directory


def crd_files() -> list[Path]:
    return sorted((require_plugins() / "crds").glob("*.yaml"))


def scheduler_configuration(
    kubeconfig: Path,
    *,
    permit_waiting_seconds: int = PERMIT_WAITING_SECONDS,
    backoff_seconds: int = 0,
    scheduler_name: str = SCHEDULER_NAME,
) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of a second scheduler whose one profile gangs Pods."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "profiles": [
            {
                "schedulerName": scheduler_name,
                "plugins": {
                    # Coscheduling replaces the queue sort: a gang's Pods are popped together.
                    "multiPoint": {
                        "enabled": [{"name": "Coscheduling"}],
                        "disabled": [{"name": "PrioritySort"}],
                    }
                },
                "pluginConfig": [
                    {
                        "name": "Coscheduling",
                        "args": {
                            "permitWaitingTimeSeconds": permit_waiting_seconds,
                            "podGroupBackoffSeconds": backoff_seconds,
                        },
                    }
                ],
            }
        ],
    }


@dataclasses.dataclass
class GangScheduler:
    """scheduler-plugins' scheduler and PodGroup controller running for `plane`."""

    plane: ControlPlane
    scheduler: Component
    controller: Component
    name: str = SCHEDULER_NAME

    def stop(self) -> None:
        for component in (self.scheduler, self.controller):
            component.stop()
            if component in self.plane.components:
                self.plane.components.remove(component)

    def log_tail(self, lines: int = 60) -> str:
        return self.scheduler.log_tail(lines)


def start_gang_scheduler(
    plane: ControlPlane,
    *,
    permit_waiting_seconds: int = PERMIT_WAITING_SECONDS,
    backoff_seconds: int = 0,
    name: str = "scheduler-plugins",
) -> GangScheduler:
    """Apply the PodGroup/ElasticQuota CRDs and start the scheduler and the PodGroup
    controller against `plane`; returns once the scheduler answers /healthz."""
    directory = require_plugins()
    plane.apply_crds(crd_files())
    config_file = plane.root / f"{name}-config.yaml"
    config_file.write_text(
        yaml.safe_dump(
            scheduler_configuration(
                plane.kubeconfig,
                permit_waiting_seconds=permit_waiting_seconds,
                backoff_seconds=backoff_seconds,
            )
        ),
        encoding="utf-8",
    )
    port = ports.free_port()
    scheduler = plane.spawn(
        f"{name}-scheduler",
        [
            directory / "scheduler",
            f"--config={config_file}",
            f"--authentication-kubeconfig={plane.kubeconfig}",
            f"--authorization-kubeconfig={plane.kubeconfig}",
            f"--bind-address={ports.LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={plane.root / (name + '-certs')}",
            "--v=2",
        ],
    )
    plane.wait_healthy(
        scheduler,
        lambda: plane.https_ok(f"https://{ports.LOOPBACK}:{port}/healthz", verify_ca=False),
    )
    controller = plane.spawn(
        f"{name}-controller",
        [
            directory / "controller",
            f"--kubeconfig={plane.kubeconfig}",
            "--metricsAddr=0",
            "--probeAddr=0",
        ],
    )
    return GangScheduler(plane=plane, scheduler=scheduler, controller=controller)
