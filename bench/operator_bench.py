"""What the operator benchmarks share (operator_scale, operator_history, kueue_queue,
gang_placement, progress_load): the workload (TrainJobs and TFJobs of N replicas that kwok
runs), a minimal HTTPS client of the test API server with its metrics, a watch Tracker of each
job's children and Succeeded condition, the operators under test as processes (ours as in its
image, Kubeflow's training-operator) and a Bench that prepares a namespace and starts one, and
the machine description of a report. Not a script: the benchmarks import it as
``bench.operator_bench`` with the repository root on sys.path.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from tests.controlplane import training_operator
from tests.controlplane.cluster import KWOK_CONFIG, ControlPlane
from tests.controlplane.tools import go_mod_version, tools_dir
from tests.support import manifests, ports, processes, waits

REPO_ROOT: Final = Path(__file__).resolve().parent.parent

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
# Our operator with `--tfjob`, serving the TFJob workload that training-operator gets
# (operator_scale.py runs it between the two).
OURS_TFJOB: Final = "trainjob-tfjob"
# Our operator, in either mode: started from this repository as in its image.
OUR_OPERATORS: Final = (OURS, OURS_TFJOB)
SYSTEM_NS: Final = "bench-system"
EXIT_CODE_ANNOTATION: Final = "trainjob.dev/kwok-exit-code"
IMAGE: Final = "registry.example/never-pulled:1"
KUBEFLOW_MODULE: Final = "github.com/kubeflow/training-operator"
KUBEFLOW_WEBHOOK_CONFIG: Final = "validator.training-operator.kubeflow.org"
KUBEFLOW_WEBHOOK_SECRET: Final = "training-operator-webhook-cert"
KUBEFLOW_JOB_LABEL: Final = "training.kubeflow.org/job-name"
# The TFJob CRD our operator's chart installs: training-operator v1.9.4's, verbatim.
OUR_TFJOB_CRD: Final = REPO_ROOT / "crds" / "kubeflow" / "kubeflow.org_tfjobs.yaml"
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
    # Succeeded only while the last condition is Succeeded True (a TFJob: what KFP's launcher
    # and `kubectl get tfjob` read); otherwise any Succeeded True condition counts.
    succeeded_last: bool = False

    def succeeded(self, job: Obj) -> bool:
        """Whether the job object shows it Succeeded."""
        conditions = (job.get("status") or {}).get("conditions") or []
        if self.succeeded_last:
            conditions = conditions[-1:]
        return any(c.get("type") == "Succeeded" and c.get("status") == "True" for c in conditions)


KINDS: Final = {
    OURS: Kind(
        OURS, "TrainJob operator", "/apis/trainjob.dev/v1alpha1", "trainjobs", trainjob_body
    ),
    OURS_TFJOB: Kind(
        OURS_TFJOB,
        "TrainJob operator --tfjob",
        "/apis/kubeflow.org/v1",
        "tfjobs",
        tfjob_body,
        succeeded_last=True,
    ),
    KUBEFLOW: Kind(
        KUBEFLOW,
        "training-operator",
        "/apis/kubeflow.org/v1",
        "tfjobs",
        tfjob_body,
        succeeded_last=True,
    ),
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

    def list(self, path: str) -> list[Obj]:
        """Every object of a collection, page by page."""
        items: list[Obj] = []
        token = ""
        while True:
            query = {"limit": "500", **({"continue": token} if token else {})}
            status, data = self.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
            if status != 200:
                raise BenchError(f"GET {path} -> {status}: {data[:500]!r}")
            page = json.loads(data)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

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
            if self.kind.succeeded(obj):
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

    def create_timed(self, path: str, bodies: Mapping[str, Obj]) -> None:
        """Create the jobs of `bodies` (name -> body) at `path`, each's create time recorded
        just before its request. Four clients at once: a burst arrives interleaved, as from
        users."""

        def create(name: str) -> None:
            with self.lock:
                self.job(name).created = time.monotonic()
            self.api.create(path, bodies[name])

        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(create, bodies))

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


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class Bench:
    """A control plane made ready for operator runs: namespaces, each operator's identity
    and FlowSchema, training-operator's prerequisites, and the started operators."""

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

    def prepare_tfjob_door(self) -> None:
        """For our operator with `--tfjob`: the TFJob CRD as its chart installs it, and no
        training-operator webhook entry (prepare_kubeflow's): with one registered our operator
        refuses to start, as it should where training-operator may still serve TFJobs.
        prepare_kubeflow registers it again for the next training-operator run."""
        self.plane.apply_crds([OUR_TFJOB_CRD])
        self.plane.kubectl(
            "delete",
            "validatingwebhookconfiguration",
            KUBEFLOW_WEBHOOK_CONFIG,
            "--ignore-not-found",
        )
        self._prepared.discard(KUBEFLOW)

    def mount_webhook_certs(self) -> bool:
        """Play the kubelet for training-operator's webhook Secret (the binary waits for the
        files before it starts its controllers). False until its rotator has filled it."""
        return training_operator.mount_webhook_certs(self.plane, SYSTEM_NS)

    def start_operator(
        self, operator: str, namespace: str | None, kubeconfig: Path
    ) -> OperatorProcess:
        """`namespace` None: the operator serves every namespace."""
        log = self.workdir / f"{operator}-{namespace or 'cluster'}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        metrics_port = ports.free_port()
        if operator in OUR_OPERATORS:
            liveness = ports.free_port()
            env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "operator")])
            env["PYTHONUNBUFFERED"] = "1"
            argv = [
                sys.executable,
                "-c",
                (TRACEMALLOC_PREFIX if os.environ.get("BENCH_TRACEMALLOC") else "")
                + AS_IN_THE_IMAGE,
                *(["-n", namespace] if namespace else []),
                f"--metrics-port={metrics_port}",
                f"--liveness=http://127.0.0.1:{liveness}/healthz",
                *(["--tfjob"] if operator == OURS_TFJOB else []),
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


def flow_schema(operator: str) -> str:
    return f"bench-{operator}-operator"


def kwok_config(workdir: Path) -> Path:
    """tests/controlplane/kwok/kwok.yaml plus one Stage: the trainjob-succeed Stage applied to
    pods labelled as TFJob Pods (training.kubeflow.org/job-name), so TFJob chiefs exit 0
    exactly as TrainJob chiefs do. TrainJob-succeed itself then leaves those Pods alone: our
    operator's TFJob Pods carry both label sets, and with one Stage for every TFJob Pod they
    end the same way under either operator."""
    docs = [d for d in yaml.safe_load_all(KWOK_CONFIG.read_text(encoding="utf-8")) if d]
    stage = next(
        d for d in docs if d.get("kind") == "Stage" and d["metadata"]["name"] == "trainjob-succeed"
    )
    tfjob = copy.deepcopy(stage)
    tfjob["metadata"]["name"] = "bench-tfjob-succeed"
    for expr in tfjob["spec"]["selector"]["matchExpressions"]:
        if "trainjob.dev/job-name" in expr["key"]:
            expr["key"] = f'.metadata.labels["{KUBEFLOW_JOB_LABEL}"]'
    stage["spec"]["selector"]["matchExpressions"].append(
        {"key": f'.metadata.labels["{KUBEFLOW_JOB_LABEL}"]', "operator": "DoesNotExist"}
    )
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
