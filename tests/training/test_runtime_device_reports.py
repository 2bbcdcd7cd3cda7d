"""The devices a real replica trains on reach its progress reports: the reporting replica's
event lines (what local mode shows) and its final report in the termination message (what the
operator reads when the job ends between two reports) say them (CPU machine: no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import training_harness as harness

from trainjob.core import constants, progress_events, termination

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

CONFIG = {"nan_at_step": 0, "epochs": 1, "steps_per_epoch": 2, "progress_every_steps": 1}


def test_the_reporting_replicas_reports_say_it_trains_on_its_cpu(tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    message.write_text("")
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="trainjob.samples.diverge:build",
        config=CONFIG,
        checkpoint_dir=tmp_path / "ckpt",
        progress_file=tmp_path / "progress.jsonl",
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
    assert result.returncode == 0, result.stderr
    events = [e for e in map(progress_events.parse_line, result.stdout.splitlines()) if e]
    start = next(e for e in events if e["event"] == "start")
    said = progress_events.devices_of(start)
    assert said is not None and said.gpus == 0, start
    # From the start event on, every report of worker 0 (the reporting replica) carries them.
    after = events[events.index(start) :]
    assert all(e["progress"]["devices"]["gpus"] == 0 for e in after), after
    final = termination.read(message.read_text()).report
    assert final is not None and final.devices == said, message.read_text()
