"""Training progress as a job reports it: the report schema (the wire format of the progress
endpoint, the termination message's final report (:mod:`trainjob.core.termination`) and
`status.progress`), its validation, the ETA from a moving average of step time, and the text
`kubectl get tj` shows.

Pure: no I/O, no clock reads (callers pass `now`), so the operator, the runtime's reporter and
local mode all share this one implementation.

A report is a JSON object; every field is optional (a bring-your-own script sends what it
knows)::

    {"replica": "worker-0", "state": "Running", "epoch": 3, "totalEpochs": 10,
     "step": 300, "totalSteps": 1000, "percent": 30.0, "loss": 0.231,
     "metrics": {"accuracy": 0.93}, "examplesPerSecond": 1234.5,
     "lastCheckpoint": "/checkpoints/backup", "etaSeconds": 240, "time": 1795000000.0}

`epoch` counts from 1 (the epoch in progress, or the last one completed); `state` is `Running`
until the last report, which says `Succeeded` or `Failed` (a final report).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import times

STATE_RUNNING: Final = "Running"
STATE_SUCCEEDED: Final = "Succeeded"
STATE_FAILED: Final = "Failed"
STATES: Final = (STATE_RUNNING, STATE_SUCCEEDED, STATE_FAILED)

# Bounds that keep a report (and status) small whatever a script sends.
MAX_METRICS: Final = 8
MAX_NAME: Final = 63
MAX_TEXT: Final = 512
# The most bytes a report body may have (the endpoint answers 413 above it). A full report is
# under 1 KiB; the kubelet keeps at most 4 KiB of a termination message.
MAX_BODY_BYTES: Final = 16 * 1024

# Weight of the newest step time in the moving average: about the last 10 samples count.
EMA_ALPHA: Final = 0.2


def audience(namespace: str, name: str) -> str:
    """The audience of a job's progress tokens: a token of one job is useless for another
    job, and for the API server itself."""
    return f"trainjob.dev/progress/{namespace}/{name}"


def report_path(namespace: str, name: str) -> str:
    """The path a job's reports are POSTed to, under the operator's progress URL."""
    return f"/v1/namespaces/{namespace}/trainjobs/{name}/progress"


class ReportError(ValueError):
    """A report that cannot be used; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Report:
    replica: str | None = None
    state: str = STATE_RUNNING
    epoch: int | None = None
    total_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    percent: float | None = None
    loss: float | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    examples_per_second: float | None = None
    last_checkpoint: str | None = None
    eta_seconds: float | None = None
    time: float | None = None

    @property
    def final(self) -> bool:
        return self.state != STATE_RUNNING


# -- validation (the edge: a report from the network or a termination message) ---------------


def _count(raw: Mapping[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(f"{name}: expected a whole number, got {value!r:.40}")
    if value < 0:
        raise ReportError(f"{name}: must not be negative, got {value}")
    return value


def _number(raw: Mapping[str, Any], name: str, *, minimum: float | None = None) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{name}: expected a number, got {value!r:.40}")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return None  # a diverged loss is "unknown", not an error
    if minimum is not None and number < minimum:
        raise ReportError(f"{name}: must be at least {minimum:g}, got {number:g}")
    return number


def _text(raw: Mapping[str, Any], name: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ReportError(f"{name}: expected a string, got {value!r:.40}")
    if len(value) > MAX_TEXT:
        raise ReportError(f"{name}: at most {MAX_TEXT} characters, got {len(value)}")
    return value


def _metrics(raw: Mapping[str, Any]) -> dict[str, float]:
    value = raw.get("metrics")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ReportError(f"metrics: expected an object of name -> number, got {value!r:.40}")
    if len(value) > MAX_METRICS:
        raise ReportError(f"metrics: at most {MAX_METRICS} entries, got {len(value)}")
    result: dict[str, float] = {}
    for key in value:
        if not isinstance(key, str) or not key or len(key) > MAX_NAME:
            raise ReportError(f"metrics: names must be 1-{MAX_NAME} characters, got {key!r:.40}")
        number = _number(value, key)
        if number is not None:
            result[key] = number
    return result


def parse_report(raw: object) -> Report:
    """A Report from a decoded JSON object; ReportError naming the first bad field."""
    if not isinstance(raw, Mapping):
        raise ReportError(f"the report must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(str(key) for key in raw if key not in WIRE_FIELDS)
    if unknown:
        raise ReportError(f"{unknown[0]}: unknown field; known fields: {', '.join(WIRE_FIELDS)}")
    state = raw.get("state", STATE_RUNNING)
    if state not in STATES:
        raise ReportError(f"state: expected one of {', '.join(STATES)}, got {state!r:.40}")
    percent = _number(raw, "percent", minimum=0.0)
    if percent is not None and percent > 100.0:
        raise ReportError(f"percent: must be at most 100, got {percent:g}")
    epoch, total_epochs = _count(raw, "epoch"), _count(raw, "totalEpochs")
    step, total_steps = _count(raw, "step"), _count(raw, "totalSteps")
    return Report(
        replica=_text(raw, "replica"),
        state=str(state),
        epoch=epoch,
        total_epochs=total_epochs or None,
        step=step,
        total_steps=total_steps or None,
        percent=percent,
        loss=_number(raw, "loss"),
        metrics=_metrics(raw),
        examples_per_second=_number(raw, "examplesPerSecond", minimum=0.0),
        last_checkpoint=_text(raw, "lastCheckpoint"),
        eta_seconds=_number(raw, "etaSeconds", minimum=0.0),
        time=_number(raw, "time", minimum=0.0),
    )


def decode(body: bytes) -> Report:
    """A Report from a request body; ReportError for anything but one valid JSON object."""
    if len(body) > MAX_BODY_BYTES:
        raise ReportError(f"body: at most {MAX_BODY_BYTES} bytes, got {len(body)}")
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"body: not valid JSON ({exc})") from None
    return parse_report(raw)


_WIRE: Final = (
    ("replica", "replica"),
    ("state", "state"),
    ("epoch", "epoch"),
    ("total_epochs", "totalEpochs"),
    ("step", "step"),
    ("total_steps", "totalSteps"),
    ("percent", "percent"),
    ("loss", "loss"),
    ("metrics", "metrics"),
    ("examples_per_second", "examplesPerSecond"),
    ("last_checkpoint", "lastCheckpoint"),
    ("eta_seconds", "etaSeconds"),
    ("time", "time"),
)
WIRE_FIELDS: Final = tuple(wire for _, wire in _WIRE)


def to_wire(report: Report) -> dict[str, Any]:
    """The JSON object for a Report (None fields and empty metrics left out)."""
    result: dict[str, Any] = {}
    for attribute, wire in _WIRE:
        value = getattr(report, attribute)
        if value is None or (attribute == "metrics" and not value):
            continue
        result[wire] = dict(value) if attribute == "metrics" else value
    return result


# -- numbers derived from a report ------------------------------------------------------------


def planned_totals(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(epochs, total steps) from a runtime config when it states them: `epochs` x
    `steps_per_epoch` (Keras, custom loops), else `steps` or `max_steps` (Estimator)."""

    def number(key: str) -> int | None:
        value = config.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    epochs, per_epoch = number("epochs"), number("steps_per_epoch")
    return epochs, steps_in(epochs, per_epoch) or number("steps") or number("max_steps")


def steps_in(epochs: int | None, steps_per_epoch: int | None) -> int | None:
    """The total steps of `epochs` epochs of `steps_per_epoch` steps, when both are known."""
    return epochs * steps_per_epoch if epochs and steps_per_epoch else None


def epoch_at(
    step: int, steps_per_epoch: int, *, reported: int | None, total_epochs: int | None
) -> int:
    """The epoch (counting from 1) global `step` lies in, never behind the `reported` one and
    never past `total_epochs`."""
    epoch = max(reported or 0, 1 + max(step - 1, 0) // steps_per_epoch)
    return min(epoch, total_epochs) if total_epochs else epoch


def step_percent(step: int, total_steps: int) -> float:
    """How far `step` is into `total_steps` (> 0), in percent, at most 100."""
    return min(100.0, 100.0 * step / total_steps)


def percent_of(report: Report) -> float | None:
    """The report's own percent, else step/totalSteps, else completed epochs/totalEpochs; 100
    for a job that succeeded."""
    if report.state == STATE_SUCCEEDED:
        return 100.0
    if report.percent is not None:
        return report.percent
    if report.step is not None and report.total_steps:
        return step_percent(report.step, report.total_steps)
    if report.epoch is not None and report.total_epochs:
        return min(100.0, 100.0 * max(report.epoch - 1, 0) / report.total_epochs)
    return None


@dataclasses.dataclass(frozen=True)
class StepTimer:
    """Exponential moving average of seconds per step, from (step, time) samples."""

    last_step: int | None = None
    last_time: float | None = None
    seconds_per_step: float | None = None

    def observe(self, step: int, now: float, alpha: float = EMA_ALPHA) -> StepTimer:
        """The timer after seeing `step` at `now`. A step that went back (a restart resumed
        from a checkpoint) starts a new series; the average itself is kept."""
        if self.last_step is None or self.last_time is None or step < self.last_step:
            return StepTimer(step, now, self.seconds_per_step)
        done, spent = step - self.last_step, now - self.last_time
        if done <= 0 or spent <= 0:
            return self
        sample = spent / done
        average = self.seconds_per_step
        # Weight by the steps the sample covers, so sparse samples count as much as many
        # single-step ones would have.
        weight = 1.0 - (1.0 - alpha) ** done
        updated = sample if average is None else average + weight * (sample - average)
        return StepTimer(step, now, updated)

    def eta(self, step: int | None, total_steps: int | None) -> float | None:
        if step is None or not total_steps or self.seconds_per_step is None:
            return None
        return max(0.0, (total_steps - step) * self.seconds_per_step)


def summary(report: Report) -> str:
    """`45% (3/10)`: percent and epoch/total epochs (else step/total steps, else the step)."""
    percent = percent_of(report)
    count = ""
    if report.epoch is not None and report.total_epochs:
        count = f"{report.epoch}/{report.total_epochs}"
    elif report.step is not None and report.total_steps:
        count = f"{report.step}/{report.total_steps}"
    elif report.step is not None:
        count = f"step {report.step}"
    if percent is None:
        return count
    text = f"{math.floor(percent)}%"
    return f"{text} ({count})" if count else text


def significant(value: float | None, digits: int = 4) -> float | None:
    """`value` to `digits` significant digits (a loss column reads 0.2314, not 0.231403995)."""
    if value is None or value == 0:
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


# The keys of `status.progress` (besides `metrics`), each set or nulled by every write.
STATUS_FIELDS: Final = (
    "summary",
    "state",
    "lastUpdateTime",
    "replica",
    "epoch",
    "totalEpochs",
    "step",
    "totalSteps",
    "percent",
    "loss",
    "examplesPerSecond",
    "lastCheckpoint",
    "etaSeconds",
    "eta",
)


def status_progress(report: Report, received: datetime.datetime) -> dict[str, Any]:
    """`status.progress` for a report received at `received` (the same object local mode
    writes to status.json)."""
    result: dict[str, Any] = {
        "summary": summary(report),
        "state": report.state,
        "lastUpdateTime": times.format_time(received),
    }
    percent = percent_of(report)
    eta = 0.0 if report.state == STATE_SUCCEEDED else report.eta_seconds
    fields: dict[str, Any] = {
        "replica": report.replica,
        "epoch": report.epoch,
        "totalEpochs": report.total_epochs,
        "step": report.step,
        "totalSteps": report.total_steps,
        "percent": None if percent is None else round(percent, 1),
        "loss": significant(report.loss),
        "metrics": {k: significant(v) for k, v in report.metrics.items()} or None,
        "examplesPerSecond": (
            None if report.examples_per_second is None else round(report.examples_per_second, 1)
        ),
        "lastCheckpoint": report.last_checkpoint,
        "etaSeconds": None if eta is None or report.state == STATE_FAILED else round(eta),
        "eta": "" if report.state == STATE_FAILED else times.format_eta(eta),
    }
    result.update({k: v for k, v in fields.items() if v not in (None, "")})
    return result
