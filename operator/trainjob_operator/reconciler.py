"""One reconcile of one TrainJob: read → parse → decide (policy engine) → apply → status.

Every decision is the core's (`policy.reconcile`); this module only turns a Decision into API
calls through `kube`, in an order that is safe to interrupt at any point (the operator may be
killed between any two calls and the next reconcile converges):

    post Events → write status → delete stale children → create Services → PodGroup → Pods

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
Creation is idempotent (deterministic names, 409 is success); the status records which
attempt each replica is on, and a Pod of a newer attempt than recorded is adopted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

from trainjob.core import naming, policy, render, spec
from trainjob.core import status as st
from trainjob_operator import (
    children,
    config,
    gang,
    gang_sync,
    informer,
    kube,
    kueue,
    metrics,
    nodes,
    watchdog,
)
from trainjob_operator import kueue_patches as kp
from trainjob_operator import kueue_workload as kw

JobKey = children.JobKey

logger = logging.getLogger("trainjob_operator.reconciler")

# The keys of `status` this operator writes (`progress` belongs to progress reporting).
STATUS_KEYS: Final = (
    "state",
    "ready",
    "restartCount",
    "disruptionCount",
    "conditions",
    "replicaStatuses",
    "startTime",
    "attemptStartTime",
    "completionTime",
    "observedGeneration",
)


def creating_jobs(api_workers: int) -> int:
    """How many jobs may create children at once: enough that their creates (8 per replica
    group of a typical job) keep every one of the `api_workers` request slots busy."""
    return max(1, api_workers // 2)


class JobWrites(Protocol):
    """The API calls one reconcile makes for its own job (kube.Kube is one; the unit tests'
    recorder is another): its write protocol is checked against this, in order, with no
    API server (tests/unit/test_write_protocol.py)."""

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None: ...

    async def post_event(
        self,
        job: dict[str, Any],
        event_type: str,
        reason: str,
        message: str,
        now: datetime.datetime,
        event_id: str | None = None,
    ) -> str | None: ...

    async def withdraw_events(self, namespace: str, names: Iterable[str]) -> None: ...

    async def create(
        self, kind: str, namespace: str, name: str, render: Callable[[], dict[str, Any]]
    ) -> bool: ...

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None: ...

    async def delete_service(
        self, namespace: str, name: str, uid: str | None = None
    ) -> None: ...

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    # Seconds until a deadline / TTL needs another look; None: only events wake the job.
    requeue_after: float | None
    # The TrainJob is gone (or going): stop its reconcile loop.
    done: bool = False
    # Nothing left to do and nothing due (see `at_rest`): park the job until an event.
    at_rest: bool = False


def at_rest(decision: policy.Decision, seen: Seen) -> bool:
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
        and settled(seen)
    )


def settled(seen: Seen) -> bool:
    """The watched copy shows everything this loop wrote, and nothing is being retried."""
    return seen.known is None and not seen.stale and not seen.refused and not seen.refusals


@dataclasses.dataclass
class OperatorContext:
    """Operator-wide state shared by the job loop, the informers and the progress server
    (kept in kopf's memo). Named apart from `trainjob.runtime`, the code in each replica."""

    settings: config.Settings
    kube: kube.Kube
    metrics: metrics.Metrics
    # Set by the controller (controller.py): wake a job's loop; whether a job has one.
    on_wake: Callable[[JobKey], None] = lambda key: None
    has_loop: Callable[[JobKey], bool] = lambda key: False
    child_index: children.ChildIndex = dataclasses.field(default_factory=children.ChildIndex)
    # Keeps child_index current and wakes the jobs whose children changed.
    informer: informer.ChildInformer = dataclasses.field(init=False)
    # Which nodes are not Ready; wakes the jobs with Pods on a node whose readiness moved.
    nodes: nodes.NodeInformer = dataclasses.field(init=False)
    # Jobs creating children at the same time, served first come, first served (asyncio's
    # semaphore). Why a limit: otherwise a burst of N new jobs holds a task per create for
    # all N jobs at once (16,000 at 1,000 x 8), the largest share of the operator's peak
    # memory (bench: 161 -> 123 MiB at 1,000 x 8). The cost, measured there: later jobs'
    # creates now share the request turns with earlier jobs' status writes and clean-up, so
    # the last child of such a burst came later (176 -> ~300 s); the median barely moved.
    creating: asyncio.Semaphore = dataclasses.field(init=False)
    # Jobs whose loop has begun reconciling; the watchdog reports the jobs that never do.
    reconciled: set[JobKey] = dataclasses.field(default_factory=set)
    watchdog: watchdog.Watchdog = dataclasses.field(init=False)
    # Where new Pods report progress (progress_server.serve sets it); None: no reporting.
    progress_endpoint: Callable[[], render.ProgressEndpoint | None] = lambda: None
    # When a job's step last advanced (progress_server.serve sets it; hang detection).
    progress_at: Callable[[JobKey], datetime.datetime | None] = lambda key: None
    # Which namespaces Kueue manages every job of (--kueue-manage-jobs-without-queue-name).
    kueue_namespaces: kueue.Namespaces = dataclasses.field(default_factory=kueue.Namespaces)
    # Jobs whose orphaned Workloads are being released now.
    releasing: set[JobKey] = dataclasses.field(default_factory=set)
    # Gangs waiting for nodes, and the touches they are owed when room appears.
    gangs: gang_sync.Requeue = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.creating = asyncio.Semaphore(creating_jobs(self.settings.api_workers))
        # One list+watch per kind for the cluster when kopf watches TrainJobs cluster-wide
        # (no namespace given, or namespace patterns), else one per watched namespace.
        kinds = informer.KINDS + ((informer.WORKLOADS,) if self.settings.kueue else ())
        if gang.wanted(self.settings):
            kinds += (informer.pod_groups(self.settings.gang_scheduler),)
        self.informer = informer.ChildInformer(
            self.kube, self.child_index, self.wake, not self.settings.kopf_namespaces, kinds
        )
        self.nodes = nodes.NodeInformer(self.kube, self._wake_on_nodes)
        self.watchdog = watchdog.Watchdog(
            self.kube, self.settings, self.metrics, self.reconciled.__contains__
        )
        if self.settings.kueue:
            self.child_index.workload_listeners.append(self._release_if_orphaned)
        self.gangs = gang_sync.Requeue(self.kube, self.settings, self.wake)
        if gang.wanted(self.settings):
            self.child_index.pod_listeners.append(self.gangs.pod_changed)

    def _release_if_orphaned(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """A Workload being deleted whose job has no reconcile loop here (the job is gone:
        deleted while no operator ran, or its loop ended before it could release it) still
        holds our `resource-in-use` finalizer: finish and release it, or it hangs forever."""
        meta = body.get("metadata") or {}
        if self.has_loop(key) or not meta.get("deletionTimestamp"):
            return
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

    def _wake_on_nodes(self, names: set[str]) -> None:
        for key in self.child_index.jobs_on_nodes(names):
            self.wake(key)
        if any(self.nodes.index.loss(name) is None for name in names):
            self.gangs.room_appeared()  # a node joined or is Ready again

    def begin(self, key: JobKey) -> None:
        """The job's loop is about to reconcile it (for the first time, or again)."""
        if key not in self.reconciled:
            self.reconciled.add(key)
            self.watchdog.served(key)

    def problems(self) -> list[str]:
        """Why this operator is not healthy now (empty: it is)."""
        return self.watchdog.problems([*self.informer.health(), self.nodes.health])

    def wake(self, key: JobKey) -> None:
        self.on_wake(key)

    def forget(self, key: JobKey) -> None:
        self.reconciled.discard(key)
        self.gangs.forget(key)


@dataclasses.dataclass
class Seen:
    """What one job's reconcile loop knows about its TrainJob between reconciles, so that it
    can work from kopf's copy of the object (kept current by kopf's watch) instead of a GET
    per reconcile, without ever deciding from a copy older than what it already knows.

    kopf's copy lags behind our own status writes until their watch events arrive, and it can
    lag for long (a TrainJob watch that is down while the Pod informer is live): deciding from
    it then decides again from an old status. So after every GET and every write of ours, the
    result is the newest known version (`known`), and kopf's copy is trusted again only once
    it shows exactly that version (watch events come in order, so from then on it is at
    least as new). Until then each reconcile reads with a GET. resourceVersions are opaque:
    they are only compared for equality, never ordered."""

    # The newest TrainJob this loop has read or written, until kopf's copy shows it.
    known: dict[str, Any] | None = None
    # A conditional write of ours conflicted: the next reconcile reads afresh.
    stale: bool = False
    # The Events this loop posted for a decision whose status write conflicted.
    superseded: Superseded | None = None
    # Replicas whose Pod the API server refused at the last try, with its message: the next
    # decision says so (a waiting cause) until the Pod exists.
    refused: dict[policy.ReplicaKey, str] = dataclasses.field(default_factory=dict)
    # Consecutive reconciles that met a refusal: the retry backs off (2 s doubling to 60 s).
    refusals: int = 0


@dataclasses.dataclass(frozen=True)
class Superseded:
    """Events posted for a decision that was never recorded, and the status it was made
    from. Whether they told of something that did not happen is known only after a fresh
    read: if the status is still the same, nobody recorded a transition from it, and the
    Events the new decision does not post again are withdrawn; if the status moved on,
    another writer (a second operator) recorded a transition from it, most likely the same
    one, whose Events these are: they stay."""

    fingerprint: str
    names: tuple[str, ...]


def _version(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


async def current_trainjob(
    rt: OperatorContext,
    namespace: str,
    name: str,
    live: Mapping[str, Any] | None,
    seen: Seen | None,
) -> dict[str, Any] | None:
    """The TrainJob to reconcile from: kopf's live copy when it is known to be at least as
    new as anything this loop has read or written (see `Seen`), else a GET."""
    if live is not None and seen is not None and not seen.stale:
        # A shallow copy: kopf swaps in a new event's dict instead of changing the old one,
        # so this snapshot stays as it is while the reconcile awaits.
        snapshot = dict(live)
        version = _version(snapshot)
        if seen.known is None and version is not None:
            return snapshot
        if seen.known is not None and version is not None and version == _version(seen.known):
            seen.known = None  # kopf's copy has caught up: trust it from now on
            return snapshot
    raw = await rt.kube.get_trainjob(namespace, name)
    if seen is not None:
        seen.stale = False
        seen.known = raw
    return raw


async def _patch_status(
    rt: OperatorContext,
    raw: Mapping[str, Any],
    patch: dict[str, Any],
    seen: Seen | None,
) -> dict[str, Any] | None:
    """Write `patch` only if the TrainJob is still the version `raw` was read at; returns the
    TrainJob as written (None: it is gone). kube.ConflictError: decide again from a fresh read."""
    metadata = raw.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    try:
        result = await rt.kube.patch_status(namespace, name, patch, _version(raw))
    except kube.ConflictError:
        if seen is not None:
            seen.stale = True
        raise
    if seen is not None and result is not None and _version(result):
        seen.known = result
    return result


def status_fingerprint(status: Mapping[str, Any]) -> str:
    """The status a decision was made from, as far as decisions go: our own keys only (a
    progress report changes the resourceVersion and `status.progress`, not the transition)."""
    owned = {key: status[key] for key in STATUS_KEYS if key in status}
    return json.dumps(owned, sort_keys=True, separators=(",", ":"), default=str)


def event_id(uid: str, fingerprint: str, position: int, event: policy.Event) -> str:
    """The name suffix of the `position`-th Event of a decision made from TrainJob `uid` whose
    status was `fingerprint`. The same transition decided again from the same recorded status
    gets the same name, whatever else changed in between (the resourceVersion moves with
    kopf's finalizer, labels, progress): a decision whose status write never landed (a
    crash, a conflict) posts its Events once. A later transition starts from another status
    (conditions carry their transition times), so it gets other names."""
    key = f"{uid}/{fingerprint}/{position}/{event.type}/{event.reason}/{event.message}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


async def _post_events(
    rt: OperatorContext,
    raw: Mapping[str, Any],
    fingerprint: str,
    events: Iterable[policy.Event],
    now: datetime.datetime,
) -> tuple[list[str], list[str]]:
    """Post the Events of a decision made from the status `fingerprint`; returns the names
    of all of them and of those this call created (the others were there already, or were
    refused)."""
    metadata = raw.get("metadata") or {}
    uid, job_name = str(metadata.get("uid") or ""), str(metadata.get("name"))
    names: list[str] = []
    created: list[str] = []
    for position, event in enumerate(events):
        suffix = event_id(uid, fingerprint, position, event)
        name = await rt.kube.post_event(
            dict(raw), event.type, event.reason, event.message, now, suffix
        )
        names.append(kube.event_name(job_name, suffix))
        if name is not None:
            created.append(name)
    return names, created


def _status_of(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    status = raw.get("status")
    return status if isinstance(status, Mapping) else {}


async def _record(
    rt: OperatorContext,
    raw: Mapping[str, Any],
    events: Iterable[policy.Event],
    patch: dict[str, Any] | None,
    now: datetime.datetime,
    seen: Seen | None,
) -> dict[str, Any] | None:
    """Record a decision: its Events, then its status (if it changes); returns the TrainJob
    as written, or `raw` when the status was already so (None: the job is gone).

    A conflicting status write means the decision was superseded (the job changed under it:
    a suspend, a delete, another writer); the caller decides again from a fresh read, and
    this loop remembers the Events it posted (see `Superseded`). A transition decided again
    from the same status posts the same names again."""
    fingerprint = status_fingerprint(_status_of(raw))
    names, created = await _post_events(rt, raw, fingerprint, events, now)
    pending = seen.superseded if seen is not None else None
    keep: list[str] = []
    if seen is not None:
        seen.superseded = None
    if pending is not None and pending.fingerprint == fingerprint:
        keep = [name for name in pending.names if name in names]
        stale = [name for name in pending.names if name not in names]
        namespace = str((raw.get("metadata") or {}).get("namespace"))
        await rt.kube.withdraw_events(namespace, stale)
    if patch is None:
        return dict(raw)
    try:
        return await _patch_status(rt, raw, patch, seen)
    except kube.ConflictError:
        if seen is not None:
            seen.superseded = Superseded(fingerprint, tuple(created + keep))
        raise


def _conditions(status: st.JobStatus) -> list[dict[str, Any]]:
    return [
        {
            "type": c.type,
            "status": "True" if c.status else "False",
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": st.format_time(c.last_transition_time),
        }
        for c in status.conditions
    ]


def _invalid_status_dict(status: st.JobStatus) -> dict[str, Any]:
    """Status of a TrainJob whose spec cannot be parsed (no TrainJob to render replicas)."""
    result: dict[str, Any] = {
        "state": st.state_of(status),
        "restartCount": status.restart_count,
        "conditions": _conditions(status),
    }
    if status.completion_time is not None:
        result["completionTime"] = st.format_time(status.completion_time)
    if status.observed_generation is not None:
        result["observedGeneration"] = status.observed_generation
    return result


def status_patch(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch turning `current` into `wanted` for our keys; None when nothing changes.
    Keys we own but no longer write are nulled; keys we do not own are left alone."""
    patch: dict[str, Any] = {}
    for key in STATUS_KEYS:
        if key in wanted:
            if current.get(key) != wanted[key]:
                patch[key] = wanted[key]
        elif key in current:
            patch[key] = None
    return patch or None


async def reconcile_job(
    rt: OperatorContext,
    namespace: str,
    name: str,
    pods: Iterable[children.ChildPod],
    services: Iterable[children.ChildService],
    now: datetime.datetime,
    live: Mapping[str, Any] | None = None,
    seen: Seen | None = None,
) -> Outcome:
    """`live`/`seen`: kopf's live copy of the TrainJob and the loop's memory of it (see
    `current_trainjob`); without them the TrainJob is read with a GET."""
    raw = await current_trainjob(rt, namespace, name, live, seen)
    if raw is None:
        return Outcome(None, done=True)
    metadata = raw.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return Outcome(None, done=True)
    uid = str(metadata.get("uid") or "")
    raw_status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    old = st.from_dict(raw_status)

    try:
        job = spec.parse(raw)
    except spec.SpecError as exc:
        message = "; ".join(str(problem) for problem in exc.problems)
        await _mark_invalid(rt, raw, raw_status, old, None, message, now, seen)
        return Outcome(None, at_rest=seen is not None and settled(seen))

    mine_pods = [p for p in pods if p.owner_uid in (uid, None)]
    mine_services = [s for s in services if s.owner_uid in (uid, None)]
    options = gang.render_options(job, rt.settings, namespace, rt.progress_endpoint())

    # Kueue first: it may suspend the job (before any Pod exists) or start it with the
    # admission's templates, and the decision below is made from the job as it left it.
    queued: kueue.Step | None = None
    if await kueue.is_managed(rt.kube, rt.settings, rt.kueue_namespaces, job, namespace):
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
            if seen is not None:
                seen.stale = True
            raise
        if queued.raw is not raw:
            raw = dict(queued.raw)
            if seen is not None:
                seen.known = raw
            job = spec.parse(raw)
            options = gang.render_options(job, rt.settings, namespace, rt.progress_endpoint())
    if kw.managed_elsewhere(job.managed_by):
        # MultiKueue runs this job on a worker cluster and mirrors its status here: no
        # Pods, Services or status of ours.
        return Outcome(None)

    observed = {p.key: p.observed for p in mine_pods}
    pod_uids = {p.key: p.uid for p in mine_pods}
    service_uids = {s.key: s.uid for s in mine_services}

    refused: dict[policy.ReplicaKey, str] = {}
    if seen is not None:
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
    owner = render.Owner(name=name, uid=uid)

    # Record the decision before acting on it (see the module docstring for why).
    # kube.ConflictError (the job changed since it was read): the caller decides again.
    patch = status_patch(raw_status, st.to_dict(job, decision.status))
    written = await _record(rt, raw, decision.events, patch, now, seen)
    if written is None:
        return Outcome(None, done=True)
    raw = written
    raw_status = raw.get("status") if isinstance(raw.get("status"), Mapping) else {}
    assert isinstance(raw_status, Mapping)
    rt.metrics.transition(namespace, old, decision.status)
    rt.metrics.set_state(uid, namespace, st.state_of(decision.status))

    for rtype, index in decision.delete_pods:
        await rt.kube.delete_pod(
            namespace, naming.child_name(name, rtype, index), pod_uids.get((rtype, index))
        )
    for rtype, index in decision.delete_services:
        await rt.kube.delete_service(
            namespace, naming.child_name(name, rtype, index), service_uids.get((rtype, index))
        )
    if gang_plan.delete and group is not None:
        # After the Pods (none is left running): a Pod whose group is gone is never placed.
        await gang_sync.delete_pod_group(rt.kube, rt.settings, namespace, group)
    refusals: dict[policy.ReplicaKey, str] = {}
    try:
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
        await _mark_invalid(rt, raw, raw_status, decision.status, job, str(exc), now, seen)
        return Outcome(None, at_rest=seen is not None and settled(seen))

    if queued is not None:
        await kueue.sync_pods_ready(rt.kube, queued.workload, decision.status, now)

    if decision.delete_job:
        await rt.kube.delete_trainjob(namespace, name, uid)
        rt.metrics.forget(uid)
        return Outcome(None, done=True)
    if seen is not None:
        if refusals:
            # Told in status by the next decision, at once the first time; tried again
            # with a growing delay while the refusal stays (a quota may free up).
            seen.refusals += 1
            seen.refused.update(refusals)
            retry = 0.0 if seen.refusals == 1 else kube.retry_delay(seen.refusals - 1, 2.0, 60.0)
            requeue = (
                retry if decision.requeue_after is None else min(retry, decision.requeue_after)
            )
            return Outcome(requeue)
        seen.refusals = 0
    if requeue_gang_in is not None:
        later = decision.requeue_after
        return Outcome(requeue_gang_in if later is None else min(later, requeue_gang_in))
    return Outcome(decision.requeue_after, at_rest=seen is not None and at_rest(decision, seen))


async def release_workloads(
    rt: OperatorContext,
    key: JobKey,
    now: datetime.datetime,
    workloads: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """A deleted job's Workloads (default: those the index holds for it) are finished and
    released. A failure is logged: the Workload is then deleted by the garbage collector,
    and its next watch event (deletionTimestamp set) releases it (`_release_if_orphaned`)."""
    if workloads is None:
        workloads = [w.body for w in rt.child_index.workloads(key)]
    if not workloads:
        return
    try:
        await kueue.finalize(rt.kube, workloads, now)
    except (kube.TransientError, kube.RejectedError) as exc:
        logger.warning("Could not release the Workloads of TrainJob %s/%s: %s", *key, exc)


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
            naming.child_name(job.name, rtype, index),
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
            naming.child_name(job.name, rtype, index),
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
    raw: Mapping[str, Any],
    raw_status: Mapping[str, Any],
    old: st.JobStatus,
    job: spec.TrainJob | None,
    message: str,
    now: datetime.datetime,
    seen: Seen | None = None,
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
    wanted = st.to_dict(job, new) if job is not None else _invalid_status_dict(new)
    patch = status_patch(raw_status, wanted)
    if patch is None:
        return  # already marked
    await _record(
        rt, raw, [policy.Event("Warning", policy.REASON_INVALID, message)], patch, now, seen
    )
    logger.warning("Marked TrainJob %s/%s Failed (InvalidSpec): %s", namespace, name, message)
    rt.metrics.transition(namespace, old, new)
    rt.metrics.set_state(uid, namespace, st.state_of(new))
