"""Custom training loops (``LoopTrainSpec``) under every strategy, with real processes:
SIGTERM saves at the next step boundary and the rerun resumes at that exact step; under
ParameterServer a killed worker's steps are retried by the coordinator. MultiWorkerMirrored
(kill and SIGTERM of one worker) runs through `trainjob run` in
tests/local/test_custom_loop_examples.py."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from tests.support.processes import all_threads_stopped

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]

ENTRYPOINT = "trainjob.samples.mnist_loop:build"


def _config(data_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "epochs": 2,
        "steps_per_epoch": 10,
        "batch_size": 32,
        "data_dir": str(data_dir),
        "progress_every_steps": 1,
        **extra,
    }


def _start(
    tmp: Path,
    run: str,
    roles: dict[str, int],
    config: dict[str, Any],
    ckpt: Path,
    strategy: str,
    cluster: dict[str, list[str]] | None = None,
) -> tuple[dict[str, harness.Replica], Path]:
    cluster = harness.cluster_spec(roles) if cluster is None else cluster
    progress = tmp / f"{run}.progress.jsonl"
    replicas = {
        f"{role}-{i}": harness.start(
            f"{run}-{role}-{i}",
            harness.replica_env(
                cluster if sum(roles.values()) > 1 else {},
                role,
                i,
                entrypoint=ENTRYPOINT,
                config=config,
                checkpoint_dir=ckpt,
                progress_file=progress,
                strategy=strategy,
            ),
            tmp,
        )
        for role in ("ps", "worker", "chief")
        for i in range(roles.get(role, 0))
    }
    return replicas, progress


def _steps(events: list[dict[str, Any]], replica: str) -> list[int]:
    return [e["step"] for e in harness.events_of(events, replica, "step")]


def _wait_step(progress: Path, replica: str, step: int, replicas: list[harness.Replica]) -> None:
    harness.wait_until(
        lambda: any(s >= step for s in _steps(harness.read_events(progress), replica)),
        180,
        f"{replica} at step {step}",
        replicas,
    )


@pytest.mark.parametrize("strategy", ["Auto", "OneDevice", "Mirrored"])
def test_sigterm_saves_at_the_step_boundary_and_the_rerun_resumes_there(
    tmp_path: Path, mnist_data_dir: Path, strategy: str
) -> None:
    ckpt = tmp_path / "ckpt"
    config = _config(mnist_data_dir, step_delay_ms=20)
    first, progress1 = _start(tmp_path, "run1", {"worker": 1}, config, ckpt, strategy)
    replicas = list(first.values())
    try:
        _wait_step(progress1, "worker-0", 13, replicas)
        first["worker-0"].signal(signal.SIGTERM)
        codes = harness.wait_exit(replicas, 60)
    finally:
        harness.stop_all(replicas)
    assert codes == {"run1-worker-0": 143}, harness.dump_logs(replicas)
    events1 = harness.read_events(progress1)
    (saved,) = [e for e in harness.events_of(events1, "worker-0", "checkpoint") if e.get("reason")]
    # Saved after the last step it ran: nothing is lost.
    assert saved["step"] == max(_steps(events1, "worker-0")) >= 13
    assert saved["reason"] == "preempted"

    second, progress2 = _start(tmp_path, "run2", {"worker": 1}, config, ckpt, strategy)
    try:
        codes = harness.wait_exit(list(second.values()), 120)
    finally:
        harness.stop_all(list(second.values()))
    print(f"{strategy}: lost steps 0; {harness.report(replicas + list(second.values()))}")
    assert codes == {"run2-worker-0": 0}, harness.dump_logs(list(second.values()))
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "worker-0", "start")
    assert (start["initial_step"], start["initial_epoch"]) == (saved["step"], 1)
    assert _steps(events2, "worker-0") == list(range(saved["step"] + 1, 21))
    (end,) = harness.events_of(events2, "worker-0", "end")
    assert end["step"] == 20 and end["export"] == str(ckpt / "export")
    assert (ckpt / "export" / "saved_model.pb").is_file()
    (epoch,) = harness.events_of(events2, "worker-0", "epoch")
    assert epoch["examples_per_sec"] > 0 and 0 <= epoch["metrics"]["accuracy"] <= 1


def test_parameter_server_coordinator_survives_a_killed_worker_and_resumes_after_sigterm(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    roles = {"chief": 1, "ps": 1, "worker": 2}
    config = _config(mnist_data_dir, epochs=3, step_delay_ms=30, server_stop_delay_seconds=3)
    first, progress1 = _start(tmp_path, "run1", roles, config, ckpt, "ParameterServer")
    replicas = list(first.values())
    try:
        _wait_step(progress1, "chief-0", 5, replicas)
        first["worker-1"].kill()
        # The coordinator retries the lost worker's steps on worker 0 and goes on.
        _wait_step(progress1, "chief-0", 15, replicas)
        for replica in replicas:
            replica.signal(signal.SIGTERM)
        codes = harness.wait_exit(replicas, 60)
    finally:
        harness.stop_all(replicas)
    assert codes["run1-chief-0"] == 143, harness.dump_logs(replicas)
    events1 = harness.read_events(progress1)
    (saved,) = [e for e in harness.events_of(events1, "chief-0", "checkpoint") if e.get("reason")]
    assert saved["step"] == max(_steps(events1, "chief-0")) >= 15

    second, progress2 = _start(tmp_path, "run2", roles, config, ckpt, "ParameterServer")
    replicas2 = list(second.values())
    try:
        codes = harness.wait_exit([second["chief-0"]], 180)
    finally:
        harness.stop_all(replicas2)
    print("PS:", harness.report(replicas + replicas2))
    assert codes == {"run2-chief-0": 0}, harness.dump_logs(replicas2)
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "chief-0", "start")
    assert start["initial_step"] == saved["step"]
    (end,) = harness.events_of(events2, "chief-0", "end")
    assert end["step"] == 30 and end["export"] == str(ckpt / "export")
    assert (ckpt / "export" / "saved_model.pb").is_file()


def _latest_complete(loop_dir: Path) -> int:
    """The step the CheckpointManager's state file points at; its files must all be there."""
    state = (loop_dir / "checkpoint").read_text()
    name = state.split('model_checkpoint_path: "', 1)[1].split('"', 1)[0]
    assert (loop_dir / f"{name}.index").is_file(), state
    assert list(loop_dir.glob(f"{name}.data-*")), state
    return int(name.rsplit("-", 1)[1])


def _torn(loop_dir: Path) -> set[str]:
    """What an interrupted save leaves: its `_temp` files, a half-written state file."""
    return {p.name for p in loop_dir.glob("*") if "_temp" in p.name or ".tmp" in p.name}


def _kill_during_a_save(replica: harness.Replica, loop_dir: Path, rng: random.Random) -> int:
    """SIGKILL the replica at a seeded random point of one of its saves; the number of saves
    it let go by. At that point the process is frozen (SIGSTOP) and its save's `_temp` files
    are looked for: still there, the save is under way and the kill tears it; gone, the save
    ended first, and the process goes on (SIGCONT) to its next save. So every kill hits a
    save however fast this machine saves, rather than by chance."""
    missed, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        before = _torn(loop_dir)
        while not _torn(loop_dir) - before and time.monotonic() < deadline:
            time.sleep(0.0005)  # a save lasts milliseconds: poll that finely
        time.sleep(rng.uniform(0.0, 0.003))  # the seeded random point of the save
        replica.signal(signal.SIGSTOP)
        harness.wait_until(
            lambda: all_threads_stopped(replica.process.pid), 10, "frozen", [replica]
        )
        if _torn(loop_dir) - before:
            replica.kill()
            return missed
        missed += 1
        replica.signal(signal.SIGCONT)
    raise AssertionError(f"no save was caught under way in 60 s ({missed} ended first)")


@pytest.mark.timeout(600)
def test_a_process_killed_during_checkpoint_saves_resumes_from_the_last_complete_one(
    tmp_path: Path,
) -> None:
    """10 seeded SIGKILLs, each at a random point of a save (the process frozen a few
    milliseconds after the save's `_temp` files appeared, and killed only if they are still
    there; the loop saves after every step): every restart restores the checkpoint the state
    file names, with the state of that very step, never a torn one."""
    ckpt = tmp_path / "ckpt"
    loop_dir = ckpt / "loop"
    total = 300
    config = {"steps_per_epoch": total, "progress_every_steps": 1}
    env_extra = {"PYTHONPATH": f"{harness.REPO_ROOT}:{Path(__file__).parent}"}

    def start(run: str) -> tuple[harness.Replica, Path]:
        progress = tmp_path / f"{run}.progress.jsonl"
        env = harness.replica_env(
            {},
            "worker",
            0,
            entrypoint="tutorial_entrypoints:counter_loop",
            config=config,
            checkpoint_dir=ckpt,
            progress_file=progress,
        )
        return harness.start(run, {**env, **env_extra}, tmp_path), progress

    def consistent(events: list[dict[str, Any]]) -> None:
        # The counter restored with step N holds N: the checkpoint was whole.
        for event in harness.events_of(events, "worker-0", "step"):
            assert event["metrics"]["w"] == event["step"], event

    expected_start, lost, missed, torn_kills = 0, [], [], 0
    for seed in range(10):
        rng = random.Random(seed)
        replica, progress = start(f"kill{seed}")
        try:
            _wait_step(progress, "worker-0", expected_start + rng.randint(1, 5), [replica])
            before = _torn(loop_dir)
            missed.append(_kill_during_a_save(replica, loop_dir, rng))
        finally:
            harness.stop_all([replica])
        events = harness.read_events(progress)
        (start_event,) = harness.events_of(events, "worker-0", "start")
        assert start_event["initial_step"] == expected_start, (seed, start_event)
        consistent(events)
        torn_kills += bool(_torn(loop_dir) - before)
        expected_start = _latest_complete(loop_dir)
        lost.append(max(_steps(events, "worker-0")) - expected_start)
    replica, progress = start("final")
    try:
        codes = harness.wait_exit([replica], 180)
    finally:
        harness.stop_all([replica])
    print(
        f"kills during saves: {torn_kills}/10 left a save's files; lost steps per kill {lost};"
        f" saves that ended before the freeze, per kill {missed}"
    )
    assert codes == {"final": 0}, harness.dump_logs([replica])
    events = harness.read_events(progress)
    (start_event,) = harness.events_of(events, "worker-0", "start")
    assert start_event["initial_step"] == expected_start
    consistent(events)
    assert harness.events_of(events, "worker-0", "end")[0]["step"] == total
    assert torn_kills == 10, "a kill left no save's files: it did not tear a checkpoint"


def test_parameter_server_sample_of_unbatched_scalars_runs_to_the_end(tmp_path: Path) -> None:
    """TensorFlow's ParameterServer sample (`Dataset.range(1, 6)` unbatched, a Variable
    summing each element) under a real coordinator, one ps and one worker."""
    roles = {"chief": 1, "ps": 1, "worker": 1}
    cluster = harness.cluster_spec(roles)
    progress = tmp_path / "progress.jsonl"
    replicas = []
    for role in ("ps", "worker", "chief"):
        env = harness.replica_env(
            cluster,
            role,
            0,
            entrypoint="tutorial_entrypoints:scalar_sum_loop",
            config={"server_stop_delay_seconds": 1},
            checkpoint_dir=tmp_path / "ckpt",
            progress_file=progress,
            strategy="ParameterServer",
        )
        env["PYTHONPATH"] = f"{harness.REPO_ROOT}:{Path(__file__).parent}"
        replicas.append(harness.start(f"scalars-{role}-0", env, tmp_path))
    try:
        codes = harness.wait_exit([replicas[-1]], 180)
    finally:
        harness.stop_all(replicas)
    assert codes == {"scalars-chief-0": 0}, harness.dump_logs(replicas)
    events = harness.read_events(progress)
    epochs = harness.events_of(events, "chief-0", "epoch")
    assert [e["step"] for e in epochs] == [5], events
    # One worker runs the scheduled steps in order: 1 + 2 + 3 + 4 + 5.
    assert epochs[0]["metrics"]["total"] == 15.0, epochs
    assert all(e["examples_per_sec"] > 0 for e in epochs), epochs


def test_the_gpu_path_runs_two_multi_worker_mirrored_workers_to_the_end(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """``loss_check: at_reports`` (what a GPU gets): logs reduced at reports only, examples and
    the NaN flag kept in variables; two workers still agree on every report and count the job's
    examples (32 per step over both workers, the host path's number)."""
    config = _config(mnist_data_dir, loss_check="at_reports", progress_every_steps=5)
    replicas, progress = _start(
        tmp_path,
        "gpupath",
        {"worker": 2},
        config,
        tmp_path / "ckpt",
        "MultiWorkerMirrored",
    )
    try:
        codes = harness.wait_exit(list(replicas.values()), 180)
    finally:
        harness.stop_all(list(replicas.values()))
    assert set(codes.values()) == {0}, harness.dump_logs(list(replicas.values()))
    events = harness.read_events(progress)
    assert _steps(events, "worker-0") == [5, 10, 15, 20], events
    epochs = harness.events_of(events, "worker-0", "epoch")
    assert [e["step"] for e in epochs] == [10, 20], epochs
    assert all(isinstance(e["loss"], float) for e in epochs), epochs
    assert all(e["examples_per_sec"] > 0 for e in epochs), epochs
    ends = harness.events_of(events, "worker-1", "end")
    assert ends and ends[-1]["step"] == 20, events
