"""The operator's parts, built in one place, started in order and stopped in the reverse order
(controller-runtime's Manager): the shared context with the child index, its informers, the
node watch and the watchdog; the progress server; one job loop per watched kind. handlers.py
builds and starts it at kopf's start-up and closes it at kopf's clean-up.

    build:  child index → wake router → child informers, gang requeue, node watch,
            watchdog → progress server → context → job loops (each registered with the wake
            router) → job informers (each feeding its loop)
    start:  children listed (bounded wait) → node watch → progress server → job loops →
            job informers → leader election (with --leader-elect)
    close:  resign (the write gate closes) → job informers → job loops → progress server →
            watchdog → child informers → node watch → release the Lease → API client

Every kind the operator watches comes in the same way, a list then a watch (informer.py):
the jobs (TrainJobs; TFJobs with --tfjob) through their job informers into their loops, their
children (Pods, Services, Workloads, PodGroups) and the nodes into indexes whose events wake
the job they belong to (controller-runtime's For().Owns()). kopf serves the rest: start-up,
clean-up, probes.

With leader election (elector.py) every replica builds and starts all of it: a standby's
informers list and watch as the leader's do; only its writes wait (the job loops, the
progress writer, Kueue's releases) and the API layer's write gate refuses any other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from typing import Final

from trainjob.core import tfjob
from trainjob_operator import (
    aio,
    children,
    config,
    context,
    controller,
    doors,
    elector,
    gang,
    gang_sync,
    informer,
    kube,
    leader,
    metrics,
    nodes,
    progress_server,
    reconciler,
    watchdog,
)

logger = logging.getLogger(__name__)

# How long start-up waits for the children's first list before kopf lists the TrainJobs (it
# goes on without it: jobs are then reconciled once it is in, as always, only not parked at
# sight). Short: kopf serves nothing, its liveness probe included, until start-up is done, and
# an operator that may not list Pods must still start and say so (test_operator_watchdog).
LIST_WAIT: Final = 10.0


def watched_children(settings: config.Settings) -> tuple[informer.Resource, ...]:
    """The kinds the child informers list and watch: Pods and Services always; the jobs'
    Workloads with Kueue; training-operator's Pods and Services of TFJobs taken over with
    --tfjob; the PodGroups of the configured gang scheduler."""
    kinds = informer.KINDS + ((informer.WORKLOADS,) if settings.kueue else ())
    if settings.tfjob:
        kinds += informer.KUBEFLOW_KINDS
    if gang.wanted(settings):
        kinds += (informer.pod_groups(settings.gang_scheduler),)
    return kinds


@dataclasses.dataclass
class Manager:
    ctx: context.OperatorContext
    # The TrainJob loop, and the TFJob loop with --tfjob.
    jobs: controller.Controller
    tfjobs: controller.Controller | None
    progress: progress_server.ProgressServer | None
    # The list+watch of each job kind, feeding its loop.
    job_informers: list[informer.JobInformer] = dataclasses.field(default_factory=list)
    # This replica's part in leader election (None: no election, it always writes).
    election: elector.Elector | None = None

    def problems(self) -> list[str]:
        """Why this operator is not healthy now (empty: it is): a list+watch failing too
        long, or a job waiting too long for its first reconcile (watchdog.py)."""
        ctx = self.ctx
        watches = [*ctx.informer.health(), ctx.nodes.health]
        watches += [health for jobs in self.job_informers for health in jobs.watches]
        return ctx.watchdog.problems(watches)

    @property
    def loops(self) -> list[controller.Controller]:
        return [self.jobs] + ([self.tfjobs] if self.tfjobs is not None else [])

    async def start(self) -> None:
        ctx = self.ctx
        # Children (and Workloads) are listed before kopf lists the TrainJobs: a finished
        # job with no child left is then parked at first sight, without a reconcile
        # (controller.py), and a Workload whose job was deleted while no operator ran is
        # still released.
        scopes = ctx.settings.watched_namespaces or ("",)
        listed = [ctx.informer.acquire(namespace) for namespace in scopes]
        try:
            await aio.within(asyncio.gather(*(event.wait() for event in listed)), LIST_WAIT)
        except asyncio.TimeoutError:
            logger.warning("Children not listed in %.0fs; serving jobs as they come", LIST_WAIT)
        ctx.nodes.start()
        if self.progress is not None:
            await self.progress.start()
        for loop in self.loops:
            loop.start()
        for jobs in self.job_informers:
            jobs.start()
        if self.election is not None:
            self.election.start()

    async def close(self) -> None:
        if self.election is not None:
            await self.election.resign()
        for jobs in self.job_informers:
            await jobs.close()
        for loop in reversed(self.loops):
            await loop.close()
        if self.progress is not None:
            await self.progress.close()
        await self.ctx.watchdog.close()
        await self.ctx.informer.close()
        await self.ctx.nodes.close()
        if self.election is not None:
            await self.election.release()
        await self.ctx.kube.close()


def build(
    settings: config.Settings,
    api: kube.Kube,
    meters: metrics.Metrics,
    election: elector.Elector | None = None,
) -> Manager:
    """The operator's parts for `settings`; with `election`, writes wait for this replica
    to lead and the API layer refuses any write while it does not."""
    leadership: leader.Leadership = election if election is not None else leader.Alone()
    if election is not None:
        api.gate_writes(election.leading)
    index = children.ChildIndex()
    wakes = context.Wakes()
    # Jobs whose loop has begun reconciling (the watchdog and the progress server ask).
    reconciled: set[children.JobKey] = set()
    # One list+watch per kind for the cluster when kopf watches TrainJobs cluster-wide (no
    # namespace given, or namespace patterns), else one per watched namespace.
    child_informer = informer.ChildInformer(
        api, index, wakes.wake, not settings.watched_namespaces, watched_children(settings)
    )
    gangs = gang_sync.Requeue(api, settings, wakes.wake)
    # The node watch wakes the jobs on a node whose readiness moved; the context, built below
    # with the node watch in it, knows them (so the call is bound late, on purpose).
    node_informer = nodes.NodeInformer(api, lambda names: ctx.wake_on_nodes(names))  # noqa: PLW0108
    dog = watchdog.Watchdog(settings, meters, reconciled.__contains__, leadership.leading)
    server, progress = (
        progress_server.build(settings, api, index, reconciled.__contains__, meters, leadership)
        if settings.progress_enabled
        else (None, context.Progress())
    )
    ctx = context.OperatorContext(
        settings=settings,
        kube=api,
        metrics=meters,
        wakes=wakes,
        child_index=index,
        informer=child_informer,
        nodes=node_informer,
        watchdog=dog,
        gangs=gangs,
        reconciled=reconciled,
        progress=progress,
        leadership=leadership,
    )
    if election is not None and settings.kueue:
        election.on_elected.append(ctx.release_orphans)
    if settings.kueue:
        index.workload_listeners.append(ctx.release_if_orphaned)
    if gang.wanted(settings):
        index.pod_listeners.append(gangs.pod_changed)
    jobs = controller.Controller(ctx, leadership=leadership)
    tfjobs = (
        controller.Controller(
            ctx,
            leadership=leadership,
            reconcile=functools.partial(
                reconciler.reconcile, door=doors.TFJobDoor(mode=settings.tfjob_mode)
            ),
            kind=tfjob.KIND,
        )
        if settings.tfjob
        else None
    )
    manager = Manager(ctx=ctx, jobs=jobs, tfjobs=tfjobs, progress=server, election=election)
    for loop in manager.loops:
        wakes.serve(loop)
    manager.job_informers.append(informer.JobInformer(api, settings, informer.TRAINJOBS, jobs))
    if tfjobs is not None:
        manager.job_informers.append(informer.JobInformer(api, settings, informer.TFJOBS, tfjobs))
    return manager
