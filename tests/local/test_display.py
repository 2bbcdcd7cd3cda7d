"""Display (pure): progress folding, lines, the live table, the summary and exit codes."""

from __future__ import annotations

import datetime

import pytest

from trainjob.core import spec
from trainjob.core import status as st
from trainjob.local import display

from .conftest import job_manifest

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
JOB = spec.parse(
    job_manifest(
        "mnist",
        {"worker": {"replicas": 2, "restartPolicy": "ExitCode"}},
        image="img",
        runtime={
            "entrypoint": "trainjob.samples.mnist:build",
            "config": {"epochs": 3, "steps_per_epoch": 40},
        },
    )
)


def test_fold_keeps_the_latest_known_numbers() -> None:
    p = display.fold(None, {"event": "start", "epoch": 1, "step": 40, "initial_step": 40})
    p = display.fold(
        p, {"event": "epoch", "epoch": 1, "step": 80, "loss": 0.5, "examples_per_sec": 1234.5}
    )
    p = display.fold(p, {"event": "checkpoint", "epoch": 1, "step": 80, "loss": None})
    assert (p.epoch, p.step, p.loss, p.examples_per_sec, p.initial_step) == (1, 80, 0.5, 1234.5, 40)
    assert display.progress_text(p, JOB) == "epoch 2/3 step 80/120 loss 0.5000 1,234 ex/s"


def test_event_lines_for_plain_output() -> None:
    key = ("worker", 0)
    assert display.event_line(key, {"event": "start", "initial_step": 40}, JOB) == (
        "[worker-0] progress: resumed at step 40"
    )
    line = display.event_line(
        key, {"event": "end", "status": "succeeded", "export": "/r/export", "step": 120}, JOB
    )
    assert line == "[worker-0] progress: ended (succeeded), model at /r/export step 120/120"


def test_prefix_lines_align() -> None:
    width = display.prefix_width([("worker", 0), ("ps", 0)])
    assert display.prefix_line(("ps", 0), "hello\n", width) == "ps-0     | hello"


def test_table_shows_state_attempt_exit_and_progress() -> None:
    status = st.JobStatus(restart_count=1)
    rows = [
        display.ReplicaRow(("worker", 0), "Running", 1, None, 42),
        display.ReplicaRow(("worker", 1), "Failed", 0, 137, None),
    ]
    lines = display.table(JOB, status, rows, {("worker", 0): display.ReplicaProgress(step=3)}, 65.0)
    assert lines[0] == "TrainJob mnist: Pending  1m05s  restarts 1/6"
    assert lines[1] == "  worker-0 Running    attempt 1 pid 42  step 3/120"
    assert lines[2] == "  worker-1 Failed     attempt 0 exit 137"
    redraw = display.redraw(3, lines, ["log"])
    assert redraw.startswith("\x1b[3A\r\x1b[2Klog\n")


def _summary(status: st.JobStatus, interrupted: str | None = None) -> display.Summary:
    return display.Summary(
        JOB,
        status,
        interrupted,
        12.0,
        "/r",
        "/r/logs",
        "/r/checkpoints",
        "/r/checkpoints/export",
        {},
    )


def test_summary_and_exit_code_of_a_failed_job() -> None:
    status = st.JobStatus(
        conditions=(
            st.Condition(st.FAILED, True, "ReplicaFailed", "worker 0 exited with code 3", NOW),
        ),
        replicas={("worker", 0): st.ReplicaRecord(0, st.STATE_FAILED, 3)},
        restart_count=0,
    )
    summary = _summary(status)
    text = display.summary_text(summary)
    assert "TrainJob mnist Failed after 12.0s" in text
    assert "ReplicaFailed: worker 0 exited with code 3" in text
    assert "worker-0=3 (Failed, attempt 0)" in text
    assert "restarts:   0 (backoffLimit 6)" in text
    assert display.exit_code_of(summary) == 1


def test_exit_codes() -> None:
    succeeded = st.JobStatus(conditions=(st.Condition(st.SUCCEEDED, True, "r", "m", NOW),))
    assert display.exit_code_of(_summary(succeeded)) == 0
    assert display.exit_code_of(_summary(st.JobStatus(), "SIGINT")) == 130
    assert display.exit_code_of(_summary(st.JobStatus(), "SIGTERM")) == 143
    assert "Run the same command again" in display.summary_text(_summary(st.JobStatus(), "SIGINT"))
