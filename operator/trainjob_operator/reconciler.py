"""One reconcile of one job, by key (`reconcile(ctx, Request)`): its watched copy and its
children come from the operator's caches, its decision from the core (`policy.reconcile`).
This module runs the fixed stages; each integration (Kueue, the gang scheduler, the job's
NetworkPolicy) adds its part at the stages it needs, in phases.py:

    read → admit → observe → decide → amend → record → delete → prune → prepare →
    create → settle → publish

That turns a Decision into API calls through `kube` in an order that is safe to interrupt at
any point (the operator may be killed between any two calls and the next reconcile
converges):

    post Events → write status → delete stale children → NetworkPolicy → PodGroup →
    Services → Pods → the status of the job's kind, if it has its own (a TFJob's: doors.py)

- The decision is recorded before it is acted on. A verdict that destroys evidence (clean-up
  of a finished job deletes its Pods) or a restart (a new attempt, counted toward
  backoffLimit) is durable in status before any Pod is deleted or created, so an operator
  killed in between finds the verdict and carries it out, instead of reading the missing
  Pods as "deleted under the job" and restarting a finished job, or creating a replacement
  whose restart was never counted.
- The status write is conditional on the resourceVersion the decision was made from: a
  decision made from a stale view (an older copy of the job than our own last write) fails
  with a conflict and is made again from a fresh read, never overwriting a newer status.
- Events are posted first, under names derived from the job and the status decided from
  (not its resourceVersion), so the same transition decided again (after a crash, or after a
  conflicting status write: kopf's finalizer, a label) posts the same names (409: already
  there); no Event of a recorded transition is lost and none is posted twice. An Event that
  cannot be posted because the API server is unreachable fails the reconcile (retried) before
  the status is written; the Events of a decision whose status write conflicted (superseded:
  the job was suspended or changed meanwhile) are withdrawn once a fresh read shows that
  nobody recorded a transition from the same status.
The pieces of that protocol (which copy to decide from, Events, the conditional status
write) are in writes.py; the operator's shared state in context.py; the loop that calls
`reconcile_job` in controller.py.
Creation is idempotent (deterministic names, 409 is success); the status records which
attempt each replica is on, and a Pod of a newer attempt than recorded is adopted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from trainjob.core import naming, policy, policy_terms, render, spec
from trainjob.core import status as st
from trainjob_operator import children, doors, kube, log_causes, phases, writes
from trainjob_operator.context import OperatorContext
from trainjob_operator.phases import Reconciling

JobKey = children.JobKey

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Outcome:
    # Seconds until a deadline / TTL needs another look; None: only events wake the job.
    requeue_after: float | None
    # The TrainJob is gone (or going): stop its reconcile loop.
    done: bool = False
    # Nothing left to do and nothing due (see `at_rest`): park the job until an event.
    at_rest: bool = False


def at_rest(decision: policy.Decision, seen: writes.Seen) -> bool:
    """A finished job whose clean-up is carried out, with nothing due later (no TTL, no
    retry) and our last status write already in the watched copy: nothing can change for it
    without an event, so its loop parks it (no timer, no copy kept)."""
    actions = (
        decision.create_pods,
        decision.create_services,
        decision.delete_pods,
        decision.delete_services,
        decision.events,
    )
    return (
        decision.status.finished
        and not any(actions)
        and not decision.delete_job
        and decision.requeue_after is None
        and writes.settled(seen)
    )


@dataclasses.dataclass(frozen=True)
class Request:
    """What the job loop asks of one reconcile (controller.py)."""

    key: JobKey
    # The watched copy of the job (the loop's cache); None: read it with a GET.
    live: Mapping[str, Any] | None
    # The job loop's memory of it (see `writes.current_trainjob`).
    seen: writes.Seen
    now: datetime.datetime


async def reconcile(
    ctx: OperatorContext, request: Request, door: doors.Door = doors.TRAINJOB
) -> Outcome:
    """Reconcile the job `request.key` names, its children read from the child index.
    `door`: the kind it came in by (a TrainJob, or a TFJob: doors.py). The stages, each run
    for every phase that takes part (phases.py): read, admit, observe, decide, amend,
    record, delete, prune, prepare, create, settle, publish."""
    work = await _read(ctx, request, door)
    if isinstance(work, Outcome):
        return work
    runs = [run for phase in phases.PHASES if (run := await phase.start(ctx, work)) is not None]
    for run in runs:
        if not await run.admit(ctx, work):
            return Outcome(None)
    # A failed replica of one's own command whose termination message names no exception
    # quotes the last one in its log instead (each log read once), and a refused write on a
    # volume says how to fix it.
    observed = await log_causes.observed_with_causes(
        ctx.kube, work.namespace, work.job, work.pods, work.old.finished, work.seen.log_causes
    )
    seen = work.seen
    for key in [k for k in seen.refused if k in observed]:
        del seen.refused[key]  # created since: no longer refused
    # Replicas whose node is not Ready: shown, never deleted by us (Kubernetes decides).
    lost = {
        p.key: loss
        for p in work.pods
        if p.node_name and (loss := ctx.nodes.index.loss(p.node_name)) is not None
    }
    for run in runs:
        run.observe(ctx, work)
    work.decision = policy.reconcile(
        work.job,
        work.old,
        observed,
        {s.key for s in work.services},
        work.now,
        progress_at=ctx.progress_at(work.key),
        refused=dict(seen.refused),
        lost=lost,
        held=work.held,
    )
    for run in runs:
        await run.amend(ctx, work)

    # Record the decision before acting on it (see the module docstring for why).
    # kube.ConflictError (the job changed since it was read): the caller decides again.
    decision = work.decided()
    api = door.recorder(ctx.kube, work.raw)
    patch = writes.status_diff(work.raw_status, st.to_dict(work.job, decision.status))
    written = await writes.record_decision(api, work.raw, decision.events, patch, work.now, seen)
    if written is None:
        return Outcome(None, done=True)
    work.raw = written
    raw_status = written.get("status") if isinstance(written.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    work.raw_status = raw_status
    ctx.metrics.transition(work.namespace, work.old, decision.status)
    ctx.metrics.set_state(work.uid, work.namespace, st.state_of(decision.status))

    await _delete_stale(ctx, work)
    for run in runs:
        await run.prune(ctx, work)
    try:
        for run in runs:
            await run.prepare(ctx, work)
        decision = work.decided()
        if decision.create_services or decision.create_pods:
            async with ctx.creating:
                await _create_children(ctx, work)
    except kube.RejectedError as exc:
        # The API server refused what the spec renders to (e.g. an invalid Pod template that
        # the CRD schema cannot check): the job can never run as written.
        await _mark_failed(
            ctx,
            door,
            work.raw,
            work.raw_status,
            decision.status,
            work.job,
            str(exc),
            work.now,
            seen,
            work.pods,
        )
        return Outcome(None, at_rest=writes.settled(seen))
    for run in runs:
        await run.settle(ctx, work)
    # What clients of the job's kind read (a TFJob's own status), from the recorded decision:
    # after the children, so that a new job's Pods are not kept waiting for it.
    await door.publish(ctx.kube, work.raw, decision.status, work.pods, work.now, seen)
    return await _outcome(ctx, work, api)


async def _read(ctx: OperatorContext, request: Request, door: doors.Door) -> Reconciling | Outcome:
    """The job as this reconcile decides from, with its children; an Outcome when there is
    nothing to decide (gone, going, another controller's, or invalid: then marked so)."""
    namespace, name = request.key
    seen = request.seen
    raw = await door.current(ctx.kube, namespace, name, request.live, seen)
    if raw is None:
        return Outcome(None, done=True)
    metadata = raw.get("metadata") or {}
    finalizers = metadata.get("finalizers") or []
    if door.stale_finalizer is not None and door.stale_finalizer in finalizers:
        # An earlier release put it there and nothing needs it: a job keeping it could never
        # be deleted. Its change wakes the job again.
        kept = [f for f in finalizers if f != door.stale_finalizer]
        version = metadata.get("resourceVersion")
        await ctx.kube.patch_trainjob(
            namespace, name, {"metadata": {"finalizers": kept}}, str(version or "") or None
        )
        return Outcome(None)
    if metadata.get("deletionTimestamp"):
        return Outcome(None, done=True)
    if not door.accepts(raw):
        # Another controller's job (a TFJob's runPolicy.managedBy, which is immutable).
        return Outcome(None, at_rest=True)
    uid = str(metadata.get("uid") or "")
    raw_status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    old = st.from_dict(raw_status)
    pods = [p for p in ctx.child_index.pods(request.key) if p.owner_uid in (uid, None)]
    services = [s for s in ctx.child_index.services(request.key) if s.owner_uid in (uid, None)]
    # Jobs of two kinds under one name: the first keeps it (children.name_holder), as every
    # loop sees them from its watch.
    namesakes = ctx.wakes.namesakes(request.key)
    me = next((n for n in namesakes if n.kind == door.kind and n.uid == uid), None)
    holder = children.name_holder(me, namesakes) if me is not None else None
    if holder is not None:
        message = name_in_use(door.kind, holder.kind, name)
        await _mark_failed(
            ctx,
            door,
            raw,
            raw_status,
            old,
            None,
            message,
            request.now,
            seen,
            pods,
            policy_terms.REASON_NAME_IN_USE,
        )
        return Outcome(None, at_rest=writes.settled(seen))
    try:
        job = door.parse(raw)
    except spec.SpecError as exc:
        message = "; ".join(str(problem) for problem in exc.problems)
        await _mark_failed(ctx, door, raw, raw_status, old, None, message, request.now, seen, pods)
        return Outcome(None, at_rest=writes.settled(seen))
    return Reconciling(
        key=request.key,
        door=door,
        now=request.now,
        seen=seen,
        raw=raw,
        raw_status=raw_status,
        old=old,
        uid=uid,
        job=job,
        options=phases.render_options(ctx, door, raw, job, namespace),
        pods=pods,
        services=services,
    )


def name_in_use(kind: str, holder_kind: str, name: str) -> str:
    """Why a job is refused: a job of another kind was there first under its name."""
    return (
        f"{holder_kind} {name} in this namespace was created first: its Pods and Services are "
        f"named {name}-<type>-<index>, as this {kind}'s would be. Delete this {kind} and "
        "create it under another name"
    )


async def _delete_stale(ctx: OperatorContext, work: Reconciling) -> None:
    """The children the decision deletes (each by the uid it was seen with)."""
    decision, job = work.decided(), work.job
    pod_uids = {p.key: p.uid for p in work.pods}
    service_uids = {s.key: s.uid for s in work.services}
    for rtype, index in decision.delete_pods:
        await ctx.kube.delete_pod(
            work.namespace,
            naming.child_name(work.name, job.task_type(rtype), index),
            pod_uids.get((rtype, index)),
        )
    for rtype, index in decision.delete_services:
        await ctx.kube.delete_service(
            work.namespace,
            naming.child_name(work.name, job.task_type(rtype), index),
            service_uids.get((rtype, index)),
        )


async def _outcome(ctx: OperatorContext, work: Reconciling, api: writes.JobWrites) -> Outcome:
    """Deletes a job whose TTL is over; otherwise when to requeue it."""
    decision, seen = work.decided(), work.seen
    if decision.delete_job:
        await api.delete_trainjob(work.namespace, work.name, work.uid)
        ctx.metrics.forget(work.uid)
        return Outcome(None, done=True)
    if work.refusals:
        # Told in status by the next decision, at once the first time; tried again
        # with a growing delay while the refusal stays (a quota may free up).
        seen.refusals += 1
        seen.refused.update(work.refusals)
        retry = 0.0 if seen.refusals == 1 else kube.retry_delay(seen.refusals - 1, 2.0, 60.0)
        requeue = retry if decision.requeue_after is None else min(retry, decision.requeue_after)
        return Outcome(requeue)
    seen.refusals = 0
    if work.requeue_after is not None:
        later = decision.requeue_after
        return Outcome(work.requeue_after if later is None else min(later, work.requeue_after))
    return Outcome(decision.requeue_after, at_rest=at_rest(decision, seen))


async def _create_children(ctx: OperatorContext, work: Reconciling) -> None:
    """Create the decision's Services, then its Pods; `work.refusals` gets the replicas whose
    Pod (or Service) the API server refused (403)."""
    decision, job, namespace, options = work.decided(), work.job, work.namespace, work.options
    owner = phases.owner(work)
    # Each group's creates are independent of each other, so they go out together (the API
    # layer bounds how many requests run at once); the groups keep their order (Services,
    # then Pods: the PodGroup, if any, is there before both) and each group finishes before
    # the next starts.
    await _all(
        _create_refusable(
            ctx,
            "Service",
            namespace,
            (rtype, index),
            naming.child_name(job.name, job.task_type(rtype), index),
            functools.partial(render.render_service, job, rtype, index, options, owner),
            work.refusals,
        )
        for rtype, index in decision.create_services
    )
    # The cluster spec (TF_CONFIG's host lists) once per reconcile, not once per Pod: it grows
    # with the job, so per Pod it made rendering a large job quadratic.
    cluster = render.cluster_of(job, options) if decision.create_pods else None
    await _all(
        _create_refusable(
            ctx,
            "Pod",
            namespace,
            (rtype, index),
            naming.child_name(job.name, job.task_type(rtype), index),
            functools.partial(
                render.render_pod, job, rtype, index, attempt, options, owner, cluster
            ),
            work.refusals,
        )
        for rtype, index, attempt in decision.create_pods
    )


async def _create_refusable(
    ctx: OperatorContext,
    kind: str,
    namespace: str,
    key: policy.ReplicaKey,
    name: str,
    render_child: Callable[[], dict[str, Any]],
    refusals: dict[policy.ReplicaKey, str],
) -> bool:
    """Create one child. A Pod the API server finds invalid (422) is the user's template at
    fault: the error (which names the Pod's field) also names the TrainJob field to fix. One
    it forbids (403: Pod Security, a quota, a LimitRange, a webhook) goes into `refusals`
    with the API server's words, for the job's status, and is tried again later."""
    try:
        return await ctx.kube.create(kind, namespace, name, render_child)
    except kube.RejectedError as exc:
        if kind != "Pod":
            raise
        raise kube.RejectedError(f"spec.replicaSpecs.{key[0]}.template: {exc}") from exc
    except kube.TransientError as exc:
        if not exc.refused():
            raise
        refusals[key] = exc.api_message or str(exc)
        logger.warning("Could not create %s %s/%s: %s", kind, namespace, name, exc)
        return False


async def _all(calls: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run `calls` concurrently and wait for every one of them (none is left running when
    this returns or raises); then raise the first RejectedError if any call was rejected
    (the job is invalid whatever else failed), else the first other error."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if isinstance(error, kube.RejectedError):
            raise error
    if errors:
        raise errors[0]


async def _mark_failed(
    ctx: OperatorContext,
    door: doors.Door,
    raw: Mapping[str, Any],
    raw_status: Mapping[str, Any],
    old: st.JobStatus,
    job: spec.TrainJob | None,
    message: str,
    now: datetime.datetime,
    seen: writes.Seen,
    pods: Iterable[children.ChildPod],
    reason: str = policy.REASON_INVALID,
) -> None:
    """Fail a job the operator cannot run (InvalidSpec, or `reason`), saying why."""
    metadata = raw.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    uid = str(metadata.get("uid") or "")
    if old.finished:
        return  # a finished job stays as it ended; a later spec problem changes nothing
    generation = metadata.get("generation")
    new = policy.invalid_spec(
        old, message, now, generation if isinstance(generation, int) else None, reason
    )
    wanted = st.to_dict(job, new) if job is not None else writes.invalid_status_dict(new)
    patch = writes.status_diff(raw_status, wanted)
    if patch is None:
        return  # already marked
    written = await writes.record_decision(
        door.recorder(ctx.kube, raw),
        raw,
        [policy.Event("Warning", reason, message)],
        patch,
        now,
        seen,
    )
    if written is not None:
        await door.publish(ctx.kube, written, new, pods, now, seen)
    logger.warning("Marked %s %s/%s Failed (%s): %s", door.kind, namespace, name, reason, message)
    ctx.metrics.transition(namespace, old, new)
    ctx.metrics.set_state(uid, namespace, st.state_of(new))
