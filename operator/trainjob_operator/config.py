"""Operator settings from command-line flags and environment variables.

Pure: the environment is passed in as a mapping (``__main__`` passes ``os.environ``), so the
parsing is tested as data. A flag wins over its environment variable, which wins over the
default.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from trainjob.core import constants
from trainjob.core import tfjob as tfjob_core
from trainjob_operator import leader

GANG_NONE: Final = "none"
GANG_VOLCANO: Final = "volcano"
GANG_SCHEDULER_PLUGINS: Final = "scheduler-plugins"
GANG_SCHEDULERS: Final = (GANG_NONE, GANG_VOLCANO, GANG_SCHEDULER_PLUGINS)

# The schedulerName each gang scheduler answers to by default (its Helm chart's default).
DEFAULT_SCHEDULER_NAMES: Final = {
    GANG_VOLCANO: "volcano",
    GANG_SCHEDULER_PLUGINS: "scheduler-plugins-scheduler",
}

DEFAULT_METRICS_PORT: Final = 8080
# The leader Lease's name (controller-runtime's LeaderElectionID).
DEFAULT_LEADER_ELECTION_ID: Final = "trainjob-operator"
DEFAULT_RESYNC_SECONDS: Final = 600.0
DEFAULT_API_WORKERS: Final = 16
DEFAULT_SERVE_DEADLINE: Final = 60.0
# A watch stream silent this long is taken for dead (a stalled proxy or load balancer keeps
# the connection open but forwards nothing) and opened again from the last version seen. The
# API server sends a bookmark about every minute on a live stream; 70 s is kopf's own default.
DEFAULT_WATCH_IDLE: Final = 70.0

ENV_NAMESPACES: Final = "TRAINJOB_OPERATOR_NAMESPACES"
ENV_CLUSTER_DOMAIN: Final = "TRAINJOB_CLUSTER_DOMAIN"
ENV_DEFAULT_IMAGE: Final = "TRAINJOB_DEFAULT_IMAGE"
ENV_METRICS_PORT: Final = "TRAINJOB_METRICS_PORT"
ENV_LIVENESS: Final = "TRAINJOB_LIVENESS_ENDPOINT"
ENV_GANG_SCHEDULER: Final = "TRAINJOB_GANG_SCHEDULER"
ENV_SCHEDULER_NAME: Final = "TRAINJOB_SCHEDULER_NAME"
ENV_LEADER_ELECT: Final = "TRAINJOB_LEADER_ELECT"
ENV_LEADER_ELECTION_NAMESPACE: Final = "TRAINJOB_LEADER_ELECTION_NAMESPACE"
ENV_LEADER_ELECTION_ID: Final = "TRAINJOB_LEADER_ELECTION_ID"
ENV_LEASE_DURATION: Final = "TRAINJOB_LEADER_ELECT_LEASE_DURATION"
ENV_RENEW_DEADLINE: Final = "TRAINJOB_LEADER_ELECT_RENEW_DEADLINE"
ENV_RETRY_PERIOD: Final = "TRAINJOB_LEADER_ELECT_RETRY_PERIOD"
# The namespace of the Pod the operator runs in (the downward API; the chart sets it).
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
# Settings of kopf peering, which HA used before the Lease: refused with the way forward.
REMOVED_FLAGS: Final = {
    "--peering": "TRAINJOB_PEERING",
    "--priority": "TRAINJOB_PRIORITY",
    "--standalone": "TRAINJOB_STANDALONE",
}
REMOVED: Final = "removed: HA now uses a Lease (--leader-elect); without it the operator runs alone"
ENV_RESYNC: Final = "TRAINJOB_RESYNC_SECONDS"
ENV_API_WORKERS: Final = "TRAINJOB_API_WORKERS"
ENV_SERVE_DEADLINE: Final = "TRAINJOB_SERVE_DEADLINE_SECONDS"
ENV_WATCH_IDLE: Final = "TRAINJOB_WATCH_IDLE_SECONDS"
ENV_PROGRESS_PORT: Final = "TRAINJOB_PROGRESS_PORT"
ENV_PROGRESS_URL: Final = "TRAINJOB_OPERATOR_PROGRESS_URL"
ENV_PROGRESS_CERT_DIR: Final = "TRAINJOB_PROGRESS_CERT_DIR"
ENV_PROGRESS_INTERVAL: Final = "TRAINJOB_PROGRESS_INTERVAL_SECONDS"
ENV_PROGRESS_WRITES: Final = "TRAINJOB_PROGRESS_STATUS_WRITES_PER_SECOND"
ENV_RESTRICTED: Final = "TRAINJOB_RESTRICTED_POD_DEFAULTS"
ENV_NETWORK_POLICY: Final = "TRAINJOB_NETWORK_POLICY"
ENV_TFJOB: Final = "TRAINJOB_TFJOB"
ENV_TFJOB_MODE: Final = "TRAINJOB_TFJOB_MODE"
ENV_KUEUE: Final = "TRAINJOB_KUEUE"
ENV_KUEUE_MANAGE_ALL: Final = "TRAINJOB_KUEUE_MANAGE_JOBS_WITHOUT_QUEUE_NAME"
ENV_KUEUE_NAMESPACES: Final = "TRAINJOB_KUEUE_MANAGED_NAMESPACES"
# Kueue's default managedJobsNamespaceSelector: never its own namespace nor kube-system.
DEFAULT_KUEUE_NAMESPACES: Final = "kubernetes.io/metadata.name notin (kube-system,kueue-system)"

DEFAULT_PROGRESS_INTERVAL: Final = 5.0
DEFAULT_PROGRESS_WRITES: Final = 20.0


@dataclasses.dataclass(frozen=True)
class Settings:
    # Empty: cluster-wide (every namespace). Otherwise only these namespaces (kopf globs allowed).
    namespaces: tuple[str, ...] = ()
    cluster_domain: str = constants.DEFAULT_CLUSTER_DOMAIN
    default_image: str | None = None
    # 0 disables the /metrics server.
    metrics_port: int = DEFAULT_METRICS_PORT
    # e.g. http://0.0.0.0:8081/healthz ; None disables it.
    liveness_endpoint: str | None = None
    gang_scheduler: str = GANG_NONE
    scheduler_name: str | None = None
    # HA: replicas elect a leader on a Lease (leader.py, elector.py); only the leader
    # writes. Off: this replica is the only one and always writes.
    leader_elect: bool = False
    # The Lease's namespace; None: the operator Pod's own (POD_NAMESPACE, else its service
    # account's namespace file: `election_namespace`).
    leader_election_namespace: str | None = None
    leader_election_id: str = DEFAULT_LEADER_ELECTION_ID
    leader_timing: leader.Timing = dataclasses.field(default_factory=leader.Timing)
    # A safety net only: every change already wakes the job's reconcile.
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    api_workers: int = DEFAULT_API_WORKERS
    # A job (of any kind) with no reconcile this long after it was seen is logged, counted
    # and fails the liveness probe; so does a list+watch that keeps failing this long.
    serve_deadline_seconds: float = DEFAULT_SERVE_DEADLINE
    # Every watch (the jobs' and their children's) is reopened after this long without a byte.
    watch_idle_seconds: float = DEFAULT_WATCH_IDLE
    # Progress reports (HTTPS): 0 = off. `progress_url` is the base URL Pods report to (the
    # operator's Service); `progress_cert_dir` holds tls.crt, tls.key and ca.crt.
    progress_port: int = 0
    progress_url: str | None = None
    progress_cert_dir: str | None = None
    progress_interval_seconds: float = DEFAULT_PROGRESS_INTERVAL
    # The most status writes of progress per second (the write budget); final reports go at once.
    progress_writes_per_second: float = DEFAULT_PROGRESS_WRITES
    verbose: bool = False
    # Fill in the Pod Security "restricted" fields a template leaves unset (render.py).
    restricted_pod_defaults: bool = False
    # Kueue integration (kueue.py): jobs with a kueue.x-k8s.io/queue-name label wait for
    # Kueue's admission; with `kueue_manage_all`, every job in the namespaces matching the
    # label selector `kueue_namespaces` does (Kueue's manageJobsWithoutQueueName).
    kueue: bool = False
    kueue_manage_all: bool = False
    # One NetworkPolicy per job that wants it (spec.networkIsolation: Job): only the job's
    # replicas reach its TensorFlow ports (netpol.py). False: none (the cluster manages
    # policies itself).
    network_policy: bool = True
    kueue_namespaces: str = DEFAULT_KUEUE_NAMESPACES
    # Serve Kubeflow's kubeflow.org/v1 TFJobs too (doors.py), in takeover mode (no
    # training-operator serves TFJobs: runPolicy.managedBy unset, training-operator's or ours)
    # or coexist mode (it still runs: ours only). trainjob.core.tfjob.served.
    tfjob: bool = False
    tfjob_mode: str = tfjob_core.TAKEOVER

    @property
    def progress_enabled(self) -> bool:
        return self.progress_port > 0

    @property
    def serves_every_namespace(self) -> bool:
        return not self.namespaces

    @property
    def namespace_patterns(self) -> bool:
        """Whether a namespace is given as a pattern (glob, negation, comma list): jobs are then
        watched cluster-wide and kept when `serves` says so (kopf observes namespaces only
        for peering); exact names need no observation."""
        return not all(is_exact_namespace(ns) for ns in self.namespaces)

    @property
    def watched_namespaces(self) -> tuple[str, ...]:
        """The namespaces jobs (and their children) are listed and watched in one by one; ()
        means one cluster-wide list+watch (every namespace, or namespace patterns)."""
        return () if self.namespace_patterns else self.namespaces

    def serves(self, namespace: str) -> bool:
        """Whether a TrainJob in `namespace` is this operator's to reconcile."""
        return self.serves_every_namespace or any(
            namespace_matches(namespace, pattern) for pattern in self.namespaces
        )

    @property
    def effective_scheduler_name(self) -> str | None:
        if self.gang_scheduler == GANG_NONE:
            return None
        return self.scheduler_name or DEFAULT_SCHEDULER_NAMES[self.gang_scheduler]


def is_exact_namespace(pattern: str) -> bool:
    """A plain namespace name, not a kopf pattern (globs, `!` negations, comma lists)."""
    return not any(char in pattern for char in "*?[!,")


def namespace_matches(namespace: str, pattern: str) -> bool:
    """kopf's namespace pattern semantics (`kopf run --namespace`), so a pattern selects the
    same namespaces as it did when kopf matched them: comma-separated globs read left to right;
    the first glob decides the initial match (a leading `!glob` implies `*` before it); `!glob`
    removes a match; a later inclusive glob re-includes only what the first glob matched."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if globs[0].startswith("!"):
        globs.insert(0, "*")
    matches = first_match = fnmatch.fnmatchcase(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matches = matches and not fnmatch.fnmatchcase(namespace, glob.lstrip("!"))
        else:
            matches = matches or (first_match and fnmatch.fnmatchcase(namespace, glob))
    return matches


class ConfigError(ValueError):
    """A flag or environment variable has an unusable value."""


def _split(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _int(value: str | None, name: str, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from exc


def _float(value: str | None, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: expected a number, got {value!r}") from exc


_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN: Final = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def _seconds(value: str | None, name: str, default: float) -> float:
    """A duration in seconds ("15" or "15s", as kube-scheduler's flags take it)."""
    if value is None or value == "":
        return default
    try:
        return float(value.strip().removesuffix("s"))
    except ValueError as exc:
        raise ConfigError(f"{name}: expected seconds, e.g. 15 or 15s, got {value!r}") from exc


def _whole_seconds(value: str | None, name: str, default: int) -> int:
    seconds = _seconds(value, name, float(default))
    if not seconds.is_integer():
        raise ConfigError(f"{name}: whole seconds (the Lease stores them), got {value!r}")
    return int(seconds)


def _bool(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def env_flag(env: Mapping[str, str], name: str) -> bool:
    """Whether the environment variable `name` is set to a true value (1, true, yes, on)."""
    return _bool(env.get(name))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainjob_operator",
        description="The TrainJob operator: reconciles TrainJobs into Pods, Services and status.",
    )
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help=f"watch only this namespace (repeatable; default: all namespaces; env {ENV_NAMESPACES}"
        ", comma-separated)",
    )
    p.add_argument("--cluster-domain", help=f"e.g. cluster.local (env {ENV_CLUSTER_DOMAIN})")
    p.add_argument(
        "--default-image", help=f"image for jobs that set none (env {ENV_DEFAULT_IMAGE})"
    )
    p.add_argument(
        "--metrics-port", help=f"Prometheus /metrics port, 0 = off (env {ENV_METRICS_PORT})"
    )
    p.add_argument(
        "--liveness",
        dest="liveness_endpoint",
        help=f"e.g. http://0.0.0.0:8081/healthz (env {ENV_LIVENESS})",
    )
    p.add_argument(
        "--gang-scheduler",
        choices=GANG_SCHEDULERS,
        help=f"place every job as a gang: a PodGroup per job (env {ENV_GANG_SCHEDULER})",
    )
    p.add_argument(
        "--scheduler-name", help=f"override the gang scheduler's name ({ENV_SCHEDULER_NAME})"
    )
    p.add_argument(
        "--leader-elect",
        action="store_true",
        default=None,
        help="elect a leader on a coordination.k8s.io Lease: run several replicas, one "
        "writes, the others stand by with warm caches and take over when it goes (env "
        f"{ENV_LEADER_ELECT}; default off: this replica is the only one)",
    )
    p.add_argument(
        "--leader-election-namespace",
        help="the Lease's namespace (env "
        f"{ENV_LEADER_ELECTION_NAMESPACE}; default: the operator Pod's namespace)",
    )
    p.add_argument(
        "--leader-election-id",
        help=f"the Lease's name (env {ENV_LEADER_ELECTION_ID}; default "
        f"{DEFAULT_LEADER_ELECTION_ID})",
    )
    p.add_argument(
        "--leader-elect-lease-duration",
        help="seconds a standby waits after the leader's last renewal it saw before it takes "
        f"over (env {ENV_LEASE_DURATION}; default {leader.DEFAULT_LEASE_DURATION})",
    )
    p.add_argument(
        "--leader-elect-renew-deadline",
        help="seconds a leader keeps writing without a successful renewal; then it stops "
        "writing and exits (shorter than the lease duration; env "
        f"{ENV_RENEW_DEADLINE}; default {leader.DEFAULT_RENEW_DEADLINE:g})",
    )
    p.add_argument(
        "--leader-elect-retry-period",
        help="seconds between tries to acquire or renew the Lease (env "
        f"{ENV_RETRY_PERIOD}; default {leader.DEFAULT_RETRY_PERIOD:g})",
    )
    for removed in REMOVED_FLAGS:
        # Refused with the way forward (from_args), not with argparse's "unrecognized".
        p.add_argument(removed, nargs="?", const="", default=None, help=argparse.SUPPRESS)
    p.add_argument("--resync-seconds", help=f"safety-net resync period (env {ENV_RESYNC})")
    p.add_argument("--api-workers", help=f"API requests in flight at most (env {ENV_API_WORKERS})")
    p.add_argument(
        "--serve-deadline-seconds",
        help="a TrainJob not reconciled this long after it appears, or a watch failing this "
        f"long, is logged and fails the liveness probe (env {ENV_SERVE_DEADLINE}; default 60)",
    )
    p.add_argument(
        "--watch-idle-seconds",
        help="a watch stream silent this long is reopened from the last version seen "
        f"(env {ENV_WATCH_IDLE}; default 70)",
    )
    p.add_argument(
        "--progress-port",
        help=f"HTTPS port for training progress reports, 0 = off (env {ENV_PROGRESS_PORT})",
    )
    p.add_argument(
        "--progress-url",
        help="base URL Pods report progress to, e.g. https://trainjob-operator.trainjob-system"
        f".svc:8443 (env {ENV_PROGRESS_URL})",
    )
    p.add_argument(
        "--progress-cert-dir",
        help=f"directory with tls.crt, tls.key and ca.crt (env {ENV_PROGRESS_CERT_DIR})",
    )
    p.add_argument(
        "--progress-interval",
        help="seconds between a job's progress reports, at most (env "
        f"{ENV_PROGRESS_INTERVAL}; default 5)",
    )
    p.add_argument(
        "--progress-status-writes",
        help="status writes of progress per second, at most: the write budget (env "
        f"{ENV_PROGRESS_WRITES}; default 20)",
    )
    p.add_argument(
        "--restricted-pod-defaults",
        action="store_true",
        default=None,
        help="fill in what Pod Security 'restricted' requires and a template leaves unset "
        "(runAsNonRoot with user 1000, no privilege escalation, drop ALL capabilities), so "
        f"images of your own run in restricted namespaces (env {ENV_RESTRICTED})",
    )
    p.add_argument(
        "--no-network-policy",
        action="store_false",
        dest="network_policy",
        default=None,
        help="create no NetworkPolicy for the jobs (by default each job gets one that lets "
        "only its own replicas reach its TensorFlow ports), for clusters that manage "
        f"policies themselves (env {ENV_NETWORK_POLICY}=false)",
    )
    p.add_argument(
        "--tfjob",
        action="store_true",
        default=None,
        help="serve Kubeflow's kubeflow.org/v1 TFJobs as training-operator v1.9.4 does (its CRD "
        f"must be installed; env {ENV_TFJOB})",
    )
    p.add_argument(
        "--tfjob-mode",
        choices=tfjob_core.MODES,
        help="takeover: serve TFJobs with runPolicy.managedBy unset, "
        f"{tfjob_core.TRAINING_OPERATOR!r} or {tfjob_core.OURS!r} (no training-operator serves "
        f"TFJobs); coexist: only {tfjob_core.OURS!r} (env {ENV_TFJOB_MODE}; default takeover)",
    )
    p.add_argument(
        "--kueue",
        action="store_true",
        default=None,
        help="Kueue integration: jobs with a kueue.x-k8s.io/queue-name label wait for Kueue's "
        f"admission (env {ENV_KUEUE}; Kueue needs externalFrameworks: "
        "[TrainJob.v1alpha1.trainjob.dev])",
    )
    p.add_argument(
        "--kueue-manage-jobs-without-queue-name",
        action="store_true",
        default=None,
        help="as Kueue's manageJobsWithoutQueueName: jobs without a queue label are managed too, "
        f"in the namespaces of --kueue-managed-namespaces (env {ENV_KUEUE_MANAGE_ALL})",
    )
    p.add_argument(
        "--kueue-managed-namespaces",
        help="label selector of the namespaces where jobs without a queue label are managed "
        f"(env {ENV_KUEUE_NAMESPACES}; default {DEFAULT_KUEUE_NAMESPACES!r})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def from_args(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Settings from command-line flags, falling back to environment variables."""
    args = parser().parse_args(list(argv))

    def pick(flag: object, var: str) -> str | None:
        if flag is not None:
            return str(flag)
        return env.get(var)

    for flag, var in REMOVED_FLAGS.items():
        if getattr(args, flag.lstrip("-")) is not None:
            raise ConfigError(f"{flag}: {REMOVED}")
        if env.get(var):
            raise ConfigError(f"{var}: {REMOVED}")

    namespaces = tuple(args.namespaces or ()) or _split(env.get(ENV_NAMESPACES))
    gang = pick(args.gang_scheduler, ENV_GANG_SCHEDULER) or GANG_NONE
    if gang not in GANG_SCHEDULERS:
        raise ConfigError(
            f"gang scheduler: expected one of {', '.join(GANG_SCHEDULERS)}, got {gang!r}"
        )
    metrics_port = _int(pick(args.metrics_port, ENV_METRICS_PORT), "metrics port", None)
    api_workers = _int(pick(args.api_workers, ENV_API_WORKERS), "api workers", None)
    timing = leader.Timing(
        lease_duration=_whole_seconds(
            pick(args.leader_elect_lease_duration, ENV_LEASE_DURATION),
            "--leader-elect-lease-duration",
            leader.DEFAULT_LEASE_DURATION,
        ),
        renew_deadline=_seconds(
            pick(args.leader_elect_renew_deadline, ENV_RENEW_DEADLINE),
            "--leader-elect-renew-deadline",
            leader.DEFAULT_RENEW_DEADLINE,
        ),
        retry_period=_seconds(
            pick(args.leader_elect_retry_period, ENV_RETRY_PERIOD),
            "--leader-elect-retry-period",
            leader.DEFAULT_RETRY_PERIOD,
        ),
    )
    timing_problem = timing.problem()
    if timing_problem is not None:
        raise ConfigError(f"--leader-elect-*: {timing_problem}")
    election_id = pick(args.leader_election_id, ENV_LEADER_ELECTION_ID) or (
        DEFAULT_LEADER_ELECTION_ID
    )
    if not _DNS_SUBDOMAIN.fullmatch(election_id):
        raise ConfigError(
            f"--leader-election-id: a Lease name (lower-case letters, digits, '-' and '.'), "
            f"got {election_id!r}"
        )
    progress_port = _int(pick(args.progress_port, ENV_PROGRESS_PORT), "--progress-port", 0) or 0
    progress_url = pick(args.progress_url, ENV_PROGRESS_URL) or None
    progress_cert_dir = pick(args.progress_cert_dir, ENV_PROGRESS_CERT_DIR) or None
    if not 0 <= progress_port <= 65535:
        raise ConfigError(f"--progress-port: expected 0-65535, got {progress_port}")
    if progress_port and not progress_url:
        raise ConfigError("--progress-url: required with --progress-port (the URL Pods use)")
    if progress_port and not progress_cert_dir:
        raise ConfigError("--progress-cert-dir: required with --progress-port (reports are HTTPS)")
    if progress_url and not progress_url.startswith("https://"):
        raise ConfigError(f"--progress-url: must be an https:// URL, got {progress_url!r}")
    interval = _float(
        pick(args.progress_interval, ENV_PROGRESS_INTERVAL),
        "--progress-interval",
        DEFAULT_PROGRESS_INTERVAL,
    )
    writes = _float(
        pick(args.progress_status_writes, ENV_PROGRESS_WRITES),
        "--progress-status-writes",
        DEFAULT_PROGRESS_WRITES,
    )
    if interval < 1:
        raise ConfigError(f"--progress-interval: at least 1 second, got {interval:g}")
    if writes <= 0:
        raise ConfigError(f"--progress-status-writes: must be positive, got {writes:g}")
    return Settings(
        namespaces=namespaces,
        cluster_domain=pick(args.cluster_domain, ENV_CLUSTER_DOMAIN)
        or constants.DEFAULT_CLUSTER_DOMAIN,
        default_image=pick(args.default_image, ENV_DEFAULT_IMAGE) or None,
        metrics_port=DEFAULT_METRICS_PORT if metrics_port is None else metrics_port,
        liveness_endpoint=pick(args.liveness_endpoint, ENV_LIVENESS) or None,
        gang_scheduler=gang,
        scheduler_name=pick(args.scheduler_name, ENV_SCHEDULER_NAME) or None,
        leader_elect=(
            args.leader_elect if args.leader_elect is not None else _bool(env.get(ENV_LEADER_ELECT))
        ),
        leader_election_namespace=pick(
            args.leader_election_namespace, ENV_LEADER_ELECTION_NAMESPACE
        )
        or None,
        leader_election_id=election_id,
        leader_timing=timing,
        resync_seconds=_float(
            pick(args.resync_seconds, ENV_RESYNC), "resync", DEFAULT_RESYNC_SECONDS
        ),
        api_workers=DEFAULT_API_WORKERS if api_workers is None else max(1, api_workers),
        serve_deadline_seconds=max(
            1.0,
            _float(
                pick(args.serve_deadline_seconds, ENV_SERVE_DEADLINE),
                "serve deadline",
                DEFAULT_SERVE_DEADLINE,
            ),
        ),
        watch_idle_seconds=max(
            1.0,
            _float(pick(args.watch_idle_seconds, ENV_WATCH_IDLE), "watch idle", DEFAULT_WATCH_IDLE),
        ),
        progress_port=progress_port,
        progress_url=progress_url,
        progress_cert_dir=progress_cert_dir,
        progress_interval_seconds=interval,
        progress_writes_per_second=writes,
        verbose=bool(args.verbose),
        restricted_pod_defaults=(
            args.restricted_pod_defaults
            if args.restricted_pod_defaults is not None
            else _bool(env.get(ENV_RESTRICTED))
        ),
        network_policy=(
            args.network_policy
            if args.network_policy is not None
            else _bool(env.get(ENV_NETWORK_POLICY, "true"))
        ),
        kueue=args.kueue if args.kueue is not None else _bool(env.get(ENV_KUEUE)),
        kueue_manage_all=(
            args.kueue_manage_jobs_without_queue_name
            if args.kueue_manage_jobs_without_queue_name is not None
            else _bool(env.get(ENV_KUEUE_MANAGE_ALL))
        ),
        kueue_namespaces=pick(args.kueue_managed_namespaces, ENV_KUEUE_NAMESPACES)
        or DEFAULT_KUEUE_NAMESPACES,
        tfjob=args.tfjob if args.tfjob is not None else _bool(env.get(ENV_TFJOB)),
        tfjob_mode=_tfjob_mode(pick(args.tfjob_mode, ENV_TFJOB_MODE)),
    )


def _tfjob_mode(value: str | None) -> str:
    if value is None or value == "":
        return tfjob_core.TAKEOVER
    if value not in tfjob_core.MODES:
        raise ConfigError(
            f"{ENV_TFJOB_MODE}: must be one of {', '.join(tfjob_core.MODES)}, got {value!r}"
        )
    return value


SERVICE_ACCOUNT_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def election_namespace(
    settings: Settings, env: Mapping[str, str], read: Callable[[str], str | None]
) -> str:
    """The leader Lease's namespace: --leader-election-namespace, else the operator Pod's
    own (POD_NAMESPACE, else its service account's namespace file, read by `read`; None:
    no such file), as controller-runtime finds it. Outside a Pod it must be given."""
    if settings.leader_election_namespace:
        return settings.leader_election_namespace
    found = env.get(ENV_POD_NAMESPACE) or (read(SERVICE_ACCOUNT_NAMESPACE) or "").strip()
    if found:
        return found
    raise ConfigError(
        "--leader-election-namespace: needed outside a Pod (no POD_NAMESPACE and no "
        f"{SERVICE_ACCOUNT_NAMESPACE})"
    )


def credentials_problem(
    env: Mapping[str, str], home: str, exists: Callable[[str], bool]
) -> str | None:
    """Why the operator cannot possibly log in (None: it may): no service account of a Pod
    and no kubeconfig file where kubectl would look. Checked once at start, so a missing
    kubeconfig is one clear line instead of a retry loop."""
    if env.get("KUBERNETES_SERVICE_HOST") and exists(SERVICE_ACCOUNT_TOKEN):
        return None
    configured = env.get("KUBECONFIG")
    if configured:
        paths = [path for path in configured.split(":") if path]
        if any(exists(path) for path in paths):
            return None
        return f"KUBECONFIG names {configured}, which does not exist"
    default = f"{home}/.kube/config"
    if exists(default):
        return None
    return (
        f"no Kubernetes credentials: not in a Pod with a service account, no {default}, "
        "and KUBECONFIG is not set"
    )


def from_env(env: Mapping[str, str]) -> Settings:
    """Settings when run as `kopf run -m trainjob_operator.handlers` (kopf owns the flags)."""
    return from_args((), env)
