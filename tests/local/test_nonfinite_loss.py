"""`trainjob run` of a job whose loss becomes NaN (``trainjob.samples.diverge``): it ends Failed
with reason NonFiniteLoss, the replica's line in the summary and exit code 1, from the same
policy as the operator; with ``stop_on_nonfinite_loss: false`` it trains on and succeeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import cli_env, job_manifest, read_json, write_job

pytestmark = pytest.mark.training

RUN_TIMEOUT = 180
NAN_LINE = "NonFiniteLossError: loss became nan at step 7 (epoch 1)"


# Replica counts -> the strategy Auto picks: one worker (default strategy), two workers
# (MultiWorkerMirrored: both see the NaN at the same step), ParameterServer (the chief checks
# the loss where it fetches the logs: progress_every_steps 1 here).
LAYOUTS = {
    "one-worker": {"worker": 1},
    "multiworker-mirrored": {"worker": 2},
    "parameter-server": {"chief": 1, "ps": 1, "worker": 1},
}


def _run_diverging(tmp_path: Path, roles: dict[str, int], **config: Any) -> tuple[int, str]:
    runtime = {
        "entrypoint": "trainjob.samples.diverge:build",
        # A data_dir of its own: the sample makes its inputs up, no MNIST to prepare.
        "config": {
            "nan_at_step": 7,
            "epochs": 2,
            "steps_per_epoch": 5,
            "data_dir": str(tmp_path / "data"),
            "progress_every_steps": 1,
            **config,
        },
    }
    replicas = {
        role: {"replicas": count, "restartPolicy": "ExitCode"} for role, count in roles.items()
    }
    write_job(tmp_path / "job.yaml", job_manifest("diverge", replicas, runtime=runtime))
    result = subprocess.run(
        [sys.executable, "-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"],
        cwd=str(tmp_path),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_nan_loss_fails_the_run_with_its_reason_and_line(tmp_path: Path, layout: str) -> None:
    roles = LAYOUTS[layout]
    code, text = _run_diverging(tmp_path, roles)
    assert code == 1, text
    assert "TrainJob diverge Failed" in text, text
    trainer = "chief" if "chief" in roles else "worker"
    assert f"  reason:     NonFiniteLoss: {trainer} " in text, text
    assert "exited with code 6; restartPolicy ExitCode does not retry it" in text, text
    assert f": {NAN_LINE}" in text, text  # the summary's cause line, from the replica's log
    assert "Traceback" not in text, text
    saved = read_json(tmp_path / "run" / "status.json")
    assert saved["state"] == "Failed", saved


def test_the_opt_out_lets_the_run_succeed(tmp_path: Path) -> None:
    code, text = _run_diverging(tmp_path, LAYOUTS["one-worker"], stop_on_nonfinite_loss=False)
    assert code == 0, text
    assert "TrainJob diverge Succeeded" in text, text
    assert "NonFiniteLoss" not in text, text
