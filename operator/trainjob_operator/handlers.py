"""What the operator reacts to, and kopf's part in it: start-up, clean-up, login and the
liveness probe, all through kopf's public API. Everything watched comes in through the
operator's own informers, one mechanism for every kind (manager.py builds them; informer.py
is the list+watch):

    For    TrainJob                        → its job loop (controller.py)
    For    TFJob (with --tfjob)            → its job loop, the same engine (doors.py)
    Owns   Pod, Service                    → wake the job named by trainjob.dev/job-name
    Owns   Workload (with Kueue)           → wake the job; release an orphan's quota
    Owns   PodGroup (with a gang scheduler) → wake the job; requeue waiting gangs
    Owns   Pod, Service of training-operator (with --tfjob) → wake the TFJob taken over
    Watch  Node                            → wake the jobs on a node whose readiness moved

Why not kopf's resource handlers: kopf keeps per-object state for every object it watches
(memories, a throttler, a worker task holding the last body) and makes a handler call per
event; the informers keep only what a decision needs, hand a listed job over page by page,
and keep nothing of a parked (finished, cleaned up) job but its key.

HA (--leader-elect): the replicas elect a leader on a Lease (elector.py; the rules in
leader.py); standbys keep every informer warm and write nothing. A leader that loses the
Lease stops the process (`LOST_KEY`; __main__ exits 1 and the kubelet starts it again as a
standby); a graceful stop releases the Lease, so a standby takes over at once.

Children need no finalizer: they carry a controller ownerReference and the garbage collector
deletes them. Jobs need none either (a job that still carries the one an earlier release put
there loses it at its first reconcile: reconciler.py).

Run with `python -m trainjob_operator` or `kopf run -m trainjob_operator.handlers` (then
settings come from TRAINJOB_* environment variables; see config.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable
from typing import Any, Final

import kopf

from trainjob.core import constants, tfjob
from trainjob_operator import config, elector, gang, informer, kube, metrics
from trainjob_operator import manager as manager_
from trainjob_operator.manager import build

MANAGER_KEY: Final = "trainjob_manager"
# Why start-up refused to go on (kopf then stops; __main__ says it and exits 2).
REFUSED_KEY: Final = "trainjob_refused"
SETTINGS_KEY: Final = "trainjob_settings"
# Set (to why) when this replica lost the leader Lease; __main__ then exits 1.
LOST_KEY: Final = "trainjob_lost_lease"
# The flag kopf.run stops on (__main__ passes it); without it (`kopf run`) a SIGTERM stops it.
STOP_KEY: Final = "trainjob_stop"
BACKOFF_FIRST: Final = 0.5
logger = logging.getLogger(__name__)


def identity() -> str:
    """This replica's leader-election identity, unique per process (controller-runtime's:
    the host name, which is the Pod's name, and a UUID)."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def read_file(path: str) -> str | None:
    """A small file's text (the service account's namespace), None when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _stopper(memo: kopf.Memo) -> Callable[[str], None]:
    """What to call when the leader Lease is lost: record why and stop kopf (its clean-up
    closes the manager; writes stopped already, by the clock)."""

    def lost(why: str) -> None:
        memo[LOST_KEY] = why
        stop = memo.get(STOP_KEY)
        if isinstance(stop, asyncio.Event):
            stop.set()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    return lost


@kopf.on.startup()
async def trainjob_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    cfg = memo.get(SETTINGS_KEY)
    if not isinstance(cfg, config.Settings):
        cfg = config.from_env(os.environ)
    lease_namespace = ""
    if cfg.leader_elect:
        try:
            lease_namespace = config.election_namespace(cfg, os.environ, read_file)
        except config.ConfigError as exc:
            memo[REFUSED_KEY] = str(exc)
            raise kopf.PermanentError(str(exc)) from exc
    # kopf watches nothing (every kind comes through our informers), so it needs no view of
    # the cluster's namespaces or CRDs beyond its one discovery scan at start.
    settings.scanning.disabled = True
    # Never kopf's peering, even under `kopf run` with kopf.dev CRDs left in the cluster:
    # HA is leader election on a Lease (elector.py).
    settings.peering.standalone = True
    # kopf's own k8s Events only for problems; ours tell the job's story.
    settings.posting.level = logging.WARNING
    # When the API server says when to come back (429: "storage is (re)initializing" after
    # it restarts, or priority-and-fairness throttling), come back then, as client-go does,
    # instead of after kopf's growing backoff (13 s, 21 s).
    settings.networking.enforce_retry_after = True
    me = identity()
    api = kube.Kube(
        functools.partial(kube.login, settings, logger),
        cfg.api_workers,
        crash_after=os.environ.get(kube.ENV_CRASH),
        watch_idle_seconds=cfg.watch_idle_seconds,
        identity=me,
    )
    meters = metrics.Metrics()
    if cfg.leader_elect:
        meters.leader.set(0)  # a standby until the elector says otherwise
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
    election = None
    if cfg.leader_elect:
        election = elector.Elector(
            api,
            lease_namespace,
            cfg.leader_election_id,
            me,
            cfg.leader_timing,
            meters,
            _stopper(memo),
        )
    manager = build(cfg, api, meters, election)
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
    """kopf (its one discovery scan at start) logs in as our own API layer does (kube.login)."""
    return kube.login(settings, logger)


@kopf.on.probe(id="leader")
def trainjob_leader_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """Liveness and readiness say which part this replica plays: "leader" (it writes),
    "standby" (it watches and waits for the Lease) or "alone" (no leader election)."""
    running = memo.get(MANAGER_KEY)
    if not isinstance(running, manager_.Manager):
        return {"role": "starting"}
    election = running.election
    if election is None:
        return {"role": "alone"}
    return {
        "role": "leader" if election.leading() else "standby",
        "identity": election.identity,
        "lease": election.lease,
        "holder": election.holder,
    }


@kopf.on.probe(id="jobs")
def trainjob_probe(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: how many TrainJobs this operator knows; fails while a list+watch keeps
    failing or a job waits past the serve deadline for its first reconcile."""
    running = memo.get(MANAGER_KEY)
    if not isinstance(running, manager_.Manager):
        return 0
    problems = running.problems()
    if problems:
        # Permanent: kopf would retry a plain exception with a delay, holding the probe's
        # HTTP request open until the kubelet gives up; this one answers 500 at once.
        raise kopf.PermanentError("; ".join(problems))
    return len(running.jobs.known)
