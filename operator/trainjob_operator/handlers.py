"""kopf handlers: thin wiring from kopf (TrainJob watch, start-up, probes, peering) to the job
loop in controller.py.

- kopf watches the TrainJobs and hands every event to `controller.observe`; the controller
  owns the loop (a keyed work queue served by a bounded pool of workers, timers, retries,
  parking finished jobs). There is no kopf daemon and no finalizer: kopf keeps no copy of
  each object and makes no request per job. (Jobs that still carry the finalizer an
  earlier release put there lose it at their first event: kopf removes a finalizer that no
  handler needs, one PATCH per such job, once.)
- Pods and Services are read from an in-memory index that informer.py keeps with a list
  and a watch of the labelled objects (no list call per reconcile, no kopf per-object state
  for them); their events wake the job. A job is first reconciled once its scope's initial
  list is in, so a restarted operator sees every existing child before deciding anything
  and adopts instead of duplicating.
- Children need no finalizer: they carry a controller ownerReference and the garbage
  collector deletes them.
- Nothing is ever returned from a handler, so nothing lands in status; kopf's own progress
  and diff-base annotations (none are written by event handlers) use our prefix.

Run with `python -m trainjob_operator` or `kopf run -m trainjob_operator.handlers` (then
settings come from TRAINJOB_* environment variables; see config.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Any, Final

import kopf

from trainjob.core import constants, tfjob
from trainjob_operator import config, controller, gang, informer, kopf_fixes, kube, metrics
from trainjob_operator import manager as manager_
from trainjob_operator.manager import build

MANAGER_KEY: Final = "trainjob_manager"
# Why start-up refused to go on (kopf then stops; __main__ says it and exits 2).
REFUSED_KEY: Final = "trainjob_refused"
SETTINGS_KEY: Final = "trainjob_settings"
BACKOFF_FIRST: Final = 0.5
logger = logging.getLogger("trainjob_operator")


# Whether kopf peering has paused this replica (kopf_fixes passes kopf's pause toggles on).
PAUSE: Final = controller.Pause()


class NoEssenceDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf builds every watched object's "essence" (a deep copy of the whole body, then
    trimmed) on every watch event, to diff it for on.create/on.update/on.resume handlers. This
    operator has none of those (event handlers and a daemon only), so nothing is ever diffed
    and the copy was pure cost: about a tenth of the operator's CPU at 100 jobs x 8 (py-spy),
    mostly on Pod events. An empty essence keeps kopf's contract without the copy."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def _manager(memo: kopf.Memo) -> manager_.Manager:
    running = memo.get(MANAGER_KEY)
    if not isinstance(running, manager_.Manager):
        raise kopf.TemporaryError("operator is not started yet", delay=1)
    return running


@kopf.on.startup()
async def trainjob_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Before kopf starts its namespace observer and peering watches (they wait for start-up).
    kopf_fixes.install(PAUSE.track)
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
    # When the API server says when to come back (429: "storage is (re)initializing" after
    # it restarts, or priority-and-fairness throttling), come back then, as client-go does,
    # instead of after kopf's growing backoff (13 s, 21 s): after a restart at 10,000 jobs a
    # new job otherwise waited ~25 s for the TrainJob watch to resume.
    settings.networking.enforce_retry_after = True
    # A stalled stream (open, silent) is reopened, kopf's and ours alike.
    settings.watching.inactivity_timeout = cfg.watch_idle_seconds
    # kopf lists in one request by default: 10,000 TrainJobs parsed at once, a peak whose
    # memory the process keeps. Pages of the size our informers use bound it.
    settings.watching.chunk_size = kube.LIST_PAGE
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
    await _wait_until_served(
        api,
        constants.KIND,
        constants.GROUP,
        constants.VERSION,
        constants.PLURAL,
        "the TrainJob CRD is not installed or not Established yet",
    )
    if cfg.tfjob:
        refusal = await _tfjob_problem(api)
        if refusal is not None:
            memo[REFUSED_KEY] = refusal
            await api.close()
            raise kopf.PermanentError(refusal)
        await _wait_until_served(
            api,
            tfjob.KIND,
            tfjob.GROUP,
            tfjob.VERSION,
            tfjob.PLURAL,
            "--tfjob: the TFJob CRD is not installed: kubectl apply --server-side -f "
            "crds/kubeflow/kubeflow.org_tfjobs.yaml, or the chart's tfjob.installCRD",
        )
    if gang.wanted(cfg):
        refusal = await _pod_groups_problem(api, cfg)
        if refusal is not None:
            memo[REFUSED_KEY] = refusal
            await api.close()
            raise kopf.PermanentError(refusal)
    manager = build(cfg, api, meters, PAUSE)
    await manager.start()
    memo[MANAGER_KEY] = manager


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


async def _wait_until_served(
    api: kube.Kube, kind: str, group: str, version: str, plural: str, missing: str
) -> None:
    """Until the API server's discovery lists the resource: kopf resolves what it serves from
    one scan of discovery right after start-up, and a resource missing from it (CRD not
    installed yet, API server still starting) would never be served. `missing`: what to say
    while it is not there (how to install it)."""
    failures = 0
    while True:
        try:
            if await api.serves(group, version, plural):
                if failures:
                    logger.info("The %s resource is served now", kind)
                return
            reason = missing
        except (kube.TransientError, kube.RejectedError) as exc:
            reason = str(exc)
        failures += 1
        delay = kube.retry_delay(failures, BACKOFF_FIRST, 10.0)
        logger.warning(
            "Waiting for the API server to serve %s.%s (%s); again in %.1fs",
            plural,
            group,
            reason,
            delay,
        )
        await asyncio.sleep(delay)


# training-operator's validating webhook (pkg/webhooks/tensorflow): while registered it
# refuses every TFJob whose managedBy is ours, and with training-operator not serving TFJobs
# (its handler unregistered) it refuses every TFJob create (failurePolicy: Fail).
TRAINING_OPERATOR_WEBHOOKS: Final = "validator.training-operator.kubeflow.org"
TRAINING_OPERATOR_TFJOB_WEBHOOK: Final = "validator.tfjob.training-operator.kubeflow.org"


async def _tfjob_problem(api: kube.Kube) -> str | None:
    """What would make serving TFJobs fight training-operator or be refused, in one line
    with the fix; None: nothing found (or not allowed to look: then a warning)."""
    try:
        found = await api.get_object(
            "admissionregistration.k8s.io",
            "v1",
            None,
            "validatingwebhookconfigurations",
            TRAINING_OPERATOR_WEBHOOKS,
        )
    except (kube.TransientError, kube.RejectedError) as exc:
        logger.warning("Could not check for training-operator's TFJob webhook: %s", exc)
        return None
    hooks = (found or {}).get("webhooks") or []
    if not any(h.get("name") == TRAINING_OPERATOR_TFJOB_WEBHOOK for h in hooks):
        return None
    return (
        f"--tfjob: training-operator's TFJob webhook {TRAINING_OPERATOR_TFJOB_WEBHOOK} is "
        f"registered (ValidatingWebhookConfiguration {TRAINING_OPERATOR_WEBHOOKS}): it refuses "
        f"TFJobs managed by {tfjob.OURS} and, with training-operator serving TFJobs, the two "
        "controllers would fight over the same Pods. Remove that webhook entry and run "
        "training-operator without tfjob in --enable-scheme (or uninstall it), then start again"
    )


@kopf.on.cleanup()
async def trainjob_cleanup(memo: kopf.Memo, **_: Any) -> None:
    running = memo.get(MANAGER_KEY)
    if isinstance(running, manager_.Manager):
        await running.close()


@kopf.on.login()
def trainjob_login(settings: kopf.OperatorSettings, logger: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf (TrainJob watch, peering) logs in as our own API layer does (kube.login)."""
    return kube.login(settings, logger)


@kopf.on.probe(id="jobs")
def trainjob_probe(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: how many TrainJobs this operator knows; fails while a list+watch keeps
    failing or a job waits past the serve deadline for its first reconcile."""
    running = memo.get(MANAGER_KEY)
    if not isinstance(running, manager_.Manager):
        return 0
    problems = running.ctx.problems()
    if problems:
        # Permanent: kopf would retry a plain exception with a delay, holding the probe's
        # HTTP request open until the kubelet gives up; this one answers 500 at once.
        raise kopf.PermanentError("; ".join(problems))
    return len(running.jobs.known)


# -- wake-ups -------------------------------------------------------------------------------
# Handlers are `async def` although they never await: kopf runs a plain `def` handler in its
# thread pool (a thread hop, a context copy and a shielded task per call), once per watch
# event; these are short and CPU-only, so they run inline.


@kopf.on.event(constants.GROUP, constants.VERSION, constants.PLURAL)
async def trainjob_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Created, changed, listed at operator start or after a pause, deleted: to the loop."""
    _manager(memo).jobs.observe(event.get("type"), event["object"])


async def tfjob_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A TFJob created, changed, listed or deleted (with --tfjob): to its loop."""
    loop = _manager(memo).tfjobs
    if loop is not None:
        loop.observe(event.get("type"), event["object"])


_serving_tfjobs: list[bool] = []


def serve_tfjobs() -> None:
    """Watch TFJobs (--tfjob): registered before kopf.run, which resolves what it watches
    once at start."""
    if not _serving_tfjobs:
        kopf.on.event(tfjob.GROUP, tfjob.VERSION, tfjob.PLURAL)(tfjob_event)
        _serving_tfjobs.append(True)


# `kopf run -m trainjob_operator.handlers` takes its settings from the environment.
if config.env_flag(os.environ, config.ENV_TFJOB):
    serve_tfjobs()
