"""The operator's shared state (`OperatorContext`): settings, the API, metrics, the child
index and its informers, the node watch, the watchdog, Kueue and gang bookkeeping. One per
operator, built at start-up (manager.py) and handed to the job loops (controller.py) and to
every reconcile (reconciler.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from trainjob.core import render
from trainjob_operator import (
    children,
    config,
    gang_sync,
    informer,
    kube,
    kueue,
    leader,
    metrics,
    nodes,
    pods_left,
    watchdog,
)
from trainjob_operator import kueue_workload as kw

JobKey = children.JobKey

logger = logging.getLogger(__name__)


def creating_jobs(api_workers: int) -> int:
    """How many jobs may create children at once: enough that their creates (8 per replica
    group of a typical job) keep every one of the `api_workers` request slots busy."""
    return max(1, api_workers // 2)


class Wakes:
    """Where "look at this job again" goes: to the job loop of each kind that knows the job
    (one loop per watched kind, controller.py; each registers itself with `serve`)."""

    def __init__(self) -> None:
        self._loops: list[JobLoop] = []

    def serve(self, loop: JobLoop) -> None:
        self._loops.append(loop)

    def wake(self, key: JobKey) -> None:
        for loop in self._loops:
            loop.wake(key)

    def has_loop(self, key: JobKey) -> bool:
        return any(loop.knows(key) for loop in self._loops)

    def namesakes(self, key: JobKey) -> list[children.Identity]:
        """The jobs of every kind known under `key` (one per kind at most)."""
        return [found for loop in self._loops if (found := loop.identity(key)) is not None]


class JobLoop(Protocol):
    def wake(self, key: JobKey) -> None: ...

    def knows(self, key: JobKey) -> bool: ...

    def identity(self, key: JobKey) -> children.Identity | None: ...


@dataclasses.dataclass(frozen=True)
class Progress:
    """How the operator's jobs report progress (progress_server.py), or None/never when off."""

    # Where new Pods report (URL + CA); None: no reporting.
    endpoint: Callable[[], render.ProgressEndpoint | None] = lambda: None
    # When a job's step last advanced (hang detection).
    at: Callable[[JobKey], datetime.datetime | None] = lambda key: None
    # The job is gone: what its replicas reported (their devices too) must not greet a new job
    # of the same name.
    forget: Callable[[JobKey], None] = lambda key: None


@dataclasses.dataclass
class OperatorContext:
    """Operator-wide state shared by the job loops, the informers and the progress server,
    every collaborator given when it is built (manager.py builds it, in one place). Named
    apart from `trainjob.runtime`, the code in each replica."""

    settings: config.Settings
    kube: kube.Kube
    metrics: metrics.Metrics
    wakes: Wakes
    child_index: children.ChildIndex
    # Keeps child_index current and wakes the jobs whose children changed.
    informer: informer.ChildInformer
    # Which nodes are not Ready; wakes the jobs with Pods on a node whose readiness moved.
    nodes: nodes.NodeInformer
    watchdog: watchdog.Watchdog
    # Gangs waiting for nodes, and the touches they are owed when room appears.
    gangs: gang_sync.Requeue
    # Jobs whose loop has begun reconciling; the watchdog reports the jobs that never do.
    reconciled: set[JobKey]
    progress: Progress = Progress()
    # Whether this replica may write (leader election; always, without it).
    leadership: leader.Leadership = dataclasses.field(default_factory=leader.Alone)
    # Jobs creating children at the same time, served first come, first served (asyncio's
    # semaphore). Why a limit: otherwise a burst of N new jobs holds a task per create for
    # all N jobs at once (16,000 at 1,000 x 8), the largest share of the operator's peak
    # memory (bench: 161 -> 123 MiB at 1,000 x 8). The cost, measured there: later jobs'
    # creates now share the request turns with earlier jobs' status writes and clean-up, so
    # the last child of such a burst came later (176 -> ~300 s); the median barely moved.
    creating: asyncio.Semaphore = dataclasses.field(init=False)
    # Which namespaces Kueue manages every job of (--kueue-manage-jobs-without-queue-name).
    kueue_namespaces: kueue.Namespaces = dataclasses.field(default_factory=kueue.Namespaces)
    # Jobs whose orphaned Workloads are being released now.
    releasing: set[JobKey] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        self.creating = asyncio.Semaphore(creating_jobs(self.settings.api_workers))

    def progress_endpoint(self) -> render.ProgressEndpoint | None:
        return self.progress.endpoint()

    def progress_at(self, key: JobKey) -> datetime.datetime | None:
        return self.progress.at(key)

    def release_if_orphaned(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """A Workload being deleted whose job has no reconcile loop here (the job is gone:
        deleted while no operator ran, or its loop ended before it could release it) still
        holds our `resource-in-use` finalizer: finish and release it, or it hangs forever."""
        meta = body.get("metadata") or {}
        if self.wakes.has_loop(key) or not meta.get("deletionTimestamp"):
            return
        if not self.leadership.leading():
            return  # the leader releases it; a standby that takes over looks again then
        if kw.RESOURCE_IN_USE not in (meta.get("finalizers") or []) or key in self.releasing:
            return
        self.releasing.add(key)

        async def release() -> None:
            try:
                now = datetime.datetime.now(datetime.timezone.utc)
                await release_workloads(self, key, now, [body])
            finally:
                self.releasing.discard(key)

        asyncio.get_running_loop().create_task(release(), name=f"release workloads {key}")

    def release_orphans(self) -> None:
        """This replica has just become the leader: release what the previous leader left
        (Workloads being deleted whose job is gone), which it saw while standing by."""
        for key, body in self.child_index.all_workloads():
            self.release_if_orphaned(key, body)

    def wake_on_nodes(self, names: set[str]) -> None:
        for key in self.child_index.jobs_on_nodes(names):
            self.wake(key)
        if any(self.nodes.index.loss(name) is None for name in names):
            self.gangs.room_appeared()  # a node joined or is Ready again

    def begin(self, key: JobKey) -> None:
        """The job's loop is about to reconcile it (for the first time, or again)."""
        if key not in self.reconciled:
            self.reconciled.add(key)
            self.watchdog.served(key)

    def wake(self, key: JobKey) -> None:
        self.wakes.wake(key)

    def forget(self, key: JobKey) -> None:
        self.reconciled.discard(key)
        self.gangs.forget(key)
        self.progress.forget(key)


async def release_workloads(
    ctx: OperatorContext,
    key: JobKey,
    now: datetime.datetime,
    workloads: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """A deleted job's Workloads (default: those the index holds for it) are finished and
    released once the job's Pods are gone (see `pods_stopped`). A failure is logged: the
    Workload is then deleted by the garbage collector, and its next watch event
    (deletionTimestamp set) releases it (`_release_if_orphaned`)."""
    if workloads is None:
        workloads = [w.body for w in ctx.child_index.workloads(key)]
    if not workloads:
        return
    try:
        if not await pods_stopped(ctx, key, workloads):
            logger.warning(
                "Released the Workloads of deleted TrainJob %s/%s while some of its Pods "
                "still run (%.0fs after it was deleted)",
                *key,
                RELEASE_WAIT_SECONDS,
            )
            now = datetime.datetime.now(datetime.timezone.utc)
        await kueue.finalize(ctx.kube, workloads, now)
    except (kube.TransientError, kube.RejectedError) as exc:
        logger.warning("Could not release the Workloads of TrainJob %s/%s: %s", *key, exc)


# How long a deleted job's Workloads keep their quota while the garbage collector stops
# its Pods: their termination grace period (30 s unless the template says otherwise) and
# some. Past it the quota is given back anyway: a Pod stuck on a lost node must not hold
# a queue for ever (the node controller's own eviction takes 5 minutes to start).
RELEASE_WAIT_SECONDS: Final = 120.0
RELEASE_POLL_FIRST: Final = 0.5
RELEASE_POLL_MAX: Final = 5.0


async def pods_stopped(
    ctx: OperatorContext, key: JobKey, workloads: Sequence[Mapping[str, Any]]
) -> bool:
    """Wait until no Pod of the deleted job may still run, or RELEASE_WAIT_SECONDS have
    passed (False). Why wait: the TrainJob is gone at once, but the garbage collector
    deletes its Pods afterwards and each stops within its grace period; the Workload's
    quota pays for them until then (Kueue would admit another job onto their nodes). The
    job has no reconcile loop any more (and with per-namespace watches, no Pod watch either
    once it was the namespace's last job), so the Pods are asked of the API server, with a
    growing pause between asks."""
    owners = {uid for wl in workloads if (uid := kw.owner_uid(wl)) is not None}
    deadline = time.monotonic() + RELEASE_WAIT_SECONDS
    asks = 0
    while True:
        indexed = ctx.child_index.pods(key)
        if all([await pods_left.gone(ctx.kube, key[0], key[1], uid, indexed) for uid in owners]):
            return True
        asks += 1
        pause = kube.retry_delay(asks, RELEASE_POLL_FIRST, RELEASE_POLL_MAX)
        if time.monotonic() + pause > deadline:
            return False
        await asyncio.sleep(pause)
