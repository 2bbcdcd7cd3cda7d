"""The test control plane itself: versions, authentication/authorization, controllers, and a
stop() that leaves no process behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.controlplane.cluster import ControlPlane
from tests.support import waits

pytestmark = pytest.mark.integration


def test_server_reports_the_pinned_version(control_plane: ControlPlane) -> None:
    versions = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    pinned = control_plane.tools.kubernetes_version
    assert versions["serverVersion"]["gitVersion"] == pinned
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["minor"] == pinned.split(".")[1]


def test_env_runs_the_built_kubectl_against_the_control_plane(
    control_plane: ControlPlane, kubeconfig: Path
) -> None:
    # control_plane.env(): KUBECONFIG set, the built kubectl first on PATH.
    env = control_plane.env()
    assert env["KUBECONFIG"] == str(kubeconfig)
    result = subprocess.run(
        ["kubectl", "get", "--raw", "/readyz"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_rbac_denies_a_service_account_without_bindings(
    control_plane: ControlPlane, namespace: str
) -> None:
    sa_config = control_plane.service_account_kubeconfig(namespace, "default")
    as_sa = (f"--kubeconfig={sa_config}",)  # the last --kubeconfig flag wins
    denied = control_plane.kubectl("get", "pods", *as_sa, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    assert f"system:serviceaccount:{namespace}:default" in denied.stderr
    # Granting a Role makes the same token work: the authorizer is RBAC, not deny-all.
    control_plane.kubectl(
        "create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", namespace
    )
    control_plane.kubectl(
        "create", "rolebinding", "pod-reader", "--role=pod-reader",
        f"--serviceaccount={namespace}:default", "-n", namespace,
    )  # fmt: skip
    waits.wait_until(
        lambda: control_plane.kubectl("get", "pods", *as_sa, check=False).returncode == 0,
        timeout=30,
        what="the RoleBinding to take effect",
    )


def test_namespace_controller_finalizes_deleted_namespaces(control_plane: ControlPlane) -> None:
    control_plane.kubectl("create", "namespace", "doomed-ns")
    control_plane.kubectl("create", "configmap", "x", "-n", "doomed-ns")
    control_plane.kubectl("delete", "namespace", "doomed-ns", "--timeout=60s")
    gone = control_plane.kubectl("get", "namespace", "doomed-ns", check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr


def test_helm_is_installed(control_plane: ControlPlane) -> None:
    out = subprocess.run(
        [str(control_plane.tools.helm), "version", "--short"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.startswith(control_plane.tools.helm_version)


def test_stop_leaves_no_process_behind(control_plane: ControlPlane) -> None:
    second = ControlPlane(tools=control_plane.tools)
    second.start()
    try:
        pids = [c.process.pid for c in second.components]
        assert len(pids) == 4  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler
        assert second.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        workdir = second.root
    finally:
        second.stop()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} survived stop()"
    assert not workdir.exists()
    # The session's own control plane is untouched.
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
