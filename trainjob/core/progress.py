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
     "lastCheckpoint": "/checkpoints/backup", "etaSeconds": 240, "time": 1795000000.0,
     "devices": {"gpus": 2, "names": ["GPU:0", "GPU:1"], "cudaBuild": true,
                 "cudaVersion": "12.5"}}

`epoch` counts from 1 (the epoch in progress, or the last one completed); `state` is `Running`
until the last report, which says `Succeeded` or `Failed` (a final report).

`devices` is what TensorFlow sees in the sending replica (the runtime's ``start`` event): the
chief's reports carry its own, and every other replica sends one report of just its replica
and devices when it starts (:func:`says_progress` tells the two apart). The operator folds them
per replica (:func:`fold_devices`) into `status.progress.replicaDevices` and one line for
`kubectl get tj`, `status.progress.deviceSummary` (:func:`devices_summary`: `4 GPU`, `CPU`,
`4 GPU + CPU`), so a replica training on its CPU is never silent.
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
# Bounds of a report's `devices` (a full one stays far below the termination message's 4 KiB).
MAX_GPUS: Final = 1024
MAX_DEVICE_NAMES: Final = 16
MAX_VERSION: Final = 32
# The most replicas whose devices a job's status keeps (each entry is about 100 bytes).
MAX_DEVICE_REPLICAS: Final = 128
# The key of a report that names no replica in a job's devices.
UNKNOWN_REPLICA: Final = "unknown"
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
class Devices:
    """What TensorFlow sees in one replica: its GPUs (`names` may list fewer than `gpus`, at
    most MAX_DEVICE_NAMES), and whether it is a CUDA build and of which CUDA (None: not
    said)."""

    gpus: int = 0
    names: tuple[str, ...] = ()
    cuda_build: bool | None = None
    cuda_version: str | None = None


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
    devices: Devices | None = None

    @property
    def final(self) -> bool:
        return self.state != STATE_RUNNING


# -- validation (the edge: a report from the network or a termination message) ---------------


def _count(raw: Mapping[str, Any], name: str, *, prefix: str = "") -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(f"{prefix}{name}: expected a whole number, got {value!r:.40}")
    if value < 0:
        raise ReportError(f"{prefix}{name}: must not be negative, got {value}")
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


def _devices(raw: Mapping[str, Any]) -> Devices | None:
    value = raw.get("devices")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReportError(f"devices: expected an object (gpus, names, ...), got {value!r:.40}")
    unknown = sorted(str(key) for key in value if key not in DEVICE_FIELDS)
    if unknown:
        raise ReportError(
            f"devices.{unknown[0]:.40}: unknown field; known fields: {', '.join(DEVICE_FIELDS)}"
        )
    gpus = _count(value, "gpus", prefix="devices.")
    if gpus is None:
        raise ReportError("devices.gpus: required (0 for a replica that trains on its CPU)")
    if gpus > MAX_GPUS:
        raise ReportError(f"devices.gpus: at most {MAX_GPUS}, got {gpus}")
    names = value.get("names")
    if names is None:
        names = []
    if not isinstance(names, list):
        raise ReportError(f"devices.names: expected a list of strings, got {names!r:.40}")
    if len(names) > min(gpus, MAX_DEVICE_NAMES):
        raise ReportError(
            f"devices.names: at most {min(gpus, MAX_DEVICE_NAMES)} (one per GPU, up to "
            f"{MAX_DEVICE_NAMES}), got {len(names)}"
        )
    for name in names:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ReportError(
                f"devices.names: each must be 1-{MAX_NAME} characters, got {name!r:.40}"
            )
    cuda_build = value.get("cudaBuild")
    if cuda_build is not None and not isinstance(cuda_build, bool):
        raise ReportError(f"devices.cudaBuild: expected true or false, got {cuda_build!r:.40}")
    version = value.get("cudaVersion")
    if version is not None and (not isinstance(version, str) or len(version) > MAX_VERSION):
        raise ReportError(
            f"devices.cudaVersion: expected a string of at most {MAX_VERSION} characters, "
            f"got {version!r:.40}"
        )
    return Devices(gpus, tuple(names), cuda_build, version or None)


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
        devices=_devices(raw),
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
    ("devices", "devices"),
)
WIRE_FIELDS: Final = tuple(wire for _, wire in _WIRE)
DEVICE_FIELDS: Final = ("gpus", "names", "cudaBuild", "cudaVersion")


def devices_to_wire(devices: Devices) -> dict[str, Any]:
    """The JSON object of one replica's devices (unknown fields and no names left out): the
    report's `devices` and an entry of `status.progress.replicaDevices`."""
    result: dict[str, Any] = {"gpus": devices.gpus}
    if devices.names:
        result["names"] = list(devices.names)
    if devices.cuda_build is not None:
        result["cudaBuild"] = devices.cuda_build
    if devices.cuda_version is not None:
        result["cudaVersion"] = devices.cuda_version
    return result


def to_wire(report: Report) -> dict[str, Any]:
    """The JSON object for a Report (None fields and empty metrics left out)."""
    result: dict[str, Any] = {}
    for attribute, wire in _WIRE:
        value = getattr(report, attribute)
        if value is None or (attribute == "metrics" and not value):
            continue
        if isinstance(value, Devices):
            result[wire] = devices_to_wire(value)
        else:
            result[wire] = dict(value) if attribute == "metrics" else value
    return result


# -- devices: per replica, and the job's one line ---------------------------------------------


def says_progress(report: Report) -> bool:
    """Whether a report says anything about training progress (a number, a checkpoint, a
    final state), not only who sent it and on which devices: a replica other than the
    reporting one sends just that when it starts."""
    return report.final or any(
        value is not None and value != {}
        for value in (
            report.epoch,
            report.total_epochs,
            report.step,
            report.total_steps,
            report.percent,
            report.loss,
            report.metrics,
            report.examples_per_second,
            report.last_checkpoint,
            report.eta_seconds,
        )
    )


def fold_devices(known: Mapping[str, Devices], report: Report) -> dict[str, Devices]:
    """The devices of a job's replicas after `report`: its replica's entry replaced (a
    restarted replica may have landed elsewhere), the rest kept; at most MAX_DEVICE_REPLICAS
    replicas (a new one past that is left out)."""
    result = dict(known)
    if report.devices is None:
        return result
    replica = report.replica or UNKNOWN_REPLICA
    if replica in result or len(result) < MAX_DEVICE_REPLICAS:
        result[replica] = report.devices
    return result


def devices_text(devices: Devices) -> str:
    """One replica in a few characters: `2 GPU`, or `CPU` when TensorFlow sees no GPU."""
    return f"{devices.gpus} GPU" if devices.gpus else "CPU"


def devices_detail(devices: Devices) -> str:
    """One replica for people: `2 GPU (GPU:0, GPU:1; CUDA 12.5)`, `CPU (CUDA 12.5 build, no
    GPU visible)`, `CPU (TensorFlow without CUDA)`."""
    cuda = f"CUDA {devices.cuda_version}" if devices.cuda_version else "CUDA"
    if devices.gpus:
        names = ", ".join(devices.names)
        if names and devices.gpus > len(devices.names):
            names += f", +{devices.gpus - len(devices.names)} more"
        facts = [part for part in (names, cuda if devices.cuda_version else "") if part]
        return devices_text(devices) + (f" ({'; '.join(facts)})" if facts else "")
    if devices.cuda_build:
        return f"CPU ({cuda} build, no GPU visible)"
    if devices.cuda_build is False:
        return "CPU (TensorFlow without CUDA)"
    return "CPU"


def devices_summary(by_replica: Mapping[str, Devices]) -> str:
    """The job's devices in one short line (the `Devices` column of `kubectl get tj`): the
    GPUs of all its replicas, `4 GPU`; `CPU` when no replica has one; `4 GPU + CPU` when some
    replicas train (or serve, as parameter servers do) on their CPU. Empty when no replica said."""
    if not by_replica:
        return ""
    gpus = sum(devices.gpus for devices in by_replica.values())
    on_cpu = any(not devices.gpus for devices in by_replica.values())
    if not gpus:
        return "CPU"
    return f"{gpus} GPU + CPU" if on_cpu else f"{gpus} GPU"


def devices_of_status(progress: object) -> dict[str, Devices]:
    """The replicas' devices `status.progress.replicaDevices` holds (entries that are not
    valid are left out: status is read, not trusted), by replica."""
    if not isinstance(progress, Mapping):
        return {}
    entries = progress.get(REPLICA_DEVICES)
    if not isinstance(entries, Mapping):
        return {}
    result: dict[str, Devices] = {}
    for replica, entry in entries.items():
        try:
            devices = _devices({"devices": entry})
        except ReportError:
            continue
        if isinstance(replica, str) and devices is not None:
            result[replica] = devices
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
# Keys of `status.progress` with the replicas' devices, written only when some are known (a
# write never removes what a replica said: a replica says it once, when it starts).
DEVICE_SUMMARY: Final = "deviceSummary"
REPLICA_DEVICES: Final = "replicaDevices"


def devices_status(by_replica: Mapping[str, Devices]) -> dict[str, Any]:
    """The devices' keys of `status.progress` (none when no replica said)."""
    if not by_replica:
        return {}
    return {
        DEVICE_SUMMARY: devices_summary(by_replica),
        REPLICA_DEVICES: {
            replica: devices_to_wire(devices) for replica, devices in sorted(by_replica.items())
        },
    }


def status_progress(
    report: Report,
    received: datetime.datetime,
    devices: Mapping[str, Devices] | None = None,
) -> dict[str, Any]:
    """`status.progress` for a report received at `received` (the same object local mode
    writes to status.json). `devices`: every replica's, by replica (the operator folds them);
    else the report's own."""
    if devices is None:
        devices = fold_devices({}, report)
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
    result.update(devices_status(devices))
    return result
