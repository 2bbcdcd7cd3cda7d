"""What replicas report about their training (pure): the TRAINJOB_PROGRESS events of each
replica folded into its latest numbers, and which replica speaks for the job."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainjob.core import progress as core_progress
from trainjob.core import progress_events, spec
from trainjob.core.naming import ReplicaKey


@dataclasses.dataclass(frozen=True)
class ReplicaProgress:
    """The latest progress numbers of one replica: from its TRAINJOB_PROGRESS events (local
    mode), or from the job's progress report (a cluster job)."""

    epoch: int | None = None  # counted from 1, as a report counts it
    step: int | None = None
    loss: float | None = None
    examples_per_sec: float | None = None
    checkpoint: str | None = None
    export: str | None = None
    initial_step: int | None = None
    end_status: str | None = None
    devices: core_progress.Devices | None = None  # what it trains on, from its start event


def fold(current: ReplicaProgress | None, event: Mapping[str, Any]) -> ReplicaProgress:
    """Update one replica's progress with one event; unknown or null fields keep old values."""
    base = current or ReplicaProgress()
    kind = event.get("event")
    changes: dict[str, Any] = {}
    epoch = progress_events.epoch_number(event)
    if epoch is not None:
        changes["epoch"] = epoch
    for name in ("step", "loss", "examples_per_sec", "checkpoint", "export"):
        value = event.get(name)
        if value is not None:
            changes[name] = value
    if kind == "start":
        changes["initial_step"] = event.get("initial_step")
        changes["end_status"] = None
        changes["devices"] = progress_events.devices_of(event)
    if kind == "end":
        changes["end_status"] = event.get("status")
    return dataclasses.replace(base, **changes)


def lead_replica(job: spec.TrainJob) -> ReplicaKey:
    """The replica whose numbers speak for the job: the chief, else worker 0."""
    return ("chief", 0) if job.replicas("chief") else ("worker", 0)


def job_step(progress: Mapping[ReplicaKey, ReplicaProgress]) -> int | None:
    """The job's global step: the highest any replica reported (all-reduce workers agree; under
    ParameterServer only the chief counts steps)."""
    steps = [p.step for p in progress.values() if p.step is not None]
    return max(steps) if steps else None
