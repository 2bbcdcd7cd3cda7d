"""Operator scale benchmark: TrainJob operator vs Kubeflow training-operator v1, same run.

On a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
``tests/controlplane``) with kwok fake nodes, create N jobs of M replicas (1 chief, 2 ps,
the rest workers; 8 = 1 chief + 5 workers + 2 ps) and let kwok run the pods: every pod goes
Running, the chief exits 0 after kwok's 500 ms run time, the job Succeeds and the operator
deletes the still-running pods (cleanPodPolicy Running). Measured per operator:

- create -> all children (M Pods + M headless Services) exist, per job: p50, p99, max
- total time from the first create to the last child of the last job
- create -> Succeeded condition, per job (p50, p99) and in total
- API requests made by the operator, per job (API Priority and Fairness dispatch counter of a
  FlowSchema that matches only the operator's service account), and by all clients
  (``apiserver_request_total``), both from the API server's /metrics before and after
- operator peak RSS (VmHWM) and CPU seconds spent on the workload (/proc/<pid>); ours runs
  as in its image, without the `kubernetes` package importable (see AS_IN_THE_IMAGE)

The same workload then runs as TFJobs against Kubeflow's training-operator (built by
``bash bench/kubeflow/install.sh`` with its shipped defaults: QPS 20, burst 30, one worker
thread; only the tfjob scheme is enabled and it watches one namespace, neither of which
changes its throughput). Both operators run on the same control plane in the same run, one
after the other, each in its own namespace, each with one unmeasured warm-up job first.

Usage (from the repository root)::

    .venv/bin/python bench/operator_scale.py                      # 500 x 8, both operators
    .venv/bin/python bench/operator_scale.py --jobs 100 --replicas 8
    .venv/bin/python bench/operator_scale.py --sizes 1,100,500 --trainjob-only-sizes 1000 \
        --write-results bench/RESULTS.md                         # what RESULTS.md shows
    .venv/bin/python bench/operator_scale.py --jobs 3 --operator trainjob   # smoke size

Needs ``bash tests/controlplane/install.sh`` (control plane, kwok) and, for the baseline,
``bash bench/kubeflow/install.sh``. Everything listens on 127.0.0.1 except training-operator's
webhook server, which binds every interface (it has no flag for the address).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import copy
import datetime
import http.client
import json
import math
import os
import platform
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.controlplane.cluster import KWOK_CONFIG, ControlPlane  # noqa: E402 - after the sys.path line above
from tests.controlplane.tools import Tools, go_mod_version, tools_dir  # noqa: E402
from tests.support import manifests, ports, processes, waits  # noqa: E402

Obj = dict[str, Any]


# Our operator runs as in its image (images/operator), where the `kubernetes` package is not
# installed: the tests' venv has it, and kopf imports it whenever it can (to recognise its
# model objects), which costs ~20 MiB of RSS that the deployed operator does not pay. A None
# in sys.modules makes `import kubernetes` fail exactly as if it were not installed.
AS_IN_THE_IMAGE: Final = (
    "import runpy, sys; sys.modules['kubernetes'] = None; "
    "runpy.run_module('trainjob_operator', run_name='__main__', alter_sys=True)"
)

# Diagnosis (BENCH_TRACEMALLOC=<file> in the environment): our operator traces its
# allocations and, on SIGUSR1, writes the largest allocation sites to that file.
TRACEMALLOC_PREFIX: Final = (
    "import os, signal, tracemalloc; tracemalloc.start(8); "
    "signal.signal(signal.SIGUSR1, lambda *_: open(os.environ['BENCH_TRACEMALLOC'], 'w').write("
    "'\\n\\n'.join(str(s) + '\\n' + '\\n'.join(s.traceback.format()) for s in "
    "tracemalloc.take_snapshot().statistics('traceback')[:40]))); "
)

OURS: Final = "trainjob"
KUBEFLOW: Final = "kubeflow"
OPERATORS: Final = (OURS, KUBEFLOW)
SYSTEM_NS: Final = "bench-system"
EXIT_CODE_ANNOTATION: Final = "trainjob.dev/kwok-exit-code"
IMAGE: Final = "registry.example/never-pulled:1"
KUBEFLOW_MODULE: Final = "github.com/kubeflow/training-operator"
KUBEFLOW_WEBHOOK_CONFIG: Final = "validator.training-operator.kubeflow.org"
KUBEFLOW_WEBHOOK_SECRET: Final = "training-operator-webhook-cert"
KUBEFLOW_JOB_LABEL: Final = "training.kubeflow.org/job-name"
# Hard-coded in training-operator (pkg/cert): where its Deployment mounts the webhook Secret.
KUBEFLOW_CERT_DIR: Final = Path("/tmp/k8s-webhook-server/serving-certs")
BENCH_DIR: Final = Path(__file__).resolve().parent


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- workload


def replica_counts(replicas: int) -> dict[str, int]:
    """1 chief, 2 ps (1 below 4 replicas, none below 3), the rest workers."""
    if replicas < 1:
        raise BenchError("--replicas must be >= 1")
    ps = 2 if replicas >= 4 else (1 if replicas >= 3 else 0)
    return {"chief": 1, "worker": replicas - 1 - ps, "ps": ps}


def _template(chief: bool, finishes: bool = True) -> Obj:
    # Without the exit-code annotation kwok keeps the Pod Running until it is deleted.
    annotations = {EXIT_CODE_ANNOTATION: "0"} if chief and finishes else {}
    return {
        "metadata": {"annotations": annotations},
        "spec": {"containers": [manifests.container(IMAGE)]},
    }


def trainjob_body(name: str, replicas: int, finishes: bool = True) -> Obj:
    specs = {
        rtype: manifests.replica(n, _template(rtype == "chief", finishes))
        for rtype, n in replica_counts(replicas).items()
        if n
    }
    return manifests.trainjob(name, specs, {"cleanPodPolicy": "Running"})


def tfjob_body(name: str, replicas: int, finishes: bool = True) -> Obj:
    kinds = {"chief": "Chief", "worker": "Worker", "ps": "PS"}
    specs = {
        kinds[rtype]: manifests.replica(n, _template(rtype == "chief", finishes))
        for rtype, n in replica_counts(replicas).items()
        if n
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {"tfReplicaSpecs": specs, "runPolicy": {"cleanPodPolicy": "Running"}},
    }


@dataclass(frozen=True)
class Kind:
    """How the benchmark talks about one operator's job kind."""

    operator: str
    label: str
    api_path: str  # /apis/<group>/<version>
    plural: str
    body: Callable[[str, int, bool], Obj]  # (name, replicas, the chief finishes)


KINDS: Final = {
    OURS: Kind(
        OURS, "TrainJob operator", "/apis/trainjob.dev/v1alpha1", "trainjobs", trainjob_body
    ),
    KUBEFLOW: Kind(KUBEFLOW, "training-operator", "/apis/kubeflow.org/v1", "tfjobs", tfjob_body),
}


# --------------------------------------------------------------------------- API access


class Api:
    """A minimal HTTPS client for the test API server (admin bearer token, pinned CA)."""

    def __init__(self, plane: ControlPlane) -> None:
        url = urllib.parse.urlparse(plane.apiserver_url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 443
        self.token = plane.admin_token
        self.context = ssl.create_default_context(cafile=str(plane.ca_cert))
        self._local = threading.local()

    def connection(self, timeout: float | None = 60.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )

    def _conn(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connection()
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        """One request on this thread's keep-alive connection (reconnects once if dropped)."""
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def create(self, path: str, body: Obj) -> Obj:
        status, data = self.request("POST", path, body)
        if status not in (200, 201):
            raise BenchError(f"POST {path} -> {status}: {data[:500]!r}")
        result: Obj = json.loads(data)
        return result

    def metrics(self) -> str:
        status, data = self.request("GET", "/metrics")
        if status != 200:
            raise BenchError(f"GET /metrics -> {status}")
        return data.decode()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of counter ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != name:
            continue
        have = dict(_LABEL.findall(match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


@dataclass(frozen=True)
class ApiCounts:
    all_requests: float
    operator_requests: float


def api_counts(api: Api, flow_schema: str) -> ApiCounts:
    text = api.metrics()
    return ApiCounts(
        all_requests=metric_sum(text, "apiserver_request_total"),
        operator_requests=metric_sum(
            text, "apiserver_flowcontrol_dispatched_requests_total", flow_schema=flow_schema
        ),
    )


# --------------------------------------------------------------------------- watching


@dataclass
class JobTimes:
    created: float = 0.0
    pods: set[str] = field(default_factory=set)
    services: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    children_at: float | None = None
    succeeded_at: float | None = None


class Tracker:
    """Watches Pods, Services and the job kind in one namespace; records, per job, when its
    last child first appeared and when its Succeeded condition first showed (arrival time of
    the watch event, monotonic clock)."""

    def __init__(self, api: Api, namespace: str, kind: Kind, replicas: int) -> None:
        self.api = api
        self.namespace = namespace
        self.kind = kind
        self.replicas = replicas
        self.jobs: dict[str, JobTimes] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self._conns: list[http.client.HTTPSConnection] = []

    def job(self, name: str) -> JobTimes:
        times = self.jobs.get(name)
        if times is None:
            times = self.jobs[name] = JobTimes()
        return times

    def start(self) -> None:
        ns = self.namespace
        paths = {
            "pods": f"/api/v1/namespaces/{ns}/pods",
            "services": f"/api/v1/namespaces/{ns}/services",
            "jobs": f"{self.kind.api_path}/namespaces/{ns}/{self.kind.plural}",
        }
        for what, path in paths.items():
            thread = threading.Thread(
                target=self._watch, args=(what, path), name=f"watch-{what}", daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                if conn.sock is not None:
                    conn.sock.shutdown(2)
            conn.close()
        for thread in self.threads:
            thread.join(timeout=10)

    def _watch(self, what: str, path: str) -> None:
        resource_version = ""
        for _ in range(1000):  # reconnects (the server ends a watch after its timeout)
            if self.stopping.is_set():
                return
            query = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}
            if resource_version:
                query["resourceVersion"] = resource_version
            conn = self.api.connection(timeout=None)
            self._conns.append(conn)
            try:
                conn.request(
                    "GET",
                    f"{path}?{urllib.parse.urlencode(query)}",
                    headers={"Authorization": f"Bearer {self.api.token}"},
                )
                resp = conn.getresponse()
                if resp.status != 200:  # e.g. 429 while a new CRD's storage initialises
                    body = resp.read()[:300]
                    if resp.status in (429, 500, 503) and not self.stopping.wait(1.0):
                        continue
                    raise BenchError(f"watch {path} -> {resp.status}: {body!r}")
                for line in iter(resp.readline, b""):
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        resource_version = ""  # expired: start over from now
                        break
                    resource_version = obj.get("metadata", {}).get("resourceVersion", "")
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._observe(what, obj, now)
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
                # AttributeError: http.client, when stop() closes the socket under a read.
                if self.stopping.is_set():
                    return
                with self.lock:
                    self.errors.append(f"watch {what}: {exc!r}")
            except BenchError as exc:
                with self.lock:
                    self.errors.append(str(exc))
                return
            finally:
                conn.close()
                with contextlib.suppress(ValueError):
                    self._conns.remove(conn)

    def _observe(self, what: str, obj: Obj, now: float) -> None:
        meta = obj.get("metadata") or {}
        if what == "jobs":
            conditions = (obj.get("status") or {}).get("conditions") or []
            done = any(
                c.get("type") == "Succeeded" and c.get("status") == "True" for c in conditions
            )
            if done:
                with self.changed:
                    times = self.job(meta.get("name", ""))
                    if times.succeeded_at is None:
                        times.succeeded_at = now
                        self.changed.notify_all()
            return
        owner = next(
            (o.get("name") for o in meta.get("ownerReferences") or [] if o.get("controller")),
            None,
        )
        if owner is None:
            return
        with self.changed:
            times = self.job(owner)
            children = times.pods if what == "pods" else times.services
            children.add(meta.get("name", ""))
            if what == "pods" and (obj.get("status") or {}).get("phase") == "Running":
                times.running.add(meta.get("name", ""))
            if (
                times.children_at is None
                and len(times.pods) >= self.replicas
                and len(times.services) >= self.replicas
            ):
                times.children_at = now
                self.changed.notify_all()

    def wait(
        self, names: Sequence[str], *, succeeded: bool, deadline: float, running: bool = False
    ) -> bool:
        """Block until every named job has all children (and Succeeded, or all Pods Running,
        if asked) or the deadline passes; True when all are done."""

        def done() -> bool:
            for name in names:
                times = self.jobs.get(name)
                if times is None or times.children_at is None:
                    return False
                if succeeded and times.succeeded_at is None:
                    return False
                if running and len(times.running) < self.replicas:
                    return False
            return True

        with self.changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(timeout=min(left, 5.0))
            return True


# --------------------------------------------------------------------------- processes


@dataclass
class ProcStats:
    peak_rss_kib: int
    cpu_seconds: float


def status_kib(pid: int, field: str) -> int:
    """A memory figure of a live process from /proc/<pid>/status (VmRSS, VmHWM), in KiB; 0
    when the kernel shows none (a zombie)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def proc_stats(pid: int) -> ProcStats:
    """Peak resident set (VmHWM) and user+system CPU seconds of a live process."""
    hwm = status_kib(pid, "VmHWM")
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return ProcStats(hwm, (int(fields[11]) + int(fields[12])) / ticks)


@dataclass
class OperatorProcess(processes.LoggedProcess):
    """An operator under benchmark: a logged process group with a Prometheus endpoint."""

    metrics_url: str = ""  # set by whoever chose the port

    def stop(self, grace: float = 15.0) -> bool:
        """As LoggedProcess.stop, with 15 s for the operator's last writes."""
        return super().stop(grace)


def kubeflow_dir() -> Path:
    """Where bench/kubeflow/install.sh caches the baseline, keyed by the version its go.mod
    requires."""
    version = go_mod_version(BENCH_DIR / "kubeflow" / "go.mod", KUBEFLOW_MODULE)
    return tools_dir() / f"training-operator-{version}"


def kubeflow_version() -> str:
    return kubeflow_dir().name.removeprefix("training-operator-")


def kubeflow_binary() -> Path:
    binary = kubeflow_dir() / "training-operator"
    if not os.access(binary, os.X_OK):
        raise BenchError(
            f"{binary} is missing: build it once with `bash bench/kubeflow/install.sh` "
            "(or run with --operator trainjob)"
        )
    return binary


# --------------------------------------------------------------------------- the bench


@dataclass
class RunResult:
    operator: str
    jobs: int
    replicas: int
    completed_children: int
    completed_succeeded: int
    children_p50: float
    children_p99: float
    children_max: float
    children_total: float
    succeeded_p50: float
    succeeded_p99: float
    succeeded_total: float
    create_seconds: float
    operator_requests_per_job: float
    all_requests_per_job: float
    peak_rss_mib: float
    cpu_seconds: float
    timed_out: bool
    notes: list[str] = field(default_factory=list)


@dataclass
class LoadedResult:
    """One more job created while `jobs` jobs run: how soon its children exist."""

    operator: str
    jobs: int
    replicas: int
    probes: int
    children_p50: float
    children_p99: float
    children_max: float
    notes: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class Bench:
    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        replicas: int,
        timeout: float,
        operator_args: dict[str, list[str]] | None = None,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.replicas = replicas
        self.timeout = timeout
        self.api = Api(plane)
        self._prepared: set[str] = set()
        # Extra command-line flags per operator (e.g. the Kueue benchmark's --kueue).
        self.operator_args = operator_args or {}

    # -- setup ---------------------------------------------------------------------------

    def kubectl_apply(self, docs: Sequence[Obj]) -> None:
        text = yaml.safe_dump_all(list(docs), sort_keys=False)
        self.plane.kubectl("apply", "-f", "-", stdin=text)

    def namespace(self, name: str) -> None:
        self.kubectl_apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        self.plane.wait_service_account(name)

    def operator_identity(self, operator: str) -> Path:
        """A service account (cluster-admin) for the operator, its kubeconfig, and a FlowSchema
        matching only it, so the API server counts its requests apart from everyone else's."""
        account = f"{operator}-operator"
        self.namespace(SYSTEM_NS)
        self.kubectl_apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": account, "namespace": SYSTEM_NS},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"bench-{account}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NS}
                    ],
                },
                {
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                    "kind": "FlowSchema",
                    "metadata": {"name": flow_schema(operator)},
                    "spec": {
                        "matchingPrecedence": 100,
                        "priorityLevelConfiguration": {"name": "workload-high"},
                        "distinguisherMethod": {"type": "ByUser"},
                        "rules": [
                            {
                                "subjects": [
                                    {
                                        "kind": "ServiceAccount",
                                        "serviceAccount": {"name": account, "namespace": SYSTEM_NS},
                                    }
                                ],
                                "resourceRules": [
                                    {
                                        "verbs": ["*"],
                                        "apiGroups": ["*"],
                                        "resources": ["*"],
                                        "clusterScope": True,
                                        "namespaces": ["*"],
                                    }
                                ],
                                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                            }
                        ],
                    },
                },
            ]
        )
        return self.plane.service_account_kubeconfig(
            SYSTEM_NS, account, self.workdir / f"kubeconfig-{operator}", duration="12h"
        )

    def prepare_kubeflow(self) -> None:
        """TFJob CRD, and what training-operator's certificate rotator needs before it starts
        its controllers: the webhook Secret and a ValidatingWebhookConfiguration to inject the
        CA into. The webhook never matches (namespaceSelector), so the API server never calls
        it: creates are not slowed by admission in either column."""
        if KUBEFLOW in self._prepared:
            return
        crd = kubeflow_dir() / "kubeflow.org_tfjobs.yaml"
        if not crd.is_file():
            raise BenchError(f"{crd} is missing: run `bash bench/kubeflow/install.sh`")
        self.plane.apply_crds([crd])
        self.namespace(SYSTEM_NS)
        self.kubectl_apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": KUBEFLOW_WEBHOOK_SECRET, "namespace": SYSTEM_NS},
                },
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": KUBEFLOW_WEBHOOK_CONFIG},
                    "webhooks": [
                        {
                            "name": "validator.tfjob.training-operator.kubeflow.org",
                            "admissionReviewVersions": ["v1"],
                            "clientConfig": {
                                "service": {
                                    "name": "training-operator",
                                    "namespace": SYSTEM_NS,
                                    "path": "/validate-kubeflow-org-v1-tfjob",
                                }
                            },
                            "failurePolicy": "Ignore",
                            "sideEffects": "None",
                            "namespaceSelector": {
                                "matchLabels": {"bench.trainjob.dev/never": "true"}
                            },
                            "rules": [
                                {
                                    "apiGroups": ["kubeflow.org"],
                                    "apiVersions": ["v1"],
                                    "operations": ["CREATE", "UPDATE"],
                                    "resources": ["tfjobs"],
                                }
                            ],
                        }
                    ],
                },
            ]
        )
        self._prepared.add(KUBEFLOW)

    def mount_webhook_certs(self) -> bool:
        """Play the kubelet for training-operator's webhook Secret: once its certificate
        rotator has filled the Secret, write it where the Deployment mounts it (the binary
        waits for the files before it starts its controllers). False until it is filled."""
        out = self.plane.kubectl(
            "get", "secret", KUBEFLOW_WEBHOOK_SECRET, "-n", SYSTEM_NS, "-o", "json", check=False
        ).stdout
        data = (json.loads(out or "{}").get("data") or {}) if out else {}
        files = ("tls.crt", "tls.key", "ca.crt")
        if not all(data.get(f) for f in files):
            return False
        KUBEFLOW_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name in files:
            target = KUBEFLOW_CERT_DIR / name
            target.write_bytes(base64.b64decode(data[name]))
            target.chmod(0o600)
        return True

    def start_operator(
        self, operator: str, namespace: str | None, kubeconfig: Path
    ) -> OperatorProcess:
        """`namespace` None: the operator serves every namespace."""
        log = self.workdir / f"{operator}-{namespace or 'cluster'}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        metrics_port = ports.free_port()
        if operator == OURS:
            liveness = ports.free_port()
            env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "operator")])
            env["PYTHONUNBUFFERED"] = "1"
            argv = [
                sys.executable,
                "-c",
                (TRACEMALLOC_PREFIX if os.environ.get("BENCH_TRACEMALLOC") else "")
                + AS_IN_THE_IMAGE,
                "--standalone",
                *(["-n", namespace] if namespace else []),
                f"--metrics-port={metrics_port}",
                f"--liveness=http://127.0.0.1:{liveness}/healthz",
            ]
            ready_url = f"http://127.0.0.1:{liveness}/healthz"
        else:
            probe = ports.free_port()
            env["MY_POD_NAMESPACE"] = SYSTEM_NS
            argv = [
                str(kubeflow_binary()),
                f"--kubeconfig={kubeconfig}",
                "--enable-scheme=tfjob",
                *([f"--namespace={namespace}"] if namespace else []),
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--webhook-server-port={ports.free_port()}",
            ]
            ready_url = f"http://127.0.0.1:{probe}/readyz"
        argv += self.operator_args.get(operator, [])
        proc = OperatorProcess(
            processes.spawn_logged(argv, log, env=env),
            log,
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        )
        mounted: list[bool] = []

        def ready() -> bool:
            if not proc.running():
                raise BenchError(f"{operator} exited:\n{proc.log_tail()}")
            if operator == KUBEFLOW and not mounted:
                mounted.extend([True] if self.mount_webhook_certs() else [])
                return False
            return waits.http_ok(ready_url)

        waits.wait_until(ready, timeout=120, what=f"{operator} to become ready", interval=0.2)
        return proc

    # -- one run -------------------------------------------------------------------------

    def _setup(self, operator: str, namespace: str) -> tuple[Kind, Tracker, str, OperatorProcess]:
        """A fresh namespace watched by a Tracker and served by a started operator; returns
        the job kind, the tracker, the jobs' collection path and the operator process."""
        kind = KINDS[operator]
        if operator == KUBEFLOW:
            self.prepare_kubeflow()
        kubeconfig = self.operator_identity(operator)
        self.namespace(namespace)
        tracker = Tracker(self.api, namespace, kind, self.replicas)
        tracker.start()
        jobs_path = f"{kind.api_path}/namespaces/{namespace}/{kind.plural}"
        return kind, tracker, jobs_path, self.start_operator(operator, namespace, kubeconfig)

    def run(self, operator: str, jobs: int) -> RunResult:
        namespace = f"bench-{operator}-{jobs}x{self.replicas}"
        kind, tracker, jobs_path, proc = self._setup(operator, namespace)
        notes: list[str] = []
        try:
            # Warm-up (not measured): the operator's caches are synced and its first
            # reconcile has run before the clock starts.
            tracker.job("warmup").created = time.monotonic()
            self.api.create(jobs_path, kind.body("warmup", self.replicas, True))
            if not tracker.wait(["warmup"], succeeded=True, deadline=time.monotonic() + 120):
                warm = tracker.jobs.get("warmup", JobTimes())
                raise BenchError(
                    f"{operator}: the warm-up job did not succeed in 120s: "
                    f"{len(warm.pods)} pods, {len(warm.services)} services seen, "
                    f"succeeded={warm.succeeded_at is not None}, watch errors {tracker.errors}"
                )
            before = api_counts(self.api, flow_schema(operator))
            cpu_before = proc_stats(proc.pid).cpu_seconds

            names = [f"job-{i:05d}" for i in range(jobs)]
            bodies = {n: kind.body(n, self.replicas, True) for n in names}
            start = time.monotonic()

            def create(name: str) -> None:
                with tracker.lock:
                    tracker.job(name).created = time.monotonic()
                self.api.create(jobs_path, bodies[name])

            with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(create, names))
            create_seconds = time.monotonic() - start
            deadline = start + self.timeout
            finished = tracker.wait(names, succeeded=True, deadline=deadline)
            stats = proc_stats(proc.pid)
            after = api_counts(self.api, flow_schema(operator))
            if not proc.running():
                notes.append(f"{operator} exited during the run:\n{proc.log_tail()}")
        finally:
            proc.stop()
            tracker.stop()
        if tracker.errors:
            notes.append("watch errors: " + "; ".join(tracker.errors[:5]))
        with tracker.lock:
            times = [tracker.jobs[n] for n in names if n in tracker.jobs]
        children = [t.children_at - t.created for t in times if t.children_at is not None]
        succeeded = [t.succeeded_at - t.created for t in times if t.succeeded_at is not None]
        last_child = max((t.children_at for t in times if t.children_at is not None), default=None)
        last_success = max(
            (t.succeeded_at for t in times if t.succeeded_at is not None), default=None
        )
        return RunResult(
            operator=operator,
            jobs=jobs,
            replicas=self.replicas,
            completed_children=len(children),
            completed_succeeded=len(succeeded),
            children_p50=percentile(children, 50),
            children_p99=percentile(children, 99),
            children_max=max(children, default=float("nan")),
            children_total=(last_child - start) if last_child is not None else float("nan"),
            succeeded_p50=percentile(succeeded, 50),
            succeeded_p99=percentile(succeeded, 99),
            succeeded_total=(last_success - start) if last_success is not None else float("nan"),
            create_seconds=create_seconds,
            operator_requests_per_job=(after.operator_requests - before.operator_requests) / jobs,
            all_requests_per_job=(after.all_requests - before.all_requests) / jobs,
            peak_rss_mib=stats.peak_rss_kib / 1024,
            cpu_seconds=stats.cpu_seconds - cpu_before,
            timed_out=not finished,
            notes=notes,
        )

    def run_loaded(self, operator: str, jobs: int, probes: int) -> LoadedResult:
        """Responsiveness at `jobs` concurrent jobs: create `jobs` jobs whose chiefs never
        exit, wait until every one of their Pods is Running, then create `probes` more jobs,
        one at a time (the next once the previous one's children all exist), and time each
        probe from its create request to its last child. This is what a user submitting a
        job to a busy cluster waits for; the burst run above measures throughput instead."""
        namespace = f"bench-{operator}-loaded-{jobs}x{self.replicas}"
        kind, tracker, jobs_path, proc = self._setup(operator, namespace)
        notes: list[str] = []
        latencies: list[float] = []
        try:
            background = [f"load-{i:05d}" for i in range(jobs)]

            def create(name: str) -> None:
                with tracker.lock:
                    tracker.job(name).created = time.monotonic()
                self.api.create(jobs_path, kind.body(name, self.replicas, False))

            with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(create, background))
            deadline = time.monotonic() + self.timeout
            if not tracker.wait(background, succeeded=False, running=True, deadline=deadline):
                notes.append(f"the {jobs} background jobs were not all Running in time")
            for i in range(probes if not notes else 0):
                name = f"probe-{i:03d}"
                create(name)
                if not tracker.wait([name], succeeded=False, deadline=time.monotonic() + 120):
                    notes.append(f"{name}: children incomplete after 120 s")
                    break
                with tracker.lock:
                    times = tracker.jobs[name]
                    assert times.children_at is not None
                    latencies.append(times.children_at - times.created)
            if not proc.running():
                notes.append(f"{operator} exited during the run:\n{proc.log_tail()}")
        finally:
            proc.stop()
            tracker.stop()
        return LoadedResult(
            operator=operator,
            jobs=jobs,
            replicas=self.replicas,
            probes=len(latencies),
            children_p50=percentile(latencies, 50),
            children_p99=percentile(latencies, 99),
            children_max=max(latencies, default=float("nan")),
            notes=notes,
        )


def flow_schema(operator: str) -> str:
    return f"bench-{operator}-operator"


def kwok_config(workdir: Path) -> Path:
    """tests/controlplane/kwok/kwok.yaml plus one Stage: the trainjob-succeed Stage applied to
    pods labelled by training-operator (training.kubeflow.org/job-name), so TFJob chiefs exit 0
    exactly as TrainJob chiefs do."""
    docs = [d for d in yaml.safe_load_all(KWOK_CONFIG.read_text(encoding="utf-8")) if d]
    stage = next(
        d for d in docs if d.get("kind") == "Stage" and d["metadata"]["name"] == "trainjob-succeed"
    )
    tfjob = copy.deepcopy(stage)
    tfjob["metadata"]["name"] = "bench-tfjob-succeed"
    for expr in tfjob["spec"]["selector"]["matchExpressions"]:
        if "trainjob.dev/job-name" in expr["key"]:
            expr["key"] = f'.metadata.labels["{KUBEFLOW_JOB_LABEL}"]'
    path = workdir / "kwok-bench.yaml"
    path.write_text(yaml.safe_dump_all([*docs, tfjob], sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- reporting


def machine_info(plane: ControlPlane) -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    tools = plane.tools
    kopf_version = "unknown"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        kopf_version = version("kopf")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu}, {os.cpu_count()} logical cores",
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "load average at start (1/5/15 min)": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "kopf": kopf_version,
        "kubernetes": f"{tools.kubernetes_version} (kube-apiserver, etcd {tools.etcd_version})",
        "kwok": tools.kwok_version,
        "training-operator": kubeflow_version(),
    }


def fmt(value: float, unit: str = "s") -> str:
    if math.isnan(value):
        return "-"
    if unit == "s":
        return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:.1f}"


ROWS: Final[list[tuple[str, str, str]]] = [
    ("create -> all children, p50", "children_p50", "s"),
    ("create -> all children, p99", "children_p99", "s"),
    ("create -> all children, max", "children_max", "s"),
    ("first create -> last child (total)", "children_total", "s"),
    ("create -> Succeeded, p50", "succeeded_p50", "s"),
    ("create -> Succeeded, p99", "succeeded_p99", "s"),
    ("first create -> last Succeeded (total)", "succeeded_total", "s"),
    ("operator API requests per job", "operator_requests_per_job", ""),
    ("all API requests per job (every client)", "all_requests_per_job", ""),
    ("operator peak RSS", "peak_rss_mib", "MiB"),
    ("operator CPU seconds (workload)", "cpu_seconds", ""),
]


LOADED_ROWS: Final[list[tuple[str, str, str]]] = [
    ("create -> all children, p50", "children_p50", "s"),
    ("create -> all children, p99", "children_p99", "s"),
    ("create -> all children, max", "children_max", "s"),
]


def _markdown(
    title: str, ours: Any, theirs: Any, rows: Sequence[tuple[str, str, str]]
) -> list[str]:
    """Title and table: one column per operator present, plus the ratio training-operator /
    ours when both are (above 1: ours is faster / cheaper)."""
    header = ["metric"]
    if ours:
        header.append("TrainJob operator")
    if theirs:
        header.append(f"training-operator {kubeflow_version()}")
    if ours and theirs:
        header.append("ratio (theirs / ours)")
    lines = [
        title,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for label, attr, unit in rows:
        values = [getattr(r, attr) for r in (ours, theirs) if r is not None]
        row = [label, *(fmt(v, unit) for v in values)]
        if ours and theirs:
            a, b = values
            row.append(f"{b / a:.1f}x" if a and not (math.isnan(a) or math.isnan(b)) else "-")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def table(results: Sequence[RunResult]) -> str:
    """The markdown report of one burst size."""
    by_op = {r.operator: r for r in results}
    ours, theirs = by_op.get(OURS), by_op.get(KUBEFLOW)
    any_r = ours or theirs
    assert any_r is not None
    counts = " + ".join(f"{n} {t}" for t, n in replica_counts(any_r.replicas).items() if n)
    title = f"**{any_r.jobs} jobs x {any_r.replicas} replicas** ({counts})"
    lines = _markdown(title, ours, theirs, ROWS)
    for r in (ours, theirs):
        if r is None:
            continue
        if r.timed_out:
            lines.append(
                f"\n{r.operator}: TIMED OUT: {r.completed_children}/{r.jobs} jobs had all "
                f"children, {r.completed_succeeded}/{r.jobs} Succeeded"
            )
        lines.extend(f"\n{r.operator}: {note}" for note in r.notes)
    return "\n".join(lines) + "\n"


def loaded_table(results: Sequence[LoadedResult]) -> str:
    """The markdown report of the responsiveness run."""
    by_op = {r.operator: r for r in results}
    ours, theirs = by_op.get(OURS), by_op.get(KUBEFLOW)
    any_r = ours or theirs
    assert any_r is not None
    title = (
        f"**One more job while {any_r.jobs} jobs x {any_r.replicas} replicas run** "
        f"({any_r.probes} jobs created one at a time)"
    )
    lines = _markdown(title, ours, theirs, LOADED_ROWS)
    for r in (ours, theirs):
        if r is not None:
            lines.extend(f"\n{r.operator}: {note}" for note in r.notes)
    return "\n".join(lines) + "\n"


RESULTS_HEADER: Final = """\
# Operator scale benchmark: TrainJob operator vs Kubeflow training-operator v1

Generated by `{command}` (bench/operator_scale.py; method in its docstring). Each size runs
both operators one after the other on the same control plane (real etcd + kube-apiserver +
kube-controller-manager + kube-scheduler, kwok fake nodes), each in its own namespace, each
after one unmeasured warm-up job. Times are from the benchmark's create request to the
arrival of the watch event; "children" are the job's Pods and headless Services (one each per
replica, for both operators). Operator API requests are counted by the API server (API
Priority and Fairness dispatches of a FlowSchema that matches only that operator's service
account). The ratio column is training-operator / ours: above 1 means ours is faster or
cheaper. training-operator runs with its shipped defaults (QPS 20, burst 30, 1 worker thread);
ours runs as in its image, where the `kubernetes` Python package is not installed.
The machine may be shared with other work (see the load average): compare the two columns
of one run, not figures across runs.

## Machine

{machine}

## Results
"""


def write_results(path: Path, command: str, info: dict[str, str], tables: Sequence[str]) -> None:
    machine = "\n".join(f"- {k}: {v}" for k, v in info.items())
    text = RESULTS_HEADER.format(command=command, machine=machine)
    text += "\n" + "\n".join(tables)
    path.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/operator_scale.py",
        description="TrainJob operator vs Kubeflow training-operator v1 on a real API server.",
    )
    p.add_argument("--jobs", type=int, default=500, help="jobs per run (default 500)")
    p.add_argument(
        "--sizes",
        help="comma-separated job counts to run in turn, e.g. 1,100,500 (overrides --jobs)",
    )
    p.add_argument(
        "--trainjob-only-sizes",
        help="job counts to run afterwards with the TrainJob operator alone, e.g. 1000 (the "
        "baseline would take most of an hour there)",
    )
    p.add_argument("--replicas", type=int, default=8, help="replicas per job (default 8)")
    p.add_argument(
        "--operator",
        choices=[*OPERATORS, "both"],
        default="both",
        help="which operator(s) to run (default both)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds per run for every job to succeed (default 120 + 4 per job)",
    )
    p.add_argument(
        "--loaded",
        type=int,
        default=100,
        help="responsiveness run: jobs kept running while single jobs are timed (default 100; "
        "0 skips it)",
    )
    p.add_argument(
        "--probes", type=int, default=20, help="jobs timed in the responsiveness run (default 20)"
    )
    p.add_argument("--write-results", type=Path, help="write a markdown report (bench/RESULTS.md)")
    p.add_argument("--json", type=Path, help="write the raw figures as JSON")
    p.add_argument("--workdir", type=Path, help="keep the control plane state and logs here")
    return p.parse_args(argv)


@contextlib.contextmanager
def bench_workdir(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="trainjob-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.jobs]
    operators = list(OPERATORS) if args.operator == "both" else [args.operator]
    runs = [(jobs, operators) for jobs in sizes]
    if args.trainjob_only_sizes:
        runs += [(int(s), [OURS]) for s in args.trainjob_only_sizes.split(",")]
    if KUBEFLOW in operators:
        kubeflow_binary()  # fail fast, naming the install command
    tools = Tools.locate().require()
    given = sys.argv[1:] if argv is None else list(argv)
    # The report names the command that regenerates it, without this run's scratch paths.
    shown = [a for a in given if not a.startswith(("--json", "--workdir", "/tmp/"))]
    command = "python bench/operator_scale.py " + " ".join(shown)
    crds = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    all_results: list[RunResult] = []
    all_loaded: list[LoadedResult] = []
    tables: list[str] = []
    with bench_workdir(args.workdir) as workdir:
        plane = ControlPlane(tools=tools, workdir=workdir / "cp")
        with plane:
            plane.apply_crds(crds)
            plane.start_kwok(config=kwok_config(workdir))
            info = machine_info(plane)
            print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            for jobs, run_operators in runs:
                timeout = args.timeout if args.timeout is not None else 120 + 4 * jobs
                bench = Bench(plane, workdir, args.replicas, timeout)
                results: list[RunResult] = []
                for operator in run_operators:
                    print(f"== {operator}: {jobs} jobs x {args.replicas} replicas", flush=True)
                    t0 = time.monotonic()
                    result = bench.run(operator, jobs)
                    print(f"   done in {time.monotonic() - t0:.0f} s", flush=True)
                    results.append(result)
                rendered = table(results)
                print(rendered, flush=True)
                tables.append(rendered)
                all_results.extend(results)
            if args.loaded > 0:
                timeout = args.timeout if args.timeout is not None else 120 + 4 * args.loaded
                bench = Bench(plane, workdir, args.replicas, timeout)
                loaded: list[LoadedResult] = []
                for operator in operators:
                    print(
                        f"== {operator}: {args.probes} jobs created one at a time while "
                        f"{args.loaded} jobs x {args.replicas} replicas run",
                        flush=True,
                    )
                    t0 = time.monotonic()
                    loaded.append(bench.run_loaded(operator, args.loaded, args.probes))
                    print(f"   done in {time.monotonic() - t0:.0f} s", flush=True)
                rendered = loaded_table(loaded)
                print(rendered, flush=True)
                tables.append(rendered)
                all_loaded.extend(loaded)
    if args.write_results is not None:
        write_results(args.write_results, command.strip(), info, tables)
    if args.json is not None:
        payload = {
            "machine": info,
            "results": [r.__dict__ for r in all_results],
            "loaded": [r.__dict__ for r in all_loaded],
        }
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    failed = any(r.timed_out or r.notes for r in all_results) or any(r.notes for r in all_loaded)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
