"""Estimator on TF 2.15 (the legacy venv): 2 workers (chief + worker, as Kubeflow renders them),
a group restart after a lost worker, resume from the checkpoint, and an evaluator beside the
resumed job.

The legacy venv is built by ``tests/training/install_legacy.sh`` (CI runs it). Without it this
test fails, on purpose: a skipped Estimator tier would look green while testing nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import training_harness as harness

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]

MAX_STEPS = 300
SAVE_STEPS = 50


def legacy_python() -> Path:
    tools = Path(os.environ.get("TRAINJOB_TOOLS_DIR") or Path.home() / ".cache/trainjob-tools")
    python = tools / "legacy-tf215" / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"the TF 2.15 legacy venv is missing ({python}); build it with "
            f"tests/training/install_legacy.sh"
        )
    return python


def _start(
    tmp: Path, data_dir: Path, run: str, ckpt: Path, python: Path, evaluators: int = 0
) -> tuple[dict[str, harness.Replica], Path]:
    # Estimator requires a chief once TF_CONFIG has a cluster; the evaluator is listed in the
    # cluster exactly as Kubeflow (and our core) render it.
    roles = {"chief": 1, "worker": 1, "evaluator": evaluators}
    cluster = harness.cluster_spec(roles)
    progress = tmp / f"{run}.progress.jsonl"
    config = {
        "max_steps": MAX_STEPS,
        "save_checkpoints_steps": SAVE_STEPS,
        "batch_size": 64,
        "data_dir": str(data_dir),
        "progress_every_steps": 10,
        "step_delay_ms": 15,
    }
    replicas = {
        f"{task}-{i}": harness.start(
            f"{run}-{task}-{i}",
            harness.replica_env(
                cluster,
                task,
                i,
                entrypoint="trainjob.samples.mnist_estimator:build",
                config=config,
                checkpoint_dir=ckpt,
                progress_file=progress,
                framework="Estimator",
            ),
            tmp,
            command=[str(python), "-m", "trainjob.runtime", "train"],
        )
        for task, count in roles.items()
        for i in range(count)
    }
    return replicas, progress


def test_two_workers_restart_resume_and_evaluate(tmp_path: Path, mnist_data_dir: Path) -> None:
    python = legacy_python()
    ckpt = tmp_path / "ckpt"
    first, progress1 = _start(tmp_path, mnist_data_dir, "run1", ckpt, python)
    try:
        checkpoint = harness.wait_until(
            lambda: [
                e
                for e in harness.events_of(harness.read_events(progress1), "chief-0", "checkpoint")
                if e["step"] >= 100
            ],
            180,
            "a checkpoint at step >= 100",
            list(first.values()),
        )
        # A lost worker makes Estimator's survivors retry forever (TF 2.15): the executors
        # restart the whole group, which is what happens here.
        first["worker-0"].kill()
        first["chief-0"].signal(signal.SIGTERM)
        codes = harness.wait_exit(list(first.values()), 30)
    finally:
        harness.stop_all(list(first.values()))
    print("run1:", harness.report(list(first.values())))
    assert codes["run1-chief-0"] == 143, "SIGTERM must stop an Estimator task (exit 143)"
    assert checkpoint[-1]["step"] < MAX_STEPS
    saved = sorted(
        int(p.name.split("-")[1].split(".")[0])
        for p in (ckpt / "estimator").glob("model.ckpt-*.index")
    )
    assert saved and saved[-1] % SAVE_STEPS == 0 and saved[-1] < MAX_STEPS

    second, progress2 = _start(tmp_path, mnist_data_dir, "run2", ckpt, python, evaluators=1)
    try:
        codes = harness.wait_exit(list(second.values()), 180)
    finally:
        harness.stop_all(list(second.values()))
    print("run2:", harness.report(list(second.values())))
    assert set(codes.values()) == {0}, harness.dump_logs(list(second.values()))
    events = harness.read_events(progress2)
    for replica in ("chief-0", "worker-0"):
        (start,) = harness.events_of(events, replica, "start")
        assert start["tf_version"].startswith("2.15."), start
        assert start["initial_step"] == saved[-1], "did not resume from the latest checkpoint"
        (end,) = harness.events_of(events, replica, "end")
        assert end["status"] == "succeeded" and end["step"] == MAX_STEPS
    (chief_end,) = harness.events_of(events, "chief-0", "end")
    assert chief_end["checkpoint"].endswith(f"model.ckpt-{MAX_STEPS}")
    assert (Path(chief_end["export"]) / "saved_model.pb").is_file()
    assert len(list((ckpt / "export").iterdir())) == 1, "exported more than once"
    assert not list((ckpt / "estimator").glob("tmp_worker_*"))
    (evaluated,) = harness.events_of(events, "evaluator-0", "end")
    assert evaluated["step"] == MAX_STEPS and evaluated["metrics"]["accuracy"] > 0.5, evaluated


def test_tutorial_model_fn_without_params_trains(tmp_path: Path, mnist_data_dir: Path) -> None:
    """TF's Estimator tutorial writes model_fn(features, labels, mode); no params are passed."""
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="tutorial_entrypoints:estimator_without_params",
        config={"data_dir": str(mnist_data_dir)},
        checkpoint_dir=tmp_path / "ckpt",
        progress_file=tmp_path / "progress.jsonl",
        framework="Estimator",
    )
    env["PYTHONPATH"] = f"{harness.REPO_ROOT}:{Path(__file__).parent}"
    replica = harness.start(
        "worker-0", env, tmp_path, [str(legacy_python()), "-m", "trainjob.runtime", "train"]
    )
    try:
        codes = harness.wait_exit([replica], 180)
    finally:
        harness.stop_all([replica])
    assert codes == {"worker-0": 0}, harness.dump_logs([replica])
    (end,) = harness.events_of(harness.read_events(tmp_path / "progress.jsonl"), "worker-0", "end")
    assert end["step"] == 5


def test_an_s3_checkpoint_dir_is_refused_before_training_with_one_line(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """s3:// is not for Estimator (trainjob.core.storage.framework_problem; the spec's
    validation refuses it first, naming spec.checkpoint.path): a replica given one anyway ends
    at once, before TensorFlow is imported, with exit 2 (InvalidConfig) and one line."""
    python = legacy_python()
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="trainjob.samples.mnist_estimator:build",
        config={"max_steps": 10, "data_dir": str(mnist_data_dir)},
        checkpoint_dir=tmp_path / "unused",
        progress_file=tmp_path / "progress.jsonl",
        framework="Estimator",
    )
    env.pop("TF_CONFIG", None)
    env["TRAINJOB_CHECKPOINT_DIR"] = "s3://ckpt/estimator"
    replica = harness.start(
        "est-s3", env, tmp_path, command=[str(python), "-m", "trainjob.runtime", "train"]
    )
    try:
        codes = harness.wait_exit([replica], 60)
    finally:
        harness.stop_all([replica])
    assert codes == {"est-s3": 2}, replica.log
    lines = [line for line in replica.log.splitlines() if line.strip()]
    assert "s3:// does not work with framework Estimator" in lines[-1], replica.log
    assert "Traceback" not in replica.log
    assert (
        not (tmp_path / "progress.jsonl").exists()
        or "start" not in (tmp_path / "progress.jsonl").read_text()
    )
