"""The job loop: every job of one kind reconciled by a bounded pool of workers from one keyed work
queue (controller-runtime's shape), and a finished job costs nothing.

- What wakes a job: its watch events (the job informer of its kind, through `observe`), its
  children's and nodes' events (informer.py, nodes.py, gang_sync.py, through `wake`), and
  its own timer (`Outcome.requeue_after`: deadlines, TTL, back-off; plus the safety-net
  resync while it is active). One reconcile of a job at a time (workqueue.py), many jobs at
  once (`workers` of them).
- Active jobs keep what the loop knows between reconciles (`JobState`: the `Seen` memory of
  our own writes, retry counters) and their latest watched copy (minus managedFields),
  so a reconcile needs no GET. A job at rest (`Outcome.at_rest`: finished, clean-up done,
  nothing pending) is parked: its state, its copy and its timer are dropped; it stays
  known only by its key. Anything that happens to it later (an event of its own or of a
  child) reconciles it again, from a GET if its copy was dropped. So 9,000 finished jobs hold
  no task, no timer and no copy, and cost no request at rest. (Before, each job had a kopf
  daemon, finished ones included: a task, kopf's copy of the object and a finalizer each,
  and a resync every 10 minutes.)
- Retries: a conflicting status write (our copy was older than the job) is decided again
  soon from a fresh read; API trouble backs off exponentially (0.5 s doubling to 60 s); a
  bug in one reconcile is logged and retried the same way. None stops another job.
- HA: while this replica stands by (another holds the leader Lease: elector.py) the
  workers take nothing; the job informers still feed `observe` and the children's events
  still queue their jobs, so the copies and the queue are current when it takes over, and
  every job queued meanwhile is reconciled then. A reconcile whose write the API layer
  refuses because the lease lapsed under it (kube.NotLeaderError) is queued again, quietly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from trainjob.core import status as st
from trainjob_operator import children, context, kube, leader, reconciler, workqueue, writes

JobKey = children.JobKey

logger = logging.getLogger(__name__)

BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 60.0
# Wake slightly after a deadline so that the engine sees it as passed.
REQUEUE_SLACK: Final = 0.05
# Jobs reconciled at once. Each reconcile is mostly waiting on the API (whose own limit,
# --api-workers, bounds the requests in flight): enough workers to keep that busy, few
# enough that a burst of new jobs does not hold a task per job.
WORKERS: Final = 32


def job_key(raw: Mapping[str, Any]) -> JobKey | None:
    metadata = raw.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        return None
    return str(metadata.get("namespace") or ""), str(name)


def slim(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainJob as the reconciler needs it: managedFields (often the largest part of
    the object, never read) left out. A shallow copy; nothing else is changed."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return dict(raw)
    return {**raw, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


def finished_at_sight(raw: Mapping[str, Any]) -> str | None:
    """The state to count a TrainJob as when one look at it shows a finished job with
    nothing due: Succeeded or Failed, no TTL to wait for, not being deleted. None: it needs
    a reconcile. (Whether clean-up is done is the child index's to say.)"""
    metadata = raw.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    spec = raw.get("spec")
    run_policy = spec.get("runPolicy") if isinstance(spec, Mapping) else None
    if isinstance(run_policy, Mapping) and run_policy.get("ttlSecondsAfterFinished") is not None:
        return None
    raw_status = raw.get("status")
    status = st.from_dict(raw_status if isinstance(raw_status, Mapping) else {})
    return st.state_of(status) if status.finished else None


def requeue_delay(outcome: reconciler.Outcome, resync_seconds: float) -> float | None:
    """Seconds until an active job is requeued with no event; None: never (parked)."""
    if outcome.at_rest:
        return None
    if outcome.requeue_after is None:
        return resync_seconds
    return min(resync_seconds, max(outcome.requeue_after, 0.0) + REQUEUE_SLACK)


# reconciler.reconcile's shape.
Reconcile = Callable[[context.OperatorContext, reconciler.Request], Awaitable[reconciler.Outcome]]


@dataclasses.dataclass
class JobState:
    """An active job's loop memory between reconciles (dropped when it is parked)."""

    seen: writes.Seen = dataclasses.field(default_factory=writes.Seen)
    failures: int = 0
    conflicts: int = 0


class Controller:
    def __init__(
        self,
        ctx: context.OperatorContext,
        workers: int = WORKERS,
        leadership: leader.Leadership | None = None,
        reconcile: Reconcile = reconciler.reconcile,
        kind: str = "TrainJob",
    ) -> None:
        """`kind`: the kind this loop serves (one loop per kind: doors.py); its `reconcile`
        reads that kind."""
        self.ctx = ctx
        self.kind = kind
        self._reconcile_job = reconcile
        self.workers = workers
        self.queue: workqueue.WorkQueue[JobKey] = workqueue.WorkQueue()
        self.leadership = leadership if leadership is not None else leader.Alone()
        # Every job seen and not deleted: its uid, and who it is beside same-named jobs of
        # other kinds (children.name_holder).
        self.known: dict[JobKey, str] = {}
        self.identities: dict[JobKey, children.Identity] = {}
        # Active jobs' latest watched TrainJob, and their loop memory.
        self.bodies: dict[JobKey, dict[str, Any]] = {}
        self.states: dict[JobKey, JobState] = {}
        # Per job: the event set once its scope's children have been listed.
        self._listed: dict[JobKey, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.queue.run_timers(), name="job timers"))
        for i in range(self.workers):
            self._tasks.append(loop.create_task(self._work(), name=f"job worker {i}"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # -- what wakes a job -------------------------------------------------------------

    def observe(self, event_type: str | None, raw: Mapping[str, Any]) -> None:
        """A watch event of a job of this loop's kind (type None: found by a list)."""
        key = job_key(raw)
        if key is None:
            return
        if event_type == "DELETED":
            self._gone(key)
            return
        metadata = raw.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        if key not in self.known:
            self._listed[key] = self.ctx.informer.acquire(key[0])
        elif self.known[key] != uid:
            self._drop(key)  # deleted and made again under the same name: a new job
        self.known[key] = uid
        self.identities[key] = children.Identity.of(self.kind, raw)
        if metadata.get("deletionTimestamp"):
            self.ctx.watchdog.forget(key)  # going: its loop ends, or never needs to start
        else:
            self.ctx.watchdog.saw(key, self.kind)
        if key not in self.states and self._parks_at_sight(key, uid, raw):
            return
        self.bodies[key] = slim(raw)
        self.queue.add(key)

    def _parks_at_sight(self, key: JobKey, uid: str, raw: Mapping[str, Any]) -> bool:
        """A finished job with nothing due and no child left (its children listed) is
        parked without a reconcile: nothing a reconcile could do for it. This is most of a
        cluster's jobs when the operator starts, or lists again after 410 Gone, so they are
        looked at without keeping 10,000 copies queued at once."""
        state = finished_at_sight(raw)
        if state is None or not self._listed[key].is_set():
            return False
        if self.ctx.child_index.has_children(key):
            return False
        self.bodies.pop(key, None)
        self.queue.forget(key)
        self.ctx.begin(key)
        self.ctx.metrics.set_state(uid, key[0], state)
        return True

    def wake(self, key: JobKey) -> None:
        """Its children or nodes changed: look again (only at jobs its informer told of). A
        child's event wakes its job in whichever loop knows it (a TrainJob's and a TFJob's
        loops share the child index and its informers: context.Wakes)."""
        if key in self.known:
            self.queue.add(key)

    def knows(self, key: JobKey) -> bool:
        """Whether this loop serves the job (it exists and was not deleted)."""
        return key in self.known

    def identity(self, key: JobKey) -> children.Identity | None:
        return self.identities.get(key)

    # -- the workers ------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            await self.leadership.wait_leading()
            key = await self.queue.get()
            try:
                if key in self.known:
                    await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # never lose a worker
                logger.exception("The loop of %s %s/%s failed", self.kind, *key)
                self.queue.add_after(key, BACKOFF_MAX)
            finally:
                self.queue.done(key)

    async def _reconcile(self, key: JobKey) -> None:
        ctx = self.ctx
        listed = self._listed.get(key)
        if listed is not None and not listed.is_set():
            # Decide nothing before the children that exist are known (after a restart, or
            # when another replica worked on this job before).
            await listed.wait()
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = JobState()
        body = self.bodies.get(key)
        ctx.begin(key)
        started = time.monotonic()
        try:
            now = datetime.datetime.now(datetime.timezone.utc)
            outcome = await self._reconcile_job(ctx, reconciler.Request(key, body, state.seen, now))
        except kube.NotLeaderError:
            # The lease lapsed under this reconcile (the process is stopping): whoever leads
            # next decides it again from what it sees.
            logger.info("Stopped reconciling %s %s/%s: not the leader", self.kind, *key)
            self.queue.add(key)
            return
        except kube.ConflictError:
            # Decided from a copy older than the job (our status write was conditional on
            # it): decide again from a fresh read, soon; not an error.
            state.conflicts += 1
            logger.info("%s %s/%s changed since it was read; deciding again", self.kind, *key)
            self.queue.add_after(key, kube.retry_delay(state.conflicts, 0.05, 5.0))
            return
        except (kube.TransientError, kube.RejectedError) as exc:
            self._retry(key, state, f"failed ({exc})", exc)
            return
        except Exception as exc:  # a bug must not stop this job's loop, nor any other job
            logger.exception("Reconcile of %s %s/%s crashed", self.kind, *key)
            self._retry(key, state, "crashed", exc)
            return
        finally:
            ctx.metrics.reconcile_seconds.observe(time.monotonic() - started)
        state.failures = state.conflicts = 0
        if key not in self.known:
            return  # deleted while it was reconciled
        if outcome.done:
            # Gone or going: nothing more to do until its DELETED event forgets it.
            self._park(key, body)
            return
        delay = requeue_delay(outcome, ctx.settings.resync_seconds)
        if delay is None:
            self._park(key, body)
        else:
            self.queue.add_after(key, delay)

    def _retry(self, key: JobKey, state: JobState, what: str, error: Exception) -> None:
        state.failures += 1
        delay = kube.retry_after_failure(state.failures, error, BACKOFF_FIRST, BACKOFF_MAX)
        self.ctx.metrics.reconcile_errors.labels(key[0]).inc()
        logger.warning("Reconcile of %s %s/%s %s; retrying in %.1fs", self.kind, *key, what, delay)
        self.queue.add_after(key, delay)

    # -- parking and forgetting -------------------------------------------------------

    def _park(self, key: JobKey, decided_from: Mapping[str, Any] | None) -> None:
        """At rest: keep only the key. The copy goes unless a newer event replaced it
        meanwhile (that event has queued the job again)."""
        self.states.pop(key, None)
        self.queue.cancel_timer(key)
        if self.bodies.get(key) is decided_from:
            self.bodies.pop(key, None)

    def _drop(self, key: JobKey) -> None:
        self.states.pop(key, None)
        self.bodies.pop(key, None)
        self.queue.forget(key)

    def listed(self, namespace: str | None, keys: set[JobKey]) -> None:
        """A fresh list of `namespace` (None: all) holds `keys`: the jobs known there and not
        in it were deleted while the watch was down (their DELETED event was never seen)."""
        for key in [k for k in self.known if namespace in (None, k[0]) and k not in keys]:
            self._gone(key)

    def _gone(self, key: JobKey) -> None:
        uid = self.known.pop(key, None)
        self.identities.pop(key, None)
        if uid is None:
            return
        self._drop(key)
        self._listed.pop(key, None)
        ctx = self.ctx
        ctx.informer.release(key[0])
        ctx.forget(key)
        ctx.watchdog.forget(key)
        ctx.metrics.forget(uid)
        if ctx.settings.kueue and self.leadership.leading():
            # Kueue holds quota for the job's Workloads until they are finished and released
            # (by the leader; one that takes over later releases what is left: context.py).
            asyncio.get_running_loop().create_task(
                context.release_workloads(ctx, key, datetime.datetime.now(datetime.timezone.utc)),
                name=f"release workloads {key}",
            )
