"""`trainjob tensorboard` as data: the cluster's TensorBoard Pod, why one does not start, the
local run's directory and TensorBoard's command line, and how the command decides between a
local run and a cluster job."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from trainjob import cli
from trainjob.cluster import board
from trainjob.cluster.cli import tensorboard as cluster_tensorboard
from trainjob.local import board as local_board

ROOT = Path(__file__).parents[2]


def example_job(name: str = "mnist-multiworker.yaml") -> dict[str, Any]:
    """An example as the API server returns it (with a uid)."""
    job: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    job["metadata"].update(namespace="team-a", uid="0b5e3c2a-1111-2222-3333-444455556666")
    return job


def test_the_pod_mounts_the_jobs_volume_read_only_at_its_sub_path() -> None:
    pod = board.tensorboard_pod(example_job(), "a1b2c3")
    assert pod["metadata"]["name"] == "mnist-multiworker-tensorboard-a1b2c3"
    (container,) = pod["spec"]["containers"]
    assert container["volumeMounts"] == [
        {
            "name": "checkpoints",
            "mountPath": "/logs",
            "readOnly": True,
            "subPath": "mnist-multiworker",
        }
    ]
    assert pod["spec"]["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "trainjob-checkpoints"}}
    ]
    assert container["image"] == "trainjob/trainjob:0.1.0"
    # TensorBoard on the Pod's loopback: the port-forward reaches it, nothing else does.
    assert container["command"] == [
        "python", "-m", "tensorboard.main", "--logdir", "/logs", "--host", "127.0.0.1",
        "--port", "6006",
    ]  # fmt: skip
    assert pod["spec"]["restartPolicy"] == "Never"
    # Next to the job's Pods while they run (a ReadWriteOnce disk attaches to one node).
    (term,) = pod["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": {"trainjob.dev/job-name": "mnist-multiworker"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert pod["spec"]["activeDeadlineSeconds"] == 12 * 3600
    kubernetes_validate.validate(pod, "1.34", strict=True)


def test_the_pod_meets_pod_security_restricted() -> None:
    pod = board.tensorboard_pod(example_job(), "x")
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_the_pod_is_no_replica_but_goes_with_its_job() -> None:
    """No job-name label (the operator would count it as a replica), an ownerReference that is
    not the controller (deleting the job garbage-collects a Pod left behind)."""
    pod = board.tensorboard_pod(example_job(), "x")
    labels = pod["metadata"]["labels"]
    assert "trainjob.dev/job-name" not in labels
    assert labels["trainjob.dev/tensorboard-for"] == "mnist-multiworker"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "name": "mnist-multiworker",
            "uid": "0b5e3c2a-1111-2222-3333-444455556666",
        }
    ]


def test_a_long_job_name_still_gives_a_valid_pod_name() -> None:
    name = board.pod_name("j" * 62 + "x", "abcdef")
    assert len(name) == 63 and name.endswith("-tensorboard-abcdef")


def test_the_image_is_the_jobs_unless_one_is_given() -> None:
    job = example_job()
    assert board.tensorboard_pod(job, "x", "mine:1")["spec"]["containers"][0]["image"] == "mine:1"
    del job["spec"]["image"]
    job["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {"containers": [{"name": "tensorflow", "image": "team/tf:2"}]}
    }
    assert board.tensorboard_pod(job, "x")["spec"]["containers"][0]["image"] == "team/tf:2"
    job["spec"]["replicaSpecs"]["worker"]["template"] = {}
    with pytest.raises(board.BoardError, match=r"names no image to run TensorBoard in; give --im"):
        board.tensorboard_pod(job, "x")


def test_a_job_without_a_checkpoint_volume_is_named_with_the_field() -> None:
    job = example_job()
    del job["spec"]["checkpoint"]
    with pytest.raises(board.BoardError) as raised:
        board.tensorboard_pod(job, "x")
    assert str(raised.value) == (
        "TrainJob mnist-multiworker has no checkpoint volume (spec.checkpoint.claimName), so its "
        "TensorBoard logs were written inside its Pods and are not kept; give the job a "
        "PersistentVolumeClaim in spec.checkpoint to see them"
    )


def pod_with(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": status}


def test_why_a_pod_will_not_serve_in_the_kubelets_words() -> None:
    pulling = pod_with(
        phase="Pending",
        containerStatuses=[
            {
                "name": "tensorboard",
                "state": {"waiting": {"reason": "ErrImagePull", "message": "not found: x:1"}},
            }
        ],
    )
    assert board.failure(pulling) == "ErrImagePull: not found: x:1"
    exited = pod_with(
        phase="Failed",
        containerStatuses=[
            {
                "name": "tensorboard",
                "state": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": "Traceback...\nModuleNotFoundError: No module named 'tb'\n",
                    }
                },
            }
        ],
    )
    assert board.failure(exited) == (
        "TensorBoard exited with code 1 (Error): Traceback... ModuleNotFoundError: No module "
        "named 'tb'"
    )
    creating = pod_with(
        phase="Pending",
        containerStatuses=[
            {"name": "tensorboard", "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    )
    assert board.failure(creating) is None
    assert not board.started(creating)
    running = pod_with(
        phase="Running", containerStatuses=[{"name": "tensorboard", "state": {"running": {}}}]
    )
    assert board.failure(running) is None and board.started(running)
    deadline = pod_with(phase="Failed", reason="DeadlineExceeded", message="active 43200s")
    assert board.failure(deadline) == "the Pod is Failed: DeadlineExceeded active 43200s"


def test_what_a_pod_that_did_not_start_waits_for() -> None:
    unschedulable = pod_with(
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient memory.",
            }
        ],
    )
    assert board.waiting_reason(unschedulable, []) == (
        "Unschedulable: 0/1 nodes are available: 1 Insufficient memory."
    )
    events = [
        {"type": "Normal", "reason": "Scheduled", "message": "assigned"},
        {"type": "Warning", "reason": "FailedMount", "message": "claim ckpt not found"},
    ]
    assert board.waiting_reason(pod_with(phase="Pending"), events) == (
        "FailedMount: claim ckpt not found"
    )
    assert board.waiting_reason(pod_with(), []) == "the Pod is Pending"


def test_the_local_run_is_served_from_its_checkpoint_dir() -> None:
    assert local_board.logdir("/runs/mnist") == "/runs/mnist/checkpoints"
    assert local_board.argv("/py", "/runs/mnist/checkpoints", "127.0.0.1", None) == [
        "/py", "-m", "tensorboard.main", "--logdir", "/runs/mnist/checkpoints",
        "--host", "127.0.0.1", "--port", "default",
    ]  # fmt: skip
    assert local_board.argv("/py", "/d", "0.0.0.0", 0)[-1] == "0"
    said = (
        "W1124 12:00:00 absl] some warning\n"
        "TensorBoard 2.21.0 at http://127.0.0.1:40123/ (Press CTRL+C to quit)\n"
    )
    assert local_board.announced_url(said) == "http://127.0.0.1:40123/"
    assert local_board.announced_url("Serving TensorBoard on localhost; to expose") is None
    assert local_board.last_words("a\n\nb\nc\nE0 error: port in use\n") == (
        "b | c | E0 error: port in use"
    )
    assert local_board.last_words("") == "no output"


def args_of(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["tensorboard", *argv])


def test_a_local_run_is_served_locally_anything_else_from_the_cluster(tmp_path: Path) -> None:
    runs = "trainjob-runs"
    (tmp_path / runs / "here").mkdir(parents=True)
    cwd = str(tmp_path)
    assert not cluster_tensorboard.wants_cluster_tensorboard(args_of(), cwd, runs)
    assert not cluster_tensorboard.wants_cluster_tensorboard(args_of("here"), cwd, runs)
    assert not cluster_tensorboard.wants_cluster_tensorboard(args_of(str(tmp_path)), cwd, runs)
    assert cluster_tensorboard.wants_cluster_tensorboard(args_of("mnist"), cwd, runs)
    for flags in (["--cluster"], ["-n", "a"], ["--context", "c"], ["--image", "i:1"]):
        assert cluster_tensorboard.wants_cluster_tensorboard(args_of("here", *flags), cwd, runs), (
            flags
        )


@pytest.mark.parametrize("port", ["70000", "web", "-1"])
def test_a_bad_port_is_named(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["tensorboard", "x", "--port", port])
    assert exited.value.code == 2
    assert f"argument --port: '{port}' is not a port (0-65535; 0: any free port)" in (
        capsys.readouterr().err
    )


def test_no_local_run_is_said_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    assert cli.main(["tensorboard"], err=err) == 2
    assert err.getvalue() == (
        f"trainjob tensorboard: no runs here: {tmp_path}/trainjob-runs does not exist; give a "
        "run dir (trainjob run --run-dir)\n"
    )


def test_completion_offers_cluster_job_names_to_tensorboard() -> None:
    script = cli.completion_script(cli.build_parser(), "bash")
    assert "get|describe|wait|attach|delete|tensorboard)" in script
    assert "tensorboard) opts=" in script and "--address" in script


def test_pod_manifest_is_a_fresh_copy_each_time() -> None:
    """The command list is a module constant: a caller editing one Pod never changes the
    next."""
    first = board.tensorboard_pod(example_job(), "a")
    first["spec"]["containers"][0]["command"].append("--oops")
    second = board.tensorboard_pod(copy.deepcopy(example_job()), "b")
    assert "--oops" not in second["spec"]["containers"][0]["command"]


def test_tensorboard_missing_here_is_said_with_the_way_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "trainjob-runs" / "mnist"
    (run / "logs").mkdir(parents=True)
    (run / "status.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec

    def without_tensorboard(name: str, *args: Any) -> Any:
        return None if name == "tensorboard" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_tensorboard)
    err = io.StringIO()
    assert cli.main(["tensorboard", "mnist"], err=err) == 2
    assert err.getvalue() == (
        f"trainjob tensorboard: TensorBoard is not installed in this Python ({sys.executable}): "
        "pip install tensorboard (or pip install 'trainjob[tf]')\n"
    )
