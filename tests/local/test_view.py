"""Local mode's pure modules: progress folding (replica_progress), the live table at every width
and the summary (view), noise filtering and failure causes (logfilter), exit codes and the status
after a stop (outcome), and `trainjob status` rendering (runs)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import time

import pytest

from trainjob.console import logfilter, outcome, terminal, view
from trainjob.console.replica_progress import ReplicaProgress, fold
from trainjob.core import policy, spec
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.local import runs

from .conftest import job_manifest

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
JOB = spec.parse(
    job_manifest(
        "mnist-multiworker",
        {
            "chief": {"replicas": 1},
            "worker": {"replicas": 2, "restartPolicy": "ExitCode"},
            "ps": {"replicas": 1},
        },
        image="img",
        runtime={
            "entrypoint": "trainjob.samples.mnist:build",
            "config": {"epochs": 3, "steps_per_epoch": 40},
        },
    )
)
ROWS = [
    view.ReplicaRow(("chief", 0), "Running", 1, None, 123456),
    view.ReplicaRow(("worker", 0), "Running", 1, None, 42),
    view.ReplicaRow(("worker", 1), "Failed", 0, 137, None),
    view.ReplicaRow(("ps", 0), "", 0, None, None),
]
PROGRESS = {
    ("chief", 0): ReplicaProgress(epoch=2, step=80, loss=0.42104, examples_per_sec=1234.5),
    ("worker", 0): ReplicaProgress(epoch=2, step=80, loss=0.421, examples_per_sec=1200),
}
TIMER = core_progress.StepTimer().observe(40, 0.0).observe(80, 10.0)


def _table(width: int, height: int = 40, status: st.JobStatus | None = None) -> list[str]:
    snapshot = view.Snapshot(
        JOB, status or st.JobStatus(restart_count=1), ROWS, PROGRESS, 65.0, timer=TIMER
    )
    return _lines(snapshot, width, height)


def _lines(snapshot: view.Snapshot, width: int, height: int) -> list[str]:
    segments = view.table_segments(snapshot, width=width, height=height)
    return [view.render_segments(line, color=False) for line in segments]


def test_fold_keeps_the_latest_known_numbers() -> None:
    p = fold(None, {"event": "start", "epoch": 1, "step": 40, "initial_step": 40})
    p = fold(p, {"event": "epoch", "epoch": 1, "step": 80, "loss": 0.5, "examples_per_sec": 1234.5})
    p = fold(p, {"event": "checkpoint", "epoch": 1, "step": 80, "loss": None})
    assert (p.epoch, p.step, p.loss, p.examples_per_sec, p.initial_step) == (2, 80, 0.5, 1234.5, 40)
    assert view.progress_text(p, JOB) == "epoch 2/3 step 80/120 loss 0.5000 1,234 ex/s"


def test_event_lines_for_plain_output() -> None:
    key = ("worker", 0)
    assert view.event_line(key, {"event": "start", "initial_step": 40}, JOB) == (
        "[worker-0] progress: resumed at step 40"
    )
    line = view.event_line(
        key, {"event": "end", "status": "succeeded", "export": "/r/export", "step": 120}, JOB
    )
    assert line == "[worker-0] progress: ended (succeeded), model at /r/export step 120/120"
    # A replica trainjob stopped itself (Ctrl-C, end of job) is stopped, not "Preempted".
    stopped = view.event_line(
        ("ps", 0), {"event": "end", "status": "Preempted", "step": 7}, JOB, stopped=True
    )
    assert stopped == "[ps-0] progress: stopped step 7/120"


def test_on_a_terminal_the_lead_replica_keeps_one_line_per_epoch() -> None:
    epoch = {"event": "epoch", "epoch": 0, "step": 40}
    assert view.keeps_line(("chief", 0), epoch, JOB)
    assert not view.keeps_line(("worker", 0), epoch, JOB)  # the chief speaks for this job
    assert not view.keeps_line(("chief", 0), {"event": "step", "step": 3}, JOB)
    no_chief = spec.parse(job_manifest("w", {"worker": {"replicas": 2}}, image="i"))
    assert view.keeps_line(("worker", 0), epoch, no_chief)


def test_prefix_lines_align_and_cannot_move_the_cursor() -> None:
    width = view.prefix_width([("worker", 0), ("ps", 0)])
    assert view.prefix_line(("ps", 0), "hello\n", width) == "ps-0     | hello"
    # A Keras progress bar redraws with \r; escape sequences would move the cursor under the
    # live table: only what a terminal would leave visible is kept.
    bar = " 1/40 [>....] - ETA: 3s\r 2/40 [=>...] - ETA: 2s\r"
    assert view.prefix_line(("ps", 0), bar, width) == "ps-0     |  2/40 [=>...] - ETA: 2s"
    assert logfilter.terminal_safe("\x1b[31mred\x1b[0m\x1b[2A\x07 ok\tx") == "red ok  x"
    colored = view.prefix_line(("ps", 0), "hi", width, color=True, style="36")
    assert colored == "\x1b[36mps-0     |\x1b[0m hi"


@pytest.mark.parametrize("width", [20, 40, 60, 80, 120, 200])
def test_every_table_line_fits_the_terminal(width: int) -> None:
    lines = _table(width)
    assert len(lines) == 5  # the job line and one per replica
    assert all(len(line) <= width - 1 for line in lines), lines
    assert lines[0].startswith("TrainJob mnist-mul")
    assert lines[3].startswith("  worker-1"[: width - 1])


def test_the_table_drops_the_least_useful_columns_first() -> None:
    wide = _table(200)
    assert wide[0] == (
        "TrainJob mnist-multiworker  Pending  1m05s  step 80/120 (66%)  ETA 10.0s  restarts 1/6"
    )
    assert wide[1] == (
        "  chief-0   Running             epoch 2/3  step 80/120  loss 0.4210  1,234 ex/s"
        "  attempt 1  pid 123456"
    )
    assert wide[3] == "  worker-1  Failed    exit 137" + " " * 51 + "attempt 0"
    at_80 = _table(80)
    assert "pid" not in "".join(at_80) and "attempt" not in "".join(at_80)
    assert (
        at_80[1]
        == "  chief-0   Running             epoch 2/3  step 80/120  loss 0.4210  1,234 ex/s"
    )
    # restarts happened: they stay on the job line, the elapsed time goes first
    assert (
        at_80[0]
        == "TrainJob mnist-multiworker  Pending  step 80/120 (66%)  ETA 10.0s  restarts 1/6"
    )
    at_60 = _table(60)
    assert at_60[1] == "  chief-0   Running             step 80/120  loss 0.4210"
    assert at_60[3] == "  worker-1  Failed    exit 137"


def test_a_table_taller_than_the_terminal_sums_up_the_rest() -> None:
    lines = _table(80, height=4)
    assert len(lines) == 3  # height - 1: the cursor can always go back to the first line
    assert lines[1].split()[:2] == ["worker-1", "Failed"]  # not running: shown first
    assert lines[2] == "  … 3 more replicas: 2 Running, 1 Starting"


def test_a_thousand_replicas_render_fast_and_fit() -> None:
    job = spec.parse(
        job_manifest("big", {"worker": {"replicas": 1000}, "ps": {"replicas": 2}}, image="i")
    )
    rows = [
        view.ReplicaRow(key, "Running", 0, None, 1000 + i)
        for i, key in enumerate(job.replica_keys())
    ]
    progress = {key: ReplicaProgress(step=5, loss=0.1) for key in job.replica_keys()}
    started = time.perf_counter()
    for _ in range(10):
        lines = _lines(view.Snapshot(job, st.JobStatus(), rows, progress, 3.0), 80, 24)
    per_frame = (time.perf_counter() - started) / 10
    assert per_frame < 0.05, per_frame  # redrawn twice a second at most
    assert len(lines) == 23
    assert lines[-1] == "  … 981 more replicas: 981 Running"


def test_redraw_goes_back_to_the_first_line_and_clears_everything_below() -> None:
    clear_below = "\x1b[K\x1b[2G\x1b[J\r"  # this row, then the rest from its 2nd column
    text = view.redraw(3, ["table"], ["a log line far wider than the terminal " * 5])
    # one clear for all rows before the log lines, wrapped ones included
    assert text.startswith("\x1b[3A\r" + clear_below)
    assert text.endswith("\ntable\x1b[K\n" + clear_below)
    # no log lines: each table line is written over the old one, then erased to its end
    assert view.redraw(2, ["t", "u"], []) == "\x1b[2A\rt\x1b[K\nu\x1b[K\n" + clear_below
    assert view.redraw(2, [], []) == "\x1b[2A\r" + clear_below  # erased: the summary follows


def test_redraw_never_clears_from_the_top_left_cell() -> None:
    """tmux (scroll-on-clear) and GNU screen push the whole screen into the scrollback when
    asked to erase below the top-left cell: the table may start there, so no erase-below may
    ever come right after the cursor was put in the first column."""
    for text in (
        view.redraw(3, ["table"], ["log"]),
        view.redraw(0, ["t"], []),
        view.redraw(2, [], []),
        view.redraw(5, ["a", "b"], []),
    ):
        for at in range(len(text)):
            if text.startswith("\x1b[J", at):
                assert text[:at].endswith("\x1b[2G"), repr(text)
            assert not text.startswith("\x1b[2J", at) and not text.startswith("\x1b[H", at)


def test_drawn_height_follows_a_terminal_made_narrower() -> None:
    assert view.drawn_height([79, 40, 10], 80) == 3
    assert view.drawn_height([79, 40, 10], 60) == 4  # the 79-column line re-wraps
    assert view.drawn_height([0], 60) == 1


def test_rewrap_extra_counts_the_rows_a_narrower_terminal_adds() -> None:
    assert view.rewrap_extra([98, 86, 19], 120) == 2  # 98 and 86 re-wrap at 60 columns
    assert view.rewrap_extra([98, 86, 19], 120, narrowest=40) == 4
    assert view.rewrap_extra([59, 59], 120) == 0
    assert view.rewrap_extra([59, 40], 60) == 0  # already that narrow


def test_headroom_keeps_rows_above_a_table_for_a_narrower_terminal() -> None:
    # Nothing known above a 120-column table whose 2 wide lines re-wrap at 60: 2 blank rows.
    assert view.headroom_rows(0, [98, 86, 19], 120, 30) == 2
    assert view.headroom_rows(1, [98, 86, 19], 120, 30) == 1  # a log line counts
    assert view.headroom_rows(5, [98, 86, 19], 120, 30) == 0
    assert view.headroom_rows(0, [59, 40], 120, 30) == 0  # nothing would re-wrap
    assert view.headroom_rows(0, [98, 86, 19], 60, 30) == 0
    # Never more than the window has room for: a 5-row window holds a 3-line table and 1 row.
    assert view.headroom_rows(0, [98, 86, 19], 120, 5) == 1
    assert view.headroom_rows(0, [98] * 29, 120, 30) == 0


def test_rows_above_follow_what_tmux_does_on_a_resize() -> None:
    table, logs = [98, 86, 19], [150, 10]
    # Narrower: the rows the table gains leave from above it.
    assert view.rows_above_after_resize(5, table, logs, (120, 30), (60, 30)) == 3
    assert view.rows_above_after_resize(1, table, logs, (120, 30), (60, 30)) == 0
    # Wider: the log line that wrapped joins again (one row fewer above).
    assert view.rows_above_after_resize(5, table, logs, (120, 30), (200, 30)) == 4
    # Shorter: at worst the rows taken off come from the top.
    assert view.rows_above_after_resize(5, table, logs, (120, 30), (120, 27)) == 2
    assert view.rows_above_after_resize(5, table, logs, (120, 30), (120, 40)) == 5


def test_the_terminal_prints_headroom_once_and_again_after_a_narrowing() -> None:
    sizes = [(120, 30)]
    out = io.StringIO()
    screen = terminal.Terminal(out, tty=True, color=False, size=lambda: sizes[-1])
    snapshot = view.Snapshot(JOB, st.JobStatus(restart_count=1), ROWS, PROGRESS, 65.0)
    widths = [len(view.plain(line)) for line in view.table_segments(snapshot, width=120)]
    wanted = view.rewrap_extra(widths, 120)
    assert wanted > 0

    def blank_rows() -> int:
        """Blank rows the last draw printed: the old table is cleared, then come newlines."""
        text = out.getvalue().split("\r", 1)[1]
        out.seek(0)
        out.truncate()
        if not text.startswith(view.ANSI_CLEAR_BELOW):
            return 0
        rest = text[len(view.ANSI_CLEAR_BELOW) :]
        return len(rest) - len(rest.lstrip("\n"))

    screen.draw(lambda: snapshot, force=True)
    assert blank_rows() == wanted
    screen.draw(lambda: snapshot, force=True)
    assert blank_rows() == 0  # they stay above the table
    sizes.append((60, 30))  # tmux moved them into its scrollback
    screen.draw(lambda: snapshot, force=True)
    assert blank_rows() == 0  # nothing at 60 columns re-wraps any more
    sizes.append((120, 30))
    screen.draw(lambda: snapshot, force=True)
    assert blank_rows() == wanted


def test_visible_width_leaves_out_styles() -> None:
    assert view.visible_width("\x1b[36mps-0 |\x1b[0m hi") == len("ps-0 | hi")


REAL_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795439295.226345   18621 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1795439303.967021   18621 cuda_platform.cc:52] failed call to cuInit: INTERNAL:"
    " CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "2026-11-23 13:08:25,466 INFO tensorflow Enabled multi-worker collective ops with available"
    " devices: ['/job:worker/replica:0/task:1/device:CPU:0']",
    "2026-11-23 13:08:28,694 INFO tensorflow Collective all_reduce tensors: 8 all_reduces, "
    "num_devices = 1, group_size = 2, implementation = CommunicationImplementation.AUTO",
    "2026-11-23 13:08:27,092 INFO absl Load dataset info from /tmp/i14/tfds/mnist/3.0.1",
    "INFO:tensorflow:Using MirroredStrategy with devices ('/job:worker/task:0/device:CPU:0',)",
    "2026-11-23 13:02:27.443295: I tensorflow/core/util/port.cc:153] oneDNN custom operations",
]
USER_LINES = [
    "Epoch 1/3",
    "ValueError: Shapes (None, 10) and (None, 1) are incompatible",
    "2026-11-23 13:08:25,466 ERROR trainjob.runtime.entry Replica worker-0 failed",
    "2026-11-23 13:08:25,466 WARNING tensorflow Your input ran out of data",
    "E1123 13:08:25.466000 1 grpc_server_lib.cc:1] Could not start gRPC server",
    "my own line mentioning tensorflow",
]


def test_tensorflow_noise_is_recognised_and_user_lines_are_not() -> None:
    assert [line for line in REAL_NOISE if not logfilter.is_noise(line)] == []
    assert [line for line in USER_LINES if logfilter.is_noise(line)] == []


def test_filter_hides_noise_unless_verbose_and_folds_a_stop_we_asked_for() -> None:
    state = logfilter.FilterState()
    assert logfilter.filter_line(REAL_NOISE[0], state, verbose=False, stopping=False)[0] is None
    assert (
        logfilter.filter_line(REAL_NOISE[0], state, verbose=True, stopping=False)[0]
        == (REAL_NOISE[0])
    )
    lines = [
        "2026-11-23 13:09:01,000 ERROR trainjob.runtime.entry Replica worker-1 failed "
        "(Preempted, exit 143): Traceback (most recent call last):",
        '  File "/x/keras_runner.py", line 98, in on_train_batch_end',
        "    raise Preempted(f'signal {stop.signum} received')",
        "trainjob.runtime.exitcodes.Preempted: signal 15 received during epoch 1",
        "",
        "2026-11-23 13:09:02,000 INFO trainjob.runtime.entry Saved",
    ]
    shown = []
    for line in lines:
        text, state = logfilter.filter_line(line, state, verbose=False, stopping=True)
        if text is not None:
            shown.append(text)
    assert shown == ["stopped (exit 143)", lines[-1]]


def test_protobuf_text_that_goes_on_a_hidden_record_is_hidden_too() -> None:
    lines = [
        "2026-11-23 13:09:46,643 INFO absl Enabling collectives with server_def: cluster {",
        "  job {",
        '    name: "worker"',
        "    tasks {",
        "      key: 0",
        '      value: "127.0.0.1:44563"',
        "    }",
        "  }",
        "}",
        'protocol: "grpc"',
        "",
        "Epoch 1/2",
        "  indented user text",
    ]
    state = logfilter.FilterState()
    shown = []
    for line in lines:
        text, state = logfilter.filter_line(line, state, verbose=False, stopping=False)
        if text is not None:
            shown.append(text)
    assert shown == ["Epoch 1/2", "  indented user text"]


def test_the_last_exception_line_is_the_cause() -> None:
    log = "\n".join(
        [
            "=== trainjob: job-worker-0 attempt 0 started 2026-01-01T00:00:00Z",
            REAL_NOISE[2],
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "ValueError: learning rate must be positive, got -1",
            "",
        ]
    )
    assert logfilter.last_exception_line(log) == (
        "ValueError: learning rate must be positive, got -1"
    )
    grpc = "E1123 13:08:25.466 1 server.cc:1] Could not start gRPC server\n"
    assert logfilter.last_exception_line(grpc) == grpc.strip()
    assert logfilter.last_exception_line("all good\n") is None


def test_tensorflows_noise_is_never_a_cause() -> None:
    # What a replica SIGKILLed mid-training leaves on a CPU machine: its start-up noise (one
    # line at error level, "CUDA error"), then progress lines. Its exit code says why.
    log = "\n".join(
        ["=== trainjob: job-worker-0 attempt 0 started 2026-01-01T00:00:00Z", *REAL_NOISE]
    )
    assert logfilter.last_exception_line(log) is None
    cause = outcome.Cause("worker-0", logfilter.last_exception_line(log), "logs/worker-0.log")
    assert view.exit_line(cause, 137) == (
        "! worker-0 exited with code 137: killed by SIGKILL (log: logs/worker-0.log)"
    )


def test_a_failing_replica_gets_one_line_with_its_cause() -> None:
    cause = outcome.Cause("worker-1", "ValueError: bad", "/r/logs/worker-1.log")
    assert view.exit_line(cause, 1) == (
        "! worker-1 exited with code 1: ValueError: bad (log: /r/logs/worker-1.log)"
    )
    killed = outcome.Cause("worker-1", None, "/l")
    assert (
        view.exit_line(killed, 137)
        == "! worker-1 exited with code 137: killed by SIGKILL (log: /l)"
    )
    assert (
        view.exit_line(killed, 3)
        == "! worker-1 exited with code 3: (no exception in its log) (log: /l)"
    )
    assert outcome.killed_by(139) == "killed by SIGSEGV"
    assert outcome.killed_by(1) is None and outcome.killed_by(None) is None


def test_eta_from_the_rate_seen_since_the_attempt_started() -> None:
    assert TIMER.eta(80, 120) == pytest.approx(10.0)
    assert core_progress.StepTimer().observe(80, 0.0).eta(80, 120) is None
    assert TIMER.eta(80, None) is None


def _summary(
    status: st.JobStatus,
    interrupted: str | None = None,
    *,
    causes: tuple[outcome.Cause, ...] = (),
    has_checkpoint: bool = False,
) -> outcome.Summary:
    return outcome.Summary(
        JOB,
        status,
        interrupted,
        12.0,
        "/r",
        "/r/logs",
        "/r/checkpoints",
        "/r/checkpoints/export",
        {},
        causes=causes,
        has_checkpoint=has_checkpoint,
    )


def test_summary_of_a_failed_job_quotes_the_cause_and_the_log() -> None:
    status = st.JobStatus(
        conditions=(
            st.Condition(st.FAILED, True, "ReplicaFailed", "worker 0 exited with code 1", NOW),
        ),
        replicas={
            ("worker", 0): st.ReplicaRecord(0, st.STATE_FAILED, 1),
            ("worker", 1): st.ReplicaRecord(0, st.STATE_FAILED, 143),
        },
    )
    assert outcome.failed_replicas(status, JOB) == [("worker", 0)]
    cause = outcome.Cause("worker-0", "ValueError: bad shape", "/r/logs/worker-0.log")
    summary = _summary(status, causes=(cause,))
    text = view.summary_text(summary)
    assert "TrainJob mnist-multiworker Failed after 12.0s" in text
    assert "ReplicaFailed: worker 0 exited with code 1" in text
    assert "  cause:      worker-0: ValueError: bad shape\n" in text
    assert "full log: /r/logs/worker-0.log" in text
    assert "worker-0=1 (Failed, attempt 0)" in text
    assert outcome.command_exit_code(summary) == 1


def test_exit_codes_and_the_word_about_resuming() -> None:
    succeeded = st.JobStatus(conditions=(st.Condition(st.SUCCEEDED, True, "r", "m", NOW),))
    assert outcome.command_exit_code(_summary(succeeded)) == 0
    assert outcome.command_exit_code(_summary(st.JobStatus(), "SIGINT")) == 130
    assert outcome.command_exit_code(_summary(st.JobStatus(), "SIGTERM")) == 143
    assert outcome.command_exit_code(_summary(st.JobStatus(), "SIGHUP")) == 129
    assert outcome.command_exit_code(_summary(st.JobStatus(), "SIGPIPE")) == 141
    assert (
        outcome.command_exit_code(dataclasses.replace(_summary(st.JobStatus()), problem="x")) == 2
    )
    with_checkpoint = view.summary_text(_summary(st.JobStatus(), "SIGINT", has_checkpoint=True))
    assert "Run the same command again to resume from the checkpoint" in with_checkpoint
    without = view.summary_text(_summary(st.JobStatus(), "SIGINT"))
    assert "resume" not in without and "No checkpoint was written yet" in without


def test_stopped_status_is_true_after_an_interruption() -> None:
    status = st.JobStatus(
        conditions=(st.Condition(st.RUNNING, True, "Running", "running", NOW),),
        replicas={
            ("worker", 0): st.ReplicaRecord(0, st.STATE_RUNNING),
            ("worker", 1): st.ReplicaRecord(0, st.STATE_SUCCEEDED, 0),
        },
    )
    stopped = outcome.stopped_status(status, {("worker", 0): 143, ("worker", 1): 0}, "SIGINT", NOW)
    assert stopped.record(("worker", 0)) == st.ReplicaRecord(
        0, st.STATE_STOPPED, 143, "Interrupted"
    )
    assert stopped.record(("worker", 1)).state == st.STATE_SUCCEEDED
    assert not stopped.is_true(st.RUNNING)
    assert stopped.condition(st.RUNNING).reason == "Interrupted"  # type: ignore[union-attr]
    text = view.summary_text(_summary(stopped, "SIGINT"))
    assert "worker-0=143 (Stopped, attempt 0)" in text


def test_engine_events_are_marked() -> None:
    warning = policy.Event("Warning", "Restarting", "worker 1 exited 137")
    assert view.engine_event_line(warning) == "! Restarting: worker 1 exited 137"


def test_status_of_a_run_nobody_holds_is_unknown_not_running() -> None:
    data = {
        "jobName": "mnist",
        "state": "Running",
        "ready": "2/2",
        "restartCount": 0,
        "replicaStatuses": {
            "worker": {"indexes": [{"index": 0, "attempt": 0, "state": "Running"}]}
        },
    }
    held = runs.RunEntry("/runs/mnist", data, 4242)
    assert runs.effective_state(held) == "Running"
    assert runs.status_lines(held)[0] == "TrainJob mnist: Running (trainjob run pid 4242)"
    lost = runs.RunEntry("/runs/mnist", data, None)
    lines = runs.status_lines(lost)
    assert lines[0] == "TrainJob mnist: Unknown"
    assert "no trainjob run holds this run dir" in lines[2]
    assert lines[-1].split() == ["worker-0", "Running", "0", "-"]
    assert runs.status_data(lost)["state"] == "Unknown"
    assert runs.last_step('{"step": 3}\n{"step": 40, "event": "epoch"}\n{"st') == 40
    assert runs.last_step("") is None
    stepped = runs.RunEntry("/runs/mnist", data, 4242, 40)
    assert "  step:       40" in runs.status_lines(stepped)
    assert runs.status_data(stepped)["step"] == 40
    done = runs.RunEntry("/runs/b", {"state": "Succeeded", "ready": "0/2"}, None)
    table = runs.runs_table([held, done])
    assert table[0].split() == ["NAME", "STATE", "READY", "RESTARTS", "COMPLETED", "RUN", "DIR"]
    assert table[2].split()[:2] == ["b", "Succeeded"]
