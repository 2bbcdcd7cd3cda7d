"""`trainjob run` of a MultiWorkerMirrored job whose worker 0 is killed: worker 0 hosts the job's
coordination service, so every other worker's TensorFlow preemption watcher loses it at once.
The run says why it failed (worker 0's exit), and the survivor's log says what its watcher saw
in one line, never with a thread's traceback (the same thread died when a NaN that every worker
saw ended worker 0 a moment sooner than worker 1)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from .conftest import (
    finish_run,
    job_manifest,
    read_events,
    read_json,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.training

RUN_TIMEOUT = 180
WATCHER_LINE = (
    "TensorFlow's preemption watcher (PeerTerminationWatcher-1) stopped: the job's coordination "
    "service is gone (UnavailableError: "
)


def test_a_killed_coordination_host_leaves_its_peer_one_line_not_a_thread_traceback(
    tmp_path: Path,
) -> None:
    runtime = {
        "entrypoint": "trainjob.samples.diverge:build",
        # Long enough to be killed mid-training; made-up inputs, no dataset to prepare.
        "config": {
            "nan_at_step": 0,
            "epochs": 400,
            "steps_per_epoch": 50,
            "data_dir": str(tmp_path / "data"),
            "progress_every_steps": 10,
        },
    }
    replicas = {"worker": {"replicas": 2, "restartPolicy": "Never"}}
    write_job(tmp_path / "job.yaml", job_manifest("peer", replicas, runtime=runtime))
    log = tmp_path / "out.log"
    run = start_run(["-f", "job.yaml", "--run-dir", "run"], tmp_path, log)
    run_dir = tmp_path / "run"
    wait_until(
        lambda: any(e["event"] == "checkpoint" for e in read_events(run_dir)),
        RUN_TIMEOUT,
        "the first checkpoint (the watchers are up)",
        log.read_text,
    )
    os.kill(read_json(run_dir / "processes.json")["worker-0"]["pid"], signal.SIGKILL)
    code, out = finish_run(run, log, RUN_TIMEOUT)
    assert code == 1, out
    reason = "ReplicaFailed: worker 0 exited with code 137; restartPolicy Never does not retry it"
    assert reason in out, out
    # Its log ends in progress lines, after TensorFlow's start-up noise: the exit code says why.
    assert "! worker-0 exited with code 137: killed by SIGKILL (log: " in out, out
    survivor = (run_dir / "logs" / "worker-1.log").read_text()
    assert "Exception in thread PeerTerminationWatcher" not in survivor, survivor
    assert WATCHER_LINE in survivor, survivor
