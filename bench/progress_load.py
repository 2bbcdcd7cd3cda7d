"""Progress-report load benchmark: N running TrainJobs, each reporting every few seconds.

On a real control plane (``tests/controlplane``: etcd, kube-apiserver, controller-manager),
our operator serves N TrainJobs of one worker each (the worker Pod is the reporter; Pods are
marked Running by patching their status, as a kubelet would). Each Pod's token comes from the
TokenRequest API, bound to the Pod, with the job's audience: exactly what the projected volume
holds. Then, in the same run and the same operator process:

1. **baseline**: ``--window`` seconds with no reports (the cost of N running jobs alone);
2. **progress**: after one unmeasured round of reports (each job's first costs a TokenReview
   and a TLS handshake), the same window with every job reporting every ``--interval`` seconds
   over HTTPS, one connection per report as the runtime's reporter does (``--keep-alive``:
   one kept open per job), each job from its own loopback address as each Pod has its own IP
   (a pool of client threads, each job at its own phase).

Measured per phase: operator CPU (cores, from /proc), RSS (VmRSS at the end, VmHWM), status
writes per second (``PATCH trainjobs/status`` from the API server's own metrics, and the
operator's ``trainjob_progress_status_writes_total``), reports answered per status code, and
report -> visible: for every report, the time until a watch of the TrainJobs shows its step or a
later one in ``status.progress`` (p50/p99/max). With ``--budgets 20,250`` the progress phase
runs again per budget (the operator restarted with ``--progress-status-writes``), which shows
what batching saves against writing every report.

Usage (from the repository root)::

    .venv/bin/python bench/progress_load.py                        # 1,000 jobs, 5 s, 60 s
    .venv/bin/python bench/progress_load.py --budgets 20,250 --write-results bench/RESULTS.md
    .venv/bin/python bench/progress_load.py --jobs 5 --window 8     # smoke size

The operator closes a connection idle for 4 s (below the 5 s interval), so a client that keeps
connections open does not make it hold one per job: with 1,000 jobs kept alive it measured
419 MiB RSS against 151 MiB without reports, most of it in idle TLS connections.

The load generator runs on the same machine (2 cores here) and competes with the operator
and the API server for CPU in the progress phase; the table says so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import heapq
import http.client
import json
import shutil
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.operator_bench import (  # noqa: E402 - after the sys.path line above
    Api,
    bench_workdir,
    machine_info,
    metric_sum,
    percentile,
    proc_stats,
    status_kib,
)
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.tools import Tools  # noqa: E402
from tests.support import kubelet, manifests, operator_process, ports, waits  # noqa: E402

Obj = dict[str, Any]
NAMESPACE: Final = "bench-progress"
NO_SCHEDULER: Final = "trainjob-bench-no-scheduler"
GROUP_PATH: Final = f"/apis/trainjob.dev/v1alpha1/namespaces/{NAMESPACE}/trainjobs"
CLIENT_THREADS: Final = 8
IMAGE: Final = "bench:none"  # never pulled: the benchmark plays the kubelet


def job_name(i: int) -> str:
    return f"p{i:05d}"


def trainjob_body(name: str) -> Obj:
    template = {"spec": {"schedulerName": NO_SCHEDULER, "containers": [manifests.container(IMAGE)]}}
    return manifests.trainjob(name, {"worker": manifests.replica(1, template, None)})


@dataclass
class Phase:
    name: str
    window: float
    cpu_cores: float = 0.0
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    status_patches_per_s: float = 0.0
    progress_writes_per_s: float = 0.0
    reports_per_s: float = 0.0
    codes: dict[str, int] = field(default_factory=dict)
    visible_p50: float = float("nan")
    visible_p99: float = float("nan")
    visible_max: float = float("nan")
    unseen: int = 0


class Visibility:
    """Watches the TrainJobs; for every sent report, when status first showed its step or a
    later one."""

    def __init__(self, api: Api) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._sent: dict[str, list[tuple[int, float]]] = {}
        # The newest step status showed for each job, and when: a report whose 202 reaches its
        # sender after the watch already showed its step (the sender's thread was not
        # scheduled in between, as on a loaded machine) is matched when it is recorded.
        self._shown: dict[str, tuple[int, float]] = {}
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def sent(self, job: str, step: int, at: float) -> None:
        with self._lock:
            shown_step, shown_at = self._shown.get(job, (0, 0.0))
            if shown_step >= step:
                self.latencies.append(shown_at - at)
            else:
                self._sent.setdefault(job, []).append((step, at))

    def pending(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._sent.values())

    def reset(self) -> None:
        with self._lock:
            self._sent.clear()
            self.latencies = []

    def _seen(self, job: str, step: int, at: float) -> None:
        with self._lock:
            if step > self._shown.get(job, (0, 0.0))[0]:
                self._shown[job] = (step, at)
            waiting = self._sent.get(job)
            if not waiting:
                return
            keep = []
            for sent_step, sent_at in waiting:
                if sent_step <= step:
                    self.latencies.append(at - sent_at)
                else:
                    keep.append((sent_step, sent_at))
            self._sent[job] = keep

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            conn = self._api.connection(timeout=None)
            try:
                if not version:
                    _status, data = self._api.request("GET", GROUP_PATH + "?limit=1")
                    version = json.loads(data)["metadata"]["resourceVersion"]
                conn.request(
                    "GET",
                    f"{GROUP_PATH}?watch=1&allowWatchBookmarks=true&resourceVersion={version}",
                    headers={"Authorization": f"Bearer {self._api.token}"},
                )
                response = conn.getresponse()
                while not self._stop.is_set():
                    line = response.readline()
                    if not line:
                        break
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") == "ERROR":
                        version = ""
                        break
                    step = ((obj.get("status") or {}).get("progress") or {}).get("step")
                    if isinstance(step, int):
                        self._seen(obj["metadata"]["name"], step, now)
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.5)
            finally:
                conn.close()


class Load:
    """Every job reports every `interval` seconds at its own phase, over keep-alive HTTPS."""

    def __init__(
        self,
        port: int,
        ca: Path,
        tokens: dict[str, str],
        interval: float,
        visibility: Visibility,
        keep_alive: bool = False,
    ) -> None:
        self.keep_alive = keep_alive
        self.port = port
        self.context = ssl.create_default_context(cafile=str(ca))
        self.tokens = tokens
        self.interval = interval
        self.visibility = visibility
        self.codes: dict[str, int] = {}
        self.sent = 0
        self._lock = threading.Lock()
        self._steps: dict[str, int] = dict.fromkeys(tokens, 0)

    def run(self, seconds: float) -> None:
        names = sorted(self.tokens)
        start = time.monotonic()
        until = start + seconds
        groups = [names[i::CLIENT_THREADS] for i in range(CLIENT_THREADS)]
        threads = [
            threading.Thread(target=self._client, args=(group, start, until, len(names)))
            for group in groups
            if group
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _connect(self, job: str) -> http.client.HTTPSConnection:
        """Each job's Pod has its own address in a cluster: here each job gets its own
        loopback source address (127.1.x.y), so the operator sees 1,000 clients, not one."""
        index = int(job[1:])
        source = f"127.1.{index // 250}.{index % 250 + 1}"
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.context, source_address=(source, 0)
        )

    def _client(self, jobs: list[str], start: float, until: float, total: int) -> None:
        conns = {job: self._connect(job) for job in jobs}
        queue = [(start + self.interval * int(job[1:]) / total, job) for job in jobs]
        heapq.heapify(queue)
        while queue:
            due, job = heapq.heappop(queue)
            if due >= until:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._lock:
                self._steps[job] += 1
                step = self._steps[job]
            body = json.dumps(
                {
                    "step": step,
                    "totalSteps": 100_000,
                    "epoch": 1 + step // 100,
                    "totalEpochs": 1000,
                    "loss": 1.0 / step,
                    "examplesPerSecond": 1000.0,
                    "etaSeconds": 100_000 - step,
                }
            )
            headers = {
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.tokens[job]}",
            }
            sent_at = time.monotonic()
            code = "error"
            for attempt in (1, 2):
                conn = conns[job]
                try:
                    conn.request(
                        "POST",
                        f"/v1/namespaces/{NAMESPACE}/trainjobs/{job}/progress",
                        body=body,
                        headers=headers,
                    )
                    response = conn.getresponse()
                    response.read()
                    code = str(response.status)
                    if not self.keep_alive:
                        conn.close()  # as the runtime's reporter does: one connection a report
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conns[job] = self._connect(job)
                    if attempt == 2:
                        code = "error"
            if code == "202":
                self.visibility.sent(job, step, sent_at)
            with self._lock:
                self.codes[code] = self.codes.get(code, 0) + 1
                self.sent += 1
            heapq.heappush(queue, (due + self.interval, job))
        for conn in conns.values():
            conn.close()


class Bench:
    def __init__(self, plane: ControlPlane, workdir: Path, jobs: int) -> None:
        self.plane = plane
        self.workdir = workdir
        self.jobs = jobs
        self.api = Api(plane)
        self.certs = workdir / "certs"
        self.certs.mkdir(exist_ok=True)
        pki = plane.pki
        shutil.copy(pki.serving_cert, self.certs / "tls.crt")
        shutil.copy(pki.serving_key, self.certs / "tls.key")
        shutil.copy(pki.ca_cert, self.certs / "ca.crt")
        self.port = ports.free_port()
        self.operator: operator_process.Operator | None = None

    def start_operator(self, budget: float) -> operator_process.Operator:
        operator = operator_process.Operator(
            self.plane.kubeconfig,
            self.workdir / f"operator-{budget:g}.log",
            f"--namespace={NAMESPACE}",
            f"--progress-port={self.port}",
            f"--progress-url=https://127.0.0.1:{self.port}",
            f"--progress-cert-dir={self.certs}",
            f"--progress-status-writes={budget:g}",
        )
        self.operator = operator.start().wait_serving(timeout=120)
        return operator

    def operator_metric(self, name: str, **labels: str) -> float:
        import urllib.request

        assert self.operator is not None
        url = f"http://127.0.0.1:{self.operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return metric_sum(response.read().decode(), name, **labels)

    def status_patches(self) -> float:
        return metric_sum(
            self.api.metrics(),
            "apiserver_request_total",
            verb="PATCH",
            resource="trainjobs",
            subresource="status",
        )

    def setup(self) -> dict[str, str]:
        """N jobs with their Pods Running; returns job -> its Pod's bound token."""
        self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        self.plane.wait_service_account(NAMESPACE)
        names = [job_name(i) for i in range(self.jobs)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.api.create(GROUP_PATH, trainjob_body(n)), names))
        print(f"   created {len(names)} TrainJobs", flush=True)
        pods: dict[str, Obj] = {}

        def all_pods() -> bool:
            _status, data = self.api.request(
                "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=trainjob.dev/job-name"
            )
            for pod in json.loads(data).get("items") or []:
                pods[pod["metadata"]["labels"]["trainjob.dev/job-name"]] = pod
            return len(pods) >= len(names)

        waits.wait_until(all_pods, timeout=120 + self.jobs, what="every job's Pod", interval=2.0)
        print(f"   {len(pods)} Pods exist", flush=True)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def run_and_token(job: str) -> tuple[str, str]:
            pod = pods[job]
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
            body = kubelet.pod_status("Running", kubelet.running(IMAGE, now), startTime=now)
            status, data = self._patch(path, body)
            if status != 200:
                raise RuntimeError(f"PATCH {path} -> {status}: {data[:300]!r}")
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [f"trainjob.dev/progress/{NAMESPACE}/{job}"],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
                },
            }
            reply = self.api.create(
                f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default/token", request
            )
            return job, str(reply["status"]["token"])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            tokens = dict(pool.map(run_and_token, names))
        print(f"   {len(tokens)} Pods Running, tokens requested", flush=True)

        def all_running() -> bool:
            _status, data = self.api.request("GET", GROUP_PATH)
            items = json.loads(data).get("items") or []
            states = [(i.get("status") or {}).get("state") for i in items]
            return states.count("Running") >= len(names)

        waits.wait_until(
            all_running, timeout=120 + self.jobs, what="every job Running", interval=2.0
        )
        print("   every job Running", flush=True)
        return tokens

    def _patch(self, path: str, body: Obj) -> tuple[int, bytes]:
        conn = self.api.connection()
        try:
            conn.request(
                "PATCH",
                path,
                body=json.dumps(body),
                headers={
                    "Authorization": f"Bearer {self.api.token}",
                    "Content-Type": "application/merge-patch+json",
                },
            )
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def measure(
        self,
        name: str,
        window: float,
        load: Load | None,
        visibility: Visibility,
    ) -> Phase:
        assert self.operator is not None and self.operator.process is not None
        pid = self.operator.process.pid
        if load is not None:
            # One round of reports first (each job's first costs a TokenReview and a TLS
            # handshake): the window measures the steady state.
            load.run(load.interval)
        visibility.reset()
        patches0 = self.status_patches()
        writes0 = self.operator_metric("trainjob_progress_status_writes_total", result="written")
        cpu0 = proc_stats(pid).cpu_seconds
        started = time.monotonic()
        if load is not None:
            load.codes, load.sent = {}, 0
            load.run(window)
        else:
            time.sleep(window)
        elapsed = time.monotonic() - started
        cpu = proc_stats(pid).cpu_seconds - cpu0
        phase = Phase(name, elapsed)
        phase.cpu_cores = cpu / elapsed
        phase.rss_mib = status_kib(pid, "VmRSS") / 1024
        phase.hwm_mib = proc_stats(pid).peak_rss_kib / 1024
        phase.status_patches_per_s = (self.status_patches() - patches0) / elapsed
        written = self.operator_metric("trainjob_progress_status_writes_total", result="written")
        phase.progress_writes_per_s = (written - writes0) / elapsed
        if load is not None:
            phase.codes = dict(load.codes)
            phase.reports_per_s = load.sent / elapsed
            # Reports sent near the end get the time they need to show (up to 2 budgets' worth).
            deadline = time.monotonic() + 120
            while visibility.pending() and time.monotonic() < deadline:
                time.sleep(0.5)
            phase.unseen = visibility.pending()
            lat = visibility.latencies
            phase.visible_p50 = percentile(lat, 50)
            phase.visible_p99 = percentile(lat, 99)
            phase.visible_max = max(lat) if lat else float("nan")
        return phase


def table(jobs: int, interval: float, rows: Sequence[tuple[str, Phase]]) -> str:
    base = rows[0][1]

    def ratio(value: float, of: float) -> str:
        return f"{value / of:.2f}x" if of > 0 else "-"

    lines = [
        f"#### {jobs} running TrainJobs, each reporting every {interval:g} s "
        "(same run, same operator process)",
        "",
        "| phase | reports/s | answers | status writes/s (API server) | progress writes/s "
        "| report -> visible p50 / p99 / max | operator CPU, cores (+ vs baseline) "
        "| RSS, MiB (x baseline) | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, p in rows:
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(p.codes.items())) or "-"
        visible = (
            "-"
            if p.visible_p50 != p.visible_p50
            else f"{p.visible_p50:.2f} / {p.visible_p99:.2f} / {p.visible_max:.2f} s"
            + (f" ({p.unseen} unseen)" if p.unseen else "")
        )
        extra = p.cpu_cores - base.cpu_cores
        cpu = f"{p.cpu_cores:.3f}" + ("" if p is base else f" (+{extra:.3f})")
        rss = f"{p.rss_mib:.0f}" + ("" if p is base else f" ({ratio(p.rss_mib, base.rss_mib)})")
        lines.append(
            f"| {label} | {p.reports_per_s:.1f} | {answers} | {p.status_patches_per_s:.1f} "
            f"| {p.progress_writes_per_s:.1f} | {visible} | {cpu} | {rss} | {p.hwm_mib:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000, help="running TrainJobs (default 1000)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between reports")
    p.add_argument("--window", type=float, default=60.0, help="seconds measured per phase")
    p.add_argument(
        "--budgets",
        default="20",
        help="status write budgets (writes/s), comma-separated; the first is the default run",
    )
    p.add_argument(
        "--keep-alive",
        action="store_true",
        help="keep each job's connection open between reports (the runtime's reporter opens one "
        "per report; a script with a session might keep it)",
    )
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.add_argument("--write-results", type=Path, help="append the table to this markdown file")
    p.add_argument("--workdir", type=Path, help="keep the control plane state and logs here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    tools = Tools.locate().require()
    rows: list[tuple[str, Phase]] = []
    with bench_workdir(args.workdir) as workdir:
        plane = ControlPlane(
            tools=tools, workdir=workdir / "cp", crds=sorted((REPO_ROOT / "crds").glob("*.yaml"))
        )
        with plane:
            info = machine_info(plane)
            print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            bench = Bench(plane, workdir, args.jobs)
            try:
                bench.start_operator(budgets[0])
                print(f"== setting up {args.jobs} running jobs", flush=True)
                tokens = bench.setup()
                visibility = Visibility(bench.api)
                visibility.start()
                print(f"== baseline: {args.window:g} s without reports", flush=True)
                rows.append(
                    (
                        "no progress reports",
                        bench.measure("baseline", args.window, None, visibility),
                    )
                )
                for position, budget in enumerate(budgets):
                    if position:
                        assert bench.operator is not None
                        bench.operator.stop()
                        bench.start_operator(budget)
                        time.sleep(10)  # its first list and reconciles, outside the window
                    print(
                        f"== progress: every {args.interval:g} s, budget {budget:g}/s", flush=True
                    )
                    load = Load(
                        bench.port,
                        bench.certs / "ca.crt",
                        tokens,
                        args.interval,
                        visibility,
                        keep_alive=args.keep_alive,
                    )
                    phase = bench.measure(f"budget {budget:g}", args.window, load, visibility)
                    rows.append(
                        (f"reports every {args.interval:g} s, budget {budget:g} writes/s", phase)
                    )
                visibility.stop()
            finally:
                if bench.operator is not None:
                    bench.operator.stop()
    rendered = table(args.jobs, args.interval, rows)
    print(rendered, flush=True)
    command = "python bench/progress_load.py " + " ".join(
        a
        for a in (sys.argv[1:] if argv is None else argv)
        if not a.startswith(("--json", "--workdir", "--write"))
    )
    if args.write_results is not None:
        with args.write_results.open("a", encoding="utf-8") as out:
            out.write(
                f"\n### Progress reports: `{command.strip()}`\n\n"
                + f"Machine: {info['cpu']}, {info['memory']}, {info['date']}; the load "
                "generator runs on the same machine.\n\n" + rendered + "\n"
            )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"machine": info, "phases": [{"label": label, **p.__dict__} for label, p in rows]},
                indent=2,
            ),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
