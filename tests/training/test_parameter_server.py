"""ParameterServer: chief (coordinator) + 2 workers + 1 ps train to the end; the servers stop."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import training_harness as harness

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]

EPOCHS = 2
STEPS = 20


def start_ps_job(
    run: str, config: dict[str, object], ckpt: Path, progress: Path, tmp_path: Path
) -> dict[str, harness.Replica]:
    """ps + 2 workers + chief of the ParameterServer sample, servers first; `run` prefixes logs."""
    cluster = harness.cluster_spec({"chief": 1, "ps": 1, "worker": 2})
    return {
        f"{role}-{i}": harness.start(
            f"{run}{role}-{i}",
            harness.replica_env(
                cluster,
                role,
                i,
                entrypoint="trainjob.samples.mnist:build",
                config=config,
                checkpoint_dir=ckpt,
                progress_file=progress,
                strategy="ParameterServer",
            ),
            tmp_path,
        )
        for role, count in (("ps", 1), ("worker", 2), ("chief", 1))
        for i in range(count)
    }


def test_chief_completes_and_servers_stop_on_sigterm(tmp_path: Path, mnist_data_dir: Path) -> None:
    ckpt = tmp_path / "ckpt"
    progress = tmp_path / "progress.jsonl"
    config = {
        "epochs": EPOCHS,
        "steps_per_epoch": STEPS,
        "batch_size": 64,
        "model": "mlp",
        "data_dir": str(mnist_data_dir),
        "progress_every_steps": 10,
    }
    replicas = start_ps_job("", config, ckpt, progress, tmp_path)
    servers = [replicas[n] for n in ("ps-0", "worker-0", "worker-1")]
    try:
        codes = harness.wait_exit([replicas["chief-0"]], 180)
        assert codes == {"chief-0": 0}, harness.dump_logs(list(replicas.values()))
        # Servers never exit by themselves: still running after the chief is done.
        assert all(s.sample() is None for s in servers), harness.dump_logs(servers)
        for server in servers:
            server.signal(signal.SIGTERM)
        stopped = harness.wait_exit(servers, 15)
    finally:
        harness.stop_all(list(replicas.values()))
    print("ps:", harness.report(list(replicas.values())))
    # 143 = 128 + SIGTERM: retryable, and what Kubernetes reports for a TERM'd container.
    assert set(stopped.values()) == {143}
    events = harness.read_events(progress)
    epochs = harness.events_of(events, "chief-0", "epoch")
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS))
    assert epochs[-1]["step"] == EPOCHS * STEPS
    assert all(e["examples_per_sec"] > 0 for e in epochs)
    (end,) = harness.events_of(events, "chief-0", "end")
    assert end["status"] == "succeeded" and end["export"] == str(ckpt / "export")
    assert (ckpt / "export" / "saved_model.pb").is_file()
    for name in ("ps-0", "worker-0", "worker-1"):
        assert harness.events_of(events, name, "start"), f"{name} never started serving"


def test_preempted_chief_saves_and_the_restarted_job_resumes(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    config = {
        "epochs": 3,
        "steps_per_epoch": 20,
        "batch_size": 64,
        "model": "mlp",
        "data_dir": str(mnist_data_dir),
        "progress_every_steps": 5,
        "step_delay_ms": 30,
    }

    def start_job(run: str) -> tuple[dict[str, harness.Replica], Path]:
        progress = tmp_path / f"{run}.progress.jsonl"
        replicas = start_ps_job(f"{run}-", config, ckpt, progress, tmp_path)
        return replicas, progress

    first, progress1 = start_job("run1")
    try:
        harness.wait_until(
            lambda: [
                e
                for e in harness.events_of(harness.read_events(progress1), "chief-0", "step")
                if e["epoch"] >= 1
            ],
            180,
            "a step of epoch 1",
            list(first.values()),
        )
        # Preemption of the whole job: every replica gets SIGTERM, as a node drain would do.
        for replica in first.values():
            replica.signal(signal.SIGTERM)
        codes = harness.wait_exit(list(first.values()), 40)
    finally:
        harness.stop_all(list(first.values()))
    print("ps run1:", harness.report(list(first.values())))
    assert set(codes.values()) == {143}, harness.dump_logs(list(first.values()))
    events1 = harness.read_events(progress1)
    saved = harness.events_of(events1, "chief-0", "checkpoint")
    assert saved and saved[-1].get("reason") == "preempted", saved
    done_epochs = [e["epoch"] for e in harness.events_of(events1, "chief-0", "epoch")]

    second, progress2 = start_job("run2")
    try:
        codes = harness.wait_exit([second["chief-0"]], 180)
    finally:
        harness.stop_all(list(second.values()))
    print("ps run2:", harness.report(list(second.values())))
    assert codes == {"run2-chief-0": 0}, harness.dump_logs(list(second.values()))
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "chief-0", "start")
    # The interrupted epoch is redone (its weights kept); completed epochs are not.
    assert start["initial_epoch"] == max(done_epochs) + 1
    assert start["initial_step"] > start["initial_epoch"] * 20, "the preemption save was lost"
    assert [e["epoch"] for e in harness.events_of(events2, "chief-0", "epoch")] == list(
        range(start["initial_epoch"], 3)
    )
