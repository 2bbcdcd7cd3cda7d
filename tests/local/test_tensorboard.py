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


def _points(url: str, tag: str) -> list[Any]:
    query = urllib.parse.urlencode({"run": "tensorboard/progress", "tag": tag})
    try:
        return list(get_json(f"{url}data/plugin/scalars/scalars?{query}"))
    except urllib.error.HTTPError:  # 400 until TensorBoard has seen the tag
        return []


def test_tensorboard_shows_a_running_jobs_scalars_as_they_come_and_the_same_numbers_after(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    """Started while the run trains, TensorBoard sees epochs written after it started (the
    chief flushes its summaries at every event); once the run is stopped it still serves
    them, the very numbers the run reported, until Ctrl-C stops it too. One run and one
    TensorBoard for both (each a TensorFlow start-up: two tests with one each took 190 s
    on CI's slowest machine)."""
    manifest = yaml.safe_load((REPO_ROOT / "examples" / "mnist-loop-default.yaml").read_text())
    manifest["spec"]["runtime"]["config"].update(
        epochs=2000, steps_per_epoch=10, progress_every_steps=5
    )
    write_job(tmp_path / "job.yaml", manifest)
    log = tmp_path / "run.log"
    args = ["-f", "job.yaml", "--data-dir", str(mnist_data_dir), "--quiet"]
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
            [sys.executable, "-m", "trainjob", "tensorboard", "--port", "0"],  # the only run
            cwd=str(tmp_path),
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        first = server.stdout.readline()  # the command gives TensorBoard 120 s to start
        assert first.startswith(f"TensorBoard for {run_dir} (logs: {run_dir}/checkpoints): "), first
        url = first.rsplit(": ", 1)[1].strip()
        shown = wait_until(lambda: _points(url, "epoch_loss"), 60, "TensorBoard's first points")
        seen = max(step for _, step, _ in shown)
        # TensorBoard reloads every 5 s: epochs trained since then show up while the run goes on.
        later = wait_until(
            lambda: [p for p in _points(url, "epoch_loss") if p[1] > seen], 60, "later epochs"
        )
        assert run.poll() is None, "the run ended before TensorBoard showed it live"
        assert later
        tags = get_json(f"{url}data/plugin/scalars/tags")
        assert set(tags["tensorboard/progress"]) >= {"epoch_loss", "epoch_accuracy", "batch_loss"}
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # as Ctrl-C: the run stops its replicas
        code, out = finish_run(run, log, RUN_TIMEOUT)
        if server is not None and code != 130:
            server.send_signal(signal.SIGINT)
            server.communicate(timeout=60)
    assert code == 130, out
    assert server is not None
    try:
        events = [e for e in read_events(run_dir) if e["chief"]]
        epochs = {e["epoch"]: round(e["loss"], 6) for e in events if e["event"] == "epoch"}
        steps = {e["step"]: round(e["loss"], 6) for e in events if e["event"] == "step"}
        assert len(epochs) >= 2 and steps, events[-3:]

        def served(tag: str) -> dict[int, float]:
            return {step: round(value, 6) for _, step, value in _points(url, tag)}

        # The run's own numbers, once TensorBoard has reloaded. The summary is written just
        # after the event line, so a run stopped between the two has one point fewer: the
        # last reported one, never another, and never a different value.
        def matches(tag: str, reported: dict[int, float]) -> dict[int, float] | None:
            points = served(tag)
            kept = dict(reported)
            if max(reported) not in points:
                del kept[max(reported)]
            return points if points == kept else None

        wait_until(lambda: matches("epoch_loss", epochs), 60, f"epoch_loss = {epochs}")
        wait_until(lambda: matches("batch_loss", steps), 60, f"batch_loss = {steps}")
        assert all(step % 5 == 0 for step in steps), steps  # every progress_every_steps
    finally:
        server.send_signal(signal.SIGINT)
        rest, errors = server.communicate(timeout=60)
    assert server.returncode == 0, errors
    assert rest == "Stopped TensorBoard.\n"
    with pytest.raises(OSError):  # TensorBoard went with it
        urllib.request.urlopen(url, timeout=5)
