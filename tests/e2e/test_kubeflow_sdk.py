"""Kubeflow's own TFJob e2e test, unmodified, against the operator's TFJob front door; and the
kubeflow-training SDK's TrainingClient driving TFJobs the way its users do.

- ``test/e2e/test_e2e_tfjob.py`` of the PyPI wheel ``kubeflow-training==1.9.4`` (a top-level
  ``test`` package in site-packages) runs in a pytest subprocess, exactly as Kubeflow's CI runs
  it: once with plain scheduling, once with ``GANG_SCHEDULER_NAME=scheduler-plugins`` while the
  operator gangs through scheduler-plugins' Coscheduling (tests/controlplane/gang.py). Its image
  ``gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0`` is built here, offline, by images/build.sh
  (images/kubeflow-sdk-e2e) and imported onto the node.
- ``TrainingClient.create_job(train_func=...)`` with a Chief, a PS and a Worker (and with two
  Workers), then ``get_job_pods(is_master=True)`` and ``get_job_logs``, from a user's script
  (tests/support/kubeflow_sdk_driver.py).

The SDK runs in a venv of its own (tests/controlplane/kubeflow_sdk.py: it pins an older
kubernetes client than the project's), as its users' scripts do.

The operator runs with ``tfjob.enabled=true`` (``--tfjob``) for this module and goes back
afterwards; the TFJob CRD (crds/kubeflow.org_tfjobs.yaml) is applied with the others when the
node starts. The test's Pods carry no securityContext, as upstream's: their namespaces enforce
Pod Security "baseline", not "restricted". On another cluster (TRAINJOB_E2E_CLUSTER=current)
the TFJob CRD, the test image and, for the gang run, scheduler-plugins must be there already.
"""

from __future__ import annotations

import json
import subprocess
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.controlplane import kubeflow_sdk
from tests.controlplane.e2e_cluster import (
    CHART,
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    RELEASE,
    REPO_ROOT,
    Cluster,
    wait_until,
)
from tests.e2e.conftest import IMAGE_TAG

# alone: its fixtures upgrade the shared operator (TFJob mode, gang scheduling)
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

DRIVER: Final = REPO_ROOT / "tests" / "support" / "kubeflow_sdk_driver.py"
UPSTREAM_JOB: Final = "tfjob-mnist-ci-test"
PLAIN_TEST: Final = "test_sdk_e2e"
GANG_TEST: Final = "test_sdk_e2e_with_gang_scheduling"
# The upstream test waits up to 900 s for Succeeded; its gang variant ~15 s more before that.
UPSTREAM_TIMEOUT: Final = 1200.0
TFJOB_CRD: Final = "tfjobs.kubeflow.org"
PODGROUP_CRD: Final = "podgroups.scheduling.x-k8s.io"
BASELINE: Final = "pod-security.kubernetes.io/enforce=baseline"
# The runtime image: TensorFlow for the SDK's train_func (run by `bash -c`, entrypoint replaced).
TRAIN_FUNC_IMAGE: Final = f"docker.io/trainjob/trainjob:{IMAGE_TAG}"
MARKER: Final = "SDK-TRAIN-FUNC"


def require_gang_scheduler(cluster: Cluster) -> None:
    """Fail the test, saying why, on a cluster without scheduler-plugins."""
    if PODGROUP_CRD not in cluster.kubectl("get", "crd", PODGROUP_CRD, "-o", "name", check=False):
        pytest.fail(
            "scheduler-plugins (scheduler-plugins-scheduler and its PodGroup CRD) is not "
            "installed in this cluster",
            pytrace=False,
        )


def helm_upgrade(cluster: Cluster, *values: str) -> None:
    cluster.helm(
        "upgrade",
        RELEASE,
        CHART,
        f"--namespace={OPERATOR_NAMESPACE}",
        "--reuse-values",
        *(f"--set={value}" for value in values),
        "--wait",
        "--timeout=5m",
    )
    cluster.kubectl("rollout", "status", OPERATOR_DEPLOYMENT, "-n", OPERATOR_NAMESPACE)


def dump(cluster: Cluster, namespace: str) -> None:
    """What a failure needs: the TFJobs, the Pods and Events, the Pods' logs, the operator's."""
    print(cluster.kubectl("get", "tfjobs", "-n", namespace, "-o", "yaml", check=False))
    for kind in ("pods", "podgroups", "events"):
        print(cluster.kubectl("get", kind, "-n", namespace, "-o", "wide", check=False))
    for pod in cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).split():
        print(f"--- {pod}")
        print(cluster.kubectl("logs", "-n", namespace, pod, "--tail=40", check=False))
    print(
        cluster.kubectl(
            "logs", "-n", OPERATOR_NAMESPACE, OPERATOR_DEPLOYMENT, "--tail=80", check=False
        )
    )


def ensure_tfjob_crd(cluster: Cluster) -> None:
    """The node applies crds/ (Kubeflow's TFJob CRD in crds/kubeflow/) when it starts; another
    cluster gets it here, server-side (611 KB: too big for client-side apply's annotation)."""
    if TFJOB_CRD in cluster.kubectl("get", "crd", TFJOB_CRD, "-o", "name", check=False):
        return
    files = sorted((REPO_ROOT / "crds").rglob("kubeflow.org_tfjobs.yaml"))
    if not files:
        pytest.fail(f"{TFJOB_CRD} is not installed and crds/ has no copy", pytrace=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", files[0])
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool | None:
        out = cluster.kubectl("get", "crd", TFJOB_CRD, "-o", f"jsonpath={jsonpath}", check=False)
        return out.strip() == "True" or None

    wait_until(established, timeout=60, what=f"{TFJOB_CRD} to be Established")


@pytest.fixture(scope="module")
def tfjob_operator(cluster: Cluster, operator: str) -> Iterator[str]:
    """The operator upgraded to serve TFJobs (chart value tfjob.enabled, flag --tfjob)."""
    ensure_tfjob_crd(cluster)
    helm_upgrade(cluster, "tfjob.enabled=true")
    try:
        yield operator
    finally:
        helm_upgrade(cluster, "tfjob.enabled=false")


@pytest.fixture
def sdk_namespace(
    cluster: Cluster, tfjob_operator: str, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A fresh namespace enforcing Pod Security "baseline" (the SDK's Pods set no
    securityContext, so "restricted" would refuse them)."""
    name = f"e2e-kf-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, BASELINE, "--overwrite")
    try:
        yield name
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            dump(cluster, name)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def gang_scheduler(cluster: Cluster, tfjob_operator: str) -> Iterator[str]:
    """scheduler-plugins' scheduler (a host process beside the node's control plane) and the
    operator upgraded to gang through it (chart value gangScheduler.type)."""
    gang = None
    if cluster.plane is not None:
        from tests.controlplane.gang import start_gang_scheduler

        gang = start_gang_scheduler(cluster.plane)
    else:
        require_gang_scheduler(cluster)
    helm_upgrade(cluster, "gangScheduler.type=scheduler-plugins")
    try:
        yield "scheduler-plugins"
    finally:
        helm_upgrade(cluster, "gangScheduler.type=none")
        if gang is not None:
            print(f"scheduler-plugins log, last lines:\n{gang.log_tail(30)}")
            gang.stop()


def outcomes(junit: Path) -> dict[str, str]:
    """test name -> passed | failed | error | skipped, from pytest's JUnit XML."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag.replace("failure", "failed")
                break
        found[case.get("name", "")] = outcome
    return found


def run_upstream(
    cluster: Cluster, namespace: str, tmp_path: Path, gang: str | None
) -> tuple[int, dict[str, str], str]:
    """The wheel's test_e2e_tfjob.py, unmodified, in a pytest of its own (default import mode
    "prepend": its `test` package wins over the standard library's). An empty ini of its own
    keeps this repository's pytest configuration (pyproject.toml, above .venv) out."""
    upstream = kubeflow_sdk.upstream_test()
    assert upstream.is_file(), f"{upstream}: not in kubeflow-training=={kubeflow_sdk.VERSION}"
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n", encoding="utf-8")
    junit = tmp_path / "junit.xml"
    env = dict(cluster.env)
    env.pop("GANG_SCHEDULER_NAME", None)
    if gang is not None:
        env["GANG_SCHEDULER_NAME"] = gang
    result = subprocess.run(
        [
            str(kubeflow_sdk.python()),
            "-m",
            "pytest",
            str(upstream),
            f"--namespace={namespace}",
            f"--junitxml={junit}",
            f"-c={ini}",
            f"--rootdir={tmp_path}",
            "-p",
            "no:cacheprovider",
            "-rA",
            "-v",
            "--tb=short",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=UPSTREAM_TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    print(output)
    return result.returncode, outcomes(junit) if junit.is_file() else {}, output


def test_kubeflow_sdk_e2e_plain(cluster: Cluster, sdk_namespace: str, tmp_path: Path) -> None:
    """Upstream's test_sdk_e2e: one Worker trains; Created and Succeeded, never Running,
    Restarting or Failed at the end; the master pod's `tensorflow` log is read; deleted."""
    code, found, output = run_upstream(cluster, sdk_namespace, tmp_path, gang=None)
    assert code == 0, output[-4000:]
    assert found == {PLAIN_TEST: "passed", GANG_TEST: "skipped"}, output[-4000:]


def test_kubeflow_sdk_e2e_gang(
    cluster: Cluster, gang_scheduler: str, sdk_namespace: str, tmp_path: Path
) -> None:
    """Upstream's test_sdk_e2e_with_gang_scheduling: with minAvailable 10 the job stays Created
    and not Running (its PodGroup cannot be met); update_job to minAvailable 1; it succeeds.
    (gang_scheduler before sdk_namespace: a failure is dumped while the operator still gangs.)"""
    code, found, output = run_upstream(cluster, sdk_namespace, tmp_path, gang=gang_scheduler)
    assert code == 0, output[-4000:]
    assert found == {PLAIN_TEST: "skipped", GANG_TEST: "passed"}, output[-4000:]


@pytest.mark.parametrize(
    ("replicas", "master"),
    [({"chief": 1, "ps": 1, "workers": 1}, ("chief", 0)), ({"workers": 2}, ("worker", 0))],
    ids=["chief-ps-worker", "two-workers"],
)
def test_training_client_train_func(
    cluster: Cluster, sdk_namespace: str, replicas: dict[str, int], master: tuple[str, int]
) -> None:
    """TrainingClient.create_job(train_func=...) reaches Succeeded; get_job_pods(is_master=True)
    is exactly the chief (or worker 0 without one); get_job_logs reads its `tensorflow`
    container, where TensorFlow resolved the TF_CONFIG the operator wrote; the TFJob has
    Events."""
    name = f"sdk-{master[0]}"
    result = subprocess.run(
        [
            str(kubeflow_sdk.python()),
            str(DRIVER),
            "train-func",
            name,
            sdk_namespace,
            TRAIN_FUNC_IMAGE,
            str(replicas.get("chief", 0)),
            str(replicas.get("ps", 0)),
            str(replicas["workers"]),
        ],
        env=dict(cluster.env),
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    assert found["created"] and not found["failed"], found

    role, index = master
    assert found["master_pods"] == [f"{name}-{role}-{index}"]
    expected = [f"{name}-chief-0"] * replicas.get("chief", 0)
    expected += [f"{name}-ps-{i}" for i in range(replicas.get("ps", 0))]
    expected += [f"{name}-worker-{i}" for i in range(replicas["workers"])]
    assert found["pods"] == sorted(expected)

    logs = found["logs"]
    assert list(logs) == [f"{name}-{role}-{index}"], logs
    lines = [
        json.loads(line.split(MARKER, 1)[1])
        for line in logs[f"{name}-{role}-{index}"].splitlines()
        if line.startswith(MARKER)
    ]
    jobs = sorted({"chief": "chief", "ps": "ps", "workers": "worker"}[k] for k in replicas)
    assert lines == [{"task": [role, index], "jobs": jobs, "sum": 45}], logs
    assert found["events"].get(f"tfjob/{name}"), found["events"]
