"""The operator never sits silently: a TrainJob that exists but has not had its first reconcile
within a bound is logged and counted, and the liveness probe fails while one waits (or while a
list+watch of the operator keeps failing), so the kubelet restarts an operator that stopped
serving instead of leaving it "healthy" and idle.

Why an independent watch: the jobs kopf serves come from kopf's own TrainJob watch, so a job
kopf never hears about (its resource or namespace observation missed it) leaves no trace in
kopf at all. This module lists and watches the TrainJobs in the operator's scope by itself
(metadata only: names, uids, deletion marks) and compares them with the jobs whose reconcile
loop has run.

Jobs are watched only by a standalone operator: a standby replica of an HA pair serves nothing
by design, so waiting jobs say nothing there. Failing watches fail the probe in every mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainjob_operator import children, config, informer, kube, metrics

logger = logging.getLogger("trainjob_operator.watchdog")

JobKey = children.JobKey


def job_key(body: Mapping[str, Any]) -> JobKey | None:
    metadata = body.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        return None
    return str(metadata.get("namespace") or ""), str(name)


def is_going(body: Mapping[str, Any]) -> bool:
    """Marked for deletion: its loop has ended (or never needs to start)."""
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def _key_and_going(body: Mapping[str, Any]) -> tuple[JobKey | None, bool]:
    """What the watchdog keeps of each listed TrainJob."""
    return job_key(body), is_going(body)


def unhealthy(
    watches: Iterable[informer.WatchHealth],
    waiting: Iterable[JobKey],
    now: float,
    deadline: float,
) -> list[str]:
    """Why the operator is not healthy (empty: it is): list+watches failing for longer than
    `deadline`, and jobs waiting for their first reconcile past it."""
    problems = [
        f"watching {health.what} has failed for {health.failing_for(now):.0f}s"
        for health in watches
        if health.failing_for(now) > deadline
    ]
    late = sorted(waiting)
    if late:
        names = ", ".join(f"{ns}/{name}" for ns, name in late[:5])
        more = f" and {len(late) - 5} more" if len(late) > 5 else ""
        problems.append(
            f"{len(late)} TrainJob(s) waited more than {deadline:.0f}s for a first reconcile: "
            f"{names}{more}"
        )
    return problems


class Watchdog:
    def __init__(
        self,
        api: kube.Kube,
        settings: config.Settings,
        meters: metrics.Metrics,
        reconciled: Callable[[JobKey], bool],
    ) -> None:
        self._api = api
        self._settings = settings
        self._metrics = meters
        self._reconciled = reconciled
        self.deadline = settings.serve_deadline_seconds
        # Every TrainJob of our scope that is not going away -> when we first saw it.
        self._seen: dict[JobKey, float] = {}
        # Those found waiting past the deadline, until they are served or gone.
        self.late: set[JobKey] = set()
        self.health: list[informer.WatchHealth] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}

    def start(self) -> None:
        if not self._settings.standalone:
            return
        scopes: tuple[str | None, ...] = self._settings.kopf_namespaces or (None,)
        for namespace in scopes:
            health = informer.WatchHealth(f"TrainJobs in {namespace or 'all namespaces'}")
            self.health.append(health)
            self._tasks.append(
                asyncio.get_running_loop().create_task(
                    self._run(namespace, health), name=f"watchdog {namespace}"
                )
            )

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def served(self, key: JobKey) -> None:
        """The job's loop has begun its first reconcile."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self.late:
            self.late.discard(key)
            waited = time.monotonic() - self._seen.get(key, time.monotonic())
            logger.info("TrainJob %s/%s is served now, %.0fs after it was seen", *key, waited)
            self._metrics.waiting.set(len(self.late))

    def problems(self, watches: Iterable[informer.WatchHealth]) -> list[str]:
        return unhealthy([*self.health, *watches], self.late, time.monotonic(), self.deadline)

    # -- the TrainJob list+watch ------------------------------------------------------------

    async def _run(self, namespace: str | None, health: informer.WatchHealth) -> None:
        def on_list(items: list[tuple[JobKey | None, bool]]) -> None:
            keys = {key for key, going in items if key is not None and not going}
            for key in [k for k in self._seen if namespace is None or k[0] == namespace]:
                if key not in keys:
                    self._forget(key)
            for key in keys:
                self._saw(key)

        def on_event(kind: str, body: dict[str, Any]) -> None:
            key = job_key(body)
            if key is None:
                return
            if kind == "DELETED" or is_going(body):
                self._forget(key)
            else:
                self._saw(key)

        await informer.reflect(
            health.what,
            lambda: self._api.list_trainjobs(namespace, keep=_key_and_going),
            lambda version: self._api.watch_trainjobs(namespace, version),
            on_list,
            on_event,
            health,
        )

    def _saw(self, key: JobKey) -> None:
        if key in self._seen or not self._settings.serves(key[0]):
            return
        self._seen[key] = time.monotonic()
        if not self._reconciled(key):
            self._timers[key] = asyncio.get_running_loop().call_later(
                self.deadline, self._check, key
            )

    def _forget(self, key: JobKey) -> None:
        self._seen.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self.late:
            self.late.discard(key)
            self._metrics.waiting.set(len(self.late))

    def _check(self, key: JobKey) -> None:
        self._timers.pop(key, None)
        if key not in self._seen or self._reconciled(key):
            return
        self.late.add(key)
        self._metrics.unserved.labels(key[0]).inc()
        self._metrics.waiting.set(len(self.late))
        logger.warning(
            "TrainJob %s/%s has waited %.0fs for its first reconcile; the liveness probe "
            "fails until it is served",
            *key,
            self.deadline,
        )
