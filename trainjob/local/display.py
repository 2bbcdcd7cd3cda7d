"""What local mode shows (pure): replica log prefixes, progress lines, the live table, the summary.

Every function takes plain data and returns strings; the executor decides where they go (a TTY
gets the live table redrawn below the logs, anything else gets one plain line per event).

The live table is sized for the terminal it is drawn on: every line is cut to `width - 1`
columns (a line exactly as wide as the terminal makes some terminals wrap the cursor) and the
table never has more lines than the terminal has rows minus one, so moving the cursor up by the
number of lines drawn always lands on the table's first row and the redraw leaves no debris.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import policy, spec
from trainjob.core import progress as core_progress
from trainjob.core import status as st

ReplicaKey = tuple[str, int]

ANSI_CLEAR_LINE: Final = "\x1b[2K"
ANSI_UP: Final = "\x1b[{n}A"
ANSI_CLEAR_BELOW: Final = "\x1b[J"
ELLIPSIS: Final = "…"
MIN_WIDTH: Final = 20  # below this the table is cut, not laid out
INTERRUPTED: Final = "Interrupted"

# Styles (SGR parameters); only applied when color is on (a TTY without NO_COLOR).
STYLE_BOLD: Final = "1"
STYLE_DIM: Final = "2"
STYLE_RED: Final = "31"
STYLE_GREEN: Final = "32"
STYLE_YELLOW: Final = "33"
STYLE_CYAN: Final = "36"
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


def _progress_fields(progress: ReplicaProgress | None, job: spec.TrainJob) -> dict[str, str]:
    """The progress numbers of one replica as display fields (unknown ones left out)."""
    if progress is None:
        return {}
    epochs, total = planned_totals(job)
    fields: dict[str, str] = {}
    if progress.epoch is not None:
        fields["epoch"] = f"epoch {progress.epoch + 1}" + (f"/{epochs}" if epochs else "")
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
    progress = fold(None, event)
    text = progress_text(progress, job)
    if kind == "start":
        step = event.get("initial_step") or 0
        detail = f"resumed at step {step}" if step else "started training"
        return f"[{label(key)}] progress: {detail}"
    if kind == "checkpoint":
        return f"[{label(key)}] progress: checkpoint at step {event.get('step')}"
    if kind == "end" and stopped and event.get("status") != "succeeded":
        return f"[{label(key)}] progress: stopped {text}".rstrip()
    if kind == "end":
        export = f", model at {event['export']}" if event.get("export") else ""
        return f"[{label(key)}] progress: ended ({event.get('status')}){export} {text}".rstrip()
    return f"[{label(key)}] progress: {text}"


def lead_replica(job: spec.TrainJob) -> ReplicaKey:
    """The replica whose numbers speak for the job: the chief, else worker 0."""
    return ("chief", 0) if job.replicas("chief") else ("worker", 0)


def keeps_line(key: ReplicaKey, event: Mapping[str, Any], job: spec.TrainJob) -> bool:
    """On a terminal the table shows live progress; the lead replica's start, epoch and end
    events also stay as lines above it (as Keras leaves one line per epoch), so the scrollback
    keeps the history of the run."""
    return key == lead_replica(job) and event.get("event") in ("start", "epoch", "end")


# ----- text for a terminal -----
# CSI sequences (colors, cursor moves), OSC sequences (titles, links), two-byte escapes.
_ANSI_ESCAPE: Final = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])"
)
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def terminal_safe(line: str) -> str:
    """A child's line as one printable line: what a carriage return would leave visible (Keras
    progress bars redraw with \\r), without escape sequences or control characters that would
    move the cursor under the live table. Tabs become spaces."""
    line = line.rstrip("\r\n")
    line = _ANSI_ESCAPE.sub("", line)
    if "\r" in line:
        parts = [part for part in line.split("\r") if part.strip()]
        line = parts[-1] if parts else ""
    return _CONTROL.sub("", line).expandtabs(8)  # tab stops counted on what is visible


def styled(text: str, style: str | None, color: bool) -> str:
    if not color or not style or not text:
        return text
    return f"\x1b[{style}m{text}\x1b[0m"


def prefix_line(
    key: ReplicaKey, line: str, width: int, *, color: bool = False, style: str | None = None
) -> str:
    """`worker-0   | <log line>`: every replica's output on one terminal, told apart."""
    prefix = styled(f"{label(key):<{width}} |", style, color)
    return f"{prefix} {terminal_safe(line)}".rstrip()


def log_line(label_text: str | None, line: str, width: int) -> str:
    """A line of `trainjob logs`: prefixed with its replica when several are printed."""
    safe = terminal_safe(line)
    return safe if label_text is None else f"{label_text:<{width}} | {safe}"


def prefix_width(keys: Sequence[ReplicaKey]) -> int:
    return max((len(label(key)) for key in keys), default=8)


def prefix_style(index: int) -> str:
    return PREFIX_STYLES[index % len(PREFIX_STYLES)]


def engine_event_line(event: policy.Event, color: bool = False) -> str:
    marker = styled("!", STYLE_YELLOW, color) if event.type == "Warning" else "*"
    return f"{marker} {event.reason}: {event.message}"


# ----- TensorFlow's noise -----
# Lines TensorFlow (and its C++ libraries) print that say nothing about the user's training on a
# CPU machine. They stay in logs/<replica>.log; `--verbose` shows them. Each pattern was seen in
# a real run of the examples (TF 2.21 / 2.15, CPU).
_NOISE: Final = re.compile(
    "|".join(
        (
            # INFO records of TensorFlow's and absl's Python loggers, in the runtime's format
            # (`2026-11-23 13:08:25,466 INFO tensorflow ...`) and in logging's default one.
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO (tensorflow|absl|h5py)\b",
            r"^INFO:(tensorflow|absl):",
            # C++ (absl/glog) info and warning lines: `I0000 00:00:1795439295.226345 18621 x.cc:31]`
            r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\]",
            # TensorFlow's own C++ logging: `2026-11-23 13:02:27.443295: I tensorflow/...`
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] ",
            r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
            # A CPU-only machine: TensorFlow looks for CUDA and says so, at error level.
            r"failed call to cuInit",
            r"Could not find cuda drivers",
            r"Unable to register cu(DNN|FFT|BLAS) factory",
            r"TF-TRT Warning",
            r"This TensorFlow binary is optimized to use available CPU instructions",
            r"rebuild TensorFlow with the appropriate compiler flags",
            r"oneDNN custom operations are on",
        )
    )
)


def is_noise(line: str) -> bool:
    """Whether a replica's log line is TensorFlow noise (hidden on the terminal by default)."""
    return _NOISE.search(line) is not None


_TIMESTAMPED: Final = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_STOPPED_FAILURE: Final = re.compile(
    r"Replica (?P<replica>\S+) failed \(Preempted, exit (?P<code>\d+)\)"
)


# The rest of a hidden record that spans lines: TensorFlow logs protobuf text (session configs
# of ParameterServer and DTensor, 40-60 lines each): `key: "GPU"`, `job {`, `}`, blank.
_PROTO_TEXT: Final = re.compile(r"^\s*(\}?|[a-z_][a-z0-9_]*(: .*| \{))\s*$")


@dataclasses.dataclass(frozen=True)
class FilterState:
    """Per replica: inside a traceback that a stop we asked for produced, or inside the
    protobuf text that a hidden record goes on with (both hidden)."""

    hiding_traceback: bool = False
    continuing_noise: bool = False


def filter_line(
    line: str, state: FilterState, *, verbose: bool, stopping: bool
) -> tuple[str | None, FilterState]:
    """What the terminal shows of one replica line (None: nothing), and the next state.

    `stopping`: trainjob itself asked this replica to stop (Ctrl-C, a restart of its group, the
    end of the job); its "failed (Preempted)" report and traceback are the expected way to stop,
    so they become one line. Everything is kept in the replica's log file."""
    if verbose:
        return line, FilterState()
    if state.hiding_traceback:
        if not _TIMESTAMPED.search(line):
            return None, state
        state = FilterState()
    stopped = _STOPPED_FAILURE.search(line)
    if stopped is not None and (stopping or "Traceback" in line):
        return f"stopped (exit {stopped['code']})", FilterState(hiding_traceback=True)
    if is_noise(line):
        return None, FilterState(continuing_noise=True)
    if state.continuing_noise and _PROTO_TEXT.match(line):
        return None, state
    return line, FilterState()


# An exception line as Python prints it last in a traceback: `ValueError: bad shape`,
# `tensorflow.python.framework.errors_impl.UnavailableError: ...`, `KeyboardInterrupt`.
_EXCEPTION_LINE: Final = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Preempted|Warning)"
    r"(?::\s.*)?$"
)


def last_exception_line(log_text: str) -> str | None:
    """The last exception line of a log (the cause a failure summary quotes), else the last
    error-like line (`Could not start gRPC server`, `Rejected ...`). Noise is never quoted."""
    lines = [terminal_safe(line).strip() for line in log_text.splitlines()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    for line in reversed(lines):
        if re.search(r"\b(ERROR|error|Error|FATAL|cannot|Could not)\b", line) and not (
            line.startswith("=== trainjob:") and "started" in line
        ):
            return line
    return None


# ----- the live table -----
def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


_duration = duration  # the summary's name for it


@dataclasses.dataclass(frozen=True)
class ReplicaRow:
    key: ReplicaKey
    state: str
    attempt: int
    exit_code: int | None
    pid: int | None


@dataclasses.dataclass(frozen=True)
class StepClock:
    """Two samples of the job's step (monotonic seconds): the first seen since the current
    attempt started and the latest. Enough for a rate, hence an ETA."""

    first_time: float
    first_step: int
    last_time: float
    last_step: int


def eta_seconds(clock: StepClock | None, total: int | None) -> float | None:
    """Seconds to `total` steps at the rate seen so far; None until there is a rate."""
    if clock is None or total is None:
        return None
    done = clock.last_step - clock.first_step
    spent = clock.last_time - clock.first_time
    if done <= 0 or spent <= 0:
        return None
    return max(0.0, (total - clock.last_step) * spent / done)


def job_step(progress: Mapping[ReplicaKey, ReplicaProgress]) -> int | None:
    """The job's global step: the highest any replica reported (all-reduce workers agree; under
    ParameterServer only the chief counts steps)."""
    steps = [p.step for p in progress.values() if p.step is not None]
    return max(steps) if steps else None


Segment = tuple[str, str | None]  # text, style


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    text: str
    style: str | None = None


# Which fields go first when the terminal is narrow (first in this list = first dropped).
_DROP_ORDER: Final = ("pid", "attempt", "speed", "epoch", "exit", "loss")
_FIELD_ORDER: Final = ("label", "state", "exit", "epoch", "step", "loss", "speed", "attempt", "pid")


def _row_fields(
    row: ReplicaRow, progress: ReplicaProgress | None, job: spec.TrainJob
) -> dict[str, _Field]:
    state = row.state or "Starting"
    fields = {
        "label": _Field("label", label(row.key)),
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


def _job_line(
    job: spec.TrainJob,
    status: st.JobStatus,
    progress: Mapping[ReplicaKey, ReplicaProgress],
    elapsed_seconds: float,
    clock: StepClock | None,
    state: str,
    width: int,
    report: core_progress.Report | None = None,
) -> list[Segment]:
    """`TrainJob mnist  Running  42.0s  step 80/120 (67%)  ETA 20s  restarts 0/3`.

    `report`: the chief's latest progress report, the one the operator would write to
    status.progress: its totals and ETA (moving average of step time) win."""
    _, total = planned_totals(job)
    if report is not None and report.total_steps:
        total = report.total_steps
    step = job_step(progress)
    parts: list[tuple[str, Segment]] = [
        ("name", (f"TrainJob {job.name}", STYLE_BOLD)),
        ("state", (state, _STATE_STYLES.get(state))),
        ("time", (duration(elapsed_seconds), None)),
    ]
    if step is not None:
        percent = f" ({min(100, 100 * step // total)}%)" if total else ""
        parts.append(("step", (f"step {step}" + (f"/{total}" if total else "") + percent, None)))
    eta = eta_seconds(clock, total)
    if report is not None and report.eta_seconds is not None:
        eta = report.eta_seconds
    if eta is not None and not status.finished:
        parts.append(("eta", (f"ETA {duration(eta)}", None)))
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


def table_segments(
    job: spec.TrainJob,
    status: st.JobStatus,
    rows: Sequence[ReplicaRow],
    progress: Mapping[ReplicaKey, ReplicaProgress],
    elapsed_seconds: float,
    *,
    width: int = 80,
    height: int = 24,
    clock: StepClock | None = None,
    state: str | None = None,
    report: core_progress.Report | None = None,
) -> list[list[Segment]]:
    """The live display as styled segments: a job line, then one line per replica.

    Every line fits in `width - 1` columns; at most `height - 1` lines (the rest of the
    replicas are summed up by state on the last line)."""
    usable = max(MIN_WIDTH, width) - 1
    max_lines = max(2, height - 1)
    lines = [
        _job_line(
            job,
            status,
            progress,
            elapsed_seconds,
            clock,
            state or st.state_of(status),
            usable,
            report,
        )
    ]
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


def table(
    job: spec.TrainJob,
    status: st.JobStatus,
    rows: Sequence[ReplicaRow],
    progress: Mapping[ReplicaKey, ReplicaProgress],
    elapsed_seconds: float,
    *,
    width: int = 200,
    height: int = 1000,
    clock: StepClock | None = None,
    state: str | None = None,
    color: bool = False,
) -> list[str]:
    """The live display as text lines (see `table_segments`)."""
    return [
        render_segments(line, color)
        for line in table_segments(
            job,
            status,
            rows,
            progress,
            elapsed_seconds,
            width=width,
            height=height,
            clock=clock,
            state=state,
        )
    ]


def drawn_height(line_widths: Sequence[int], width: int) -> int:
    """Rows the lines last drawn take on a terminal `width` columns wide now: a terminal that
    was made narrower re-wraps them (tmux, VTE, iTerm2 and Windows Terminal all do)."""
    columns = max(1, width)
    return sum(max(1, math.ceil(w / columns)) for w in line_widths)


def redraw(previous_height: int, lines: Sequence[str], logs: Sequence[str]) -> str:
    """ANSI text that erases the last table, prints new log lines, then draws the table again.

    The cursor goes up to the table's first row and everything from there to the end of the
    screen is cleared at once, so a log line that wraps over several rows can never leave part
    of an old table behind. Log lines then scroll up like normal output; the table follows."""
    out: list[str] = []
    if previous_height:
        out.append(ANSI_UP.format(n=previous_height))
    out.append("\r" + ANSI_CLEAR_BELOW)
    out.extend(line + "\n" for line in logs)
    out.extend(line + "\n" for line in lines)
    return "".join(out)


def erase(previous_height: int) -> str:
    """ANSI text that removes the table (before the summary, which replaces it)."""
    if not previous_height:
        return ""
    return ANSI_UP.format(n=previous_height) + "\r" + ANSI_CLEAR_BELOW


# ----- the end of a run -----
@dataclasses.dataclass(frozen=True)
class Cause:
    """Why a replica failed, quoted from its log: the last exception line and the log's path."""

    replica: str
    line: str | None
    log_path: str


def killed_by(exit_code: int | None) -> str | None:
    """`killed by SIGKILL` for 128 + N, as a shell reports a process a signal ended."""
    if exit_code is None or not 128 < exit_code < 128 + 65:
        return None
    try:
        return f"killed by {signal.Signals(exit_code - 128).name}"
    except ValueError:
        return None


def exit_line(cause: Cause, exit_code: int) -> str:
    """`! worker-1 exited with code 1: ValueError: ... (log: PATH)`, when a replica fails."""
    why = cause.line or killed_by(exit_code) or "(no exception in its log)"
    return f"! {cause.replica} exited with code {exit_code}: {why} (log: {cause.log_path})"


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
    causes: Sequence[Cause] = ()
    has_checkpoint: bool = False
    problem: str | None = None  # the run could not start (e.g. data preparation failed)
    report: core_progress.Report | None = None  # the chief's last progress report


def final_state(summary: Summary) -> str:
    if summary.problem is not None and not summary.status.finished:
        return st.FAILED
    if summary.interrupted and not summary.status.finished:
        return INTERRUPTED
    return st.state_of(summary.status)


def exit_code_of(summary: Summary) -> int:
    """0 only when the job succeeded; 130/143/129 when interrupted by SIGINT/SIGTERM/SIGHUP;
    2 when it could not start here (e.g. its data dir is not writable); else 1."""
    if summary.problem is not None and not summary.status.finished:
        return 2
    state = final_state(summary)
    if state == st.SUCCEEDED:
        return 0
    if state == INTERRUPTED:
        return {"SIGINT": 130, "SIGHUP": 129, "SIGPIPE": 141}.get(summary.interrupted or "", 143)
    return 1


def failed_replicas(status: st.JobStatus, job: spec.TrainJob) -> list[ReplicaKey]:
    """Replicas whose last attempt failed by themselves (not stopped by us), first failure
    first as the condition message names it."""
    failed = [
        key
        for key in job.replica_keys()
        if status.record(key).state == st.STATE_FAILED
        and status.record(key).exit_code not in (None, 0, 137, 143)
    ]
    condition = status.condition(st.FAILED)
    if condition is not None:
        named = [key for key in failed if f"{key[0]} {key[1]} " in condition.message + " "]
        failed = named + [key for key in failed if key not in named]
    return failed


def summary_text(summary: Summary, color: bool = False) -> str:
    """The final summary: state, reason, cause, duration, restarts, last exit codes, paths."""
    job, status = summary.job, summary.status
    state = final_state(summary)
    title = f"TrainJob {job.name} {state} after {duration(summary.elapsed_seconds)}"
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
        codes.append(
            f"{label(key)}={code} ({record.state or 'not started'}, attempt {record.attempt})"
        )
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


def stopped_status(
    status: st.JobStatus,
    exit_codes: Mapping[ReplicaKey, int | None],
    signal_name: str,
    now: datetime.datetime,
) -> st.JobStatus:
    """The status after the user stopped the run: every replica that was still pending or
    running is Stopped with the exit code it stopped with, and Running turns False with reason
    Interrupted, so status.json never claims a run that is over is still Running."""
    replicas = dict(status.replicas)
    for key, code in exit_codes.items():
        record = status.record(key)
        if record.state in (st.STATE_PENDING, st.STATE_RUNNING, st.STATE_NONE):
            replicas[key] = dataclasses.replace(
                record, state=st.STATE_STOPPED, exit_code=code, reason=INTERRUPTED
            )
    conditions = st.set_condition(
        status.conditions,
        st.RUNNING,
        False,
        INTERRUPTED,
        f"trainjob run was stopped by {signal_name}; every replica was stopped",
        now,
    )
    return dataclasses.replace(status, replicas=replicas, conditions=conditions)


def elapsed(start: datetime.datetime | None, now: datetime.datetime) -> float:
    return 0.0 if start is None else (now - start).total_seconds()


# ----- trainjob status -----
UNKNOWN: Final = "Unknown"
_ENDED: Final = (st.SUCCEEDED, st.FAILED, INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One local run as `trainjob status` sees it: its status.json data and the pid of the
    `trainjob run` holding it (None: no run is in progress there)."""

    run_dir: str
    data: Mapping[str, Any]
    holder: int | None
    step: int | None = None  # the latest global step in progress.jsonl


def last_step(progress_text: str) -> int | None:
    """The highest `step` in the end of a progress.jsonl (torn or foreign lines skipped)."""
    steps: list[int] = []
    for line in progress_text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        step = event.get("step") if isinstance(event, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            steps.append(step)
    return max(steps) if steps else None


def effective_state(entry: RunEntry) -> str:
    """status.json's state, except that a run nobody holds any more cannot be Running: its
    `trainjob run` was killed before it could write the end (Unknown, as kubectl says)."""
    state = str(entry.data.get("state") or "Pending")
    if entry.holder is None and state not in _ENDED:
        return UNKNOWN
    return state


def status_data(entry: RunEntry) -> dict[str, Any]:
    """What `trainjob status -o json|yaml` prints for one run."""
    return {
        **entry.data,
        "state": effective_state(entry),
        "runDir": entry.run_dir,
        "inProgress": entry.holder is not None,
        "step": entry.step,
    }


def _name_of(entry: RunEntry) -> str:
    name = entry.data.get("jobName")
    return str(name) if name else entry.run_dir.rstrip("/").rsplit("/", 1)[-1]


def runs_table(entries: Sequence[RunEntry]) -> list[str]:
    """`NAME  STATE  READY  RESTARTS  COMPLETED  RUN DIR`, kubectl style."""
    rows = [("NAME", "STATE", "READY", "RESTARTS", "COMPLETED", "RUN DIR")]
    for entry in entries:
        rows.append(
            (
                _name_of(entry),
                effective_state(entry),
                str(entry.data.get("ready", "-")),
                str(entry.data.get("restartCount", 0)),
                str(entry.data.get("completionTime", "-")),
                entry.run_dir,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]


def status_lines(entry: RunEntry) -> list[str]:
    """One run in detail: state and why, times, restarts, then one line per replica."""
    data = entry.data
    state = effective_state(entry)
    running = f" (trainjob run pid {entry.holder})" if entry.holder and entry.holder > 0 else ""
    lines = [f"TrainJob {_name_of(entry)}: {state}{running}", f"  run dir:    {entry.run_dir}"]
    if state == UNKNOWN:
        lines.append(
            f"  note:       status.json says {data.get('state')}, but no trainjob run holds this "
            "run dir: it was killed before it could record the end"
        )
    for condition in data.get("conditions") or []:
        if not isinstance(condition, Mapping) or condition.get("status") != "True":
            continue
        if condition.get("type") in (st.SUCCEEDED, st.FAILED, st.RESTARTING):
            lines.append(f"  reason:     {condition.get('reason')}: {condition.get('message')}")
    if data.get("state") == INTERRUPTED:
        for condition in data.get("conditions") or []:
            if isinstance(condition, Mapping) and condition.get("reason") == INTERRUPTED:
                lines.append(f"  reason:     {INTERRUPTED}: {condition.get('message')}")
    if data.get("problem"):
        lines.append(f"  reason:     {data['problem']}")
    for key, title in (("startTime", "started"), ("completionTime", "completed")):
        if data.get(key):
            lines.append(f"  {title + ':':<11} {data[key]}")
    lines.append(f"  restarts:   {data.get('restartCount', 0)}   ready: {data.get('ready', '-')}")
    if entry.step is not None:
        lines.append(f"  step:       {entry.step}")
    rows = [("REPLICA", "STATE", "ATTEMPT", "EXIT")]
    statuses = data.get("replicaStatuses") or {}
    for rtype, per_type in statuses.items() if isinstance(statuses, Mapping) else ():
        for index in per_type.get("indexes") or [] if isinstance(per_type, Mapping) else []:
            code = index.get("exitCode")
            rows.append(
                (
                    f"{rtype}-{index.get('index')}",
                    str(index.get("state") or "-"),
                    str(index.get("attempt", 0)),
                    "-" if code is None else str(code),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines.extend(
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )
    return lines
