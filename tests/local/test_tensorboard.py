"""`trainjob tensorboard` on a local run: a real custom-loop run (`trainjob run` of the
default-strategy loop example) writes its scalars, and a real TensorBoard started by the
command serves them, the same numbers the run reported, while the run trains and after,
until Ctrl-C stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import (
    REPO_ROOT,
    cli_env,
    finish_run,
    read_events,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.local

RUN_TIMEOUT = 240


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def test_tensorboard_serves_a_local_loop_runs_scalars_until_ctrl_c(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    manifest = yaml.safe_load((REPO_ROOT / "examples" / "mnist-loop-default.yaml").read_text())
    manifest["spec"]["runtime"]["config"].update(
        epochs=2, steps_per_epoch=10, progress_every_steps=5
    )
    write_job(tmp_path / "job.yaml", manifest)
    data_dir = tmp_path_factory.mktemp("tfds")
    log = tmp_path / "run.log"
    args = ["-f", "job.yaml", "--data-dir", str(data_dir), "--quiet"]
    code, out = finish_run(start_run(args, tmp_path, log), log, RUN_TIMEOUT)
    assert code == 0, out
    run_dir = tmp_path / "trainjob-runs" / "mnist-loop-default"
    reported = {
        e["epoch"]: e["loss"] for e in read_events(run_dir) if e["event"] == "epoch" and e["chief"]
    }
    assert sorted(reported) == [0, 1], reported

    server = subprocess.Popen(
        [sys.executable, "-m", "trainjob", "tensorboard", "--port", "0"],  # the only run here
        cwd=str(tmp_path),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline()  # the command gives TensorBoard 120 s to start
        assert first.startswith(f"TensorBoard for {run_dir} (logs: {run_dir}/checkpoints): "), first
        url = first.rsplit(": ", 1)[1].strip()
        tags = get_json(f"{url}data/plugin/scalars/tags")
        assert set(tags["tensorboard/progress"]) >= {"epoch_loss", "epoch_accuracy", "batch_loss"}
        query = urllib.parse.urlencode({"run": "tensorboard/progress", "tag": "epoch_loss"})
        points = get_json(f"{url}data/plugin/scalars/scalars?{query}")
        assert {step: round(value, 6) for _, step, value in points} == {
            epoch: round(loss, 6) for epoch, loss in reported.items()
        }
        batches = get_json(
            f"{url}data/plugin/scalars/scalars?"
            + urllib.parse.urlencode({"run": "tensorboard/progress", "tag": "batch_loss"})
        )
        assert [step for _, step, _ in batches] == [5, 10, 15, 20], batches
    finally:
        server.send_signal(signal.SIGINT)
        rest, errors = server.communicate(timeout=60)
    assert server.returncode == 0, errors
    assert rest == "Stopped TensorBoard.\n"
    with pytest.raises(OSError):  # TensorBoard went with it
        urllib.request.urlopen(url, timeout=5)


def _points(url: str, tag: str) -> list[Any]:
    query = urllib.parse.urlencode({"run": "tensorboard/progress", "tag": tag})
    try:
        return list(get_json(f"{url}data/plugin/scalars/scalars?{query}"))
    except urllib.error.HTTPError:  # 400 until TensorBoard has seen the tag
        return []


def test_tensorboard_shows_a_running_jobs_scalars_as_they_come(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Started while the run trains, TensorBoard sees epochs written after it started (the
    chief flushes its summaries at every event)."""
    manifest = yaml.safe_load((REPO_ROOT / "examples" / "mnist-loop-default.yaml").read_text())
    manifest["spec"]["runtime"]["config"].update(epochs=2000, steps_per_epoch=5)
    write_job(tmp_path / "job.yaml", manifest)
    data_dir = tmp_path_factory.mktemp("tfds")
    log = tmp_path / "run.log"
    args = ["-f", "job.yaml", "--data-dir", str(data_dir), "--quiet"]
    run = start_run(args, tmp_path, log)
    run_dir = tmp_path / "trainjob-runs" / "mnist-loop-default"
    server = None
    try:
        wait_until(
            lambda: any(e["event"] == "epoch" for e in read_events(run_dir)),
            RUN_TIMEOUT,
            "the run's first epoch",
            log.read_text,
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "trainjob", "tensorboard", "mnist-loop-default", "--port", "0"],
            cwd=str(tmp_path),
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        url = server.stdout.readline().rsplit(": ", 1)[1].strip()
        first = wait_until(lambda: _points(url, "epoch_loss"), 60, "TensorBoard's first points")
        seen = max(step for _, step, _ in first)
        # TensorBoard reloads every 5 s: epochs trained since then show up while the run goes on.
        later = wait_until(
            lambda: [p for p in _points(url, "epoch_loss") if p[1] > seen], 60, "later epochs"
        )
        assert run.poll() is None, "the run ended before TensorBoard showed it live"
        assert later
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # as Ctrl-C: the run stops its replicas
        code, out = finish_run(run, log, RUN_TIMEOUT)
        if server is not None:
            server.send_signal(signal.SIGINT)
            server.communicate(timeout=60)
    assert code == 130, out
