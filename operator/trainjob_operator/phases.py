"""What each integration adds to a reconcile, one class each: Kueue, the gang scheduler, the
job's NetworkPolicy. reconciler.py runs the reconcile's fixed stages and, at each, every
phase that has something to do there; a new integration is one more class here, not a new
branch inside the reconcile.

The stages, in the order reconciler.py runs them (a phase overrides the ones it needs):

    admit    before anything is observed; may change the job (Kueue starts or suspends it)
             or end the reconcile (a job MultiKueue runs elsewhere)
    observe  what the decision is made from (a gang not yet placed holds its Pods back)
    amend    the decision, before it is recorded (Kueue's hold, the gang's waiting words)
    prune    after the recorded decision's deletes (a PodGroup follows minAvailable, or goes
             once no Pod is left)
    prepare  before any child is created; may refuse the creates (the NetworkPolicy, then
             the PodGroup: no Pod runs unprotected or without its group)
    settle   after the children (Kueue's PodsReady follows the job's Running condition)

A phase's per-job memory lives on the object `start` returns for that one reconcile.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from trainjob.core import policy, render, spec
from trainjob.core import status as st
from trainjob_operator import (
    children,
    doors,
    gang,
    gang_sync,
    kube,
    kueue,
    netpol,
    pods_left,
    writes,
)
from trainjob_operator import kueue_patches as kp
from trainjob_operator import kueue_workload as kw
from trainjob_operator.context import OperatorContext

JobKey = children.JobKey


@dataclasses.dataclass
class Reconciling:
    """One reconcile of one job: what it has read and decided so far, handed from stage to
    stage (and to every phase)."""

    key: JobKey
    door: doors.Door
    now: datetime.datetime
    # The job loop's memory of this job (writes.Seen).
    seen: writes.Seen
    # The job as read, and the status recorded in it.
    raw: Mapping[str, Any]
    raw_status: Mapping[str, Any]
    old: st.JobStatus
    uid: str
    job: spec.TrainJob
    options: render.RenderOptions
    # Its children as indexed (ours, or adopted: no owner).
    pods: list[children.ChildPod]
    services: list[children.ChildService]
    # (reason, message) while the job's Pods must wait (policy.reconcile's `held`).
    held: tuple[str, str] | None = None
    decision: policy.Decision | None = None
    # Replicas whose creation was refused, with the words to show (FailedCreate).
    refusals: dict[policy.ReplicaKey, str] = dataclasses.field(default_factory=dict)
    # Seconds until a phase needs the job requeued (None: nothing due).
    requeue_after: float | None = None

    @property
    def namespace(self) -> str:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]

    def decided(self) -> policy.Decision:
        assert self.decision is not None, "the decision is made after observe"
        return self.decision

    def requeue_within(self, seconds: float | None) -> None:
        """A phase needs the job requeued within `seconds` (None: no need)."""
        if seconds is not None:
            self.requeue_after = (
                seconds if self.requeue_after is None else min(self.requeue_after, seconds)
            )

    def refuse_creates(self, words: str) -> None:
        """No Pod is created in this reconcile; each says `words` (tried again later)."""
        decision = self.decided()
        self.refusals.update({(t, i): words for t, i, _ in decision.create_pods})
        self.decision = dataclasses.replace(decision, create_pods=())


class PhaseRun:
    """One phase in one reconcile: every stage does nothing unless overridden."""

    async def admit(self, ctx: OperatorContext, work: Reconciling) -> bool:
        """False: the reconcile ends here (nothing of ours to do for this job)."""
        return True

    def observe(self, ctx: OperatorContext, work: Reconciling) -> None:
        return None

    async def amend(self, ctx: OperatorContext, work: Reconciling) -> None:
        return None

    async def prune(self, ctx: OperatorContext, work: Reconciling) -> None:
        return None

    async def prepare(self, ctx: OperatorContext, work: Reconciling) -> None:
        return None

    async def settle(self, ctx: OperatorContext, work: Reconciling) -> None:
        return None


class Phase:
    """An integration: which jobs it takes part in, and its run for each reconcile."""

    async def start(self, ctx: OperatorContext, work: Reconciling) -> PhaseRun | None:
        raise NotImplementedError


# -- Kueue ----------------------------------------------------------------------------------


class Kueue(Phase):
    """Kueue admits, suspends and resumes managed jobs through their Workloads (kueue.py)."""

    async def start(self, ctx: OperatorContext, work: Reconciling) -> PhaseRun | None:
        return _KueueRun()


class _KueueRun(PhaseRun):
    def __init__(self) -> None:
        # What Kueue's protocol left for the rest of the reconcile (None: not managed).
        self.step: kueue.Step | None = None

    async def admit(self, ctx: OperatorContext, work: Reconciling) -> bool:
        # First: Kueue may suspend the job (before any Pod exists) or start it with the
        # admission's templates, and the decision is made from the job as it left it.
        if work.door.own_kueue and await kueue.is_managed(
            ctx.kube, ctx.settings, ctx.kueue_namespaces, work.job, work.namespace
        ):
            try:
                self.step = await kueue.sync(
                    ctx.kube,
                    ctx.settings,
                    work.raw,
                    work.job,
                    ctx.child_index.workloads(work.key),
                    work.pods,
                    work.options,
                    work.now,
                )
            except kube.ConflictError:
                work.seen.stale = True
                raise
            if self.step.raw is not work.raw:
                work.raw = dict(self.step.raw)
                work.seen.known = work.raw
                work.job = work.door.parse(work.raw)
                work.options = render_options(ctx, work.door, work.raw, work.job, work.namespace)
        # MultiKueue runs this job on a worker cluster and mirrors its status here: no
        # Pods, Services or status of ours.
        return not kw.managed_elsewhere(work.job.managed_by)

    async def amend(self, ctx: OperatorContext, work: Reconciling) -> None:
        if self.step is not None:
            work.decision = kp.held_decision(
                work.decided(), work.old, self.step.hold, self.step.workload, work.now
            )

    async def settle(self, ctx: OperatorContext, work: Reconciling) -> None:
        if self.step is not None:
            await kueue.sync_pods_ready(
                ctx.kube, self.step.workload, work.decided().status, work.now
            )


# -- the gang scheduler ---------------------------------------------------------------------


class Gang(Phase):
    """All of a job's Pods placed or none: its PodGroup (gang.py decides, gang_sync.py acts)."""

    async def start(self, ctx: OperatorContext, work: Reconciling) -> PhaseRun | None:
        return _GangRun() if gang.wanted(ctx.settings) else None


class _GangRun(PhaseRun):
    def __init__(self) -> None:
        self.group: children.ChildPodGroup | None = None
        self.plan = gang.Plan()
        self.make_group = False

    def observe(self, ctx: OperatorContext, work: Reconciling) -> None:
        self.group = ctx.child_index.pod_group(work.key, gang.pod_group_name(work.job))
        self.plan = gang.plan(work.job, ctx.settings, work.old, work.pods, self.group)
        work.held = self.plan.hold

    async def amend(self, ctx: OperatorContext, work: Reconciling) -> None:
        decision = gang.waiting_message(work.decided(), work.job, self.group, ctx.settings)
        # The PodGroup comes before the Pods that need it (or, under Volcano, before their
        # hold).
        self.make_group = self.plan.create and bool(decision.create_pods or self.plan.hold)
        if self.make_group:
            bypassed = gang.bypass_events(work.job, ctx.settings)
            decision = dataclasses.replace(decision, events=(*decision.events, *bypassed))
        work.decision = decision
        work.requeue_within(await ctx.gangs.step(work.key, decision, self.group))

    async def prune(self, ctx: OperatorContext, work: Reconciling) -> None:
        group = self.group
        if group is None:
            return
        if self.plan.update:
            await gang_sync.update_pod_group(
                ctx.kube, ctx.settings, work.job, work.namespace, work.options, group
            )
            ctx.gangs.group_changed(work.key)
        if self.plan.delete and await pods_left.gone(
            ctx.kube, work.namespace, work.name, work.uid, work.pods
        ):
            # After the Pods (none is left running, confirmed by a read: the index may not
            # have seen a Pod created a moment ago): a Pod whose group is gone is never placed.
            await gang_sync.delete_pod_group(ctx.kube, ctx.settings, work.namespace, group)

    async def prepare(self, ctx: OperatorContext, work: Reconciling) -> None:
        if not self.make_group:
            return
        words = await gang_sync.create_pod_group(
            ctx.kube, ctx.settings, work.job, work.namespace, work.options, owner(work)
        )
        if words is not None:
            # Pods without their group are never placed: none is made, and each says why as
            # a refused Pod would (FailedCreate), tried again with the same backoff.
            work.refuse_creates(f"PodGroup {work.job.name}: {words}")


# -- the job's NetworkPolicy ----------------------------------------------------------------


class NetworkPolicy(Phase):
    """Only the job's own replicas reach its TensorFlow servers (netpol.py)."""

    async def start(self, ctx: OperatorContext, work: Reconciling) -> PhaseRun | None:
        return _NetworkPolicyRun() if netpol.wanted(ctx.settings, work.job) else None


class _NetworkPolicyRun(PhaseRun):
    async def prepare(self, ctx: OperatorContext, work: Reconciling) -> None:
        if not work.decided().create_pods:
            return
        # The job's NetworkPolicy comes before any of its Pods: none runs unprotected.
        words = await netpol.ensure(ctx.kube, work.job, work.namespace, owner(work))
        if words is not None:
            work.refuse_creates(netpol.refusal(words))


# At each stage the phases run in this order: Kueue first (it may start or suspend the job;
# its hold comes before the gang's words), and the NetworkPolicy is made before the PodGroup,
# as before any Pod.
PHASES: tuple[Phase, ...] = (Kueue(), NetworkPolicy(), Gang())


# -- shared by the reconcile and its phases -------------------------------------------------


def render_options(
    ctx: OperatorContext,
    door: doors.Door,
    raw: Mapping[str, Any],
    job: spec.TrainJob,
    namespace: str,
) -> render.RenderOptions:
    progress = ctx.progress_endpoint() if door.reports_progress else None
    options = gang.render_options(job, ctx.settings, namespace, progress)
    labels = door.kind_labels(raw)
    return options if labels is None else dataclasses.replace(options, kind_labels=labels)


def owner(work: Reconciling) -> render.Owner:
    """The controller reference every child carries: the job, of the kind it came in by."""
    return work.door.owner(work.raw)
