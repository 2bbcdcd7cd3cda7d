"""A loss that becomes NaN stops a real ``trainjob train`` process with exit code 6 and one
plain line (Keras fit and a custom loop), unless ``stop_on_nonfinite_loss: false``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from trainjob.core import constants, termination
from trainjob.core import progress_events as progress
from trainjob.runtime import exitcodes
from trainjob.runtime.exitcodes import FailureKind

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

# 2 epochs of 5 steps; step 7's batch is NaN: the second epoch's (epoch 1) second step.
CONFIG = {"nan_at_step": 7, "epochs": 2, "steps_per_epoch": 5, "progress_every_steps": 1}
NAN_LINE = "NonFiniteLossError: loss became nan at step 7 (epoch 1)"


def _train(
    tmp: Path, entrypoint: str, config: dict[str, Any]
) -> tuple[int, list[dict[str, Any]], str, str]:
    """(exit code, progress events, stderr, termination message) of one lone replica."""
    message = tmp / "termination-log"
    message.write_text("")
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint=entrypoint,
        config=config,
        checkpoint_dir=tmp / "ckpt",
        progress_file=tmp / "progress.jsonl",
    )
    env[constants.ENV_TERMINATION_MESSAGE_PATH] = str(message)
    result = subprocess.run(
        [sys.executable, *constants.DEFAULT_RUNTIME_COMMAND[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    events = [e for e in map(progress.parse_line, result.stdout.splitlines()) if e]
    return result.returncode, events, result.stderr, message.read_text()


@pytest.mark.parametrize(
    ("entrypoint", "every", "check"),
    [
        ("build", 1, "auto"),
        ("build", 0, "auto"),
        ("build_loop", 1, "auto"),
        # The GPU path, run on the CPU: host reads at reports only; the custom loop's on-device
        # flag still names the NaN step by its own number, at a step event or the epoch's end.
        ("build", 1, "at_reports"),
        ("build_loop", 1, "at_reports"),
        ("build_loop", 0, "at_reports"),
    ],
    # fit checks a step's loss at once where a step event fetches the logs, else one step late.
    ids=[
        "fit-step-events",
        "fit-no-step-events",
        "custom-loop",
        "fit-at-reports",
        "custom-loop-device-flag",
        "custom-loop-device-flag-at-epoch-end",
    ],
)
def test_a_nan_loss_stops_the_replica_with_exit_6_and_its_line(
    tmp_path: Path, entrypoint: str, every: int, check: str
) -> None:
    config = dict(CONFIG, progress_every_steps=every, loss_check=check)
    code, events, err, message = _train(tmp_path, f"trainjob.samples.diverge:{entrypoint}", config)
    assert code == exitcodes.exit_code(FailureKind.NON_FINITE_LOSS) == 6, err
    steps = [e["step"] for e in events if e["event"] == "step"]
    if every:
        assert steps and max(steps) < 7, events  # at once: no step event after the bad one
    else:
        assert steps == [], events
    # Named by its own step either way (the epoch event of the first epoch came before it).
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [0], events
    assert events[-1]["event"] == "end" and events[-1]["status"] == "NonFiniteLoss", events
    # The log ends with the plain line (local mode quotes it), no traceback to read.
    assert err.strip().splitlines()[-1] == NAN_LINE, err
    assert "Traceback" not in err, err
    # The termination message carries it: the job's Failed condition quotes it.
    assert termination.read(message).cause == NAN_LINE, message


def test_the_opt_out_trains_on_to_the_end(tmp_path: Path) -> None:
    config = dict(CONFIG, stop_on_nonfinite_loss=False)
    code, events, err, _ = _train(tmp_path, "trainjob.samples.diverge:build", config)
    assert code == 0, err
    end = events[-1]
    assert end["event"] == "end" and end["step"] == 10, events
    # It did diverge and went on: from step 7 each step's loss is NaN (null in the events).
    losses = {e["step"]: e["loss"] for e in events if e["event"] == "step"}
    assert sorted(losses) == list(range(1, 11)), events
    assert all(isinstance(losses[s], float) for s in range(1, 7)), losses
    assert all(losses[s] is None for s in range(7, 11)), losses
    assert NAN_LINE not in err


def test_fit_on_the_gpu_path_without_step_events_stops_at_the_epoch_end(tmp_path: Path) -> None:
    """Keras' loss is the epoch's running mean: once NaN it stays NaN, so the check at the
    epoch's end catches it, named by the step it was read at."""
    config = dict(CONFIG, progress_every_steps=0, loss_check="at_reports")
    code, _events, err, _ = _train(tmp_path, "trainjob.samples.diverge:build", config)
    assert code == 6, err
    assert err.strip().splitlines()[-1] == (
        "NonFiniteLossError: loss became nan at step 10 (epoch 1)"
    ), err
