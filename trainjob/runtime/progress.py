"""Progress events: the one schema the runtime prints and the executors read.

Every event is one JSON object on one line of stdout, after the prefix
``constants.PROGRESS_LINE_PREFIX`` (``"TRAINJOB_PROGRESS "``); when ``TRAINJOB_PROGRESS_FILE`` is
set (local mode) the same line, without the prefix, is appended to that file too.

Fields (absent or ``null`` when not known):

==================  =================================================================
``event``           ``start`` | ``epoch`` | ``step`` | ``checkpoint`` | ``end``
``time``            seconds since the epoch (float) when the event was written
``replica``         ``"<type>-<index>"`` of the writer, e.g. ``worker-0``
``chief``           whether the writer is the chief (the replica whose numbers count)
``epoch``           0-based epoch the event belongs to (Keras); ``null`` for Estimator
``step``            global step: steps completed over the whole job, resumed runs included
``loss``            last training loss
``metrics``         other training/validation metrics, name -> float
``examples_per_sec``  global examples per second over the epoch / step window
``checkpoint``      path of the latest complete checkpoint (``checkpoint`` and ``end``)
``initial_epoch``   (``start``) the epoch training resumes at; 0 on a fresh start
``initial_step``    (``start``) the global step training resumes at
``tf_version``      (``start``) the TensorFlow version the replica runs
``export``          (``end``, chief only) path of the exported model
``status``          (``end``) ``succeeded`` or the :class:`~trainjob.runtime.exitcodes.FailureKind`
``progress``        (the reporting replica: the chief, else worker 0) the job's progress
                    report as the operator receives it (:mod:`trainjob.core.progress`:
                    totals, percent, ETA from a moving average of step time); local mode
                    shows and stores exactly this
==================  =================================================================
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from trainjob.core import constants
from trainjob.core import progress as core_progress
from trainjob.runtime import reporter as reporter_mod

EVENTS: Final = ("start", "epoch", "step", "checkpoint", "end")
_RESERVED: Final = frozenset(
    {
        "event",
        "time",
        "replica",
        "chief",
        "epoch",
        "step",
        "loss",
        "metrics",
        "examples_per_sec",
        "checkpoint",
    }
)


def _clean_number(value: Any) -> float | int | None:
    """JSON has no NaN/inf; a diverged loss is reported as null rather than breaking the line."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or math.isinf(number):
        return None
    return int(number) if isinstance(value, int) else number


def make_event(
    event: str,
    *,
    replica: str,
    chief: bool,
    now: float,
    epoch: int | None = None,
    step: int | None = None,
    logs: Mapping[str, Any] | None = None,
    examples_per_sec: float | None = None,
    checkpoint: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build one event (pure).

    ``logs`` are Keras-style: ``loss`` is lifted to its own field, the rest become metrics.
    """
    if event not in EVENTS:
        raise ValueError(f"unknown progress event {event!r}; expected one of {EVENTS}")
    metrics = {k: _clean_number(v) for k, v in (logs or {}).items() if k != "loss"}
    record: dict[str, Any] = {
        "event": event,
        "time": round(now, 3),
        "replica": replica,
        "chief": chief,
        "epoch": epoch,
        "step": step,
        "loss": _clean_number((logs or {}).get("loss")),
        "metrics": metrics,
        "examples_per_sec": (None if examples_per_sec is None else round(examples_per_sec, 2)),
        "checkpoint": checkpoint,
    }
    clash = _RESERVED & extra.keys()
    if clash:
        raise ValueError(f"extra fields clash with the schema: {sorted(clash)}")
    record.update(extra)
    return record


def format_line(record: Mapping[str, Any]) -> str:
    """The stdout line for one event (pure)."""
    return constants.PROGRESS_LINE_PREFIX + json.dumps(record, sort_keys=True)


def parse_line(line: str) -> dict[str, Any] | None:
    """The event carried by a stdout line, or ``None`` for ordinary log lines (pure)."""
    if not line.startswith(constants.PROGRESS_LINE_PREFIX):
        return None
    try:
        record = json.loads(line[len(constants.PROGRESS_LINE_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def report_state(record: Mapping[str, Any]) -> str:
    """The report state an event implies: an `end` that succeeded is final, a preempted one is
    not (the replica is restarted and goes on), any other `end` is a failure."""
    if record.get("event") != "end":
        return core_progress.STATE_RUNNING
    status = record.get("status")
    if status == "succeeded":
        return core_progress.STATE_SUCCEEDED
    if status == "preempted":
        return core_progress.STATE_RUNNING
    return core_progress.STATE_FAILED


def track(tracker: reporter_mod.Tracker, record: Mapping[str, Any]) -> None:
    """Feed one event into the tracker (events count epochs from 0, reports from 1)."""
    if record.get("event") == "start":
        tracker.restart_timer()
    epoch = record.get("epoch")
    metrics = record.get("metrics")
    tracker.update(
        step=record["step"] if isinstance(record.get("step"), int) else None,
        epoch=epoch + 1 if isinstance(epoch, int) else None,
        loss=record.get("loss"),
        metrics=metrics if isinstance(metrics, Mapping) else None,
        examples_per_second=record.get("examples_per_sec"),
        checkpoint=record.get("checkpoint"),
        state=report_state(record),
    )


@dataclass
class Emitter:
    """Writes events to stdout (and the progress file when set). The only I/O in this module.

    `reporter` (the reporting replica only) turns events into progress reports: it sends them
    to the operator from its own thread when the Pod has an endpoint, and every event line
    carries the latest report, so local mode shows the same numbers from the same code."""

    replica: str
    chief: bool
    progress_file: str | None = None
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    reporter: reporter_mod.ProgressReporter | None = None
    # Sees every event (the chief's TensorBoard scalars: trainjob.runtime.summaries).
    summaries: Callable[[Mapping[str, Any]], None] | None = None

    def tick(self, step: int) -> None:
        """The global step just completed (cheap: call it every step)."""
        if self.reporter is not None:
            self.reporter.tick(step)

    def plan(
        self,
        *,
        total_epochs: int | None = None,
        total_steps: int | None = None,
        steps_per_epoch: int | None = None,
    ) -> None:
        """Totals known once training starts (Keras `fit` params, a loop's spec)."""
        if self.reporter is not None:
            self.reporter.tracker.plan(
                total_epochs=total_epochs, total_steps=total_steps, steps_per_epoch=steps_per_epoch
            )

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = make_event(
            event, replica=self.replica, chief=self.chief, now=time.time(), **fields
        )
        if self.reporter is not None:
            track(self.reporter.tracker, record)
            record["progress"] = core_progress.to_wire(self.reporter.tracker.report())
            if event == "end":
                self.reporter.finish(report_state(record))
            elif event == "epoch":
                self.reporter.epoch_end(int(record.get("epoch") or 0) + 1)
        # One write per line and an explicit flush: executors tail stdout while the process runs.
        self.stream.write(format_line(record) + "\n")
        self.stream.flush()
        if self.progress_file:
            # O_APPEND writes of one short line are atomic enough for several local replicas
            # sharing one file.
            with open(self.progress_file, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
        if self.summaries is not None:
            self.summaries(record)
        return record
