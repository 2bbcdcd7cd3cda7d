"""The operator never sits silently: a job of any served kind (a TrainJob, a TFJob) that
exists but has not had its first reconcile within a bound is logged and counted, named in its
kind's words, and the liveness probe fails while one waits (or while a list+watch of the
operator keeps failing), so the kubelet restarts an operator that stopped serving instead of
leaving it "healthy" and idle.

The jobs come from the job informers (informer.JobInformer, through the job loop: `saw`,
`forget`), the one watch of each kind; what can still leave a seen job unserved is the loop
itself (its children never listed, e.g. a missing RBAC rule; workers stuck), and a failing
list+watch says so on its own.

Jobs are watched only by the replica that may write (the leader, or the only replica): a
standby serves nothing by design, so waiting jobs say nothing there. Failing watches fail the
probe in every mode.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable

from trainjob.core import constants
from trainjob_operator import children, config, informer, metrics

logger = logging.getLogger(__name__)

JobKey = children.JobKey


def unhealthy(
    watches: Iterable[informer.WatchHealth],
    waiting: Iterable[tuple[str, JobKey]],
    now: float,
    deadline: float,
) -> list[str]:
    """Why the operator is not healthy (empty: it is): list+watches failing for longer than
    `deadline`, and jobs (kind, key) waiting for their first reconcile past it, by kind."""
    problems = [
        f"watching {health.what} has failed for {health.failing_for(now):.0f}s"
        for health in watches
        if health.failing_for(now) > deadline
    ]
    for kind, group in itertools.groupby(sorted(waiting), key=lambda late: late[0]):
        late = [key for _, key in group]
        names = ", ".join(f"{ns}/{name}" for ns, name in late[:5])
        more = f" and {len(late) - 5} more" if len(late) > 5 else ""
        problems.append(
            f"{len(late)} {kind}(s) waited more than {deadline:.0f}s for a first reconcile: "
            f"{names}{more}"
        )
    return problems


class Watchdog:
    def __init__(
        self,
        settings: config.Settings,
        meters: metrics.Metrics,
        reconciled: Callable[[JobKey], bool],
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._settings = settings
        self._metrics = meters
        self._reconciled = reconciled
        self._leading = leading
        self.deadline = settings.serve_deadline_seconds
        # Every job of our scope seen, not going away and not yet served -> when we saw it.
        self._seen: dict[JobKey, float] = {}
        # The kind of each job seen, as its words name it.
        self._kinds: dict[JobKey, str] = {}
        # Those found waiting past the deadline, until they are served or gone.
        self.late: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def served(self, key: JobKey) -> None:
        """The job's loop has begun its first reconcile."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        seen = self._seen.pop(key, None)
        if key in self.late:
            self.late.discard(key)
            waited = time.monotonic() - (time.monotonic() if seen is None else seen)
            kind = self._kinds.get(key, constants.KIND)
            logger.info("%s %s/%s is served now, %.0fs after it was seen", kind, *key, waited)
            self._metrics.waiting.set(len(self.late))

    def problems(self, watches: Iterable[informer.WatchHealth]) -> list[str]:
        late = [(self._kinds.get(key, constants.KIND), key) for key in self.late]
        return unhealthy(watches, late, time.monotonic(), self.deadline)

    def saw(self, key: JobKey, kind: str = constants.KIND) -> None:
        """A job of the operator's scope, of `kind`, exists and is not going away."""
        self._kinds[key] = kind
        if key in self._seen or not self._leading() or self._reconciled(key):
            return
        self._seen[key] = time.monotonic()
        self._timers[key] = asyncio.get_running_loop().call_later(self.deadline, self._check, key)

    def forget(self, key: JobKey) -> None:
        """The job is gone or going."""
        self._seen.pop(key, None)
        self._kinds.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self.late:
            self.late.discard(key)
            self._metrics.waiting.set(len(self.late))

    def _check(self, key: JobKey) -> None:
        self._timers.pop(key, None)
        if key not in self._seen or self._reconciled(key) or not self._leading():
            return
        self.late.add(key)
        self._metrics.unserved.labels(key[0]).inc()
        self._metrics.waiting.set(len(self.late))
        logger.warning(
            "%s %s/%s has waited %.0fs for its first reconcile; the liveness probe "
            "fails until it is served",
            self._kinds.get(key, constants.KIND),
            *key,
            self.deadline,
        )
