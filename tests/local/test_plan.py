"""Planning local processes (pure): ports, commands, environment, dry-run text."""

from __future__ import annotations

import json
import os

import pytest

from trainjob.core import constants, spec
from trainjob.local import plan

from .conftest import command_replica, job_manifest, run_main, write_job

pytestmark = pytest.mark.unit


def _runtime_job(**extra: object) -> spec.TrainJob:
    return spec.parse(
        job_manifest(
            "mnist",
            {"chief": {"replicas": 1}, "worker": {"replicas": 2}, "ps": {"replicas": 1}},
            image="img",
            runtime={"entrypoint": "trainjob.samples.mnist:build", "strategy": "ParameterServer"},
            checkpoint={"claimName": "pvc", "path": "/checkpoints"},
            **extra,
        )
    )


PORTS = {("chief", 0): 4000, ("ps", 0): 4001, ("worker", 0): 4002, ("worker", 1): 4003}


def _plan(job: spec.TrainJob, **kwargs: object) -> plan.RunPlan:
    options: dict[str, object] = {
        "ports": PORTS,
        "run_dir": "/runs/mnist",
        "python": "/venv/bin/python",
        "data_dir": "/data",
    }
    options.update(kwargs)
    return plan.make_plan(job, **options)  # type: ignore[arg-type]


def test_tf_config_uses_loopback_and_the_chosen_ports() -> None:
    run = _plan(_runtime_job())
    worker1 = run.process(("worker", 1))
    assert worker1.port == 4003
    assert json.loads(worker1.env[constants.ENV_TF_CONFIG]) == {
        "cluster": {
            "chief": ["127.0.0.1:4000"],
            "ps": ["127.0.0.1:4001"],
            "worker": ["127.0.0.1:4002", "127.0.0.1:4003"],
        },
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    # Byte-compatible with the operator's rendering: compact, keys sorted.
    assert worker1.env[constants.ENV_TF_CONFIG].startswith('{"cluster":{"chief":')


def test_checkpoint_dir_is_under_the_run_dir_whatever_the_claim() -> None:
    run = _plan(_runtime_job())
    for process in run.processes:
        assert process.env[constants.ENV_CHECKPOINT_DIR] == "/runs/mnist/checkpoints"
        assert process.env[constants.ENV_PROGRESS_FILE] == "/runs/mnist/progress.jsonl"
        assert process.env["TRAINJOB_DATA_DIR"] == "/data"
        assert process.log_path == f"/runs/mnist/logs/{process.label}.log"
        assert process.argv == ("/venv/bin/python", "-m", "trainjob", "train")
    assert any("pvc" in note for note in run.notes)
    assert run.prepare_mnist


def test_missing_port_is_a_plan_error() -> None:
    with pytest.raises(plan.PlanError):
        _plan(_runtime_job(), ports={("chief", 0): 1})


def test_custom_command_runs_the_template_command_and_args() -> None:
    manifest = job_manifest("custom", {"worker": command_replica("print(1)", replicas=2)})
    container = manifest["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["args"] = ["--epochs=1"]
    container["env"] = [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    job = spec.parse(manifest)
    run = plan.make_plan(
        job,
        ports={("worker", 0): 1, ("worker", 1): 2},
        run_dir="/r",
        python="/venv/bin/python",
        data_dir="/data",
    )
    worker = run.process(("worker", 0))
    assert worker.argv == ("/venv/bin/python", "-c", "print(1)", "--epochs=1")
    assert worker.env["A"] == "1"
    assert "B" not in worker.env
    assert any("valueFrom" in note for note in run.notes)
    # No runtime: no TRAINJOB_ENTRYPOINT and no data dir, but TF_CONFIG and the checkpoint dir.
    assert constants.ENV_ENTRYPOINT not in worker.env
    assert "TRAINJOB_DATA_DIR" not in worker.env
    assert constants.ENV_TF_CONFIG in worker.env
    assert not run.prepare_mnist


def test_a_template_without_command_and_no_runtime_cannot_run_locally() -> None:
    job = spec.parse(
        job_manifest(
            "x",
            {"worker": {"template": {"spec": {"containers": [{"name": "tensorflow"}]}}}},
            image="img",
        )
    )
    with pytest.raises(plan.PlanError, match="command"):
        plan.make_plan(job, ports={("worker", 0): 1}, run_dir="/r", python="p", data_dir=None)


def test_one_replica_job_gets_no_tf_config_like_kubeflow() -> None:
    job = spec.parse(job_manifest("one", {"worker": command_replica("pass")}))
    run = plan.make_plan(job, ports={("worker", 0): 1}, run_dir="/r", python="p", data_dir=None)
    assert constants.ENV_TF_CONFIG not in run.process(("worker", 0)).env


def test_process_env_drops_inherited_identity_and_keeps_user_overrides() -> None:
    run = _plan(_runtime_job())
    process = run.process(("chief", 0))
    environ = {
        "TF_CONFIG": "stale",
        "TRAINJOB_REPLICA_TYPE": "ps",
        "DTENSOR_CLIENT_ID": "9",
        "HOME": "/home/u",
        "TF_CPP_MIN_LOG_LEVEL": "0",
    }
    env = plan.process_env(process, environ)
    assert env["HOME"] == "/home/u"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert env[constants.ENV_REPLICA_TYPE] == "chief"
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
    assert "DTENSOR_CLIENT_ID" not in env


def test_grace_period_comes_from_the_pod_template() -> None:
    job = spec.parse(job_manifest("g", {"worker": command_replica("pass", grace=3)}))
    run = plan.make_plan(job, ports={("worker", 0): 1}, run_dir="/r", python="p", data_dir=None)
    assert run.process(("worker", 0)).grace_seconds == 3.0


def test_format_plan_lists_processes_ports_and_env() -> None:
    text = plan.format_plan(_plan(_runtime_job()))
    assert "dry run: nothing started" in text
    assert "chief-0  (mnist-chief-0)  port 4000" in text
    assert 'TF_CONFIG={"cluster":{"chief":["127.0.0.1:4000"]' in text
    assert "TRAINJOB_CHECKPOINT_DIR=/runs/mnist/checkpoints" in text
    assert "command: /venv/bin/python -m trainjob train" in text


def test_dry_run_from_stdin_starts_nothing(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import pathlib

    path = write_job(
        pathlib.Path(tmp_path) / "job.yaml",
        job_manifest("dry", {"worker": command_replica("raise SystemExit(1)", replicas=2)}),
    )
    out = io.StringIO()
    code = run_main(
        ["-f", "-", "--dry-run", "--run-dir", str(pathlib.Path(tmp_path) / "run")],
        stdin=io.StringIO(path.read_text()),
        out=out,
    )
    assert code == 0
    assert "worker-1  (dry-worker-1)" in out.getvalue()
    assert not (pathlib.Path(tmp_path) / "run").exists()


def test_invalid_job_exits_2_with_every_problem(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import pathlib

    path = write_job(pathlib.Path(tmp_path) / "bad.yaml", job_manifest("Bad", {}))
    assert run_main(["-f", str(path)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "metadata.name" in err and "is not a valid TrainJob" in err
    assert "Traceback" not in err


def test_script_of_finds_the_file_a_command_runs() -> None:
    py = "/venv/bin/python"
    assert plan.script_of((py, "/opt/train.py", "--epochs=2"), py) == "/opt/train.py"
    assert plan.script_of((py, "-u", "train.py"), py) == "train.py"
    assert plan.script_of(("python3", "train.py"), py) == "train.py"
    assert plan.script_of((py, "-c", "print(1)"), py) is None
    assert plan.script_of((py, "-m", "trainjob", "train"), py) is None
    assert plan.script_of(("/opt/bin/train",), py) == "/opt/bin/train"
    assert plan.script_of(("bash", "-c", "x"), py) is None  # found on PATH


def test_local_requirements_are_one_line_each() -> None:
    estimator = spec.parse(
        job_manifest(
            "est",
            {"chief": {"replicas": 1}, "worker": {"replicas": 1}},
            runtime={"entrypoint": "m:build", "framework": "Estimator"},
        ),
        require_images=False,
    )
    lines = plan.local_requirements(
        estimator,
        python="/py",
        modules=frozenset({"tensorflow"}),
        tf_version="2.21.0",
        missing_scripts={},
    )
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith(
        "spec.runtime.framework Estimator needs TensorFlow <= 2.15 with tensorflow-estimator, "
        "and /py has TensorFlow 2.21.0 without it; "
    )
    assert not plan.local_requirements(
        estimator,
        python="/py",
        modules=frozenset({"tensorflow", "tensorflow_estimator"}),
        tf_version="2.15.1",
        missing_scripts={},
    )
    no_tf = plan.local_requirements(
        estimator, python="/py", modules=frozenset(), tf_version=None, missing_scripts={}
    )
    assert len(no_tf) == 1 and "needs TensorFlow, which /py does not have" in no_tf[0]


def test_too_many_processes_and_rerun_refusal() -> None:
    job = spec.parse(job_manifest("big", {"worker": command_replica("x", replicas=40)}))
    assert plan.too_many_processes(job, None, 8) is None  # 8 per core
    assert "40 replicas would be 40 local processes" in (
        plan.too_many_processes(job, None, 2) or ""
    )
    assert plan.too_many_processes(job, 40, 1) is None
    assert plan.rerun_refusal(job, {"state": "Failed"}, "/r") is None
    assert plan.rerun_refusal(job, None, "/r") is None
    refusal = plan.rerun_refusal(job, {"state": "Succeeded", "completionTime": "T"}, "/r")
    assert refusal is not None and refusal.startswith("TrainJob big already Succeeded in /r (T)")


def test_dry_run_shows_each_process_devices(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import pathlib

    path = write_job(
        pathlib.Path(tmp_path) / "job.yaml",
        job_manifest(
            "gpu",
            {"worker": command_replica("pass", replicas=2), "ps": command_replica("pass")},
        ),
    )
    out = io.StringIO()
    code = run_main(
        ["-f", str(path), "--dry-run", "--gpus", "0,1", "--run-dir", str(tmp_path)],
        stdin=io.StringIO(""),
        out=out,
    )
    text = out.getvalue()
    assert code == 0, text
    blocks = {block.split()[0]: block for block in text.split("\n\n")[1:]}
    assert (
        "devices: GPU 0\n" in blocks["worker-0"]
        and "CUDA_VISIBLE_DEVICES=0\n" in blocks["worker-0"]
    )
    assert "devices: GPU 1\n" in blocks["worker-1"]
    assert "TRAINJOB_WORKER_GPUS=1" in blocks["worker-1"]
    assert "devices: CPU\n" in blocks["ps-0"] and "CUDA_VISIBLE_DEVICES=\n" in blocks["ps-0"]
    assert "gpus:           from --gpus" in text
