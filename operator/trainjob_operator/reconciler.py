"""One reconcile of one TrainJob: read → parse → decide (policy engine) → apply → status.

Every decision is the core's (`policy.reconcile`); this module only turns a Decision into API
calls through `kube`, in an order that is safe to interrupt at any point (the operator may be
killed between any two calls and the next reconcile converges):

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

from trainjob.core import naming, policy, render, spec
from trainjob.core import status as st
from trainjob_operator import (
    children,
    doors,
    gang,
    gang_sync,
    kube,
    kueue,
    log_causes,
    netpol,
    pods_left,
    writes,
)
from trainjob_operator import kueue_patches as kp
from trainjob_operator import kueue_workload as kw
from trainjob_operator.context import OperatorContext

JobKey = children.JobKey

logger = logging.getLogger("trainjob_operator.reconciler")


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


async def reconcile_job(
    rt: OperatorContext,
    namespace: str,
    name: str,
    pods: Iterable[children.ChildPod],
    services: Iterable[children.ChildService],
    now: datetime.datetime,
    live: Mapping[str, Any] | None,
    seen: writes.Seen,
    door: doors.Door = doors.TRAINJOB,
) -> Outcome:
    """`live`: the watched copy of the job (None: read it with a GET); `seen`: the job
    loop's memory of it (see `writes.current_trainjob`); `door`: the kind it came in by
    (a TrainJob, or a TFJob: doors.py)."""
    raw = await door.current(rt.kube, namespace, name, live, seen)
    if raw is None:
        return Outcome(None, done=True)
    metadata = raw.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return Outcome(None, done=True)
    if not door.accepts(raw):
        # Another controller's job (a TFJob's runPolicy.managedBy, which is immutable).
        return Outcome(None, at_rest=True)
    api = door.recorder(rt.kube, raw)
    uid = str(metadata.get("uid") or "")
    raw_status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    old = st.from_dict(raw_status)

    mine_pods = [p for p in pods if p.owner_uid in (uid, None)]
    mine_services = [s for s in services if s.owner_uid in (uid, None)]
    try:
        job = door.parse(raw)
    except spec.SpecError as exc:
        message = "; ".join(str(problem) for problem in exc.problems)
        await _mark_invalid(rt, door, raw, raw_status, old, None, message, now, seen, mine_pods)
        return Outcome(None, at_rest=writes.settled(seen))

    options = _render_options(rt, door, raw, job, namespace)

    # Kueue first: it may suspend the job (before any Pod exists) or start it with the
    # admission's templates, and the decision below is made from the job as it left it.
    queued: kueue.Step | None = None
    if door.own_kueue and await kueue.is_managed(
        rt.kube, rt.settings, rt.kueue_namespaces, job, namespace
    ):
        try:
            queued = await kueue.sync(
                rt.kube,
                rt.settings,
                raw,
                job,
                rt.child_index.workloads((namespace, name)),
                mine_pods,
                options,
                now,
            )
        except kube.ConflictError:
            seen.stale = True
            raise
        if queued.raw is not raw:
            raw = dict(queued.raw)
            seen.known = raw
            job = door.parse(raw)
            options = _render_options(rt, door, raw, job, namespace)
    if kw.managed_elsewhere(job.managed_by):
        # MultiKueue runs this job on a worker cluster and mirrors its status here: no
        # Pods, Services or status of ours.
        return Outcome(None)

    # A failed replica of one's own command whose termination message names no exception
    # quotes the last one in its log instead (each log read once), and a refused write on a
    # volume says how to fix it.
    observed = await log_causes.observed_with_causes(
        rt.kube, namespace, job, mine_pods, old.finished, seen.log_causes
    )
    pod_uids = {p.key: p.uid for p in mine_pods}
    service_uids = {s.key: s.uid for s in mine_services}

    refused: dict[policy.ReplicaKey, str] = {}
    for key in [k for k in seen.refused if k in observed]:
        del seen.refused[key]  # created since: no longer refused
    refused = dict(seen.refused)
    # Replicas whose node is not Ready: shown, never deleted by us (Kubernetes decides).
    lost = {
        p.key: loss
        for p in mine_pods
        if p.node_name and (loss := rt.nodes.index.loss(p.node_name)) is not None
    }
    group = rt.child_index.pod_group((namespace, name), gang.pod_group_name(job))
    gang_plan = gang.plan(job, rt.settings, old, mine_pods, group)
    decision = policy.reconcile(
        job,
        old,
        observed,
        set(service_uids),
        now,
        progress_at=rt.progress_at((namespace, name)),
        refused=refused,
        lost=lost,
        held=gang_plan.hold,
    )
    if queued is not None:
        decision = kp.held_decision(decision, old, queued.hold, queued.workload, now)
    requeue_gang_in: float | None = None
    # The PodGroup comes before the Pods that need it (or, under Volcano, before their hold).
    make_group = gang_plan.create and bool(decision.create_pods or gang_plan.hold)
    if gang.wanted(rt.settings):
        decision = gang.waiting_message(decision, job, group)
        if make_group:
            bypassed = gang.bypass_events(job, rt.settings)
            decision = dataclasses.replace(decision, events=(*decision.events, *bypassed))
        requeue_gang_in = await rt.gangs.step((namespace, name), decision, group)
    owner = _owner(door, raw, name, uid)

    # Record the decision before acting on it (see the module docstring for why).
    # kube.ConflictError (the job changed since it was read): the caller decides again.
    patch = writes.status_diff(raw_status, st.to_dict(job, decision.status))
    written = await writes.record_decision(api, raw, decision.events, patch, now, seen)
    if written is None:
        return Outcome(None, done=True)
    raw = written
    raw_status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    rt.metrics.transition(namespace, old, decision.status)
    rt.metrics.set_state(uid, namespace, st.state_of(decision.status))

    for rtype, index in decision.delete_pods:
        await rt.kube.delete_pod(
            namespace,
            naming.child_name(name, job.task_type(rtype), index),
            pod_uids.get((rtype, index)),
        )
    for rtype, index in decision.delete_services:
        await rt.kube.delete_service(
            namespace,
            naming.child_name(name, job.task_type(rtype), index),
            service_uids.get((rtype, index)),
        )
    if gang_plan.update and group is not None:
        await gang_sync.update_pod_group(rt.kube, rt.settings, job, namespace, options, group)
    if (
        gang_plan.delete
        and group is not None
        and await pods_left.gone(rt.kube, namespace, name, uid, mine_pods)
    ):
        # After the Pods (none is left running, confirmed by a read: the index may not have
        # seen a Pod created a moment ago): a Pod whose group is gone is never placed.
        await gang_sync.delete_pod_group(rt.kube, rt.settings, namespace, group)
    refusals: dict[policy.ReplicaKey, str] = {}
    try:
        if decision.create_pods and netpol.wanted(rt.settings, job):
            # The job's NetworkPolicy comes before any of its Pods: none runs unprotected.
            words = await netpol.ensure(rt.kube, job, namespace, owner)
            if words is not None:
                refusals.update({(t, i): netpol.refusal(words) for t, i, _ in decision.create_pods})
                decision = dataclasses.replace(decision, create_pods=())
        if make_group:
            words = await gang_sync.create_pod_group(
                rt.kube, rt.settings, job, namespace, options, owner
            )
            if words is not None:
                # Pods without their group are never placed: none is made, and each says why
                # as a refused Pod would (FailedCreate), tried again with the same backoff.
                refusals.update(
                    {(t, i): f"PodGroup {job.name}: {words}" for t, i, _ in decision.create_pods}
                )
                decision = dataclasses.replace(decision, create_pods=())
        if decision.create_services or decision.create_pods:
            async with rt.creating:
                await _create_children(rt, job, decision, namespace, options, owner, refusals)
    except kube.RejectedError as exc:
        # The API server refused what the spec renders to (e.g. an invalid Pod template that
        # the CRD schema cannot check): the job can never run as written.
        await _mark_invalid(
            rt, door, raw, raw_status, decision.status, job, str(exc), now, seen, mine_pods
        )
        return Outcome(None, at_rest=writes.settled(seen))

    if queued is not None:
        await kueue.sync_pods_ready(rt.kube, queued.workload, decision.status, now)
    # What clients of the job's kind read (a TFJob's own status), from the recorded decision:
    # after the children, so that a new job's Pods are not kept waiting for it.
    await door.publish(rt.kube, raw, decision.status, mine_pods, now, seen)

    if decision.delete_job:
        await api.delete_trainjob(namespace, name, uid)
        rt.metrics.forget(uid)
        return Outcome(None, done=True)
    if refusals:
        # Told in status by the next decision, at once the first time; tried again
        # with a growing delay while the refusal stays (a quota may free up).
        seen.refusals += 1
        seen.refused.update(refusals)
        retry = 0.0 if seen.refusals == 1 else kube.retry_delay(seen.refusals - 1, 2.0, 60.0)
        requeue = retry if decision.requeue_after is None else min(retry, decision.requeue_after)
        return Outcome(requeue)
    seen.refusals = 0
    if requeue_gang_in is not None:
        later = decision.requeue_after
        return Outcome(requeue_gang_in if later is None else min(later, requeue_gang_in))
    return Outcome(decision.requeue_after, at_rest=at_rest(decision, seen))


def _render_options(
    rt: OperatorContext,
    door: doors.Door,
    raw: Mapping[str, Any],
    job: spec.TrainJob,
    namespace: str,
) -> render.RenderOptions:
    progress = rt.progress_endpoint() if door.reports_progress else None
    options = gang.render_options(job, rt.settings, namespace, progress)
    types = door.kubeflow_types(raw)
    return options if types is None else dataclasses.replace(options, kubeflow_types=types)


def _owner(door: doors.Door, raw: Mapping[str, Any], name: str, uid: str) -> render.Owner:
    source = doors.tfjob_of(raw)
    if source:
        return render.Owner(
            name=name, uid=uid, api_version=str(source.get("apiVersion")), kind=door.kind
        )
    return render.Owner(name=name, uid=uid)


async def _create_children(
    rt: OperatorContext,
    job: spec.TrainJob,
    decision: policy.Decision,
    namespace: str,
    options: render.RenderOptions,
    owner: render.Owner,
    refusals: dict[policy.ReplicaKey, str],
) -> None:
    """`refusals` gets the replicas whose Pod (or Service) the API server refused (403)."""
    # Each group's creates are independent of each other, so they go out together (the API
    # layer bounds how many requests run at once); the groups keep their order (Services,
    # then Pods: the PodGroup, if any, is there before both) and each group finishes before
    # the next starts.
    await _all(
        _create_refusable(
            rt,
            "Service",
            namespace,
            (rtype, index),
            naming.child_name(job.name, job.task_type(rtype), index),
            functools.partial(render.render_service, job, rtype, index, options, owner),
            refusals,
        )
        for rtype, index in decision.create_services
    )
    # The cluster spec (TF_CONFIG's host lists) once per reconcile, not once per Pod: it grows
    # with the job, so per Pod it made rendering a large job quadratic.
    cluster = render.cluster_of(job, options) if decision.create_pods else None
    await _all(
        _create_refusable(
            rt,
            "Pod",
            namespace,
            (rtype, index),
            naming.child_name(job.name, job.task_type(rtype), index),
            functools.partial(
                render.render_pod, job, rtype, index, attempt, options, owner, cluster
            ),
            refusals,
        )
        for rtype, index, attempt in decision.create_pods
    )


async def _create_refusable(
    rt: OperatorContext,
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
        return await rt.kube.create(kind, namespace, name, render_child)
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
    (the job is invalid whatever else failed), else the first other error, as the one-by-one
    loop did."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for error in errors:
        if isinstance(error, kube.RejectedError):
            raise error
    if errors:
        raise errors[0]


async def _mark_invalid(
    rt: OperatorContext,
    door: doors.Door,
    raw: Mapping[str, Any],
    raw_status: Mapping[str, Any],
    old: st.JobStatus,
    job: spec.TrainJob | None,
    message: str,
    now: datetime.datetime,
    seen: writes.Seen,
    pods: Iterable[children.ChildPod],
) -> None:
    metadata = raw.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    uid = str(metadata.get("uid") or "")
    if old.finished:
        return  # a finished job stays as it ended; a later spec problem changes nothing
    generation = metadata.get("generation")
    new = policy.invalid_spec(
        old, message, now, generation if isinstance(generation, int) else None
    )
    wanted = st.to_dict(job, new) if job is not None else writes.invalid_status_dict(new)
    patch = writes.status_diff(raw_status, wanted)
    if patch is None:
        return  # already marked
    written = await writes.record_decision(
        door.recorder(rt.kube, raw),
        raw,
        [policy.Event("Warning", policy.REASON_INVALID, message)],
        patch,
        now,
        seen,
    )
    if written is not None:
        await door.publish(rt.kube, written, new, pods, now, seen)
    logger.warning("Marked %s %s/%s Failed (InvalidSpec): %s", door.kind, namespace, name, message)
    rt.metrics.transition(namespace, old, new)
    rt.metrics.set_state(uid, namespace, st.state_of(new))
