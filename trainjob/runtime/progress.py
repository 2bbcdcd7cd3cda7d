"""Progress events as the runtime writes them: the :class:`Emitter` (the only I/O here) and the
tracker it feeds for the reporting replica.

The events' schema (fields, one JSON line after ``TRAINJOB_PROGRESS ``) is the core's:
:mod:`trainjob.core.progress_events`, beside the progress report the operator receives
(:mod:`trainjob.core.progress`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from trainjob.core import progress as core_progress
from trainjob.core.progress_events import (
    devices_of,
    epoch_number,
    format_line,
    make_event,
    report_state,
)
from trainjob.runtime import reporter as reporter_mod


def track(tracker: reporter_mod.Tracker, record: Mapping[str, Any]) -> None:
    """Feed one event into the tracker."""
    if record.get("event") == "start":
        tracker.restart_timer()
    metrics = record.get("metrics")
    tracker.update(
        step=record["step"] if isinstance(record.get("step"), int) else None,
        epoch=epoch_number(record),
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
    # Added to every ``start`` event, whichever runner writes it (the devices in use).
    start_fields: dict[str, Any] = field(default_factory=dict)
    # A replica without a reporter: sends the report of its devices when training starts
    # (``reporter.announce`` in a Pod), so the job's status shows every replica's devices.
    announce: Callable[[core_progress.Report], object] | None = None
    # Sees each ``checkpoint`` event before it is written, once the checkpoint is on disk: a
    # checkpoint dir on object storage uploads it there (the chief) and returns where it is
    # now, which the event then names (trainjob.runtime.objectstore.Mirror).
    publish: Callable[[Mapping[str, Any]], str | None] | None = None

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
        if event == "start":
            fields = {**self.start_fields, **fields}
        if event == "checkpoint" and self.publish is not None:
            fields = {**fields, "checkpoint": self.publish(fields)}
        record = make_event(
            event, replica=self.replica, chief=self.chief, now=time.time(), **fields
        )
        if self.reporter is not None:
            track(self.reporter.tracker, record)
            if event == "start":
                self.reporter.started(devices_of(record))
            record["progress"] = core_progress.to_wire(self.reporter.tracker.report())
            if event == "end":
                self.reporter.finish(report_state(record))
            elif event == "epoch":
                self.reporter.epoch_end(epoch_number(record) or 1)
        elif event == "start" and self.announce is not None:
            devices = devices_of(record)
            if devices is not None:
                self.announce(
                    core_progress.Report(
                        replica=self.replica, time=record.get("time"), devices=devices
                    )
                )
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
