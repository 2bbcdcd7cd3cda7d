"""The latest progress report of every job, written to `status.progress` under a budget.

Reports arrive far more often than status needs to change (1,000 jobs every 5 s is 200 a
second), and every status write is an API request, an etcd write and a watch event for every
TrainJob watcher. So only the latest report per job is kept, and a writer sends the waiting
ones at most `writes_per_second` a second, oldest first; a job whose report changed again
before its turn is written once. Final reports (the job's last: Succeeded or Failed) skip the
queue and go at once, so a finished job shows its final figures right away.

A job that ends between two reports still shows its final figures: the runtime also writes
the final report as the container's termination message, which arrives here with the Pod's
watch event (`observe_pod`, fed by the informer the operator already runs).

Devices: the chief's reports carry its devices, every other replica sends one report of its
devices when it starts. They are folded per replica (`progress.fold_devices`) and written as
`status.progress.replicaDevices` and `deviceSummary`; such a report of another replica never
replaces the job's progress. A replica says its devices once, so a write never removes an
entry, and what status already holds (written before an operator restart) is folded back in
from the object a write returns (`resync_devices`), with one more write when the line changed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import prometheus_client

from trainjob.core import containers, progress, termination
from trainjob_operator import aio, children, kube, leader

logger = logging.getLogger(__name__)

JobKey = children.JobKey

# Writes in flight at once (each waits its turn in kube's request slots too).
MAX_CONCURRENT_WRITES: Final = 8
RETRY_SECONDS: Final = 5.0
# Reports of jobs gone this long are dropped from memory.
FORGET_AFTER_SECONDS: Final = 900.0
SWEEP_SECONDS: Final = 300.0


@dataclasses.dataclass
class Latest:
    report: progress.Report
    received: datetime.datetime
    received_mono: float
    written: bool = False
    # Metric names last written, so a metric that disappears is removed from status.
    written_metrics: frozenset[str] = frozenset()
    # When the job's step last advanced (its first report counts): what hang detection
    # (runPolicy.progressDeadlineSeconds) measures from. A hung collective keeps reporting
    # the same step; a stopped process reports nothing: neither moves it.
    advanced_at: datetime.datetime | None = None
    # The devices of the job's replicas, by replica (every replica's report of them folded).
    devices: Mapping[str, progress.Devices] = dataclasses.field(default_factory=dict)


def advanced(current: Latest | None, new: progress.Report) -> bool:
    """Whether `new` moves the job on: its first report, or a higher step than the kept one
    (a restarted attempt resuming at a lower step starts its own clock: the policy also counts
    from the job's latest Running transition)."""
    if current is None or current.advanced_at is None:
        return True
    if new.step is None:
        return False
    return current.report.step is None or new.step != current.report.step


def supersedes(current: progress.Report | None, new: progress.Report) -> bool:
    """Whether `new` replaces the kept report. An older report (by the sender's clock) never
    replaces a newer one; an identical one changes nothing; a final report is replaced only by
    a later one (a restarted job reporting again)."""
    if current is None:
        return True
    if new.replica != current.replica and not progress.says_progress(new):
        return False  # another replica saying only which devices it trains on
    if dataclasses.replace(current, time=None) == dataclasses.replace(new, time=None):
        return False
    if current.time is not None and new.time is not None:
        return new.time >= current.time
    return not current.final or new.final


def status_patch(
    report: progress.Report,
    received: datetime.datetime,
    old_metrics: frozenset[str],
    devices: Mapping[str, progress.Devices] | None = None,
) -> dict[str, Any]:
    """The merge patch of `status.progress`: every field we own is set or nulled, so nothing
    of an older report survives next to the new one; the replicas' devices (all known, by
    replica) are set when known and never removed (a replica says them once)."""
    value = progress.status_progress(report, received, devices or {})
    patch: dict[str, Any] = {key: value.get(key) for key in progress.STATUS_FIELDS}
    metrics: dict[str, Any] = dict.fromkeys(old_metrics)
    metrics.update(value.get("metrics") or {})
    patch["metrics"] = metrics or None
    patch.update(progress.devices_status(devices or {}))
    return {"progress": patch}


def resync_devices(
    known: Mapping[str, progress.Devices], written: Mapping[str, Any] | None
) -> dict[str, progress.Devices] | None:
    """The devices to write again after a write that returned the TrainJob `written`: status
    may hold replicas' devices this operator does not know (written before it restarted, or by
    another replica of it), and the line was made without them. None when nothing is new."""
    status = (written or {}).get("status")
    seen = progress.devices_of_status(
        status.get("progress") if isinstance(status, Mapping) else None
    )
    merged = dict(known)
    for replica, devices in seen.items():
        if replica not in merged and len(merged) < progress.MAX_DEVICE_REPLICAS:
            merged[replica] = devices
    return merged if merged != dict(known) else None


def report_of_pod(body: Mapping[str, Any]) -> progress.Report | None:
    """The final report in a terminated container's termination message, if any."""
    for container in containers.of_pod(body):
        if container.terminated is not None:
            report = termination.read(container.terminated.get("message")).report
            if report is not None:
                return report
    return None


class ProgressStatus:
    def __init__(
        self,
        api: kube.Kube,
        writes_per_second: float,
        registry: prometheus_client.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        leadership: leader.Leadership | None = None,
    ) -> None:
        """`leadership`: writes wait until this replica leads (a standby keeps what arrives,
        final reports from termination messages, and writes them when it takes over)."""
        self._api = api
        self._leadership = leadership if leadership is not None else leader.Alone()
        self._interval = 1.0 / writes_per_second
        self._clock = clock
        self._latest: dict[JobKey, Latest] = {}
        self._waiting: collections.OrderedDict[JobKey, None] = collections.OrderedDict()
        self._finals: collections.OrderedDict[JobKey, None] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_WRITES)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self.writes = prometheus_client.Counter(
            "progress_status_writes",
            "status.progress writes",
            ["result"],
            namespace="trainjob",
            registry=registry,
        )
        self.latency = prometheus_client.Histogram(
            "progress_report_to_status_seconds",
            "From a progress report's arrival to its status write",
            namespace="trainjob",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )

    # -- what arrives -------------------------------------------------------------------------

    def offer(self, job: JobKey, report: progress.Report) -> bool:
        """Keep `report` as the job's latest if it supersedes what is kept, and its devices
        under its replica; True if either changed what is kept."""
        current = self._latest.get(job)
        devices = progress.fold_devices(current.devices if current else {}, report)
        if not supersedes(current.report if current else None, report):
            if current is None or devices == current.devices:
                return False
            current.devices = devices  # written with the job's next write, queued now
            if job not in self._finals:
                self._waiting.setdefault(job, None)
            self._wake.set()
            return True
        now = datetime.datetime.now(datetime.timezone.utc)
        self._latest[job] = Latest(
            report,
            now,
            self._clock(),
            written_metrics=current.written_metrics if current else frozenset(),
            advanced_at=now
            if advanced(current, report) or current is None
            else current.advanced_at,
            devices=devices,
        )
        if report.final:
            self._waiting.pop(job, None)
            self._finals[job] = None
        elif job not in self._finals:
            self._waiting.setdefault(job, None)  # keeps its place in the queue
        self._wake.set()
        return True

    def observe_pod(self, job: JobKey, body: Mapping[str, Any]) -> None:
        """A Pod watch event: a final report in a termination message counts as a report."""
        report = report_of_pod(body)
        if report is not None and self.offer(job, report):
            logger.info(
                "Read the final progress of TrainJob %s/%s from Pod %s's termination message",
                job[0],
                job[1],
                (body.get("metadata") or {}).get("name"),
            )

    def latest(self, job: JobKey) -> Latest | None:
        return self._latest.get(job)

    def progress_at(self, job: JobKey) -> datetime.datetime | None:
        """When the job's step last advanced; None when it never reported."""
        latest = self._latest.get(job)
        return latest.advanced_at if latest is not None else None

    def forget(self, job: JobKey) -> None:
        """The job was deleted: its reports and its replicas' devices go with it (a job made
        again under its name reports afresh)."""
        self._latest.pop(job, None)
        self._waiting.pop(job, None)
        self._finals.pop(job, None)

    def pending(self) -> int:
        return len(self._waiting) + len(self._finals)

    # -- the writer ---------------------------------------------------------------------------

    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="progress writer")

    async def close(self) -> None:
        tasks = [t for t in (self._runner, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        next_slot = self._clock()
        swept = self._clock()
        while True:
            await self._leadership.wait_leading()
            if not self._finals and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            if self._finals:
                job, _ = self._finals.popitem(last=False)
            else:
                # The budget: one ordinary write per slot.
                delay = next_slot - self._clock()
                if delay > 0:
                    self._wake.clear()
                    # A final report arriving meanwhile is written without waiting.
                    with contextlib.suppress(asyncio.TimeoutError):
                        await aio.within(self._wake.wait(), delay)
                    continue
                if not self._waiting:
                    continue
                job, _ = self._waiting.popitem(last=False)
                next_slot = max(next_slot, self._clock() - self._interval) + self._interval
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(self._write(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if self._clock() - swept > SWEEP_SECONDS:
                swept = self._clock()
                self._sweep()

    async def _write(self, job: JobKey) -> None:
        try:
            latest = self._latest.get(job)
            if latest is None:
                return
            devices = latest.devices
            patch = status_patch(latest.report, latest.received, latest.written_metrics, devices)
            try:
                written = await self._api.patch_status(job[0], job[1], patch)
            except (kube.TransientError, kube.RejectedError) as exc:
                self.writes.labels("error").inc()
                logger.warning(
                    "Failed to write the progress of TrainJob %s/%s (%s); retrying in %.0fs",
                    job[0],
                    job[1],
                    exc,
                    RETRY_SECONDS,
                )
                await asyncio.sleep(RETRY_SECONDS)
                if self._latest.get(job) is latest:
                    self._requeue(job, latest)
                return
            if written is None:  # the TrainJob is gone
                self._latest.pop(job, None)
                self.writes.labels("gone").inc()
                return
            self.writes.labels("written").inc()
            self.latency.observe(max(0.0, self._clock() - latest.received_mono))
            latest.written = True
            latest.written_metrics = frozenset(latest.report.metrics)
            current = self._latest.get(job)
            if current is not None and current is not latest:
                current.written_metrics = latest.written_metrics
            if current is not None:
                more = resync_devices(devices, written)
                if more is not None:
                    # Replicas' devices from status this operator did not know: the line
                    # counts them from the next write on.
                    current.devices = {**more, **current.devices}
                    self._requeue(job, current)
        finally:
            self._slots.release()

    def _requeue(self, job: JobKey, latest: Latest) -> None:
        if latest.report.final:
            self._finals.setdefault(job, None)
        else:
            self._waiting.setdefault(job, None)
        self._wake.set()

    def _sweep(self) -> None:
        """Forget jobs that have not reported for long and have nothing waiting."""
        limit = self._clock() - FORGET_AFTER_SECONDS
        for job in [
            job
            for job, latest in self._latest.items()
            if latest.received_mono < limit and job not in self._waiting and job not in self._finals
        ]:
            del self._latest[job]
