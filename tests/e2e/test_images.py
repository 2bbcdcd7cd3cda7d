"""The three images as a cluster runs them: non-root, the runtime image trains offline from
its baked-in MNIST with its default command, the operator runs on a read-only root file
system (the chart's securityContext) and serves its health endpoint."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import OPERATOR_NAMESPACE, PROGRESS_PREFIX, Cluster, wait_until
from tests.e2e.conftest import IMAGE_TAG

pytestmark = pytest.mark.e2e

RESTRICTED_CONTAINER: Final = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def run_pod(
    cluster: Cluster,
    namespace: str,
    name: str,
    image: str,
    *,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Run a pod to completion with the image's own user; returns (phase, log)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "securityContext": RESTRICTED_CONTAINER,
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    if command is not None:
        container["command"] = command
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
        },
    }
    cluster.apply(namespace, json.dumps(pod))

    def finished() -> str | None:
        phase = (cluster.get_json("pod", name, "-n", namespace).get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_until(finished, timeout=300, what=f"pod {name} to finish")
    return phase, cluster.kubectl("logs", name, "-n", namespace)


@pytest.mark.parametrize(
    ("image", "uid"),
    [("trainjob-operator", "10001"), ("trainjob", "1000"), ("trainjob-legacy", "1000")],
)
def test_image_runs_as_its_non_root_user(
    cluster: Cluster, namespace: str, image: str, uid: str
) -> None:
    phase, log = run_pod(
        cluster,
        namespace,
        f"whoami-{image}",
        f"trainjob/{image}:{IMAGE_TAG}",
        command=["python", "-c", "import os; print('uid', os.getuid(), 'gid', os.getgid())"],
    )
    assert phase == "Succeeded", log
    assert f"uid {uid} gid {uid}" in log, log


def test_runtime_image_trains_offline_with_its_default_command(
    cluster: Cluster, namespace: str
) -> None:
    """`python -m trainjob train` (the image's entrypoint + command) on the baked-in MNIST;
    pods here have no route off the machine, so a download would fail."""
    phase, log = run_pod(
        cluster,
        namespace,
        "train-single",
        f"trainjob/trainjob:{IMAGE_TAG}",
        env={
            "TRAINJOB_ENTRYPOINT": "trainjob.samples.mnist:build",
            "TRAINJOB_CONFIG": json.dumps({"epochs": 1, "steps_per_epoch": 5, "batch_size": 32}),
        },
    )
    assert phase == "Succeeded", log
    events = [
        json.loads(line[len(PROGRESS_PREFIX) :])
        for line in log.splitlines()
        if line.startswith(PROGRESS_PREFIX)
    ]
    assert [e["event"] for e in events if e["event"] in ("start", "end")] == ["start", "end"], log
    assert events[-1]["status"] == "succeeded", log


def test_operator_runs_on_a_read_only_root_file_system(cluster: Cluster, operator: str) -> None:
    pods = cluster.get_json(
        "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=trainjob-operator"
    )["items"]
    assert pods, "no operator pod"
    pod = pods[0]
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready.get("Ready") == "True", pod["status"]
    probe = cluster.kubectl(
        "exec",
        "-n",
        OPERATOR_NAMESPACE,
        pod["metadata"]["name"],
        "--",
        "python",
        "-c",
        "try:\n    open('/probe', 'w')\nexcept OSError as e:\n    print('rofs', e.errno)",
    )
    assert "rofs 30" in probe, probe  # EROFS
