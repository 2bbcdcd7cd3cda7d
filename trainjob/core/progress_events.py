"""Progress events: the one schema the runtime prints on stdout and the executors read (pure).

Beside the progress report (:mod:`trainjob.core.progress`, what the operator receives over
HTTP): the runtime writes events, the reporting replica's events carry its latest report, and
local mode reads both from the same line. Pure, so an executor parses a line without importing
the runtime (and with it the HTTPS sender).

Every event is one JSON object on one line of stdout, after the prefix
``constants.PROGRESS_LINE_PREFIX`` (``"TRAINJOB_PROGRESS "``); when ``TRAINJOB_PROGRESS_FILE`` is
set (local mode) the same line, without the prefix, is appended to that file too
(:class:`trainjob.runtime.progress.Emitter` writes them).

Fields (absent or ``null`` when not known):

==================  =================================================================
``event``           ``start`` | ``epoch`` | ``step`` | ``checkpoint`` | ``end``
``time``            seconds since the epoch (float) when the event was written
``replica``         ``"<type>-<index>"`` of the writer, e.g. ``worker-0``
``chief``           whether the writer is the chief (the replica whose numbers count)
``epoch``           0-based epoch the event belongs to (Keras); ``null`` for Estimator. The
                    report, ``status.progress`` and the console count from 1:
                    :func:`epoch_number` is the one place that converts
``step``            global step: steps completed over the whole job, resumed runs included
``loss``            last training loss
``metrics``         other training/validation metrics, name -> float
``examples_per_sec``  global examples per second over the epoch / step window
``checkpoint``      path of the latest complete checkpoint (``checkpoint`` and ``end``)
``initial_epoch``   (``start``) the epoch training resumes at; 0 on a fresh start
``initial_step``    (``start``) the global step training resumes at
``tf_version``      (``start``) the TensorFlow version the replica runs
``devices``         (``start``) what TensorFlow sees: ``gpus`` (count), ``names``,
                    ``cuda_build``, ``cuda_version``: a CPU run is said, never silent;
                    :func:`devices_of` makes it a report's ``devices`` (the operator
                    shows it per replica and as one line: ``kubectl get tj``'s Devices)
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
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants
from trainjob.core import progress as core_progress

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
    """Build one event.

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


def epoch_number(record: Mapping[str, Any]) -> int | None:
    """The event's epoch counted from 1, as a progress report, `status.progress` and the
    console count it (events count from 0, as Keras does): the one conversion between the two
    bases."""
    epoch = record.get("epoch")
    return epoch + 1 if isinstance(epoch, int) else None


def format_line(record: Mapping[str, Any]) -> str:
    """The stdout line for one event."""
    return constants.PROGRESS_LINE_PREFIX + json.dumps(record, sort_keys=True)


def parse_line(line: str) -> dict[str, Any] | None:
    """The event carried by a stdout line, or ``None`` for ordinary log lines."""
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


# TensorFlow names physical devices `/physical_device:GPU:0`; a report says `GPU:0`.
_PHYSICAL_PREFIX: Final = "/physical_device:"


def short_device_name(name: str) -> str:
    """`GPU:0` for TensorFlow's `/physical_device:GPU:0` (other names as they are)."""
    return name[len(_PHYSICAL_PREFIX) :] if name.startswith(_PHYSICAL_PREFIX) else name


def devices_of(record: Mapping[str, Any]) -> core_progress.Devices | None:
    """The devices a ``start`` event says its replica trains on, as a report carries them
    (names shortened and both cut to the report's bounds), or None: no ``devices`` field, or
    one without a GPU count."""
    raw = record.get("devices")
    if not isinstance(raw, Mapping):
        return None
    gpus = raw.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        return None
    gpus = min(gpus, core_progress.MAX_GPUS)
    names = raw.get("names")
    shown = [
        short_device_name(name)[: core_progress.MAX_NAME]
        for name in (names if isinstance(names, list) else [])
        if isinstance(name, str) and name
    ]
    cuda_build = raw.get("cuda_build")
    version = raw.get("cuda_version")
    return core_progress.Devices(
        gpus=gpus,
        names=tuple(shown[: min(gpus, core_progress.MAX_DEVICE_NAMES)]),
        cuda_build=cuda_build if isinstance(cuda_build, bool) else None,
        cuda_version=version[: core_progress.MAX_VERSION]
        if isinstance(version, str) and version
        else None,
    )


def report_of(record: Mapping[str, Any]) -> core_progress.Report | None:
    """The progress report an event carries (the reporting replica's events), or None: no
    report, or a foreign or damaged one."""
    raw = record.get("progress")
    if not isinstance(raw, Mapping):
        return None
    try:
        return core_progress.parse_report(raw)
    except core_progress.ReportError:
        return None
