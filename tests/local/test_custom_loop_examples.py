"""`trainjob run` on the custom-training-loop examples (``trainjob.samples.mnist_loop``): a worker
SIGKILLed mid-epoch costs at most one checkpoint interval; a worker SIGTERMed mid-epoch costs no
step (both workers save at one agreed step); the default-strategy example runs to success."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    REPO_ROOT,
    finish_run,
    read_events,
    read_json,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.training

RUN_TIMEOUT = 240
EVERY = 5  # checkpoint_every_steps in these runs


@pytest.fixture(scope="module")
def data_dir(mnist_data_dir: Path) -> Path:
    """The run's prepared MNIST (tests/conftest.py): these runs are about checkpoints."""
    return mnist_data_dir


def _manifest(name: str, **config: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(yaml.safe_load((REPO_ROOT / "examples" / name).read_text()))
    manifest["spec"]["runtime"]["config"].update(config)
    return dict(manifest)


def _finish(run: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    return finish_run(run, log, RUN_TIMEOUT)


def _attempts(run_dir: Path, replica: str) -> list[list[dict[str, Any]]]:
    """The replica's events split at each `start` (one list per attempt, in order)."""
    attempts: list[list[dict[str, Any]]] = []
    for event in read_events(run_dir):
        if event["replica"] != replica:
            continue
        if event["event"] == "start":
            attempts.append([])
        if attempts:
            attempts[-1].append(event)
    return attempts


def _max_step(events: list[dict[str, Any]]) -> int:
    steps: list[int] = [e["step"] for e in events if e["event"] == "step"]
    return max(steps)


def _interrupt_worker_1(
    tmp_path: Path, data_dir: Path, signum: int, after_step: int
) -> tuple[int, str, Path]:
    """Run the MWMS loop example, send `signum` to worker 1 once worker 0 passed `after_step`."""
    manifest = _manifest(
        "mnist-loop-multiworker.yaml",
        epochs=2,
        steps_per_epoch=20,
        batch_size=32,
        checkpoint_every_steps=EVERY,
        progress_every_steps=1,
        step_delay_ms=150,
    )
    write_job(tmp_path / "job.yaml", manifest)
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir), "--quiet"],
        tmp_path,
        log,
    )
    run_dir = tmp_path / "run"
    wait_until(
        lambda: any(
            e["event"] == "step" and e["replica"] == "worker-0" and e["step"] >= after_step
            for e in read_events(run_dir)
        ),
        RUN_TIMEOUT,
        f"worker 0 past step {after_step}",
        log.read_text,
    )
    os.kill(read_json(run_dir / "processes.json")["worker-1"]["pid"], signum)
    code, out = _finish(run, log)
    return code, out, run_dir


def test_killed_worker_costs_at_most_one_checkpoint_interval(
    tmp_path: Path, data_dir: Path
) -> None:
    code, out, run_dir = _interrupt_worker_1(tmp_path, data_dir, signal.SIGKILL, EVERY + 2)
    assert code == 0, out
    assert "after worker 1 exited with code 137" in out
    first, second = _attempts(run_dir, "worker-0")
    resumed = second[0]["initial_step"]
    saved = [e["step"] for e in first if e["event"] == "checkpoint"]
    lost = _max_step(first) - resumed
    print(f"SIGKILL: reached step {_max_step(first)}, resumed at {resumed}, lost {lost} steps")
    assert resumed == max(saved) and resumed % EVERY == 0
    assert 0 <= lost <= EVERY
    assert second[-1]["event"] == "end" and second[-1]["step"] == 40
    assert (run_dir / "checkpoints" / "export" / "saved_model.pb").is_file()


def test_sigtermed_worker_costs_no_step(tmp_path: Path, data_dir: Path) -> None:
    code, out, run_dir = _interrupt_worker_1(tmp_path, data_dir, signal.SIGTERM, EVERY + 2)
    assert code == 0, out
    assert "exited with code 143" in out
    for replica in ("worker-0", "worker-1"):
        first, second = _attempts(run_dir, replica)
        (saved,) = [e for e in first if e["event"] == "checkpoint" and e.get("reason")]
        lost = _max_step(first) - second[0]["initial_step"]
        print(f"SIGTERM {replica}: saved at step {saved['step']}, lost {lost} steps")
        assert second[0]["initial_step"] == saved["step"] == _max_step(first)
        assert second[-1]["event"] == "end" and second[-1]["step"] == 40
    # Exported once, by the chief; the other worker's copies (checkpoints, export) are gone.
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "export" / "saved_model.pb").is_file()
    assert not list(checkpoints.glob(".tmp-*"))
    assert sorted(p.name for p in (checkpoints / "loop").glob("*.index"))[-1] == "ckpt-40.index"


def test_default_strategy_loop_example_runs_to_success(tmp_path: Path, data_dir: Path) -> None:
    log = tmp_path / "out.log"
    args = ["-f", str(REPO_ROOT / "examples" / "mnist-loop-default.yaml"), "--run-dir", "run"]
    code, out = _finish(
        start_run([*args, "--data-dir", str(data_dir), "--quiet"], tmp_path, log), log
    )
    assert code == 0, out
    assert "TrainJob mnist-loop-default Succeeded" in out
    ends = [e for e in read_events(tmp_path / "run") if e["event"] == "end"]
    assert ends[-1]["step"] == 80 and ends[-1]["export"], ends
