"""History benchmark: one operator serving many TrainJobs, most of them long finished.

Teams keep finished jobs for their history (no TTL), so a cluster holds thousands of them.
What they must cost is nothing, while the running jobs and a new one are served at once. On
the real control plane with kwok nodes (as ``bench/operator_scale.py``), per operator and per
size N (N/10 running jobs of R replicas, the rest finished, spread over 20 namespaces), one
after the other in one run:

1. The operator (serving every namespace) creates the running jobs' children; every Pod goes
   Running on kwok and stays so (the chief never exits).
2. The operator stops; the finished jobs are written straight into the API: each TrainJob (or
   TFJob) created with ``cleanPodPolicy: All`` and given a finished status (8 in 9 Succeeded,
   the rest Failed) copied from a job the operator really finished, so no children are left.
3. **Restart**: the operator starts on the whole history. Measured: start -> every job looked
   at once (ours: the `trainjob_jobs` gauge sums to N; training-operator: its reconcile
   counter reaches N and its work queue is empty), peak RSS (VmHWM) over the start.
4. **At rest** for `--rest` seconds (default 600): CPU cores used, API requests per minute
   made by the operator (API Priority and Fairness dispatches of a FlowSchema matching only
   its service account), RSS at the end (steady).
5. **A new job among them**: `--probes` jobs created one at a time (the next once the previous
   one's Pods and Services all exist): create -> all children p50/p99; then a burst of
   `--burst` jobs created together: p50/p99 and the time to the last child.
6. **A full relist**: the API server is killed, etcd compacted and the API server started
   again, so every watch that resumes gets 410 Gone and lists everything again; measured:
   API server ready -> a job created then has all its children.
7. The namespaces are deleted (and awaited) before the next run, so neither operator's
   caches ever hold the other's objects.

Usage (from the repository root)::

    .venv/bin/python bench/operator_history.py --sizes 1000,3000,10000 \\
        --write-results bench/RESULTS.md      # what RESULTS.md shows
    .venv/bin/python bench/operator_history.py --sizes 40 --replicas 2 --rest 5 \\
        --probes 2 --burst 3 --operator trainjob   # smoke size (tests/integration)

Needs ``bash tests/controlplane/install.sh`` and, for the baseline, ``bash
bench/kubeflow/install.sh``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import math
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import operator_bench  # noqa: E402 - after the sys.path line above
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.tools import Tools  # noqa: E402

Obj = dict[str, Any]
NAMESPACES: Final = 20
RUNNING_SHARE: Final = 10  # one job in ten runs
FAILED_EVERY: Final = 9  # one finished job in nine failed
STATUS_PATCH: Final = "application/merge-patch+json"


@dataclass
class HistoryResult:
    operator: str
    jobs: int
    running: int
    replicas: int
    running_ready_seconds: float = float("nan")
    seed_seconds: float = float("nan")
    startup_seconds: float = float("nan")
    startup_peak_rss_mib: float = float("nan")
    rest_seconds: float = 0.0
    rest_cpu_cores: float = float("nan")
    rest_requests_per_minute: float = float("nan")
    steady_rss_mib: float = float("nan")
    probe_p50: float = float("nan")
    probe_p99: float = float("nan")
    burst: int = 0
    burst_p50: float = float("nan")
    burst_p99: float = float("nan")
    burst_total: float = float("nan")
    relist_seconds: float = float("nan")
    notes: list[str] = field(default_factory=list)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def looked_at(operator: str, metrics: str) -> tuple[float, bool]:
    """How many jobs the operator has looked at, and whether it is idle (nothing queued)."""
    if operator == operator_bench.OURS:
        return operator_bench.metric_sum(metrics, "trainjob_jobs"), True
    total = operator_bench.metric_sum(metrics, "controller_runtime_reconcile_total")
    depth = operator_bench.metric_sum(metrics, "workqueue_depth")
    return total, depth == 0


def finished_status(template: Obj, failed: bool, operator: str) -> Obj:
    """A real finished job's status, turned into a failure when asked."""
    status = copy.deepcopy(template)
    if failed:
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Succeeded":
                condition["type"] = "Failed"
                condition["reason"] = (
                    "BackoffLimitExceeded" if operator == operator_bench.OURS else ("TFJobFailed")
                )
                condition["message"] = "seeded by the history benchmark"
    return status


class History:
    def __init__(self, plane: ControlPlane, workdir: Path, replicas: int) -> None:
        self.plane = plane
        self.workdir = workdir
        self.replicas = replicas
        self.api = operator_bench.Api(plane)
        self.bench = operator_bench.Bench(plane, workdir, replicas, timeout=3600)

    def namespaces(self, operator: str, jobs: int) -> list[str]:
        return [f"hist-{operator}-{jobs}-{i:02d}" for i in range(NAMESPACES)]

    def jobs_path(self, kind: operator_bench.Kind, namespace: str) -> str:
        return f"{kind.api_path}/namespaces/{namespace}/{kind.plural}"

    def create_all(self, make: Callable[[str], None], names: Sequence[str]) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(make, names))

    def run(self, operator: str, jobs: int, rest: float, probes: int, burst: int) -> HistoryResult:
        kind = operator_bench.KINDS[operator]
        if operator == operator_bench.KUBEFLOW:
            self.bench.prepare_kubeflow()
        running = max(1, jobs // RUNNING_SHARE)
        result = HistoryResult(operator, jobs, running, self.replicas, rest_seconds=rest)
        kubeconfig = self.bench.operator_identity(operator)
        spaces = self.namespaces(operator, jobs)
        for ns in spaces:
            self.bench.namespace(ns)
        trackers = {ns: operator_bench.Tracker(self.api, ns, kind, self.replicas) for ns in spaces}
        for tracker in trackers.values():
            tracker.start()
        proc = self.bench.start_operator(operator, None, kubeconfig)
        try:
            # A job the operator really finishes: its status is the finished jobs' template.
            first = trackers[spaces[0]]
            first.job("warmup").created = time.monotonic()
            self.api.create(
                self.jobs_path(kind, spaces[0]), kind.body("warmup", self.replicas, True)
            )
            if not first.wait(["warmup"], succeeded=True, deadline=time.monotonic() + 120):
                raise operator_bench.BenchError(
                    f"{operator}: the warm-up job did not succeed in 120 s"
                )
            warm = self._get(f"{self.jobs_path(kind, spaces[0])}/warmup")
            template = warm.get("status") or {}

            # 1. The running jobs, served by the operator.
            start = time.monotonic()
            placed: dict[str, list[str]] = {ns: [] for ns in spaces}

            def create_running(index: int) -> None:
                ns = spaces[index % NAMESPACES]
                name = f"run-{index:05d}"
                with trackers[ns].lock:
                    trackers[ns].job(name).created = time.monotonic()
                self.api.create(self.jobs_path(kind, ns), kind.body(name, self.replicas, False))
                placed[ns].append(name)

            with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(create_running, range(running)))
            deadline = start + 600 + 4 * running
            for ns, names in placed.items():
                if not trackers[ns].wait(names, succeeded=False, running=True, deadline=deadline):
                    result.notes.append(f"running jobs in {ns} not all Running in time")
                    break
            result.running_ready_seconds = time.monotonic() - start
            proc.stop()

            # 2. The history, written while no operator runs.
            start = time.monotonic()
            finished = jobs - running

            def seed(index: int) -> None:
                ns = spaces[index % NAMESPACES]
                name = f"done-{index:05d}"
                body = kind.body(name, self.replicas, True)
                body["spec"]["runPolicy"]["cleanPodPolicy"] = "All"
                path = self.jobs_path(kind, ns)
                self.api.create(path, body)
                status = finished_status(template, index % FAILED_EVERY == 0, operator)
                code, data = self.api.request(
                    "PATCH", f"{path}/{name}/status", {"status": status}, STATUS_PATCH
                )
                if code != 200:
                    raise operator_bench.BenchError(
                        f"status of {ns}/{name} -> {code}: {data[:300]!r}"
                    )

            self.create_all(seed, range(finished))  # type: ignore[arg-type]
            result.seed_seconds = time.monotonic() - start

            # 3. Restart on the whole history.
            start = time.monotonic()
            proc = self.bench.start_operator(operator, None, kubeconfig)
            want = jobs + 1  # and the warm-up job
            seen = 0.0
            while time.monotonic() - start < 900:
                if not proc.running():
                    raise operator_bench.BenchError(f"{operator} exited:\n{proc.log_tail()}")
                try:
                    seen, idle = looked_at(operator, scrape(proc.metrics_url))
                except OSError:
                    seen, idle = 0.0, False
                if seen >= want and idle:
                    result.startup_seconds = time.monotonic() - start
                    break
                time.sleep(0.2)
            else:
                result.notes.append(f"start-up: {seen:.0f} of {want} jobs looked at in 900 s")
            result.startup_peak_rss_mib = operator_bench.proc_stats(proc.pid).peak_rss_kib / 1024

            # 4. At rest.
            before = operator_bench.api_counts(self.api, operator_bench.flow_schema(operator))
            cpu_before = operator_bench.proc_stats(proc.pid).cpu_seconds
            t0 = time.monotonic()
            time.sleep(rest)
            elapsed = time.monotonic() - t0
            after = operator_bench.api_counts(self.api, operator_bench.flow_schema(operator))
            result.rest_cpu_cores = (
                operator_bench.proc_stats(proc.pid).cpu_seconds - cpu_before
            ) / elapsed
            result.rest_requests_per_minute = (
                (after.operator_requests - before.operator_requests) / elapsed * 60
            )
            result.steady_rss_mib = operator_bench.status_kib(proc.pid, "VmRSS") / 1024
            print(f"   at rest: {result}", flush=True)
            trace = os.environ.get("BENCH_TRACEMALLOC")
            if trace and operator == operator_bench.OURS:
                os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(30)

            # 5. A new job among them: one at a time, then a burst.
            tracker = trackers[spaces[0]]
            latencies: list[float] = []
            for i in range(probes):
                name = f"probe-{i:03d}"
                with tracker.lock:
                    tracker.job(name).created = time.monotonic()
                self.api.create(
                    self.jobs_path(kind, spaces[0]), kind.body(name, self.replicas, False)
                )
                if not tracker.wait([name], succeeded=False, deadline=time.monotonic() + 120):
                    result.notes.append(f"{name}: children incomplete after 120 s")
                    break
                with tracker.lock:
                    times = tracker.jobs[name]
                    assert times.children_at is not None
                    latencies.append(times.children_at - times.created)
            result.probe_p50 = operator_bench.percentile(latencies, 50)
            result.probe_p99 = operator_bench.percentile(latencies, 99)

            names = [f"burst-{i:03d}" for i in range(burst)]
            start = time.monotonic()

            def create_burst(name: str) -> None:
                with tracker.lock:
                    tracker.job(name).created = time.monotonic()
                self.api.create(
                    self.jobs_path(kind, spaces[0]), kind.body(name, self.replicas, False)
                )

            self.create_all(create_burst, names)
            if not tracker.wait(names, succeeded=False, deadline=start + 120 + 4 * burst):
                result.notes.append("burst: children incomplete in time")
            with tracker.lock:
                done = [tracker.jobs[n] for n in names if tracker.jobs[n].children_at is not None]
            result.burst = len(done)
            waits = [t.children_at - t.created for t in done if t.children_at is not None]
            result.burst_p50 = operator_bench.percentile(waits, 50)
            result.burst_p99 = operator_bench.percentile(waits, 99)
            last = max((t.children_at for t in done if t.children_at is not None), default=None)
            result.burst_total = (last - start) if last is not None else float("nan")

            # 6. A full relist: the API server restarts on a compacted etcd, so every watch
            # resuming from a version it saw gets 410 Gone and lists again.
            self.plane.kill("kube-apiserver")
            self.plane.compact_etcd()
            self.plane.revive("kube-apiserver")
            revived = time.monotonic()
            name = "relist-probe"
            with tracker.lock:
                tracker.job(name).created = time.monotonic()
            self.api.create(self.jobs_path(kind, spaces[0]), kind.body(name, self.replicas, False))
            if tracker.wait([name], succeeded=False, deadline=revived + 600):
                with tracker.lock:
                    served = tracker.jobs[name].children_at
                assert served is not None
                result.relist_seconds = served - revived
            else:
                result.notes.append("relist: a new job had no children 600 s after the restart")
            if not proc.running():
                result.notes.append(f"{operator} exited during the run:\n{proc.log_tail()}")
            print(f"   {result}", flush=True)
            # While the operator runs: it removes its own finalizers from deleted jobs.
            self.delete_namespaces(kind, spaces, result)
        finally:
            proc.stop()
            for tracker in trackers.values():
                tracker.stop()
        return result

    def _get(self, path: str) -> Obj:
        code, data = self.api.request("GET", path)
        if code != 200:
            raise operator_bench.BenchError(f"GET {path} -> {code}: {data[:300]!r}")
        obj: Obj = json.loads(data)
        return obj

    def delete_namespaces(
        self, kind: operator_bench.Kind, spaces: Sequence[str], result: HistoryResult
    ) -> None:
        """Empty the namespaces ourselves, then delete them: the namespace controller and
        the garbage collector work at kube-controller-manager's 20 requests per second,
        which would take most of half an hour for 10,000 jobs and their children."""
        now = {"gracePeriodSeconds": 0}
        for ns in spaces:
            self.api.request("DELETE", self.jobs_path(kind, ns), now)
            self.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods", now)

        def delete_services(ns: str) -> None:
            _, data = self.api.request("GET", f"/api/v1/namespaces/{ns}/services")
            for item in json.loads(data).get("items") or []:
                name = item["metadata"]["name"]
                self.api.request("DELETE", f"/api/v1/namespaces/{ns}/services/{name}")

        self.create_all(delete_services, spaces)
        for ns in spaces:
            self.api.request("DELETE", f"/api/v1/namespaces/{ns}")
        deadline = time.monotonic() + 900
        for ns in spaces:
            while time.monotonic() < deadline:
                code, _ = self.api.request("GET", f"/api/v1/namespaces/{ns}")
                if code == 404:
                    break
                time.sleep(1.0)
            else:
                result.notes.append(f"namespace {ns} still there after 900 s")
                return


# --------------------------------------------------------------------------- reporting

ROWS: Final = (
    ("start-up -> every job looked at", "startup_seconds", "s"),
    ("peak RSS over the start-up", "startup_peak_rss_mib", "MiB"),
    ("steady RSS (after the rest)", "steady_rss_mib", "MiB"),
    ("CPU at rest", "rest_cpu_cores", "cores"),
    ("operator API requests per minute at rest", "rest_requests_per_minute", "/min"),
    ("new job: create -> all children, p50", "probe_p50", "s"),
    ("new job: create -> all children, p99", "probe_p99", "s"),
    ("burst: create -> all children, p50", "burst_p50", "s"),
    ("burst: create -> all children, p99", "burst_p99", "s"),
    ("burst: first create -> last child", "burst_total", "s"),
    ("full relist (API server restart, 410) -> a new job served", "relist_seconds", "s"),
    ("(running jobs' Pods all Running after)", "running_ready_seconds", "s"),
)


def cell(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "cores":
        return f"{value:.4f}"
    if unit == "/min":
        return f"{value:.1f}"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return operator_bench.fmt(value)


def history_table(results: Sequence[HistoryResult]) -> str:
    first = results[0]
    head = (
        f"**{first.jobs} jobs: {first.jobs - first.running} finished, {first.running} running "
        f"x {first.replicas} replicas, {NAMESPACES} namespaces** (rest {first.rest_seconds:.0f} s)"
    )
    columns = [operator_bench.KINDS[r.operator].label for r in results]
    lines = [head, "", "| metric | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for label, attr, unit in ROWS:
        values = [cell(getattr(r, attr), unit) for r in results]
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    for r in results:
        for note in r.notes:
            lines.append(f"\n- {r.operator}: {note.splitlines()[0]}")
    return "\n".join(lines)


def plot(results: Sequence[HistoryResult], path: Path) -> None:
    """RSS and start-up time against the number of jobs, one line per operator (PNG)."""
    try:
        import matplotlib  # only for --plot: not a dependency (pip install matplotlib)
    except ImportError:
        raise SystemExit("--plot draws with matplotlib: pip install matplotlib") from None

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (rss, startup) = pyplot.subplots(1, 2, figsize=(10, 4))
    for operator in dict.fromkeys(r.operator for r in results):
        mine = sorted((r for r in results if r.operator == operator), key=lambda r: r.jobs)
        label = operator_bench.KINDS[operator].label
        jobs = [r.jobs for r in mine]
        rss.plot(jobs, [r.steady_rss_mib for r in mine], marker="o", label=f"{label}, steady")
        rss.plot(
            jobs,
            [r.startup_peak_rss_mib for r in mine],
            marker="x",
            ls="--",
            label=f"{label}, peak",
        )
        startup.plot(jobs, [r.startup_seconds for r in mine], marker="o", label=label)
    rss.set(title="Operator RSS", xlabel="TrainJobs / TFJobs (90% finished)", ylabel="MiB")
    startup.set(title="Start-up -> every job looked at", xlabel="jobs", ylabel="seconds")
    for axes in (rss, startup):
        axes.grid(alpha=0.3)
        axes.set_ylim(bottom=0)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/operator_history.py", description=__doc__)
    p.add_argument(
        "--sizes", default="1000,3000,10000", help="job counts (default 1000,3000,10000)"
    )
    p.add_argument("--replicas", type=int, default=8, help="replicas per running job (default 8)")
    p.add_argument("--operator", choices=[*operator_bench.OPERATORS, "both"], default="both")
    p.add_argument("--rest", type=float, default=600.0, help="seconds at rest (default 600)")
    p.add_argument("--probes", type=int, default=20, help="new jobs timed one at a time")
    p.add_argument("--burst", type=int, default=100, help="new jobs created together")
    p.add_argument("--json", type=Path, help="write the raw figures as JSON")
    p.add_argument("--write-results", type=Path, help="append the tables to this markdown file")
    p.add_argument("--workdir", type=Path, help="keep the control plane state and logs here")
    p.add_argument("--plot", type=Path, help="draw RSS and start-up against jobs (PNG)")
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        help="measure nothing: read the figures of earlier runs (--json) and only report them",
    )
    return p.parse_args(argv)


def report(args: argparse.Namespace) -> int:
    """--from-json: the tables (and plot) of earlier runs, merged."""
    results = [
        HistoryResult(**r)
        for path in args.from_json
        for r in json.loads(path.read_text(encoding="utf-8"))["results"]
    ]
    sizes = sorted({r.jobs for r in results})
    tables = [history_table([r for r in results if r.jobs == jobs]) for jobs in sizes]
    print("\n\n".join(tables))
    if args.write_results is not None:
        with args.write_results.open("a", encoding="utf-8") as out:
            out.write("\n\n".join(["", *tables]) + "\n")
    if args.plot is not None:
        plot(results, args.plot)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return report(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    operators = list(operator_bench.OPERATORS) if args.operator == "both" else [args.operator]
    # training-operator first: its Pod cache is cluster-wide, ours is by label.
    operators.sort(key=lambda op: op != operator_bench.KUBEFLOW)
    if operator_bench.KUBEFLOW in operators:
        operator_bench.kubeflow_binary()
    tools = Tools.locate().require()
    results: list[HistoryResult] = []
    tables: list[str] = []
    with operator_bench.bench_workdir(args.workdir) as workdir:
        plane = ControlPlane(tools=tools, workdir=workdir / "cp")
        with plane:
            plane.apply_crds(sorted((operator_bench.REPO_ROOT / "crds").glob("*.yaml")))
            plane.start_kwok(config=operator_bench.kwok_config(workdir))
            info = operator_bench.machine_info(plane)
            print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            history = History(plane, workdir, args.replicas)
            for jobs in sizes:
                row: list[HistoryResult] = []
                for operator in operators:
                    print(f"== {operator}: {jobs} jobs", flush=True)
                    t0 = time.monotonic()
                    row.append(history.run(operator, jobs, args.rest, args.probes, args.burst))
                    print(f"   done in {time.monotonic() - t0:.0f} s", flush=True)
                rendered = history_table(row)
                print(rendered, flush=True)
                tables.append(rendered)
                results.extend(row)
    if args.json is not None:
        payload = {"machine": info, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    if args.write_results is not None:
        with args.write_results.open("a", encoding="utf-8") as out:
            out.write("\n\n".join(["", *tables]) + "\n")
    if args.plot is not None:
        plot(results, args.plot)
    return 1 if any(r.notes for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
