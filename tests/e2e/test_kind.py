"""End to end on a real cluster (kind in CI): helm install the chart with the images built
from images/, run the 2-worker MNIST example, kill a worker mid-run and see the job resume
from its checkpoint and succeed. Run with ``pytest tests/e2e --e2e`` (see conftest.py).

Every piece is also tested without Docker by the other tiers: the chart (tests/unit/
test_chart.py, tests/integration/test_helm_install.py), the operator image's build step
(test_chart.py), the runtime image (tests/training/test_dockerfiles.py) and the example
(`trainjob run`, tests/local).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO_ROOT / "helm" / "trainjob-operator"
EXAMPLE: Final = REPO_ROOT / "examples" / "mnist-multiworker.yaml"
JOB: Final = "mnist-multiworker"
PROGRESS_PREFIX: Final = "TRAINJOB_PROGRESS "
OPERATOR_IMAGE: Final = os.environ.get("TRAINJOB_E2E_OPERATOR_IMAGE", "trainjob/trainjob-operator")
IMAGE_TAG: Final = os.environ.get("TRAINJOB_E2E_IMAGE_TAG", "0.1.0")

pytestmark = pytest.mark.e2e

T = TypeVar("T")


def tool(name: str) -> str:
    found = os.environ.get(name.upper()) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not on PATH", pytrace=False)
    return found


def run(*argv: str, check: bool = True, stdin: str | None = None) -> str:
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=600, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def kubectl(*args: str, check: bool = True, stdin: str | None = None) -> str:
    return run(tool("kubectl"), *args, check=check, stdin=stdin)


def wait_until(probe: Callable[[], T | None], *, timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(2)


def get_json(*args: str) -> dict[str, Any]:
    out = kubectl("get", *args, "-o", "json", check=False)
    try:
        value = json.loads(out) if out else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def progress(namespace: str, pod: str) -> list[dict[str, Any]]:
    logs = kubectl("logs", pod, "-n", namespace, "-c", "tensorflow", check=False)
    events = []
    for line in logs.splitlines():
        if line.startswith(PROGRESS_PREFIX):
            try:
                events.append(json.loads(line[len(PROGRESS_PREFIX) :]))
            except ValueError:
                continue
    return events


def condition(namespace: str, ctype: str) -> bool:
    status = get_json("trainjob", JOB, "-n", namespace).get("status") or {}
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or []
    )


@pytest.fixture(scope="module")
def operator_release() -> Iterator[str]:
    namespace = "trainjob-system"
    run(
        tool("helm"),
        "upgrade",
        "--install",
        "trainjob",
        str(CHART),
        f"--namespace={namespace}",
        "--create-namespace",
        f"--set=image.repository={OPERATOR_IMAGE}",
        f"--set=image.tag={IMAGE_TAG}",
        "--set=image.pullPolicy=IfNotPresent",
        "--wait",
        "--timeout=5m",
    )
    try:
        yield namespace
    finally:
        deployment = "deployment/trainjob-trainjob-operator"
        print(kubectl("logs", "-n", namespace, deployment, check=False))


@pytest.fixture
def namespace(operator_release: str) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        print(kubectl("describe", "trainjob", "-n", name, check=False))
        print(kubectl("get", "pods,events", "-n", name, check=False))
        kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_two_workers_resume_after_a_worker_is_deleted_and_succeed(namespace: str) -> None:
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "trainjob-checkpoints"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        ),
    )
    kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    worker0, worker1 = f"{JOB}-worker-0", f"{JOB}-worker-1"

    def running() -> bool:
        pods = get_json("pods", "-n", namespace, "-l", f"trainjob.dev/job-name={JOB}")
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods.get("items", [])}
        return phases.get(worker0) == "Running" and phases.get(worker1) == "Running"

    wait_until(running, timeout=600, what="both workers Running (image pull, PVC binding)")
    wait_until(lambda: condition(namespace, "Running"), timeout=60, what="condition Running")
    first_uid = get_json("pod", worker0, "-n", namespace)["metadata"]["uid"]

    # Mid-run: after the first epoch's checkpoint, before the job ends.
    wait_until(
        lambda: [e for e in progress(namespace, worker0) if e.get("event") == "checkpoint"],
        timeout=600,
        what="a first checkpoint",
    )
    assert not condition(namespace, "Succeeded"), "the job ended before the worker was killed"
    kubectl("delete", "pod", worker1, "-n", namespace, "--wait=false")

    # All-reduce: the whole group restarts (a new worker-0 too) and resumes from the checkpoint.
    def resumed() -> list[dict[str, Any]]:
        pod = get_json("pod", worker0, "-n", namespace)
        if not pod or pod["metadata"]["uid"] == first_uid:
            return []
        return [
            e
            for e in progress(namespace, worker0)
            if e.get("event") == "start" and (e.get("initial_epoch") or 0) >= 1
        ]

    wait_until(resumed, timeout=600, what="the restarted worker-0 to resume at epoch >= 1")
    wait_until(lambda: condition(namespace, "Succeeded"), timeout=900, what="condition Succeeded")
    status = get_json("trainjob", JOB, "-n", namespace)["status"]
    assert status.get("restartCount", 0) >= 1, status
