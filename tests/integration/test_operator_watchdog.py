"""The operator never sits silently: a job it cannot serve is logged, counted, and fails the
liveness probe. The fault is real: the operator runs as a service account that may read and
write TrainJobs but may not list Pods or Services, so the job's reconcile waits for a first list
of its children that never comes (as with a missing RBAC rule in a real install), and the
failing list itself fails the probe from the start."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.integration.operator_harness import Cluster, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

DEADLINE = 3  # --serve-deadline-seconds


def _liveness(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return -1.0
    values = [float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values) if values else 0.0


def _grant_trainjobs_only(api_client: k8s.ApiClient, namespace: str) -> None:
    core = k8s.CoreV1Api(api_client)
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(
        namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="limited"))
    )
    rules = [
        k8s.V1PolicyRule(
            api_groups=["trainjob.dev"],
            resources=["trainjobs", "trainjobs/status", "trainjobs/finalizers"],
            verbs=["get", "list", "watch", "patch", "update", "delete"],
        ),
        k8s.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"]),
    ]
    rbac.create_namespaced_role(
        namespace, k8s.V1Role(metadata=k8s.V1ObjectMeta(name="limited"), rules=rules)
    )
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="limited"),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="limited"
            ),
            subjects=[
                k8s.RbacV1Subject(kind="ServiceAccount", name="limited", namespace=namespace)
            ],
        ),
    )


def test_a_job_that_cannot_be_served_is_logged_counted_and_fails_liveness(
    control_plane: ControlPlane, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _grant_trainjobs_only(api_client, namespace)
    kubeconfig = control_plane.service_account_kubeconfig(namespace, "limited")
    cluster = Cluster(api_client, namespace)
    operator = operator_process.Operator(
        kubeconfig,
        tmp_path / "operator.log",
        f"--namespace={namespace}",
        f"--serve-deadline-seconds={DEADLINE}",
    ).start()
    try:
        # The operator lists its scope's Pods and Services from the start (before any job):
        # a list it may not make fails the probe at once, and its log names it.
        waits.wait_until(
            lambda: _liveness(operator.liveness_port)[0] == 500,
            timeout=60,
            what="the liveness probe failing",
        )
        assert f"Watching pods in {namespace} failed" in operator.log.read_text()
        cluster.create_job(trainjob("starved", chief=0, workers=1))
        waits.wait_until(
            lambda: _metric(operator.metrics_port, "trainjob_jobs_unserved_total") == 1.0,
            timeout=60,
            what="the starved job counted as unserved",
        )
        assert _liveness(operator.liveness_port)[0] == 500
        assert _metric(operator.metrics_port, "trainjob_jobs_unserved_total") == 1.0
        assert _metric(operator.metrics_port, "trainjob_jobs_waiting_first_reconcile") == 1.0
        log = operator.log.read_text()
        assert f"TrainJob {namespace}/starved has waited {DEADLINE}s for its first reconcile" in log
        assert operator.running(), "the operator itself keeps running (the kubelet restarts it)"
    finally:
        operator.stop()
        print(operator.log_tail(30))
