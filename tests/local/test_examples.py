"""`trainjob run` with real TensorFlow replicas on loopback (MultiWorkerMirrored, tf-keras).

Each test is one or two complete distributed jobs of a few dozen steps (20-60 s on 2 cores)."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    REPO_ROOT,
    finish_run,
    group_alive,
    read_events,
    read_json,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.training

EXAMPLE = REPO_ROOT / "examples" / "mnist-multiworker.yaml"
RUN_TIMEOUT = 240


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tfds data dir per session; the first `trainjob run` prepares MNIST there."""
    return tmp_path_factory.mktemp("tfds")


def _example(**config: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    manifest["spec"]["runtime"]["config"].update(config)
    return dict(manifest)


def _finish(run: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    return finish_run(run, log, RUN_TIMEOUT)


def _starts(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir) if e["event"] == "start"]


def test_multiworker_example_runs_to_success(tmp_path: Path, data_dir: Path) -> None:
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", str(EXAMPLE), "--run-dir", "run", "--data-dir", str(data_dir)], tmp_path, log
    )
    code, out = _finish(run, log)
    assert code == 0, out
    assert "TrainJob mnist-multiworker Succeeded" in out
    assert "progress:   100% (3/3)  step 120/120  loss " in out
    assert (tmp_path / "run" / "checkpoints" / "export" / "saved_model.pb").exists()
    assert "[worker-0] progress: epoch 3/3 step 120/120" in out
    # status.json holds every replica's devices, as the operator's status does.
    progress = read_json(tmp_path / "run" / "status.json")["progress"]
    assert set(progress["replicaDevices"]) == {"worker-0", "worker-1"}, progress
    assert progress["deviceSummary"] == "CPU", progress


def test_killed_worker_restarts_and_resumes_from_the_checkpoint(
    tmp_path: Path, data_dir: Path
) -> None:
    write_job(tmp_path / "job.yaml", _example(epochs=3, steps_per_epoch=20, step_delay_ms=100))
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir)], tmp_path, log
    )
    run_dir = tmp_path / "run"
    wait_until(
        lambda: any(e["event"] == "checkpoint" for e in read_events(run_dir)),
        RUN_TIMEOUT,
        "the first checkpoint",
        log.read_text,
    )
    victim = read_json(run_dir / "processes.json")["worker-1"]["pid"]
    os.kill(victim, signal.SIGKILL)
    code, out = _finish(run, log)
    assert code == 0, out
    assert "Restarting worker 0, worker 1 after worker 1 exited with code 137" in out
    assert "restarts:   1 (backoffLimit 3)" in out
    resumed = [e for e in _starts(run_dir) if e["initial_step"]]
    assert resumed, _starts(run_dir)
    assert all(e["initial_step"] >= 20 for e in resumed)
    assert "attempt 1 started" in (run_dir / "logs" / "worker-1.log").read_text()


def test_permanent_user_error_fails_without_restarts(tmp_path: Path, data_dir: Path) -> None:
    manifest = _example()
    manifest["spec"]["runtime"]["entrypoint"] = "trainjob.samples.mnist:no_such_function"
    write_job(tmp_path / "job.yaml", manifest)
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir)], tmp_path, log
    )
    code, out = _finish(run, log)
    assert code == 1, out
    assert "exited with code 3; restartPolicy ExitCode does not retry it" in out
    assert "restarts:   0" in out
    assert "=3 (Failed, attempt 0)" in out


def test_sigint_leaves_no_process_and_a_second_run_resumes(tmp_path: Path, data_dir: Path) -> None:
    write_job(tmp_path / "job.yaml", _example(epochs=3, steps_per_epoch=20, step_delay_ms=100))
    args = ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir)]
    run_dir = tmp_path / "run"
    log = tmp_path / "first.log"
    run = start_run(args, tmp_path, log)
    wait_until(
        lambda: any(e["event"] == "checkpoint" for e in read_events(run_dir)),
        RUN_TIMEOUT,
        "the first checkpoint",
        log.read_text,
    )
    run.send_signal(signal.SIGINT)
    code, out = _finish(run, log)
    assert code == 130, out
    assert "Interrupted" in out
    # Stopping is expected: one line per replica, no traceback, and a true word on resuming.
    assert "Traceback" not in out and "Preempted" not in out, out
    assert "Run the same command again to resume from the checkpoint" in out
    assert read_json(run_dir / "status.json")["state"] == "Interrupted"
    for info in read_json(run_dir / "processes.json").values():
        assert group_alive(info["pid"]) == [], out

    log2 = tmp_path / "second.log"
    code, out2 = _finish(start_run(args, tmp_path, log2), log2)
    assert code == 0, out2
    second_starts = [e for e in _starts(run_dir) if e["initial_step"]]
    assert second_starts, _starts(run_dir)


def _run_example(name: str, tmp_path: Path, data_dir: Path) -> tuple[int, str]:
    """`trainjob run -f examples/NAME --quiet` to its end: (exit code, output)."""
    log = tmp_path / "out.log"
    args = ["-f", str(REPO_ROOT / "examples" / name), "--run-dir", "run"]
    run = start_run([*args, "--data-dir", str(data_dir), "--quiet"], tmp_path, log)
    return _finish(run, log)


def test_parameter_server_example_runs_to_success_and_stops_ps(
    tmp_path: Path, data_dir: Path
) -> None:
    code, out = _run_example("mnist-parameter-server.yaml", tmp_path, data_dir)
    assert code == 0, out
    assert "TrainJob mnist-parameter-server Succeeded" in out
    assert "ps-0=- (Stopped, attempt 0)" in out
    assert "[ps-0] progress: stopped" in out and "ended (Preempted)" not in out, out
    for info in read_json(tmp_path / "run" / "processes.json").values():
        assert group_alive(info["pid"]) == [], out


def test_dtensor_example_runs_to_success(tmp_path: Path, data_dir: Path) -> None:
    code, out = _run_example("mnist-dtensor.yaml", tmp_path, data_dir)
    assert code == 0, out
    assert "TrainJob mnist-dtensor Succeeded" in out
    # Worker 0 decides success; worker 1 may still be finishing and is then stopped.
    assert "worker-0=0 (Succeeded, attempt 0)" in out
    ends = [e for e in read_events(tmp_path / "run") if e["event"] == "end"]
    assert any(e["replica"] == "worker-0" and e["step"] == 60 for e in ends), ends


def test_custom_command_example_runs_its_own_script(tmp_path: Path, data_dir: Path) -> None:
    code, out = _run_example("custom-command.yaml", tmp_path, data_dir)
    assert code == 0, out
    assert "TrainJob custom-command Succeeded" in out
    assert "chief-0=0 (Succeeded, attempt 0)" in out
    assert "chief-0 trained: loss" in (tmp_path / "run" / "logs" / "chief-0.log").read_text()


def legacy_python() -> Path:
    """The TF 2.15 venv (tests/training/install_legacy.sh): Estimator exists only there."""
    tools = Path(os.environ.get("TRAINJOB_TOOLS_DIR", Path.home() / ".cache" / "trainjob-tools"))
    python = tools / "legacy-tf215" / "bin" / "python"
    assert python.exists(), (
        f"the TF 2.15 legacy venv is missing ({python}); build it with "
        "tests/training/install_legacy.sh"
    )
    return python


def test_estimator_example_runs_to_success_on_the_legacy_tf(tmp_path: Path) -> None:
    example = REPO_ROOT / "examples" / "mnist-estimator.yaml"
    log = tmp_path / "out.log"
    with open(log, "wb") as out_file:
        run = subprocess.Popen(
            [
                str(legacy_python()),
                "-m",
                "trainjob",
                "run",
                "-f",
                str(example),
                "--run-dir",
                "run",
                "--data-dir",
                str(tmp_path / "tfds"),
                "--quiet",
            ],
            cwd=str(tmp_path),
            stdout=out_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    code, out = _finish(run, log)
    assert code == 0, out
    assert "TrainJob mnist-estimator Succeeded" in out
    assert "chief-0=0 (Succeeded" in out
    # With a progress report the summary shows it; without one, the last step seen.
    assert re.search(r"steps:      200\n|progress: .*(step 200\b|\(200/200\))", out), out
    exports = list((tmp_path / "run" / "checkpoints" / "export").glob("*/saved_model.pb"))
    assert len(exports) == 1, out
