"""2-worker MultiWorkerMirrored: kill a worker mid-epoch, restart both, resume from the backup."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import training_harness as harness

from trainjob.core import policy

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]

EPOCHS = 4
STEPS = 30


def _start_job(
    tmp: Path, data_dir: Path, run: str, ckpt: Path
) -> tuple[list[harness.Replica], Path]:
    cluster = harness.cluster_spec({"worker": 2})
    progress = tmp / f"{run}.progress.jsonl"
    config = {
        "epochs": EPOCHS,
        "steps_per_epoch": STEPS,
        "batch_size": 64,
        "model": "cnn",
        "data_dir": str(data_dir),
        "progress_every_steps": 5,
        "step_delay_ms": 25,
    }
    replicas = [
        harness.start(
            f"{run}-worker-{i}",
            harness.replica_env(
                cluster,
                "worker",
                i,
                entrypoint="trainjob.samples.mnist:build",
                config=config,
                checkpoint_dir=ckpt,
                progress_file=progress,
                strategy="MultiWorkerMirrored",
            ),
            tmp,
        )
        for i in range(2)
    ]
    return replicas, progress


def test_kill_worker_mid_epoch_then_resume_from_backup(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    first, progress1 = _start_job(tmp_path, mnist_data_dir, "run1", ckpt)
    try:
        # Mid-epoch: the chief has reported steps of epoch 1, after epoch 0 was backed up.
        harness.wait_until(
            lambda: [
                e
                for e in harness.events_of(harness.read_events(progress1), "worker-0", "step")
                if e["epoch"] >= 1
            ],
            180,
            "a step of epoch 1",
            first,
        )
        first[1].kill()
        codes = harness.wait_exit(first, 90)
    finally:
        harness.stop_all(first)
    print("run1:", harness.report(first))
    assert codes["run1-worker-1"] == -signal.SIGKILL
    # The survivor sees its peer gone and exits with a retryable code, not a user error.
    assert policy.retryable_exit_code(codes["run1-worker-0"]), harness.dump_logs(first)
    events1 = harness.read_events(progress1)
    backed_up = [e["epoch"] for e in harness.events_of(events1, "worker-0", "checkpoint")]
    assert backed_up, "no backup was written before the kill"
    assert (
        not harness.events_of(events1, "worker-0", "end")
        or harness.events_of(events1, "worker-0", "end")[0]["status"] != "succeeded"
    )

    second, progress2 = _start_job(tmp_path, mnist_data_dir, "run2", ckpt)
    try:
        codes = harness.wait_exit(second, 180)
    finally:
        harness.stop_all(second)
    print("run2:", harness.report(second))
    assert codes == {"run2-worker-0": 0, "run2-worker-1": 0}, harness.dump_logs(second)

    events2 = harness.read_events(progress2)
    resume_epoch = max(backed_up) + 1
    for replica in ("worker-0", "worker-1"):
        (start,) = harness.events_of(events2, replica, "start")
        assert start["initial_epoch"] == resume_epoch
        assert start["initial_step"] == resume_epoch * STEPS
    epochs = [e["epoch"] for e in harness.events_of(events2, "worker-0", "epoch")]
    assert epochs == list(range(resume_epoch, EPOCHS))
    (end0,) = harness.events_of(events2, "worker-0", "end")
    (end1,) = harness.events_of(events2, "worker-1", "end")
    assert end0["step"] == EPOCHS * STEPS
    # Exported once, by the chief (worker 0): worker 1 saved to scratch and removed it.
    assert end0["export"] == str(ckpt / "export") and end1["export"] is None
    assert (ckpt / "export" / "saved_model.pb").is_file()
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith(".tmp")) == []
    # BackupAndRestore removes its backup once training completed.
    assert not list((ckpt / "backup").glob("**/checkpoint"))


def test_sigterm_to_one_worker_saves_both_at_one_step_and_the_job_resumes_there(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """Keras fit: TF's PreemptionCheckpointHandler, driven by the runtime's stop watcher, makes
    both workers back up at one agreed step (tf-keras enables it only on Google Cloud)."""
    ckpt = tmp_path / "ckpt"
    cluster = harness.cluster_spec({"worker": 2})
    config = {
        "epochs": 3,
        "steps_per_epoch": 10,
        "batch_size": 32,
        "model": "mlp",
        "data_dir": str(mnist_data_dir),
        "progress_every_steps": 1,
        # Slow steps: the handler polls the stop request once a second, then agrees on a step.
        "step_delay_ms": 200,
    }

    def start(run: str, delay_ms: int) -> tuple[list[harness.Replica], Path]:
        progress = tmp_path / f"{run}.progress.jsonl"
        replicas = [
            harness.start(
                f"{run}-worker-{i}",
                harness.replica_env(
                    cluster,
                    "worker",
                    i,
                    entrypoint="trainjob.samples.mnist:build",
                    config={**config, "step_delay_ms": delay_ms},
                    checkpoint_dir=ckpt,
                    progress_file=progress,
                    strategy="MultiWorkerMirrored",
                ),
                tmp_path,
            )
            for i in range(2)
        ]
        return replicas, progress

    first, progress1 = start("run1", 200)
    try:
        harness.wait_until(
            lambda: [
                e
                for e in harness.events_of(harness.read_events(progress1), "worker-0", "step")
                if e["step"] >= 13
            ],
            180,
            "step 13",
            first,
        )
        first[1].signal(signal.SIGTERM)
        codes = harness.wait_exit(first, 60)
    finally:
        harness.stop_all(first)
    assert codes == {"run1-worker-0": 143, "run1-worker-1": 143}, harness.dump_logs(first)
    events1 = harness.read_events(progress1)
    saves = {
        name: [e["step"] for e in harness.events_of(events1, name, "checkpoint") if e.get("reason")]
        for name in ("worker-0", "worker-1")
    }
    (saved,) = saves["worker-0"]
    assert saves["worker-1"] == [saved], saves
    reported = max(e["step"] for e in harness.events_of(events1, "worker-0", "step"))
    # The save is taken at the step boundary after the last step that ran.
    assert saved >= reported > 13 - 1

    second, progress2 = start("run2", 0)
    try:
        codes = harness.wait_exit(second, 180)
    finally:
        harness.stop_all(second)
    print(f"Keras MWMS SIGTERM: saved at step {saved}; {harness.report(first + second)}")
    assert codes == {"run2-worker-0": 0, "run2-worker-1": 0}, harness.dump_logs(second)
    events2 = harness.read_events(progress2)
    for name in ("worker-0", "worker-1"):
        (start_event,) = harness.events_of(events2, name, "start")
        assert start_event["initial_step"] == saved, start_event
        (end,) = harness.events_of(events2, name, "end")
        assert end["step"] == 30
