"""kopf handlers: thin wiring from Kubernetes events to the per-job reconcile loop.

- Each TrainJob gets one kopf daemon (`trainjob_daemon`) running its reconcile loop, so
  reconciles of one job are serialized by construction while jobs proceed in parallel.
- The loop sleeps on an asyncio.Event, woken by TrainJob events and by events of the job's
  Pods and Services (found by the label trainjob.dev/job-name); it also wakes after
  `requeue_after` seconds when the engine asks for it (activeDeadlineSeconds, startup
  deadline, TTL), so deadlines fire with no further event. No polling; a long resync period
  (default 10 min) is only a safety net.
- Pods and Services are read from an in-memory index that informer.py keeps with a list
  and a watch of the labelled objects (no list call per reconcile, no kopf per-object state
  for them); their events wake the job. A job's loop first waits for its scope's initial
  list, so a restarted operator sees every existing child before deciding anything and
  adopts instead of duplicating.
- Finalizer: kopf puts one on each TrainJob because daemons need it (to stop the daemon
  before the object disappears); it is ours, `trainjob.dev/finalizer`, and is removed as
  soon as the daemon stops. Children need no finalizer: they carry a controller
  ownerReference and the garbage collector deletes them.
- Nothing is ever returned from a handler, so nothing lands in status; kopf's own progress
  and diff-base annotations (none are written by event handlers and daemons) use our prefix.
- TransientError API trouble: the loop logs, counts it in metrics and retries with exponential
  backoff (0.5 s doubling to 60 s), never taking the operator or other jobs down. An invalid
  spec is terminal for that job only: Failed / InvalidSpec, with the problems in the message.

Run with `python -m trainjob_operator` or `kopf run -m trainjob_operator.handlers` (then
settings come from TRAINJOB_* environment variables; see config.py).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import os
import time
from typing import Any, Final

import kopf
from kopf._core.reactor import observation

from trainjob.core import constants
from trainjob_operator import config, gang, informer, kube, metrics, progress_server, reconciler

RUNTIME_KEY: Final = "trainjob_runtime"
PROGRESS_KEY: Final = "trainjob_progress"
# Why start-up refused to go on (kopf then stops; __main__ says it and exits 2).
REFUSED_KEY: Final = "trainjob_refused"
SETTINGS_KEY: Final = "trainjob_settings"
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 60.0
# Wake slightly after a deadline so that the engine sees it as passed.
REQUEUE_SLACK: Final = 0.05

logger = logging.getLogger("trainjob_operator")


async def _observe_namespace_event(
    *,
    raw_event: kopf.RawEvent,
    namespaces: Any,
    insights: Any,
    **_: Any,
) -> None:
    """kopf's handler of namespace watch events, without its bug (kopf 1.45.2,
    `kopf._core.reactor.observation.process_discovered_namespace_event`): kopf drops every
    event of its namespace watch's own listing (type None), assuming its one-shot namespace
    list just before covered them. A namespace created between that list and the watch's
    listing, or while the watch was down and listed again, was never served, and neither was
    any TrainJob in it (measured: such namespaces, created at resourceVersions between the two
    lists, got no TrainJob watch at all). Here the listing's namespaces count as seen, exactly
    as a later ADDED event would."""
    async with insights.revised:
        observation.revise_namespaces(
            raw_events=[raw_event], insights=insights, namespaces=namespaces
        )
        insights.revised.notify_all()


# kopf resolves the function by name when its namespace observer starts, so this replaces it
# for the whole process before kopf.run. Fail loudly if a kopf release moved it.
if not callable(getattr(observation, "process_discovered_namespace_event", None)):
    raise ImportError("kopf's namespace observation moved; see handlers._observe_namespace_event")
observation.process_discovered_namespace_event = _observe_namespace_event


class NoEssenceDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf builds every watched object's "essence" (a deep copy of the whole body, then
    trimmed) on every watch event, to diff it for on.create/on.update/on.resume handlers. This
    operator has none of those (event handlers and a daemon only), so nothing is ever diffed
    and the copy was pure cost: about a tenth of the operator's CPU at 100 jobs x 8 (py-spy),
    mostly on Pod events. An empty essence keeps kopf's contract without the copy."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def _runtime(memo: kopf.Memo) -> reconciler.Runtime:
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, reconciler.Runtime):
        raise kopf.TemporaryError("operator is not started yet", delay=1)
    return runtime


@kopf.on.startup()
async def trainjob_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    cfg = memo.get(SETTINGS_KEY)
    if not isinstance(cfg, config.Settings):
        cfg = config.from_env(os.environ)
    # kopf observes namespaces only to resolve namespace patterns; exact names and "every
    # namespace" need no observation, and neither needs the CRD watch (the CRD is awaited
    # below, before kopf's one scan of the API's resources).
    settings.scanning.disabled = not cfg.namespace_patterns
    settings.persistence.finalizer = constants.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = NoEssenceDiffBaseStorage(prefix=constants.GROUP)
    # kopf's own k8s Events only for problems; ours tell the job's story.
    settings.posting.level = logging.WARNING
    # Stop a deleted job's daemon promptly so its finalizer goes away.
    settings.background.instant_exit_timeout = 1.0
    # A stalled stream (open, silent) is reopened, kopf's and ours alike.
    settings.watching.inactivity_timeout = cfg.watch_idle_seconds
    api = kube.Kube(
        functools.partial(kube.login, settings, logger),
        cfg.api_workers,
        crash_after=os.environ.get(kube.ENV_CRASH),
        watch_idle_seconds=cfg.watch_idle_seconds,
    )
    meters = metrics.Metrics()
    if cfg.metrics_port:
        meters.serve(cfg.metrics_port)
        logger.info("Serving Prometheus metrics on :%d/metrics", cfg.metrics_port)
    await _wait_for_crd(api)
    if gang.wanted(cfg):
        refusal = await _pod_groups_problem(api, cfg)
        if refusal is not None:
            memo[REFUSED_KEY] = refusal
            await api.close()
            raise kopf.PermanentError(refusal)
    runtime = reconciler.Runtime(settings=cfg, kube=api, metrics=meters)
    if cfg.kueue:
        # Watch Workloads from the start, not only while a job's loop runs: a Workload whose
        # job was deleted while no operator ran must still be released (no loop will come).
        for namespace in cfg.kopf_namespaces or ("",):
            runtime.informer.acquire(namespace)
    runtime.nodes.start()
    runtime.watchdog.start()
    if cfg.progress_enabled:
        memo[PROGRESS_KEY] = await progress_server.serve(runtime)
    memo[RUNTIME_KEY] = runtime


async def _pod_groups_problem(api: kube.Kube, cfg: config.Settings) -> str | None:
    """With a gang scheduler configured, every job's Pods wait for their PodGroup: without
    the PodGroup CRD no job could ever start, so the operator refuses to start and says why
    (the last line of its log, the reason its Pod restarts). None: the API is served."""
    resource = informer.pod_groups(cfg.gang_scheduler)
    try:
        served = await api.serves(resource.group, resource.version, resource.plural)
    except (kube.TransientError, kube.RejectedError) as exc:
        return f"cannot check for the PodGroup API: {exc}"
    if served:
        return None
    return (
        f"--gang-scheduler {cfg.gang_scheduler}: the API server does not serve "
        f"{resource.plural}.{resource.group}/{resource.version}; install the gang "
        "scheduler and its CRDs, or run without --gang-scheduler"
    )


async def _wait_for_crd(api: kube.Kube) -> None:
    """Until the API server's discovery lists TrainJobs: kopf resolves what it serves from one
    scan of discovery right after start-up, and a TrainJob resource missing from it (CRD not
    installed yet, API server still starting) would never be served."""
    failures = 0
    while True:
        try:
            if await api.serves_trainjobs():
                if failures:
                    logger.info("The TrainJob resource is served now")
                return
            reason = "the TrainJob CRD is not installed or not Established yet"
        except (kube.TransientError, kube.RejectedError) as exc:
            reason = str(exc)
        failures += 1
        delay = kube.retry_delay(failures, BACKOFF_FIRST, 10.0)
        logger.warning(
            "Waiting for the API server to serve %s.%s (%s); again in %.1fs",
            constants.PLURAL,
            constants.GROUP,
            reason,
            delay,
        )
        await asyncio.sleep(delay)


@kopf.on.cleanup()
async def trainjob_cleanup(memo: kopf.Memo, **_: Any) -> None:
    server = memo.get(PROGRESS_KEY)
    if isinstance(server, progress_server.ProgressServer):
        await server.close()
    runtime = memo.get(RUNTIME_KEY)
    if isinstance(runtime, reconciler.Runtime):
        await runtime.watchdog.close()
        await runtime.informer.close()
        await runtime.nodes.close()
        await runtime.kube.close()


@kopf.on.login()
def trainjob_login(settings: kopf.OperatorSettings, logger: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf (TrainJob watch, peering) logs in as our own API layer does (kube.login)."""
    return kube.login(settings, logger)


@kopf.on.probe(id="jobs")
def trainjob_probe(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: how many TrainJobs have a running reconcile loop; fails while a list+watch
    keeps failing or a job waits past the serve deadline for its first reconcile."""
    runtime = memo.get(RUNTIME_KEY)
    if not isinstance(runtime, reconciler.Runtime):
        return 0
    problems = runtime.problems()
    if problems:
        # Permanent: kopf would retry a plain exception with a delay, holding the probe's
        # HTTP request open until the kubelet gives up; this one answers 500 at once.
        raise kopf.PermanentError("; ".join(problems))
    return len(runtime.wakers)


# -- wake-ups -------------------------------------------------------------------------------
# Handlers are `async def` although they never await: kopf runs a plain `def` handler in its
# thread pool (a thread hop, a context copy and a shielded task per call), once per watch
# event; these are short and CPU-only, so they run inline.


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
async def trainjob_event(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Created, updated (spec, suspend/resume), resumed at operator start: look again."""
    _runtime(memo).wake((namespace or "", name))


# -- the per-job reconcile loop -------------------------------------------------------------


async def _sleep(
    stopped: kopf.DaemonStopped, waker: asyncio.Event | None, timeout: float | None
) -> None:
    """Until the waker fires, the daemon is stopped, or `timeout` seconds pass."""

    async def until_stopped() -> None:
        await stopped.wait()

    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(until_stopped())]
    if waker is not None:
        waits.append(asyncio.ensure_future(waker.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


@kopf.daemon(
    constants.GROUP,
    constants.VERSION,
    constants.PLURAL,
    id="reconcile",
    cancellation_timeout=10.0,
)
async def trainjob_daemon(
    namespace: str | None,
    name: str,
    uid: str,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    body: kopf.Body,
    **_: Any,
) -> None:
    runtime = _runtime(memo)
    namespace = namespace or ""
    key = (namespace, name)
    waker = runtime.waker(key)
    # `body` is kopf's live view of the TrainJob, updated by every watch event before the
    # event wakes this loop; the reconciler reads from it instead of a GET per reconcile.
    seen = reconciler.Seen()
    failures = conflicts = 0
    listed = runtime.informer.acquire(namespace)
    try:
        # Decide nothing before the children that exist are known (after a restart, or
        # when another replica worked on this job before).
        await _sleep(stopped, listed, None)
        while not stopped:
            waker.clear()
            runtime.begin(key)
            started = time.monotonic()
            try:
                outcome = await reconciler.reconcile_job(
                    runtime,
                    namespace,
                    name,
                    runtime.child_index.pods(key),
                    runtime.child_index.services(key),
                    datetime.datetime.now(datetime.timezone.utc),
                    body,
                    seen,
                )
            except kube.ConflictError:
                # Decided from a copy older than the job (our status write was conditional on
                # it): decide again from a fresh read, soon; not an error.
                conflicts += 1
                logger.info(
                    "TrainJob %s/%s changed since it was read; deciding again", namespace, name
                )
                await _sleep(stopped, None, kube.retry_delay(conflicts, 0.05, 5.0))
                continue
            except (kube.TransientError, kube.RejectedError) as exc:
                failures += 1
                delay = kube.retry_delay(failures, BACKOFF_FIRST, BACKOFF_MAX)
                runtime.metrics.reconcile_errors.labels(namespace).inc()
                logger.warning(
                    "Reconcile of TrainJob %s/%s failed (%s); retrying in %.1fs",
                    namespace,
                    name,
                    exc,
                    delay,
                )
                await _sleep(stopped, None, delay)
                continue
            except Exception:  # a bug must not stop this job's loop, nor any other job
                failures += 1
                delay = kube.retry_delay(failures, BACKOFF_FIRST, BACKOFF_MAX)
                runtime.metrics.reconcile_errors.labels(namespace).inc()
                logger.exception(
                    "Reconcile of TrainJob %s/%s crashed; retrying in %.1fs", namespace, name, delay
                )
                await _sleep(stopped, None, delay)
                continue
            finally:
                runtime.metrics.reconcile_seconds.observe(time.monotonic() - started)
            failures = conflicts = 0
            if outcome.done:
                return
            timeout = runtime.settings.resync_seconds
            if outcome.requeue_after is not None:
                timeout = min(timeout, max(outcome.requeue_after, 0.0) + REQUEUE_SLACK)
            await _sleep(stopped, waker, timeout)
    finally:
        reason = stopped.reason
        if (
            runtime.settings.kueue
            and reason
            and reason & kopf.DaemonStoppingReason.RESOURCE_DELETED
        ):
            # Kueue holds quota for the job's Workload until it is finished and released.
            await reconciler.release_workloads(
                runtime, key, datetime.datetime.now(datetime.timezone.utc)
            )
        runtime.informer.release(namespace)
        runtime.forget(key)
        runtime.metrics.forget(uid)
