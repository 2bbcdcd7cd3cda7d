"""The Helm chart installed into the real test control plane, and the operator run under the
chart's own RBAC: authenticated as the chart's ServiceAccount with a bound token from the
TokenRequest API, so every call it makes is authorized by the chart's (Cluster)Role only.

There is no kubelet here, so the chart's Deployment runs with replicaCount=0 (the API server
still admits and stores every object of the chart) and the operator runs as a local
subprocess with the Deployment's own arguments.
"""

from __future__ import annotations

import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import INSTALL_COMMAND, REPO_ROOT
from tests.integration.operator_harness import Cluster, meta, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

CHART: Final = REPO_ROOT / "helm" / "trainjob-operator"
T: Final = 30.0
# The harness sets these itself (free local ports). Progress reports need the chart's Secret
# mounted by a kubelet (there is none here); tests/integration/test_progress.py covers them.
# The chart's --leader-elect flags stay: the operator elects itself on the chart's Lease Role.
HARNESS_FLAGS: Final = ("--metrics-port=", "--liveness=", "--progress-")
PERMISSION_ERRORS: Final = ("forbidden", "not enough permissions", "unauthorized")

Obj = dict[str, Any]


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    service_account: str
    operator_args: tuple[str, ...]
    notes: str


def _helm(control_plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    helm = control_plane.tools.helm
    if not helm.exists():
        pytest.fail(f"helm is missing ({helm}): run {INSTALL_COMMAND}", pytrace=False)
    result = subprocess.run(
        [str(helm), f"--kubeconfig={control_plane.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


def _deployment(manifests: str) -> Obj:
    docs: list[Obj] = [d for d in yaml.safe_load_all(manifests) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment


def _operator_args(deployment: Obj) -> tuple[str, ...]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return tuple(a for a in args if not a.startswith(HARNESS_FLAGS))


def _install(control_plane: ControlPlane, *values: str) -> Release:
    suffix = uuid.uuid4().hex[:6]
    name = f"tj-{suffix}"
    namespace = f"trainjob-system-{suffix}"
    result = _helm(
        control_plane,
        "install",
        name,
        str(CHART),
        f"--namespace={namespace}",
        "--create-namespace",
        "--set=replicaCount=0",
        *values,
    )
    manifest = _helm(control_plane, "get", "manifest", name, f"--namespace={namespace}").stdout
    deployment = _deployment(manifest)
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    control_plane.wait_service_account(namespace, service_account)
    return Release(name, namespace, service_account, _operator_args(deployment), result.stdout)


def _uninstall(control_plane: ControlPlane, release: Release) -> None:
    _helm(control_plane, "uninstall", release.name, f"--namespace={release.namespace}")
    control_plane.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def _start_as_service_account(
    control_plane: ControlPlane,
    namespace: str,
    service_account: str,
    args: tuple[str, ...],
    workdir: Path,
) -> operator_process.Operator:
    kubeconfig = control_plane.service_account_kubeconfig(
        namespace, service_account, path=workdir / "kubeconfig", duration="1h"
    )
    return (
        operator_process.Operator(kubeconfig, workdir / "operator.log", *args)
        .start()
        .wait_serving(T)
    )


def _permission_errors(operator: operator_process.Operator) -> list[str]:
    text = operator.log.read_text(encoding="utf-8", errors="replace")
    return [
        line
        for line in text.splitlines()
        if any(word in line.lower() for word in PERMISSION_ERRORS)
        # A namespace of an earlier test being deleted refuses new objects with a 403; it
        # says nothing about our RBAC.
        and "because it is being terminated" not in line
    ]


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane) -> Iterator[Release]:
    """The chart with its default values (cluster-wide), installed by helm."""
    installed = _install(control_plane)
    try:
        yield installed
    finally:
        _uninstall(control_plane, installed)


@pytest.fixture
def operator(
    control_plane: ControlPlane, release: Release, tmp_path: Path
) -> Iterator[operator_process.Operator]:
    """The cluster-wide operator, for one test only: it would serve every later test's jobs."""
    op = _start_as_service_account(
        control_plane, release.namespace, release.service_account, release.operator_args, tmp_path
    )
    try:
        yield op
    finally:
        op.stop()
        print(f"operator log: {op.log}\n{op.log_tail(30)}")


# -- the install -----------------------------------------------------------------------------


def test_helm_install_creates_the_chart_objects(
    control_plane: ControlPlane, release: Release, api_client: k8s.ApiClient
) -> None:
    assert "get tj -w" in release.notes, release.notes  # never a bare `trainjobs`: see below
    assert "get trainjobs" not in release.notes, release.notes
    assert "kubectl" in release.notes and "apply -f" in release.notes
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    role = rbac.read_cluster_role(f"{release.name}-trainjob-operator")
    assert (meta(role).labels or {})["app.kubernetes.io/instance"] == release.name
    binding = rbac.read_cluster_role_binding(f"{release.name}-trainjob-operator")
    (subject,) = binding.subjects or []
    assert (subject.kind, subject.name, subject.namespace) == (
        "ServiceAccount",
        release.service_account,
        release.namespace,
    )
    apps = k8s.AppsV1Api(api_client)
    deployment = apps.read_namespaced_deployment(
        f"{release.name}-trainjob-operator", release.namespace
    )
    assert deployment.spec is not None and deployment.spec.template.spec is not None
    container = deployment.spec.template.spec.containers[0]
    assert container.security_context is not None
    assert container.security_context.read_only_root_filesystem is True
    core = k8s.CoreV1Api(api_client)
    service = core.read_namespaced_service(
        f"{release.name}-trainjob-operator-metrics", release.namespace
    )
    assert service.spec is not None and service.spec.ports is not None
    assert service.spec.ports[0].name == "metrics"
    # crds/ went in with the chart (the TrainJob CRD already existed: helm keeps it).
    ext = k8s.ApiextensionsV1Api(api_client)
    crd = "trainjobs.trainjob.dev"
    assert meta(ext.read_custom_resource_definition(crd)).name == crd
    # The operator's identity is exactly what the chart granted, and no more.
    can_i = control_plane.kubectl(
        "auth",
        "can-i",
        "--list",
        f"--as=system:serviceaccount:{release.namespace}:{release.service_account}",
        "-n",
        "default",
    ).stdout
    assert "secrets" not in can_i, can_i


# -- the operator under the chart's RBAC -------------------------------------------------------


def test_main_scenarios_under_the_chart_rbac(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> None:
    cluster = Cluster(api_client, namespace)
    cluster.create_job(
        trainjob("mnist", chief=1, workers=2, run_policy={"ttlSecondsAfterFinished": 3})
    )
    names = {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1"}
    cluster.wait_pods("mnist", names, timeout=T)
    waits.wait_until(lambda: set(cluster.services("mnist")) == names, timeout=T, what="services")
    cluster.wait_condition("mnist", "Created", timeout=T)

    for name in sorted(names):
        cluster.set_running(name)
    cluster.wait_condition("mnist", "Running", timeout=T)

    cluster.set_exited("mnist-chief-0", 0)
    cluster.wait_condition("mnist", "Succeeded", timeout=T)
    # cleanPodPolicy (default Running) deletes the workers still running: pods delete works.
    waits.wait_until(
        lambda: not {"mnist-worker-0", "mnist-worker-1"} & set(cluster.pods("mnist")),
        timeout=T,
        what="the running workers to be removed",
    )
    reasons = {event.reason for event in cluster.events("mnist")}
    assert {"Created", "Running", "TrainJobSucceeded"} <= reasons, reasons

    # ttlSecondsAfterFinished: the operator deletes the job, its finalizer goes away.
    waits.wait_until(
        lambda: cluster.job("mnist") is None, timeout=T, what="TTL deletion of the job"
    )

    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics") as resp:
        metrics = resp.read().decode()
    assert f'trainjob_jobs_succeeded_total{{namespace="{namespace}"}} 1.0' in metrics

    assert operator.running(), operator.log_tail()
    assert not _permission_errors(operator), "\n".join(_permission_errors(operator))


def test_namespaced_mode_serves_its_namespace_with_a_role(
    control_plane: ControlPlane,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    installed = _install(control_plane, f"--set=watchNamespaces={{{namespace}}}")
    try:
        rbac = k8s.RbacAuthorizationV1Api(api_client)
        role = rbac.read_namespaced_role(f"{installed.name}-trainjob-operator", namespace)
        assert role.rules
        assert f"--namespace={namespace}" in installed.operator_args
        op = _start_as_service_account(
            control_plane,
            installed.namespace,
            installed.service_account,
            installed.operator_args,
            tmp_path,
        )
        try:
            cluster = Cluster(api_client, namespace)
            cluster.create_job(trainjob("ns-mode", chief=0, workers=1))
            cluster.wait_pods("ns-mode", {"ns-mode-worker-0"}, timeout=T)
            cluster.wait_condition("ns-mode", "Created", timeout=T)
            cluster.set_running("ns-mode-worker-0")
            cluster.wait_condition("ns-mode", "Running", timeout=T)
            cluster.delete_job("ns-mode")
            waits.wait_until(lambda: cluster.job("ns-mode") is None, timeout=T, what="job deleted")
            assert not _permission_errors(op), "\n".join(_permission_errors(op))
        finally:
            op.stop()
    finally:
        _uninstall(control_plane, installed)


def test_a_tfjob_runs_under_the_charts_rbac_with_tfjob_enabled(
    control_plane: ControlPlane,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """tfjob.enabled: the operator, as the chart's ServiceAccount with the chart's flags,
    serves a TFJob from creation to TTL deletion with no permission refused (the TFJob CRD is
    the chart's, or the one an earlier test applied: the chart leaves a CRD it did not
    install alone). validate=false: the policy applies cluster-wide and is tested elsewhere."""
    installed = _install(
        control_plane,
        f"--set=watchNamespaces={{{namespace}}}",
        "--set=tfjob.enabled=true",
        "--set=tfjob.validate=false",
    )
    try:
        assert "--tfjob" in installed.operator_args
        ext = k8s.ApiextensionsV1Api(api_client)
        assert meta(ext.read_custom_resource_definition("tfjobs.kubeflow.org")).name
        op = _start_as_service_account(
            control_plane,
            installed.namespace,
            installed.service_account,
            installed.operator_args,
            tmp_path,
        )
        try:
            custom = k8s.CustomObjectsApi(api_client)
            body = {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "metadata": {"name": "tf"},
                "spec": {
                    "runPolicy": {"ttlSecondsAfterFinished": 1},
                    "tfReplicaSpecs": {
                        "Worker": {
                            "replicas": 1,
                            "template": trainjob("x")["spec"]["replicaSpecs"]["chief"]["template"],
                        }
                    },
                },
            }
            custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "tfjobs", body)
            cluster = Cluster(api_client, namespace)

            def tfjob_conditions() -> list[str]:
                try:
                    found: Any = custom.get_namespaced_custom_object(
                        "kubeflow.org", "v1", namespace, "tfjobs", "tf"
                    )
                except ApiException:
                    return ["gone"]
                return [c["type"] for c in (found.get("status") or {}).get("conditions") or []]

            waits.wait_until(
                lambda: cluster.pod("tf-worker-0") is not None, timeout=T, what="the TFJob's Pod"
            )
            cluster.set_running("tf-worker-0")
            waits.wait_until(
                lambda: tfjob_conditions() == ["Created", "Running"], timeout=T, what="Running"
            )
            cluster.set_exited("tf-worker-0", 0)
            waits.wait_until(
                lambda: tfjob_conditions() == ["gone"], timeout=T, what="success, then TTL"
            )
            assert op.running(), op.log_tail()
            assert not _permission_errors(op), "\n".join(_permission_errors(op))
        finally:
            op.stop()
    finally:
        _uninstall(control_plane, installed)


def test_removing_the_pods_rule_breaks_the_operator_visibly(
    control_plane: ControlPlane,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Proof that the RBAC is what the operator runs under: the same chart with create/delete
    removed from the Pods rule, applied with kubectl, and the operator can create no Pod."""
    suffix = uuid.uuid4().hex[:6]
    name = f"tj-broken-{suffix}"
    ops_namespace = f"trainjob-system-{suffix}"
    rendered = _helm(
        control_plane,
        "template",
        name,
        str(CHART),
        f"--namespace={ops_namespace}",
        f"--set=watchNamespaces={{{namespace}}}",
        "--set=replicaCount=0",
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    # Cluster-scoped objects of this release get unique names; only the Role is changed.
    # (The other Role, in the release namespace, is leader election's Lease.)
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == namespace]
    (pods_rule,) = [rule for rule in role["rules"] if "pods" in rule["resources"]]
    assert {"create", "delete"} <= set(pods_rule["verbs"]), pods_rule
    # Still list/watch (the operator watches Pods), but no create/delete.
    pods_rule["verbs"] = [v for v in pods_rule["verbs"] if v not in ("create", "delete")]
    control_plane.kubectl("create", "namespace", ops_namespace)
    try:
        control_plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
        deployment = _deployment(rendered)
        service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        control_plane.wait_service_account(ops_namespace, service_account)
        op = _start_as_service_account(
            control_plane, ops_namespace, service_account, _operator_args(deployment), tmp_path
        )
        try:
            cluster = Cluster(api_client, namespace)
            cluster.create_job(trainjob("denied", chief=0, workers=1))
            try:
                waits.wait_until(
                    lambda: [
                        line
                        for line in _permission_errors(op)
                        if 'cannot create resource "pods"' in line
                    ],
                    timeout=T,
                    what="the operator to report that it may not create Pods",
                )
            except waits.WaitTimeoutError as exc:
                raise waits.WaitTimeoutError(f"{exc}; operator log:\n{op.log_tail()}") from None
            assert not cluster.pods("denied"), "a Pod was created without the pods rule"

            # The refusal is in the job's status too, in the API server's words.
            def refused() -> dict[str, str] | None:
                job = cluster.job("denied") or {}
                for cond in (job.get("status") or {}).get("conditions") or []:
                    if cond["type"] == "Running":
                        assert cond["status"] == "False", cond
                        if cond["reason"] == "FailedCreate":
                            return dict(cond)
                return None

            cond = waits.wait_until(refused, timeout=T, what="FailedCreate in the job's status")
            assert 'cannot create resource "pods"' in cond["message"], cond
        finally:
            op.stop()
    finally:
        control_plane.kubectl(
            "delete",
            "-f",
            "-",
            "--ignore-not-found",
            "--wait=false",
            stdin=yaml.safe_dump_all(docs),
            check=False,
        )
        control_plane.kubectl("delete", "namespace", ops_namespace, "--wait=false", check=False)
