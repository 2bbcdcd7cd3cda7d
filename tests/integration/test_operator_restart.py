"""Kill the operator (SIGKILL) in the middle of creating 20 jobs, start it again: it adopts
what exists, creates what is missing, and creates no duplicates or spurious restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.integration.operator_harness import Cluster, Operator, attempt, trainjob, wait_until

pytestmark = pytest.mark.integration

JOBS = 20


def test_restart_operator_mid_creation(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    cluster = Cluster(api_client, namespace)
    log = tmp_path / "operator.log"
    names = [f"j{i:02d}" for i in range(JOBS)]
    expected = {f"{n}-{role}" for n in names for role in ("chief-0", "worker-0")}

    first = Operator(kubeconfig, log, f"--namespace={namespace}").start()
    try:
        for name in names:
            cluster.create_job(trainjob(name, chief=1, workers=1))
        # Kill it once it has done part of the work, not all of it.
        wait_until(
            lambda: len(cluster.pods()) >= 6 or not first.running(),
            timeout=60,
            what="the first operator to create some pods",
        )
        first.kill()
        assert first.process is not None and first.process.returncode == -9, first.log_tail()
    finally:
        first.stop()
    partial = len(cluster.pods())
    print(f"pods when the first operator was killed: {partial} of {2 * JOBS}")
    assert partial < 2 * JOBS, "the kill came too late to test a restart mid-creation"

    second = Operator(kubeconfig, log, f"--namespace={namespace}").start()
    try:
        wait_until(
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
            assert len(pod.metadata.owner_references) == 1
        for pod_name in sorted(pods):
            cluster.set_running(pod_name)
        for name in names:
            cluster.wait_condition(name, "Running", timeout=60)
            assert (cluster.job(name) or {})["status"]["restartCount"] == 0
    finally:
        second.stop()
        print(second.log_tail(40))
