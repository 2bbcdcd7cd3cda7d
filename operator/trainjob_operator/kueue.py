"""The Kueue integration: a TrainJob Kueue manages runs only while Kueue admits its Workload.

One pass of `sync` is one step of Kueue's protocol for a job's controller (a port of
Kueue's `jobframework.ReconcileGenericJob`, which its TFJob integration used); the
decisions are kueue_workload.py's and kueue_patches.py's, the API calls go through kube.py.
In order:

1. A finished job finishes its Workload (Finished=True: Kueue releases the quota) once
   its clean-up has stopped the Pods it stops, then drops the Workload's `resource-in-use`
   finalizer. A deleted job does the same.
2. Exactly one Workload matches the job (by a stored hash of its podSets): a stale one is
   dropped (the job stopped first if it ran under it), a missing one is made, but only once
   the job is suspended and has no Pods.
3. The job runs exactly while its Workload is Admitted: admitted and suspended -> one patch
   of the job merges the admission (flavors' nodeLabels and tolerations, Kueue's labels,
   podSetUpdates) into its templates and unsuspends it; evicted or not admitted and running
   -> one patch suspends it and restores its templates from the Workload. Once an evicted
   job has no Pods, its admission is cleared so Kueue can queue it again.

Every step that gives quota back (clearing an admission, finishing a Workload, releasing
or replacing one, making a new one) waits until no Pod of the job may still run, and asks
pods_left.gone, which does not trust the child index's "none" (a watch cache that may not
have seen the Pods created a moment ago, by this operator or by its predecessor): quota
is never given back while a Pod it paid for runs.
4. PodsReady follows the job's Running condition (Kueue evicts a job that never reports it).

Suspending is the policy engine's ordinary suspend: Pods are deleted (SIGTERM: the runtime
saves a checkpoint), nothing is counted toward backoffLimit, and resuming starts a new
attempt from the checkpoint. While Kueue holds a job, its Suspended condition says why in
Kueue's words (`hold`).

Why the job spec carries `suspend` (and the admission's nodeSelector) rather than the
operator keeping them in memory: that is Kueue's contract with every job kind, what TFJob
users see today, and it survives an operator restart with no state of ours.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from trainjob.core import naming, render, spec
from trainjob.core import status as st
from trainjob_operator import children, config, kube, pods_left
from trainjob_operator import kueue_patches as kp
from trainjob_operator import kueue_workload as kw

logger = logging.getLogger(__name__)

# Tries to finish and release a deleted job's Workload while Kueue keeps changing it.
FINALIZE_ATTEMPTS: Final = 5
# How long a namespace's match of --kueue-managed-namespaces is trusted.
NAMESPACE_CACHE_SECONDS: Final = 60.0

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Step:
    """What one pass of the protocol leaves for the rest of the reconcile."""

    # The TrainJob as it is now (after our patch of it, if any).
    raw: Mapping[str, Any]
    # The job's Workload, if it has one.
    workload: Mapping[str, Any] | None
    # While Kueue holds the job: the reason and message of its Suspended condition.
    hold: tuple[str, str] | None


class Namespaces:
    """Which namespaces --kueue-managed-namespaces selects, asked of the API server and
    remembered for a minute (a job without a queue label is checked once per reconcile)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[bool, float]] = {}

    async def matches(self, api: kube.Kube, namespace: str, selector: str) -> bool:
        now = time.monotonic()
        cached = self._seen.get(namespace)
        if cached is not None and now - cached[1] < NAMESPACE_CACHE_SECONDS:
            return cached[0]
        result = await api.namespace_matches(namespace, selector)
        self._seen[namespace] = (result, now)
        return result


async def is_managed(
    api: kube.Kube,
    settings: config.Settings,
    namespaces: Namespaces,
    job: spec.TrainJob,
    namespace: str,
) -> bool:
    """Whether Kueue manages this job (the integration on, and a queue label, or every job of
    a selected namespace with manageJobsWithoutQueueName)."""
    if not settings.kueue:
        return False
    if kw.queue_name(job.labels) is not None:
        return True
    if not settings.kueue_manage_all:
        return False
    return await namespaces.matches(api, namespace, settings.kueue_namespaces)


# -- API calls on Workloads ------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _rv(obj: Mapping[str, Any]) -> str | None:
    version = _meta(obj).get("resourceVersion")
    return str(version) if version else None


async def _patch_workload_status(api: kube.Kube, wl: Mapping[str, Any], status: Obj) -> None:
    meta = _meta(wl)
    await api.patch_object(
        kw.GROUP,
        kw.VERSION,
        str(meta.get("namespace")),
        kw.WORKLOADS,
        str(meta.get("name")),
        {"status": status},
        _rv(wl),
        "status",
    )


async def _patch_workload(api: kube.Kube, wl: Mapping[str, Any], patch: Obj) -> Obj | None:
    meta = _meta(wl)
    return await api.patch_object(
        kw.GROUP,
        kw.VERSION,
        str(meta.get("namespace")),
        kw.WORKLOADS,
        str(meta.get("name")),
        patch,
        _rv(wl),
    )


async def _release(api: kube.Kube, wl: Mapping[str, Any]) -> None:
    """Drop our `resource-in-use` finalizer (workload.RemoveFinalizer)."""
    finalizers = [f for f in _meta(wl).get("finalizers") or [] if f != kw.RESOURCE_IN_USE]
    if len(finalizers) == len(_meta(wl).get("finalizers") or []):
        return
    await _patch_workload(api, wl, {"metadata": {"finalizers": finalizers or None}})
    logger.info("Released Workload %s/%s", _meta(wl).get("namespace"), _meta(wl).get("name"))


async def _finish(
    api: kube.Kube, wl: Mapping[str, Any], reason: str, message: str, now: datetime.datetime
) -> None:
    if kw.is_finished(wl):
        return
    await _patch_workload_status(api, wl, kp.finish_status(wl, reason, message, now))
    logger.info(
        "Finished Workload %s/%s (%s)", _meta(wl).get("namespace"), _meta(wl).get("name"), reason
    )


async def finalize(
    api: kube.Kube, workloads: Iterable[Mapping[str, Any]], now: datetime.datetime
) -> None:
    """The job is deleted: its Workloads are finished (OwnerNotFound) and released, so their
    quota is free at once and the garbage collector can delete them. Each write is made
    from a fresh read and tried again when Kueue changed the Workload in between (it does,
    often: evictions, requeue state); kube.ConflictError only after FINALIZE_ATTEMPTS."""
    for wl in workloads:
        for attempt in range(1, FINALIZE_ATTEMPTS + 1):
            fresh = await _current(api, wl)
            if fresh is None:
                break
            try:
                await _finish(
                    api, fresh, kw.REASON_OWNER_NOT_FOUND, "The owner TrainJob was deleted", now
                )
                fresh = await _current(api, wl)
                if fresh is not None:
                    await _release(api, fresh)
                break
            except kube.ConflictError:
                if attempt == FINALIZE_ATTEMPTS:
                    raise


async def _current(api: kube.Kube, wl: Mapping[str, Any]) -> Obj | None:
    meta = _meta(wl)
    return await api.get_object(
        kw.GROUP, kw.VERSION, str(meta.get("namespace")), kw.WORKLOADS, str(meta.get("name"))
    )


async def _priority(api: kube.Kube, job: spec.TrainJob) -> kw.Priority:
    """The job's priority class and its value, as Kueue resolves it (ExtractPriority); an
    unknown class is 0, as Kueue's own jobs get."""
    source = kw.priority_source(job)
    if source is not None:
        kind, name = source
        if kind == "WorkloadPriorityClass":
            found = await api.get_object(
                kw.GROUP, "v1beta2", None, kw.WORKLOAD_PRIORITY_CLASSES, name
            )
        else:
            found = await api.get_object("scheduling.k8s.io", "v1", None, "priorityclasses", name)
        value = int((found or {}).get("value") or 0)
        return kw.Priority(kind, name, value)
    listing = await api.list_labelled(None, "priorityclasses", "", "scheduling.k8s.io", "v1")
    for item in listing.items:
        if item.get("globalDefault"):
            return kw.Priority(
                "PriorityClass", str(_meta(item).get("name")), int(item.get("value") or 0)
            )
    return kw.Priority(None, None, 0)


async def _flavors(api: kube.Kube, wl: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The ResourceFlavors an admission assigns, by name (podset.FromAssignment)."""
    names: set[str] = set()
    admission = (wl.get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        names.update(str(f) for f in (assignment.get("flavors") or {}).values())
    found: dict[str, Mapping[str, Any]] = {}
    for name in sorted(names):
        flavor = await api.get_object(kw.GROUP, kw.VERSION, None, kw.RESOURCE_FLAVORS, name)
        if flavor is None:
            raise kube.TransientError(f"ResourceFlavor {name} of the admission does not exist")
        found[name] = flavor
    return found


# -- the protocol ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Job:
    """The job being synced and the means to change it."""

    api: kube.Kube
    raw: Mapping[str, Any]
    job: spec.TrainJob
    namespace: str
    # The job's Pods as the child index holds them.
    pods: Sequence[children.ChildPod] = ()
    # pods_left.gone's answer, asked at most once per pass: nothing this pass does before
    # the policy's decision changes it (the stop only patches the job).
    _gone: bool | None = None

    async def pods_gone(self) -> bool:
        """Whether no Pod of the job may still run (see pods_left)."""
        if self._gone is None:
            meta = _meta(self.raw)
            self._gone = await pods_left.gone(
                self.api, self.namespace, str(meta.get("name")), str(meta.get("uid")), self.pods
            )
        return self._gone

    @property
    def suspended(self) -> bool:
        return bool(((self.raw.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    async def patch(self, patch: Obj) -> None:
        meta = _meta(self.raw)
        result = await self.api.patch_trainjob(
            self.namespace, str(meta.get("name")), patch, _rv(self.raw)
        )
        if result is not None:
            self.raw = result

    async def stop(self, workload: Mapping[str, Any] | None, why: str) -> None:
        """Suspend the job and restore its templates from the Workload (stopJob)."""
        if self.suspended and workload is None:
            return
        patch = kp.stop_patch(self.raw, workload)
        if self.suspended and "replicaSpecs" not in patch["spec"]:
            return
        await self.patch(patch)
        logger.info(
            "Stopped TrainJob %s/%s for Kueue: %s", self.namespace, _meta(self.raw).get("name"), why
        )


async def sync(
    api: kube.Kube,
    settings: config.Settings,
    raw: Mapping[str, Any],
    job: spec.TrainJob,
    workloads: Sequence[children.ChildWorkload],
    pods: Sequence[children.ChildPod],
    options: render.RenderOptions,
    now: datetime.datetime,
) -> Step:
    """One step of Kueue's protocol for a managed job (see the module docstring). Raises
    kube.ConflictError when the job or a Workload changed under it (decide again)."""
    meta = _meta(raw)
    namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
    status = st.from_dict(raw.get("status") or {})
    mine = [w.body for w in workloads if w.owner_uid in (uid, None)]
    this = _Job(api, raw, job, namespace, pods)

    if status.finished:
        succeeded = status.is_true(st.SUCCEEDED)
        cond = status.condition(st.SUCCEEDED if succeeded else st.FAILED)
        message = cond.message if cond is not None else ""
        unfinished = [wl for wl in mine if not kw.is_finished(wl)]
        # The clean-up stops the Pods still running (ps, evaluator, the workers of a chief
        # that succeeded): the quota goes back once they have stopped. Under cleanPodPolicy
        # None the user keeps them running, outside Kueue's account, as Kueue's own TFJob
        # integration leaves them.
        # (Asked only while a Workload is unfinished: a finished job at rest lists nothing.)
        stopping = unfinished and job.run_policy.clean_pod_policy != "None"
        if stopping and not await this.pods_gone():
            return Step(this.raw, mine[0], None)
        for wl in mine:
            await _finish(
                api, wl, kw.REASON_SUCCEEDED if succeeded else kw.REASON_FAILED, message, now
            )
            fresh = await _current(api, wl)
            if fresh is not None:
                await _release(api, fresh)
        return Step(this.raw, mine[0] if mine else None, None)

    owner = render.Owner(name=name, uid=uid)
    wanted_hash = kw.podsets_hash(kw.pod_sets(job, options))
    prebuilt = kw.prebuilt_workload_name(meta)
    if prebuilt is not None:
        workload = await _prebuilt(api, this, prebuilt, uid, wanted_hash, now)
        if workload is None:
            return Step(
                this.raw,
                None,
                (kw.JOB_REASON_QUEUED, f"Waiting for the prebuilt Workload {prebuilt}"),
            )
    else:
        matching = [w for w in mine if kw.equivalent(w, wanted_hash, uid) and not kw.is_finished(w)]
        stale = [w for w in mine if w not in matching[:1]]
        for wl in stale:
            # The job changed (replicas, templates) since its Workload was made: a Workload
            # Kueue admitted for the old shape must not run the new one (ensureOneWorkload).
            if not this.suspended:
                await this.stop(wl, f"Workload {_meta(wl).get('name')} no longer matches the job")
            if kw.has_quota_reservation(wl) and not await this.pods_gone():
                # Its quota pays for the Pods being stopped: it goes once they are gone.
                return Step(this.raw, None, kp.hold_reason(None, kw.queue_name(job.labels)))
            fresh = await _current(api, wl)
            if fresh is not None:
                await _release(api, fresh)
                await api.delete_object(
                    kw.GROUP, kw.VERSION, namespace, kw.WORKLOADS, str(_meta(wl).get("name")), None
                )
        workload = matching[0] if matching else None
        if workload is None:
            if not this.suspended:
                await this.stop(None, "no Workload admitted yet")
            if not await this.pods_gone():
                # A new Workload is admitted for Pods yet to be made, not for these.
                return Step(this.raw, None, kp.hold_reason(None, kw.queue_name(job.labels)))
            manifest = kw.build_workload(job, namespace, owner, options, await _priority(api, job))
            created = await api.create_object(manifest, kw.WORKLOADS)
            return Step(
                this.raw, created, kp.hold_reason(created or manifest, kw.queue_name(job.labels))
            )

    wl_name = str(_meta(workload).get("name"))
    if kw.is_deleting(workload):
        await this.stop(workload, f"Workload {wl_name} is deleted")
        # Our finalizer keeps its quota held until the Pods it paid for are gone.
        fresh = await _current(api, workload) if await this.pods_gone() else None
        if fresh is not None:
            await _release(api, fresh)
        return Step(this.raw, None, kp.hold_reason(None, kw.queue_name(job.labels)))

    if kw.is_finished(workload):
        # Finished by Kueue before the job ended (FailedToStart, OutOfSync): the job stays
        # stopped and says why; Kueue's TFJob behaves the same.
        await this.stop(workload, f"Workload {wl_name} is finished")
        fresh = await _current(api, workload)
        if fresh is not None:
            await _release(api, fresh)
        return Step(this.raw, workload, kp.hold_reason(workload, None))

    evicted = kw.condition(workload, kw.EVICTED)
    if evicted is not None and evicted.get("status") == "True":
        await this.stop(workload, f"evicted ({evicted.get('reason')}): {evicted.get('message')}")
        if kw.has_quota_reservation(workload) and await this.pods_gone():
            # The Pods are gone: give the quota back so Kueue can queue the job again.
            await _patch_workload_status(api, workload, kp.clear_admission_status(workload, now))
            logger.info("Cleared the admission of evicted Workload %s/%s", namespace, wl_name)
        return Step(this.raw, workload, kp.hold_reason(workload, None))

    if this.suspended:
        if kw.is_admitted(workload):
            try:
                infos = kp.admission_infos(workload, await _flavors(api, workload))
                patch = kp.start_patch(this.raw, infos)
            except kp.MergeConflictError as exc:
                await _finish(api, workload, kw.REASON_FAILED_TO_START, str(exc), now)
                return Step(
                    this.raw,
                    workload,
                    (kw.JOB_REASON_WORKLOAD_FINISHED, f"Kueue could not start the job: {exc}"),
                )
            await this.patch(patch)
            logger.info("Started TrainJob %s/%s: Workload %s admitted", namespace, name, wl_name)
            return Step(this.raw, workload, None)
        queue = kw.queue_name(job.labels)
        local = (workload.get("spec") or {}).get("queueName")
        if queue and queue != local and not kw.has_quota_reservation(workload):
            # The user moved the waiting job to another queue (QueueNameChange).
            updated = await _patch_workload(api, workload, {"spec": {"queueName": queue}})
            workload = updated or workload
        return Step(this.raw, workload, kp.hold_reason(workload, queue))

    if not kw.is_admitted(workload):
        await this.stop(workload, "not admitted by its ClusterQueue")
        return Step(this.raw, workload, kp.hold_reason(workload, None))
    return Step(this.raw, workload, None)


async def _prebuilt(
    api: kube.Kube, this: _Job, name: str, uid: str, wanted_hash: str, now: datetime.datetime
) -> Mapping[str, Any] | None:
    """The Workload MultiKueue made for this job on a worker cluster: used as it is, made ours
    (controller ownerReference, job-uid label; EnsurePrebuiltWorkloadOwnership), or marked
    Finished/OutOfSync when it does not match the job, so MultiKueue dispatches again.
    None while it does not exist (the job stays stopped) or belongs to another object."""
    workload = await api.get_object(kw.GROUP, kw.VERSION, this.namespace, kw.WORKLOADS, name)
    if workload is None or kw.owner_uid(workload) not in (None, uid):
        if not this.suspended:
            await this.stop(None, f"prebuilt Workload {name} is missing")
        return None
    if kw.owner_uid(workload) is None:
        owner = render.Owner(name=this.job.name, uid=uid)
        labels = {kw.JOB_UID_LABEL: uid, **naming.job_selector(this.job.name)}
        patch: Obj = {
            "metadata": {
                "labels": labels,
                "ownerReferences": [render.owner_reference(owner)],
            }
        }
        if kw.equivalent(workload, wanted_hash, uid):
            patch["metadata"]["annotations"] = {kw.HASH_ANNOTATION: wanted_hash}
        adopted = await _patch_workload(api, workload, patch)
        workload = adopted or workload
    if not kw.equivalent(workload, wanted_hash, uid) and not kw.is_finished(workload):
        await _finish(
            api,
            workload,
            kw.REASON_OUT_OF_SYNC,
            "The prebuilt Workload does not match the TrainJob",
            now,
        )
    return workload


# -- after the policy decided ---------------------------------------------------------------------


async def sync_pods_ready(
    api: kube.Kube,
    workload: Mapping[str, Any] | None,
    decided: st.JobStatus,
    now: datetime.datetime,
) -> None:
    """Keep the Workload's PodsReady in step with the job's Running condition."""
    if workload is None or kw.is_finished(workload) or decided.finished:
        return
    patch = kp.pods_ready_status(workload, decided.is_true(st.RUNNING), now)
    if patch is not None:
        await _patch_workload_status(api, workload, patch)
