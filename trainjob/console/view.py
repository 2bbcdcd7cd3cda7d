"""What a run shows, locally and on a cluster (pure): replica log prefixes, progress lines, the
live table, the summary.

The view takes states, not processes: a `Snapshot` of the job, its status, one `ReplicaRow` per
replica and their progress, from any source (local processes, or a cluster's objects). Every
function returns strings; `trainjob.console.terminal` decides where they go (a TTY gets the live
table redrawn below the logs, anything else gets one plain line per event).

The live table is sized for the terminal it is drawn on: every line is cut to `width - 1`
columns (a line exactly as wide as the terminal makes some terminals wrap the cursor) and the
table never has more lines than the terminal has rows minus one, so moving the cursor up by the
number of lines drawn always lands on the table's first row and the redraw leaves no debris.
A terminal made narrower re-wraps what it shows, and tmux then moves rows from the top of the
window into its scrollback: the table keeps enough rows above it (`headroom_rows`) for a
terminal made as narrow as 60 columns to re-wrap it with nothing of it pushed there.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.console.logfilter import terminal_safe
from trainjob.console.outcome import INTERRUPTED, Cause, Summary, final_state, killed_by
from trainjob.console.replica_progress import ReplicaProgress, fold, job_step, lead_replica
from trainjob.core import constants, policy, spec, times
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey, replica_label

ANSI_UP: Final = "\x1b[{n}A"
ANSI_ERASE_LINE: Final = "\x1b[K"  # from the cursor to the end of its row
# Clears the cursor's row and every row below it, and returns to the row's first column, with
# no erase that starts at the top-left cell: tmux (`scroll-on-clear`, on by default) and GNU
# screen take an erase-below from there for a clear screen and push the whole screen into the
# scrollback, so a table drawn from the top row would leave a copy there on every redraw. The
# row is erased on its own, then the rest from its second column (CHA 2, then ED 0).
ANSI_CLEAR_BELOW: Final = "\x1b[K\x1b[2G\x1b[J\r"
ELLIPSIS: Final = "…"
MIN_WIDTH: Final = 20  # below this the table is cut, not laid out
# The narrowest terminal a table drawn wider is kept whole for when the terminal is made that
# narrow (see `headroom_rows`).
NARROWEST: Final = 60
_SGR: Final = re.compile(r"\x1b\[[0-9;]*m")

# Styles (SGR parameters); only applied when color is on (a TTY without NO_COLOR).
STYLE_BOLD: Final = "1"
STYLE_DIM: Final = "2"
STYLE_RED: Final = "31"
STYLE_GREEN: Final = "32"
STYLE_YELLOW: Final = "33"
_STATE_STYLES: Final[Mapping[str, str]] = {
    st.STATE_RUNNING: STYLE_GREEN,
    st.STATE_SUCCEEDED: STYLE_GREEN,
    st.STATE_FAILED: STYLE_RED,
    st.FAILED: STYLE_RED,
    st.RESTARTING: STYLE_YELLOW,
    "Stopping": STYLE_YELLOW,
    INTERRUPTED: STYLE_YELLOW,
    st.STATE_STOPPED: STYLE_DIM,
    st.STATE_PENDING: STYLE_DIM,
    "Starting": STYLE_DIM,
}
# Replica prefixes cycle through these, as docker compose does, so interleaved logs stay legible.
PREFIX_STYLES: Final = ("36", "33", "35", "32", "34", "96", "93", "95")


def _config_totals(job: spec.TrainJob) -> tuple[int | None, int | None]:
    """(epochs, total steps) as the job's runtime config states them (the core's
    `planned_totals`, as the runtime reads it)."""
    return core_progress.planned_totals(job.runtime.config if job.runtime else {})


def _progress_fields(progress: ReplicaProgress | None, job: spec.TrainJob) -> dict[str, str]:
    """The progress numbers of one replica as display fields (unknown ones left out)."""
    if progress is None:
        return {}
    epochs, total = _config_totals(job)
    fields: dict[str, str] = {}
    if progress.epoch is not None:
        fields["epoch"] = f"epoch {progress.epoch}" + (f"/{epochs}" if epochs else "")
    if progress.step is not None:
        fields["step"] = f"step {progress.step}" + (f"/{total}" if total else "")
    if progress.loss is not None:
        fields["loss"] = f"loss {progress.loss:.4f}"
    if progress.examples_per_sec is not None:
        fields["speed"] = f"{progress.examples_per_sec:,.0f} ex/s"
    return fields


def progress_text(progress: ReplicaProgress | None, job: spec.TrainJob) -> str:
    """`epoch 2/3 step 80/120 loss 0.4210 1,234 ex/s` (fields unknown yet are left out)."""
    return " ".join(_progress_fields(progress, job).values())


def event_line(
    key: ReplicaKey, event: Mapping[str, Any], job: spec.TrainJob, *, stopped: bool = False
) -> str:
    """One plain line for a progress event (non-TTY output). `stopped`: trainjob stopped this
    replica itself, so its preempted end is the expected one, not a failure."""
    kind = event.get("event")
    name = replica_label(key)
    progress = fold(None, event)
    text = progress_text(progress, job)
    if kind == "start":
        step = event.get("initial_step") or 0
        detail = f"resumed at step {step}" if step else "started training"
        if progress.devices is not None:
            detail += f" on {core_progress.devices_detail(progress.devices)}"
        return f"[{name}] progress: {detail}"
    if kind == "checkpoint":
        return f"[{name}] progress: checkpoint at step {event.get('step')}"
    if kind == "end" and stopped and event.get("status") != "succeeded":
        return f"[{name}] progress: stopped {text}".rstrip()
    if kind == "end":
        export = f", model at {event['export']}" if event.get("export") else ""
        return f"[{name}] progress: ended ({event.get('status')}){export} {text}".rstrip()
    return f"[{name}] progress: {text}"


def keeps_line(key: ReplicaKey, event: Mapping[str, Any], job: spec.TrainJob) -> bool:
    """On a terminal the table shows live progress; the lead replica's start, epoch and end
    events also stay as lines above it (as Keras leaves one line per epoch), so the scrollback
    keeps the history of the run."""
    return key == lead_replica(job) and event.get("event") in ("start", "epoch", "end")


def styled(text: str, style: str | None, color: bool) -> str:
    if not color or not style or not text:
        return text
    return f"\x1b[{style}m{text}\x1b[0m"


def prefix_line(
    key: ReplicaKey, line: str, width: int, *, color: bool = False, style: str | None = None
) -> str:
    """`worker-0   | <log line>`: every replica's output on one terminal, told apart."""
    prefix = styled(f"{replica_label(key):<{width}} |", style, color)
    return f"{prefix} {terminal_safe(line)}".rstrip()


def log_line(label_text: str | None, line: str, width: int) -> str:
    """A line of `trainjob logs`: prefixed with its replica when several are printed."""
    safe = terminal_safe(line)
    return safe if label_text is None else f"{label_text:<{width}} | {safe}"


def prefix_width(keys: Sequence[ReplicaKey]) -> int:
    return max((len(replica_label(key)) for key in keys), default=8)


def prefix_style(index: int) -> str:
    return PREFIX_STYLES[index % len(PREFIX_STYLES)]


def engine_event_line(event: policy.Event, color: bool = False) -> str:
    marker = styled("!", STYLE_YELLOW, color) if event.type == "Warning" else "*"
    return f"{marker} {event.reason}: {event.message}"


# ----- the live table -----
@dataclasses.dataclass(frozen=True)
class ReplicaRow:
    key: ReplicaKey
    state: str
    attempt: int
    exit_code: int | None
    pid: int | None


Segment = tuple[str, str | None]  # text, style


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    text: str
    style: str | None = None


# Which fields go first when the terminal is narrow (first in this list = first dropped).
_DROP_ORDER: Final = ("pid", "attempt", "devices", "speed", "epoch", "exit", "loss")
_FIELD_ORDER: Final = (
    "label",
    "state",
    "exit",
    "epoch",
    "step",
    "loss",
    "speed",
    "devices",
    "attempt",
    "pid",
)


def _row_fields(
    row: ReplicaRow, progress: ReplicaProgress | None, job: spec.TrainJob
) -> dict[str, _Field]:
    state = row.state or "Starting"
    fields = {
        "label": _Field("label", replica_label(row.key)),
        "state": _Field("state", state, _STATE_STYLES.get(state)),
        "attempt": _Field("attempt", f"attempt {row.attempt}"),
    }
    if row.exit_code is not None:
        style = STYLE_RED if row.exit_code != 0 else None
        fields["exit"] = _Field("exit", f"exit {row.exit_code}", style)
    if row.pid is not None:
        fields["pid"] = _Field("pid", f"pid {row.pid}", STYLE_DIM)
    for name, text in _progress_fields(progress, job).items():
        fields[name] = _Field(name, text)
    if progress is not None and progress.devices is not None:
        # `CPU` when it sees no GPU: a replica that trains on its CPU is never silent.
        fields["devices"] = _Field("devices", core_progress.devices_text(progress.devices))
    return fields


def _fit(segments: Sequence[Segment], width: int) -> list[Segment]:
    """Cut a line to `width` columns, ending in an ellipsis when anything was cut."""
    total = sum(len(text) for text, _ in segments)
    if total <= width:
        return list(segments)
    out: list[Segment] = []
    room = max(0, width - 1)
    for text, style in segments:
        if room <= 0:
            break
        out.append((text[:room], style))
        room -= len(text[:room])
    out.append((ELLIPSIS, None))
    return out


def _layout_rows(rows: Sequence[dict[str, _Field]], width: int) -> list[list[Segment]]:
    """Aligned columns; the least useful columns are dropped until the widest row fits."""
    names = [n for n in _FIELD_ORDER if any(n in row for row in rows)]

    def widths(selected: Sequence[str]) -> dict[str, int]:
        return {n: max(len(row[n].text) if n in row else 0 for row in rows) for n in selected}

    def line_width(selected: Sequence[str]) -> int:
        w = widths(selected)
        return 2 + sum(w.values()) + 2 * (len(selected) - 1)

    for candidate in _DROP_ORDER:
        if line_width(names) <= width:
            break
        if candidate in names:
            names.remove(candidate)
    column = widths(names)
    lines: list[list[Segment]] = []
    for row in rows:
        segments: list[Segment] = [("  ", None)]
        for position, name in enumerate(names):
            last = position == len(names) - 1
            field = row.get(name)
            text = field.text if field else ""
            segments.append((text, field.style if field else None))
            if not last:
                segments.append((" " * (column[name] - len(text) + 2), None))
        while segments and not segments[-1][0].strip():
            segments.pop()
        lines.append(_fit(segments, width))
    return lines


def _job_line(snapshot: Snapshot, width: int) -> list[Segment]:
    """`TrainJob mnist  Running  42.0s  step 80/120 (67%)  ETA 20s  restarts 0/3`.

    The chief's latest progress report (the one the operator would write to status.progress)
    wins for the totals and the ETA; until one arrives the ETA comes from the step timer."""
    job, status, report = snapshot.job, snapshot.status, snapshot.report
    state = snapshot.state or st.state_of(status)
    _, total = _config_totals(job)
    if report is not None and report.total_steps:
        total = report.total_steps
    step = job_step(snapshot.progress)
    parts: list[tuple[str, Segment]] = [
        ("name", (f"{snapshot.kind} {job.name}", STYLE_BOLD)),
        ("state", (state, _STATE_STYLES.get(state))),
        ("time", (times.format_elapsed(snapshot.elapsed_seconds), None)),
    ]
    if step is not None:
        percent = f" ({math.floor(core_progress.step_percent(step, total))}%)" if total else ""
        parts.append(("step", (f"step {step}" + (f"/{total}" if total else "") + percent, None)))
    timer = snapshot.timer
    eta = None if timer is None else timer.eta(timer.last_step, total)
    if report is not None and report.eta_seconds is not None:
        eta = report.eta_seconds
    if eta is not None and not status.finished:
        parts.append(("eta", (f"ETA {times.format_elapsed(eta)}", None)))
    parts.append(
        ("restarts", (f"restarts {status.restart_count}/{job.run_policy.backoff_limit}", None))
    )
    # Restarts matter once there are any; until then the elapsed time and ETA go last.
    drops = ("time", "eta", "restarts") if status.restart_count else ("restarts", "time", "eta")
    for drop in drops:
        if sum(len(seg[0]) for _, seg in parts) + 2 * (len(parts) - 1) <= width:
            break
        parts = [part for part in parts if part[0] != drop]
    segments: list[Segment] = []
    for position, (_, segment) in enumerate(parts):
        if position:
            segments.append(("  ", None))
        segments.append(segment)
    return _fit(segments, width)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One state of a job as the view shows it, whatever produced it: the job, its status, a
    row per replica, each replica's latest progress, the time since the run started, the job's
    step timer (for the ETA), a state that overrides the status's (`Interrupted` while
    stopping), the chief's latest progress report, and the kind the job is named by (a
    cluster's TFJob is shown as one)."""

    job: spec.TrainJob
    status: st.JobStatus
    rows: Sequence[ReplicaRow]
    progress: Mapping[ReplicaKey, ReplicaProgress]
    elapsed_seconds: float
    timer: core_progress.StepTimer | None = None
    state: str | None = None
    report: core_progress.Report | None = None
    kind: str = constants.KIND


def table_segments(snapshot: Snapshot, *, width: int = 80, height: int = 24) -> list[list[Segment]]:
    """The live display as styled segments: a job line, then one line per replica.

    Every line fits in `width - 1` columns; at most `height - 1` lines (the rest of the
    replicas are summed up by state on the last line)."""
    job, rows, progress = snapshot.job, snapshot.rows, snapshot.progress
    usable = max(MIN_WIDTH, width) - 1
    max_lines = max(2, height - 1)
    lines = [_job_line(snapshot, usable)]
    shown = list(rows)
    hidden: list[ReplicaRow] = []
    if 1 + len(rows) > max_lines:
        # Replicas that need attention (not running) first, then the rest in order.
        ordered = sorted(rows, key=lambda r: r.state == st.STATE_RUNNING)
        shown, hidden = ordered[: max_lines - 2], ordered[max_lines - 2 :]
        shown.sort(key=lambda r: (r.key[0], r.key[1]))
    lines.extend(
        _layout_rows([_row_fields(row, progress.get(row.key), job) for row in shown], usable)
    )
    if hidden:
        counts: dict[str, int] = {}
        for row in hidden:
            counts[row.state or "Starting"] = counts.get(row.state or "Starting", 0) + 1
        text = ", ".join(f"{n} {state_name}" for state_name, n in sorted(counts.items()))
        lines.append(_fit([(f"  … {len(hidden)} more replicas: {text}", STYLE_DIM)], usable))
    return lines


def render_segments(segments: Sequence[Segment], color: bool) -> str:
    return "".join(styled(text, style, color) for text, style in segments)


def plain(segments: Sequence[Segment]) -> str:
    return "".join(text for text, _ in segments)


def drawn_height(line_widths: Sequence[int], width: int) -> int:
    """Rows the lines last drawn take on a terminal `width` columns wide now: a terminal that
    was made narrower re-wraps them (tmux, VTE, iTerm2 and Windows Terminal all do)."""
    columns = max(1, width)
    return sum(max(1, math.ceil(w / columns)) for w in line_widths)


def visible_width(text: str) -> int:
    """Columns a line takes on a terminal: its text without the styles (SGR) it carries."""
    return len(_SGR.sub("", text))


def rewrap_extra(line_widths: Sequence[int], width: int, narrowest: int = NARROWEST) -> int:
    """Rows that lines drawn on a terminal `width` columns wide gain when it is made
    `narrowest` columns wide and re-wraps them (tmux, VTE, iTerm2, Windows Terminal do).

    tmux keeps the rows below the cursor as they are and makes room for those extra rows by
    moving as many rows from the top of the window into its scrollback: with fewer rows than
    that above a table, the top of the table goes there, and a redraw can no longer reach it."""
    if width <= narrowest:
        return 0
    return max(0, drawn_height(line_widths, narrowest) - drawn_height(line_widths, width))


def rows_above_after_resize(
    rows_above: int,
    table_widths: Sequence[int],
    above_widths: Sequence[int],
    before: tuple[int, int],
    after: tuple[int, int],
) -> int:
    """The rows still known to be above a table on the window after the terminal went from
    `before` to `after` (columns, rows), as tmux re-wraps: made narrower, the window keeps its
    rows below the table and loses as many rows above it as the table gained; made wider, the
    lines above it that had wrapped join again (rows may come back from the scrollback, which
    is not counted); made shorter, at worst the rows taken off come from the top."""
    (old_width, old_height), (new_width, new_height) = before, after
    rows = rows_above
    if new_width < old_width:
        rows -= drawn_height(table_widths, new_width) - drawn_height(table_widths, old_width)
    elif new_width > old_width:
        rows -= drawn_height(above_widths, old_width) - drawn_height(above_widths, new_width)
    if new_height < old_height:
        rows -= old_height - new_height
    return max(0, rows)


def headroom_rows(
    rows_above: int,
    table_widths: Sequence[int],
    width: int,
    height: int,
    narrowest: int = NARROWEST,
) -> int:
    """Blank rows to print just above a table about to be drawn so that a terminal made as
    narrow as `narrowest` re-wraps the table with nothing of it leaving the window.

    `rows_above`: the rows known to be above the table (log lines and blank rows printed above
    it; what was on the screen before the first draw is not known, so it is not counted). A
    table too tall to stay whole once re-wrapped gets only the room the window has."""
    room = max(0, height - 1 - drawn_height(table_widths, width))
    known = min(rows_above, room)
    return max(0, min(rewrap_extra(table_widths, width, narrowest), room) - known)


def redraw(previous_height: int, lines: Sequence[str], logs: Sequence[str]) -> str:
    """ANSI text that erases the last table, prints new log lines, then draws the table again.

    The cursor goes up to the table's first row. New log lines take its place from there: the
    old table's rows are cleared first, so a log line that wraps over several rows can never
    leave part of an old table behind, and the log lines then scroll up like normal output (into
    the scrollback, where they belong). Each table line is written over the old one and erased
    to its end (table lines are narrower than the terminal, so the erase never reaches a
    character just written), and whatever an older, taller table left below is cleared last.
    The screen is never cleared from the top-left cell (see ANSI_CLEAR_BELOW), so a redraw
    leaves nothing in the scrollback, even when the table starts on the top row."""
    out: list[str] = []
    if previous_height:
        out.append(ANSI_UP.format(n=previous_height))
    out.append("\r")
    if logs:
        out.append(ANSI_CLEAR_BELOW)
        out.extend(line + "\n" for line in logs)
    out.extend(line + ANSI_ERASE_LINE + "\n" for line in lines)
    out.append(ANSI_CLEAR_BELOW)
    return "".join(out)


# ----- the end of a run -----
def exit_line(cause: Cause, exit_code: int) -> str:
    """`! worker-1 exited with code 1: ValueError: ... (log: PATH)`, when a replica fails."""
    why = cause.line or killed_by(exit_code) or "(no exception in its log)"
    return f"! {cause.replica} exited with code {exit_code}: {why} (log: {cause.log_path})"


def summary_text(summary: Summary, color: bool = False) -> str:
    """The final summary: state, reason, cause, duration, restarts, last exit codes, paths."""
    job, status = summary.job, summary.status
    state = final_state(summary)
    after = times.format_elapsed(summary.elapsed_seconds)
    title = f"{summary.kind} {job.name} {state} after {after}"
    lines = [styled(title, _STATE_STYLES.get(state, STYLE_BOLD), color)]
    if summary.problem is not None:
        lines.append(f"  reason:     {summary.problem}")
    for ctype in (st.FAILED, st.SUCCEEDED):
        condition = status.condition(ctype)
        if condition is not None and condition.status:
            lines.append(f"  reason:     {condition.reason}: {condition.message}")
    for cause in summary.causes:
        quoted = cause.line or "(no exception in its log)"
        lines.append(f"  cause:      {cause.replica}: {styled(quoted, STYLE_RED, color)}")
        lines.append(f"              full log: {cause.log_path}")
    if state == INTERRUPTED:
        again = (
            "Run the same command again to resume from the checkpoint."
            if summary.has_checkpoint
            else "No checkpoint was written yet: running again starts from the beginning."
        )
        lines.append(f"  stopped by {summary.interrupted}; every replica was stopped. {again}")
    lines.append(
        f"  restarts:   {status.restart_count} (backoffLimit {job.run_policy.backoff_limit})"
    )
    codes = []
    for key in job.replica_keys():
        record = status.record(key)
        code = "-" if record.exit_code is None else str(record.exit_code)
        state = record.state or "not started"
        codes.append(f"{replica_label(key)}={code} ({state}, attempt {record.attempt})")
    lines.append("  last exit:  " + _joined_limited(codes, 16))
    step = job_step(summary.progress)
    if summary.report is not None and core_progress.summary(summary.report):
        lines.append(f"  progress:   {progress_line(summary.report)}")
    elif step is not None:
        lines.append(f"  steps:      {step}")
    if summary.export:
        lines.append(f"  model:      {summary.export}")
    lines.append(f"  checkpoint: {summary.checkpoint_dir}")
    lines.append(f"  logs:       {summary.log_dir}")
    return "\n".join(lines) + "\n"


def progress_line(report: core_progress.Report) -> str:
    """`100% (3/3)  step 120/120  loss 0.2935`: what kubectl get tj shows, with the step."""
    parts = [core_progress.summary(report)]
    if report.step is not None and report.epoch is not None:
        parts.append(
            f"step {report.step}" + (f"/{report.total_steps}" if report.total_steps else "")
        )
    if report.loss is not None:
        parts.append(f"loss {core_progress.significant(report.loss)}")
    return "  ".join(parts)


def _joined_limited(items: Sequence[str], limit: int) -> str:
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … ({len(items) - limit} more in status.json)"


def elapsed(start: datetime.datetime | None, now: datetime.datetime) -> float:
    return 0.0 if start is None else (now - start).total_seconds()
