"""How a rendered Pod becomes a `buildah run` on this machine (tests/e2e/buildah_pods.py): the
e2e tests of the CUDA image run it so instead of in kind, and their assertions hold only if
the container gets what the operator gives a replica: TF_CONFIG (on 127.0.0.1 ports), its
environment, command, dropped capabilities, shared claim and termination message."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.e2e_cluster import REPO_ROOT
from tests.e2e import buildah_pods

pytestmark = pytest.mark.unit


def manifest(workers: int) -> dict[str, Any]:
    text = (REPO_ROOT / "examples" / "mnist-multiworker.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    loaded["spec"]["image"] = "trainjob/trainjob:0.1.0-gpu"
    loaded["spec"]["replicaSpecs"]["worker"]["replicas"] = workers
    return loaded


def options(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def test_a_rendered_replica_runs_with_the_operators_environment_on_loopback_ports() -> None:
    pods = buildah_pods.rendered_pods(
        manifest(2), tf_ports={("worker", 0): 15001, ("worker", 1): 15002}
    )
    workdir = Path("/work/run")
    pod = pods[1]
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    folder = buildah_pods.volume_folder(pod, mount, workdir)
    # Every Pod of the job that mounts the claim shares its folder, below it the subPath.
    assert folder == workdir / "claims" / "trainjob-checkpoints" / "mnist-multiworker"
    assert buildah_pods.volume_folder(pods[0], mount, workdir) == folder
    args = buildah_pods.run_arguments(pod, "c1", [folder], workdir / "termination-log")
    assert args[:3] == ["run", "--network", "host"], args
    assert options(args, "--cap-drop") == ["ALL"], args
    env = dict(e.split("=", 1) for e in options(args, "--env"))
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["127.0.0.1:15001", "127.0.0.1:15002"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    assert env["TRAINJOB_ENTRYPOINT"] == "trainjob.samples.mnist:build", env
    assert env["TRAINJOB_CHECKPOINT_DIR"] == "/checkpoints", env
    assert options(args, "--volume") == [
        f"{folder}:/checkpoints",
        f"{workdir / 'termination-log'}:/dev/termination-log",  # where the kubelet mounts it
    ]
    command = args.index("--")
    assert args[command - 1 :] == ["c1", "--", "python", "-m", "trainjob", "train"], args


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "env[TOKEN]",
        ),
        ({"command": None}, "a command is needed"),
    ],
)
def test_what_a_container_here_cannot_give_is_refused_naming_it(
    change: dict[str, Any], field: str
) -> None:
    (pod,) = buildah_pods.rendered_pods(manifest(1), tf_ports={("worker", 0): 15001})
    container = pod["spec"]["containers"][0]
    container.update({k: v for k, v in change.items() if v is not None})
    for key in [k for k, v in change.items() if v is None]:
        del container[key]
    with pytest.raises(buildah_pods.PodNotRunnableError, match=re.escape(field)):
        buildah_pods.run_arguments(pod, "c1", [Path("/v")], Path("/t"))


def test_a_volume_that_is_no_claim_or_empty_dir_is_refused_naming_it() -> None:
    (pod,) = buildah_pods.rendered_pods(manifest(1), tf_ports={("worker", 0): 15001})
    pod["spec"]["volumes"][0] = {"name": "trainjob-checkpoint", "hostPath": {"path": "/etc"}}
    (mount,) = pod["spec"]["containers"][0]["volumeMounts"]
    with pytest.raises(buildah_pods.PodNotRunnableError, match=r"volumes\[trainjob-checkpoint\]"):
        buildah_pods.volume_folder(pod, mount, Path("/work"))
