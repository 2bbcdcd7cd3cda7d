"""Kill the operator (SIGKILL) in the middle of creating 40 jobs, or while jobs run, start it
again: it adopts what exists, creates what is missing, and creates no duplicates or spurious
restarts."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from tests.integration.operator_harness import Cluster, attempt, meta, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

JOBS = 40


def test_restart_operator_mid_creation(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster = Cluster(api_client, namespace)
    log = tmp_path / "operator.log"
    names = [f"j{i:02d}" for i in range(JOBS)]
    expected = {f"{n}-{role}" for n in names for role in ("chief-0", "worker-0")}

    for name in names:
        cluster.create_job(trainjob(name, chief=1, workers=1))
    # One API thread makes the first operator create its 160 children one by one, and a watch
    # (not a poll) sees its first Pods, so the kill lands mid-creation on a fast machine too.
    first = operator_process.Operator(
        kubeconfig, log, f"--namespace={namespace}", "--api-workers=1"
    ).start()
    try:
        pods = k8s_watch.Watch().stream(
            k8s.CoreV1Api(api_client).list_namespaced_pod, namespace, timeout_seconds=60
        )
        for seen, _ in enumerate(pods, start=1):
            if seen >= 4 or not first.running():
                break
        first.kill()
        assert first.process is not None and first.process.returncode == -9, first.log_tail()
    finally:
        first.stop()
    partial = len(cluster.pods())
    print(f"pods when the first operator was killed: {partial} of {2 * JOBS}")
    assert partial < 2 * JOBS, "the kill came too late to test a restart mid-creation"

    second = operator_process.Operator(kubeconfig, log, f"--namespace={namespace}").start()
    try:
        waits.wait_until(
            lambda: set(cluster.pods()) == expected and set(cluster.services()) == expected,
            timeout=90,
            what=f"all {len(expected)} pods and services (had {partial} pods at the kill)",
        )
        for name in names:
            cluster.wait_condition(name, "Created", timeout=60)
        pods = cluster.pods()
        assert len(pods) == 2 * JOBS
        assert all(attempt(p) == 0 for p in pods.values())
        for pod in pods.values():
            assert len(meta(pod).owner_references or []) == 1
        for pod_name in sorted(pods):
            cluster.set_running(pod_name)
        for name in names:
            cluster.wait_condition(name, "Running", timeout=60)
            assert (cluster.job(name) or {})["status"]["restartCount"] == 0
    finally:
        second.stop()
        print(second.log_tail(40))


RUNNING_JOBS = 15


def _jobs_counted(operator: operator_process.Operator, namespace: str) -> int:
    """How many jobs the operator has reconciled at least once (its `trainjob_jobs` gauge)."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0
    total = 0.0
    for line in text.splitlines():
        if line.startswith("trainjob_jobs{") and f'namespace="{namespace}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_restarted_operator_keeps_running_jobs_as_they_are(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """An operator killed while jobs run must, when it comes back, see their running Pods before
    it judges them: a Pod it saw Running and cannot see now would count as deleted (a restart)."""
    cluster = Cluster(api_client, namespace)
    log = tmp_path / "operator.log"
    names = [f"r{i:02d}" for i in range(RUNNING_JOBS)]
    first = operator_process.Operator(kubeconfig, log, f"--namespace={namespace}").start()
    try:
        for name in names:
            cluster.create_job(trainjob(name, chief=1, workers=1))
        for name in names:
            cluster.run_all(name, {f"{name}-chief-0", f"{name}-worker-0"})
        for name in names:
            cluster.wait_condition(name, "Running", timeout=60)
        first.kill()
    finally:
        first.stop()
    before = {name: meta(pod).uid for name, pod in cluster.pods().items()}
    assert len(before) == 2 * RUNNING_JOBS

    second = operator_process.Operator(kubeconfig, log, f"--namespace={namespace}").start()
    try:
        waits.wait_until(
            lambda: _jobs_counted(second, namespace) >= RUNNING_JOBS or not second.running(),
            timeout=60,
            what="the restarted operator to reconcile every job once",
        )
        assert second.running(), second.log_tail()
        after = {name: meta(pod).uid for name, pod in cluster.pods().items()}
        assert after == before, "the restarted operator replaced running Pods"
        for name in names:
            status = (cluster.job(name) or {})["status"]
            assert status["restartCount"] == 0, (name, status)
            assert status["state"] == "Running", (name, status)
    finally:
        second.stop()
        print(second.log_tail(40))
