"""Kueue benchmark: TrainJobs vs Kubeflow TFJobs through the same real Kueue, same run.

On the test control plane with kwok fake nodes and the real Kueue controller (built from its
Go module, tests/controlplane/kueue.py) configured with both our external framework and its
own (deprecated) `kubeflow.org/tfjob` integration, N jobs of M replicas (1 chief, 2 ps, the
rest workers; every replica requests 1 CPU) go through one ClusterQueue whose quota fits
`--fit` jobs at a time. kwok runs the Pods; each chief exits 0 after kwok's 500 ms run time,
the job Succeeds, its Workload finishes and the next jobs are admitted. Measured per operator
(each in its own namespace and ClusterQueue, one after the other):

- create -> admitted (the Workload's Admitted condition first seen), per job: p50, p99
- create -> all children (M Pods + M Services), per job: p50, p99
- queue drain: first create -> last Succeeded
- the operator's API requests per job, peak RSS and CPU seconds (as bench/operator_scale.py)

Usage (from the repository root)::

    .venv/bin/python bench/kueue_queue.py                       # 200 x 8, fit 10, both
    .venv/bin/python bench/kueue_queue.py --jobs 20 --operator trainjob   # smoke size
    .venv/bin/python bench/kueue_queue.py --write-results bench/RESULTS.md

Needs ``bash tests/controlplane/install.sh`` (control plane, kwok, Kueue) and, for the
baseline, ``bash bench/kubeflow/install.sh`` (training-operator v1.9.4).
"""

from __future__ import annotations

import argparse
import json
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

from bench import operator_bench  # noqa: E402 - after the sys.path line above
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.kueue import EXTERNAL_FRAMEWORK, KUEUE_GROUP, start_kueue  # noqa: E402
from tests.controlplane.tools import Tools  # noqa: E402

Obj = dict[str, Any]
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_API: Final = "/apis/kueue.x-k8s.io/v1beta2"
TFJOB_FRAMEWORK: Final = "kubeflow.org/tfjob"


def queued(body: Obj, queue: str) -> Obj:
    """A benchmark job for `queue`: every replica requests 1 CPU."""
    body["metadata"]["labels"] = {QUEUE_LABEL: queue}
    specs = body["spec"].get("replicaSpecs") or body["spec"].get("tfReplicaSpecs") or {}
    for replica in specs.values():
        for container in replica["template"]["spec"]["containers"]:
            container["resources"] = {"requests": {"cpu": "1"}}
    return body


class AdmissionTracker(operator_bench.Tracker):
    """The operator benchmark's Tracker, plus the Workloads of the namespace: when each job's
    Workload was first seen Admitted."""

    def __init__(
        self, api: operator_bench.Api, namespace: str, kind: operator_bench.Kind, replicas: int
    ) -> None:
        super().__init__(api, namespace, kind, replicas)
        self.admitted: dict[str, float] = {}

    def start(self) -> None:
        super().start()
        path = f"{KUEUE_API}/namespaces/{self.namespace}/workloads"
        thread = threading.Thread(
            target=self._watch, args=("workloads", path), name="watch-workloads", daemon=True
        )
        thread.start()
        self.threads.append(thread)

    def _observe(self, what: str, obj: Obj, now: float) -> None:
        if what != "workloads":
            super()._observe(what, obj, now)
            return
        meta = obj.get("metadata") or {}
        owner = next(
            (o.get("name") for o in meta.get("ownerReferences") or [] if o.get("controller")),
            None,
        )
        conditions = (obj.get("status") or {}).get("conditions") or []
        admitted = any(
            c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions
        )
        if owner and admitted:
            with self.lock:
                self.admitted.setdefault(owner, now)


@dataclass
class QueueResult:
    operator: str
    jobs: int
    replicas: int
    fit: int
    admitted_p50: float
    admitted_p99: float
    children_p50: float
    children_p99: float
    admitted_to_children_p50: float
    admitted_to_children_p99: float
    drain_seconds: float
    operator_requests_per_job: float
    peak_rss_mib: float
    cpu_seconds: float
    completed: int
    notes: list[str] = field(default_factory=list)


ROWS: Final[list[tuple[str, str, str]]] = [
    ("create -> admitted, p50", "admitted_p50", "s"),
    ("create -> admitted, p99", "admitted_p99", "s"),
    ("admitted -> all Pods and Services, p50", "admitted_to_children_p50", "s"),
    ("admitted -> all Pods and Services, p99", "admitted_to_children_p99", "s"),
    ("create -> all Pods and Services, p50", "children_p50", "s"),
    ("create -> all Pods and Services, p99", "children_p99", "s"),
    ("queue drain (first create -> last Succeeded)", "drain_seconds", "s"),
    ("operator API requests per job", "operator_requests_per_job", ""),
    ("operator peak RSS", "peak_rss_mib", "MiB"),
    ("operator CPU seconds (workload)", "cpu_seconds", ""),
]


def cluster_queue(bench: operator_bench.Bench, name: str, cpu: int) -> None:
    bench.kubectl_apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "bench-flavor"},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "namespaceSelector": {},
                    "queueingStrategy": "BestEffortFIFO",
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [
                                {
                                    "name": "bench-flavor",
                                    "resources": [{"name": "cpu", "nominalQuota": cpu}],
                                }
                            ],
                        }
                    ],
                },
            },
        ]
    )


def run(bench: operator_bench.Bench, operator: str, jobs: int, fit: int) -> QueueResult:
    namespace = f"bench-kueue-{operator}-{jobs}x{bench.replicas}"
    base = operator_bench.KINDS[operator]
    if operator == operator_bench.KUBEFLOW:
        bench.prepare_kubeflow()
    kubeconfig = bench.operator_identity(operator)
    bench.namespace(namespace)
    cq = f"bench-{operator}"
    cluster_queue(bench, cq, fit * bench.replicas)
    bench.kubectl_apply(
        [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "queue", "namespace": namespace},
                "spec": {"clusterQueue": cq},
            }
        ]
    )
    tracker = AdmissionTracker(bench.api, namespace, base, bench.replicas)
    tracker.start()
    jobs_path = f"{base.api_path}/namespaces/{namespace}/{base.plural}"
    proc = bench.start_operator(operator, namespace, kubeconfig)
    notes: list[str] = []
    names = [f"job-{i:05d}" for i in range(jobs)]
    try:
        tracker.job("warmup").created = time.monotonic()
        bench.api.create(jobs_path, queued(base.body("warmup", bench.replicas, True), "queue"))
        if not tracker.wait(["warmup"], succeeded=True, deadline=time.monotonic() + 180):
            raise operator_bench.BenchError(f"{operator}: the warm-up job did not succeed in 180 s")
        before = operator_bench.api_counts(bench.api, operator_bench.flow_schema(operator))
        cpu_before = operator_bench.proc_stats(proc.pid).cpu_seconds
        bodies = {n: queued(base.body(n, bench.replicas, True), "queue") for n in names}
        start = time.monotonic()

        tracker.create_timed(jobs_path, bodies)
        finished = tracker.wait(names, succeeded=True, deadline=start + bench.timeout)
        stats = operator_bench.proc_stats(proc.pid)
        after = operator_bench.api_counts(bench.api, operator_bench.flow_schema(operator))
        if not finished:
            notes.append("timed out before every job Succeeded")
        if not proc.running():
            notes.append(f"{operator} exited during the run:\n{proc.log_tail()}")
    finally:
        proc.stop()
        tracker.stop()
    with tracker.lock:
        times = {n: tracker.jobs[n] for n in names if n in tracker.jobs}
        admitted_at = dict(tracker.admitted)
    admitted = [admitted_at[n] - t.created for n, t in times.items() if n in admitted_at]
    children = [t.children_at - t.created for t in times.values() if t.children_at is not None]
    after_admission = [
        t.children_at - admitted_at[n]
        for n, t in times.items()
        if t.children_at is not None and n in admitted_at
    ]
    last = max((t.succeeded_at for t in times.values() if t.succeeded_at is not None), default=None)
    return QueueResult(
        operator=operator,
        jobs=jobs,
        replicas=bench.replicas,
        fit=fit,
        admitted_p50=operator_bench.percentile(admitted, 50),
        admitted_p99=operator_bench.percentile(admitted, 99),
        children_p50=operator_bench.percentile(children, 50),
        children_p99=operator_bench.percentile(children, 99),
        admitted_to_children_p50=operator_bench.percentile(after_admission, 50),
        admitted_to_children_p99=operator_bench.percentile(after_admission, 99),
        drain_seconds=(last - start) if last is not None else float("nan"),
        operator_requests_per_job=(after.operator_requests - before.operator_requests) / jobs,
        peak_rss_mib=stats.peak_rss_kib / 1024,
        cpu_seconds=stats.cpu_seconds - cpu_before,
        completed=sum(1 for t in times.values() if t.succeeded_at is not None),
        notes=notes,
    )


def table(results: Sequence[QueueResult]) -> str:
    by_op = {r.operator: r for r in results}
    ours, theirs = by_op.get(operator_bench.OURS), by_op.get(operator_bench.KUBEFLOW)
    any_r = ours or theirs
    assert any_r is not None
    title = (
        f"**{any_r.jobs} jobs x {any_r.replicas} replicas through one ClusterQueue that fits "
        f"{any_r.fit} at a time** (Kueue v0.19.2; TrainJob vs TFJob with Kueue's own TFJob "
        "integration and training-operator v1.9.4)"
    )
    lines = [
        title,
        "",
        "| | TrainJob operator | training-operator (TFJob) |",
        "|---|---|---|",
    ]
    for label, attr, unit in ROWS:
        cells = [
            operator_bench.fmt(getattr(r, attr), unit) if r is not None else "-"
            for r in (ours, theirs)
        ]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    for r in (ours, theirs):
        if r is not None:
            lines.append(f"\n{r.operator}: {r.completed}/{r.jobs} Succeeded")
            lines.extend(f"\n{r.operator}: {note}" for note in r.notes)
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/kueue_queue.py", description=__doc__)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--fit", type=int, default=10, help="jobs the ClusterQueue's quota fits")
    p.add_argument("--operator", choices=[*operator_bench.OPERATORS, "both"], default="both")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--write-results", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    operators = list(operator_bench.OPERATORS) if args.operator == "both" else [args.operator]
    if operator_bench.KUBEFLOW in operators:
        operator_bench.kubeflow_binary()
    tools = Tools.locate().require()
    results: list[QueueResult] = []
    with operator_bench.bench_workdir(args.workdir) as workdir:
        plane = ControlPlane(tools=tools, workdir=workdir / "cp")
        with plane:
            plane.apply_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")))
            frameworks = ["batch/job"]
            groups = [KUEUE_GROUP]
            if operator_bench.KUBEFLOW in operators:
                # Kueue's TFJob integration needs the TFJob CRD before it starts.
                bench = operator_bench.Bench(plane, workdir, args.replicas, 60)
                bench.prepare_kubeflow()
                frameworks.append(TFJOB_FRAMEWORK)
                groups.append("kubeflow.org")
            plane.start_kwok(config=operator_bench.kwok_config(workdir))
            kueue = start_kueue(
                plane,
                pods_ready_timeout="30m",
                extra_config={
                    "integrations": {
                        "frameworks": frameworks,
                        "externalFrameworks": [EXTERNAL_FRAMEWORK],
                    }
                },
                webhook_groups=groups,
            )
            info = operator_bench.machine_info(plane)
            print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            timeout = args.timeout if args.timeout is not None else 180 + 3 * args.jobs
            bench = operator_bench.Bench(
                plane,
                workdir,
                args.replicas,
                timeout,
                operator_args={operator_bench.OURS: ["--kueue"]},
            )
            for operator in operators:
                print(
                    f"== {operator}: {args.jobs} jobs x {args.replicas}, fit {args.fit}", flush=True
                )
                t0 = time.monotonic()
                results.append(run(bench, operator, args.jobs, args.fit))
                print(f"   done in {time.monotonic() - t0:.0f} s", flush=True)
            kueue.stop()
    rendered = table(results)
    print(rendered, flush=True)
    if args.write_results is not None:
        command = "python bench/kueue_queue.py " + " ".join(
            a
            for a in (sys.argv[1:] if argv is None else argv)
            if not a.startswith(("--json", "--workdir", "--write"))
        )
        with args.write_results.open("a", encoding="utf-8") as out:
            out.write(f"\n## Kueue: queued jobs\n\n`{command.strip()}`\n\n{rendered}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"machine": info, "results": [r.__dict__ for r in results]}, indent=2)
        )
    failed = any(r.notes or r.completed < r.jobs for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
