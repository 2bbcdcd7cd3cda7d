"""What local mode shows (pure): replica log prefixes, progress lines, the live table, the summary.

Every function takes plain data and returns strings; the executor decides where they go (a TTY
gets the live table redrawn below the logs, anything else gets one plain line per event).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import policy, spec
from trainjob.core import status as st

ReplicaKey = tuple[str, int]

ANSI_CLEAR_LINE: Final = "\x1b[2K"
ANSI_UP: Final = "\x1b[{n}A"


@dataclasses.dataclass(frozen=True)
class ReplicaProgress:
    """The latest progress event numbers of one replica (from TRAINJOB_PROGRESS lines)."""

    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    examples_per_sec: float | None = None
    checkpoint: str | None = None
    export: str | None = None
    initial_step: int | None = None
    end_status: str | None = None


def label(key: ReplicaKey) -> str:
    return f"{key[0]}-{key[1]}"


def fold(current: ReplicaProgress | None, event: Mapping[str, Any]) -> ReplicaProgress:
    """Update one replica's progress with one event; unknown or null fields keep old values."""
    base = current or ReplicaProgress()
    kind = event.get("event")
    changes: dict[str, Any] = {}
    for name in ("epoch", "step", "loss", "examples_per_sec", "checkpoint", "export"):
        value = event.get(name)
        if value is not None:
            changes[name] = value
    if kind == "start":
        changes["initial_step"] = event.get("initial_step")
        changes["end_status"] = None
    if kind == "end":
        changes["end_status"] = event.get("status")
    return dataclasses.replace(base, **changes)


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def planned_totals(job: spec.TrainJob) -> tuple[int | None, int | None]:
    """(epochs, total steps) from the runtime config when it states them: `epochs` x
    `steps_per_epoch` (Keras), else `steps` or `max_steps` (custom loops, Estimator)."""
    if job.runtime is None:
        return None, None
    config = job.runtime.config

    def number(key: str) -> int | None:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    epochs_n, per_epoch = number("epochs"), number("steps_per_epoch")
    if epochs_n is not None and per_epoch is not None:
        return epochs_n, epochs_n * per_epoch
    return epochs_n, number("steps") or number("max_steps")


def progress_text(progress: ReplicaProgress | None, job: spec.TrainJob) -> str:
    """`epoch 2/3 step 80/120 loss 0.4210 1,234 ex/s` (fields unknown yet are left out)."""
    if progress is None:
        return ""
    epochs, total = planned_totals(job)
    parts: list[str] = []
    if progress.epoch is not None:
        parts.append(f"epoch {progress.epoch + 1}" + (f"/{epochs}" if epochs else ""))
    if progress.step is not None:
        parts.append(f"step {progress.step}" + (f"/{total}" if total else ""))
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if progress.examples_per_sec is not None:
        parts.append(f"{progress.examples_per_sec:,.0f} ex/s")
    return " ".join(parts)


def event_line(key: ReplicaKey, event: Mapping[str, Any], job: spec.TrainJob) -> str:
    """One plain line for a progress event (non-TTY output)."""
    kind = event.get("event")
    progress = fold(None, event)
    text = progress_text(progress, job)
    if kind == "start":
        step = event.get("initial_step") or 0
        detail = f"resumed at step {step}" if step else "started training"
        return f"[{label(key)}] progress: {detail}"
    if kind == "checkpoint":
        return f"[{label(key)}] progress: checkpoint at step {event.get('step')}"
    if kind == "end":
        export = f", model at {event['export']}" if event.get("export") else ""
        return f"[{label(key)}] progress: ended ({event.get('status')}){export} {text}".rstrip()
    return f"[{label(key)}] progress: {text}"


def prefix_line(key: ReplicaKey, line: str, width: int) -> str:
    """`worker-0   | <log line>`: every replica's output on one terminal, told apart."""
    return f"{label(key):<{width}} | {line.rstrip()}"


def prefix_width(keys: Sequence[ReplicaKey]) -> int:
    return max((len(label(key)) for key in keys), default=8)


def engine_event_line(event: policy.Event) -> str:
    marker = "!" if event.type == "Warning" else "*"
    return f"{marker} {event.reason}: {event.message}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


@dataclasses.dataclass(frozen=True)
class ReplicaRow:
    key: ReplicaKey
    state: str
    attempt: int
    exit_code: int | None
    pid: int | None


def table(
    job: spec.TrainJob,
    status: st.JobStatus,
    rows: Sequence[ReplicaRow],
    progress: Mapping[ReplicaKey, ReplicaProgress],
    elapsed_seconds: float,
) -> list[str]:
    """The live display: a header, then one line per replica."""
    header = (
        f"TrainJob {job.name}: {st.state_of(status)}  {_duration(elapsed_seconds)}  "
        f"restarts {status.restart_count}/{job.run_policy.backoff_limit}"
    )
    width = prefix_width([row.key for row in rows])
    lines = [header]
    for row in rows:
        exit_text = f" exit {row.exit_code}" if row.exit_code is not None else ""
        pid_text = f" pid {row.pid}" if row.pid is not None else ""
        lines.append(
            f"  {label(row.key):<{width}} {(row.state or 'Starting'):<10} attempt {row.attempt}"
            f"{exit_text}{pid_text}  {progress_text(progress.get(row.key), job)}".rstrip()
        )
    return lines


def redraw(previous_height: int, lines: Sequence[str], logs: Sequence[str]) -> str:
    """ANSI text that erases the last table, prints new log lines, then draws the table again."""
    out: list[str] = []
    if previous_height:
        out.append(ANSI_UP.format(n=previous_height) + "\r")
    for line in [*logs, *lines]:
        out.append(ANSI_CLEAR_LINE + line + "\n")
    out.append("\x1b[J")  # clear anything below (a table that shrank)
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class Summary:
    job: spec.TrainJob
    status: st.JobStatus
    interrupted: str | None  # "SIGINT"/"SIGTERM" when stopped by the user
    elapsed_seconds: float
    run_dir: str
    log_dir: str
    checkpoint_dir: str
    export: str | None
    progress: Mapping[ReplicaKey, ReplicaProgress]


def final_state(summary: Summary) -> str:
    if summary.interrupted and not summary.status.finished:
        return "Interrupted"
    return st.state_of(summary.status)


def exit_code_of(summary: Summary) -> int:
    """0 only when the job succeeded; 130/143 when interrupted by SIGINT/SIGTERM; else 1."""
    state = final_state(summary)
    if state == st.SUCCEEDED:
        return 0
    if state == "Interrupted":
        return 130 if summary.interrupted == "SIGINT" else 143
    return 1


def summary_text(summary: Summary) -> str:
    """The final summary: state, reason, duration, restarts, last exit codes, where things are."""
    job, status = summary.job, summary.status
    state = final_state(summary)
    lines = [f"TrainJob {job.name} {state} after {_duration(summary.elapsed_seconds)}"]
    for ctype in (st.FAILED, st.SUCCEEDED):
        condition = status.condition(ctype)
        if condition is not None and condition.status:
            lines.append(f"  reason:     {condition.reason}: {condition.message}")
    if state == "Interrupted":
        lines.append(
            f"  stopped by {summary.interrupted}; every replica was stopped. "
            "Run the same command again to resume from the checkpoint."
        )
    lines.append(
        f"  restarts:   {status.restart_count} (backoffLimit {job.run_policy.backoff_limit})"
    )
    codes = []
    for key in job.replica_keys():
        record = status.record(key)
        code = "-" if record.exit_code is None else str(record.exit_code)
        codes.append(
            f"{label(key)}={code} ({record.state or 'not started'}, attempt {record.attempt})"
        )
    lines.append("  last exit:  " + ", ".join(codes))
    steps = [p.step for p in summary.progress.values() if p.step is not None]
    if steps:
        lines.append(f"  steps:      {max(steps)}")
    if summary.export:
        lines.append(f"  model:      {summary.export}")
    lines.append(f"  checkpoint: {summary.checkpoint_dir}")
    lines.append(f"  logs:       {summary.log_dir}")
    return "\n".join(lines) + "\n"


def elapsed(start: datetime.datetime | None, now: datetime.datetime) -> float:
    return 0.0 if start is None else (now - start).total_seconds()
