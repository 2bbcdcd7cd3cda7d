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

The same workload then runs as TFJobs (kubeflow.org/v1), twice: under our operator started
with ``--tfjob`` (its TFJob door: the same engine, TFJob status and training-operator's Pod
names and labels; the TFJob CRD from crds/kubeflow/, no training-operator webhook entry
registered meanwhile, as our operator requires) and under Kubeflow's training-operator (built
by ``bash bench/kubeflow/install.sh`` with its shipped defaults: QPS 20, burst 30, one worker
thread; only the tfjob scheme is enabled and it watches one namespace, neither of which
changes its throughput). The two TFJob runs get the same TFJob bodies, and kwok ends their
Pods by the same Stage (bench-tfjob-succeed, keyed on the training.kubeflow.org/job-name
label both operators put on a TFJob's Pods); a TFJob counts as Succeeded when its last
condition is Succeeded True, and after each run a list of the jobs checks that every counted
job still shows that. The operators run on the same control plane in the same run, one after
the other (TrainJob, our TFJob door, training-operator), each in its own namespace, each with
one unmeasured warm-up job first.

Usage (from the repository root)::

    .venv/bin/python bench/operator_scale.py                      # 500 x 8, all three runs
    .venv/bin/python bench/operator_scale.py --sizes 500 --loaded 0 \
        --write-tfjob-section bench/RESULTS.md                   # RESULTS.md's TFJob section
    .venv/bin/python bench/operator_scale.py --jobs 100 --replicas 8
    .venv/bin/python bench/operator_scale.py --sizes 1,100,500 --trainjob-only-sizes 1000 \
        --write-results bench/RESULTS.md                         # what RESULTS.md shows
    .venv/bin/python bench/operator_scale.py --jobs 3 --operator trainjob   # smoke size

Needs ``bash tests/controlplane/install.sh`` (control plane, kwok) and, for the baseline,
``bash bench/kubeflow/install.sh``. Everything listens on 127.0.0.1 except training-operator's
webhook server, which binds every interface (it has no flag for the address). The workload,
the watch, the operators' processes and the Bench it runs on are bench/operator_bench.py's,
shared with the other operator benchmarks.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import report_sections  # noqa: E402 - after the sys.path line above
from bench.operator_bench import (  # noqa: E402
    KINDS,
    KUBEFLOW,
    OURS,
    OURS_TFJOB,
    Bench,
    BenchError,
    JobTimes,
    Kind,
    Obj,
    OperatorProcess,
    Tracker,
    api_counts,
    bench_workdir,
    flow_schema,
    fmt,
    kubeflow_binary,
    kubeflow_version,
    kwok_config,
    machine_info,
    percentile,
    proc_stats,
    replica_counts,
)
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.tools import Tools  # noqa: E402

# --------------------------------------------------------------------------- the runs


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
    # Jobs that a list after the run shows Succeeded (Kind.succeeded; a TFJob: its last
    # condition), of those the watch counted, and the jobs' conditions in that list (types
    # and statuses in order, e.g. "Created, Running False, Succeeded") -> how many jobs.
    verified_succeeded: int = 0
    final_conditions: dict[str, int] = field(default_factory=dict)
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


def conditions_summary(job: Obj) -> str:
    """A job's conditions in order, each as its type, with its status unless True."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return (
        ", ".join(
            str(c.get("type")) + ("" if c.get("status") == "True" else f" {c.get('status')}")
            for c in conditions
        )
        or "(none)"
    )


class ScaleBench(Bench):
    """The burst and responsiveness runs of this benchmark on the shared Bench."""

    # -- one run -------------------------------------------------------------------------

    def _setup(self, operator: str, namespace: str) -> tuple[Kind, Tracker, str, OperatorProcess]:
        """A fresh namespace watched by a Tracker and served by a started operator; returns
        the job kind, the tracker, the jobs' collection path and the operator process."""
        kind = KINDS[operator]
        if operator == KUBEFLOW:
            self.prepare_kubeflow()
        elif operator == OURS_TFJOB:
            self.prepare_tfjob_door()
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

            tracker.create_timed(jobs_path, bodies)
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
        counted = {n for n in names if tracker.jobs.get(n, JobTimes()).succeeded_at is not None}
        verified, final_conditions = self.verify_succeeded(kind, jobs_path, counted)
        if verified < len(counted):
            notes.append(
                f"{len(counted) - verified} of the {len(counted)} jobs the watch saw Succeeded "
                "do not show it in a list after the run"
            )
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
            verified_succeeded=verified,
            final_conditions=final_conditions,
            notes=notes,
        )

    def verify_succeeded(
        self, kind: Kind, jobs_path: str, counted: set[str]
    ) -> tuple[int, dict[str, int]]:
        """How many of the `counted` jobs a list now shows Succeeded (Kind.succeeded), and
        the conditions of every measured job in it (conditions_summary -> jobs)."""
        verified = 0
        summaries: collections.Counter[str] = collections.Counter()
        for job in self.api.list(jobs_path):
            name = (job.get("metadata") or {}).get("name")
            if name == "warmup":
                continue
            summaries[conditions_summary(job)] += 1
            verified += name in counted and kind.succeeded(job)
        return verified, dict(summaries.most_common())

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

            def never_ending(names: Sequence[str]) -> dict[str, Obj]:
                return {name: kind.body(name, self.replicas, False) for name in names}

            tracker.create_timed(jobs_path, never_ending(background))
            deadline = time.monotonic() + self.timeout
            if not tracker.wait(background, succeeded=False, running=True, deadline=deadline):
                notes.append(f"the {jobs} background jobs were not all Running in time")
            for i in range(probes if not notes else 0):
                name = f"probe-{i:03d}"
                tracker.create_timed(jobs_path, never_ending([name]))
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


# --------------------------------------------------------------------------- reporting


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


# The runs a table shows, in column order, and the ratios it shows for them: (baseline,
# candidate, header), baseline / candidate, so above 1 means the candidate is faster or
# cheaper. Training-operator against ours on TrainJobs only where our TFJob run is absent
# (the two-column tables); with it, the like-for-like TFJob ratio and what the TFJob door
# costs against our TrainJob run.
COLUMN_ORDER: Final = (OURS, OURS_TFJOB, KUBEFLOW)
RATIOS: Final = (
    (KUBEFLOW, OURS, "ratio (theirs / ours)"),
    (KUBEFLOW, OURS_TFJOB, "ratio TFJob (theirs / ours)"),
    (OURS, OURS_TFJOB, "ratio ours (TrainJob / TFJob)"),
)


def column_label(operator: str, kinds_shown: bool) -> str:
    """A column's header; `kinds_shown`: the table has our TFJob run, so each column also
    names the kind its jobs were."""
    if operator == KUBEFLOW:
        name = f"training-operator {kubeflow_version()}"
        return f"{name} (TFJob)" if kinds_shown else name
    if kinds_shown:
        return (
            "TrainJob operator (TFJob)"
            if operator == OURS_TFJOB
            else "TrainJob operator (TrainJob)"
        )
    return "TrainJob operator" + (" --tfjob" if operator == OURS_TFJOB else "")


def _ratio(baseline: float, candidate: float) -> str:
    """baseline / candidate; two decimals below 2, where a few percent matter."""
    if not candidate or math.isnan(baseline) or math.isnan(candidate):
        return "-"
    ratio = baseline / candidate
    return f"{ratio:.1f}x" if ratio >= 2 else f"{ratio:.2f}x"


def _markdown(
    title: str, by_op: Mapping[str, Any], rows: Sequence[tuple[str, str, str]]
) -> list[str]:
    """Title and table: one column per run present (COLUMN_ORDER), then the RATIOS whose two
    runs are both present."""
    shown = [op for op in COLUMN_ORDER if by_op.get(op) is not None]
    kinds_shown = OURS_TFJOB in shown
    ratios = [
        (base, cand, header)
        for base, cand, header in RATIOS
        if base in shown
        and cand in shown
        and not (kinds_shown and (base, cand) == (KUBEFLOW, OURS))
    ]
    header = ["metric", *(column_label(op, kinds_shown) for op in shown)]
    header += [h for _, _, h in ratios]
    lines = [
        title,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    for label, attr, unit in rows:
        values = {op: float(getattr(by_op[op], attr)) for op in shown}
        row = [label, *(fmt(values[op], unit) for op in shown)]
        row += [_ratio(values[base], values[cand]) for base, cand, _ in ratios]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _by_operator(results: Sequence[RunResult] | Sequence[LoadedResult]) -> dict[str, Any]:
    by_op: dict[str, Any] = {r.operator: r for r in results}
    if not by_op:
        raise ValueError("no results to report")
    return by_op


def table(results: Sequence[RunResult]) -> str:
    """The markdown report of one burst size."""
    by_op = _by_operator(results)
    any_r: RunResult = next(iter(by_op.values()))
    counts = " + ".join(f"{n} {t}" for t, n in replica_counts(any_r.replicas).items() if n)
    title = f"**{any_r.jobs} jobs x {any_r.replicas} replicas** ({counts})"
    lines = _markdown(title, by_op, ROWS)
    ordered: list[RunResult] = [by_op[op] for op in COLUMN_ORDER if op in by_op]
    if OURS_TFJOB in by_op:
        lines.extend(
            f"\n{r.operator}: {r.completed_succeeded}/{r.jobs} Succeeded by the watch, "
            f"{r.verified_succeeded} of them confirmed by a list after the run; conditions "
            "then: " + "; ".join(f"[{c}] x{n}" for c, n in r.final_conditions.items())
            for r in ordered
        )
    for r in ordered:
        if r.timed_out:
            lines.append(
                f"\n{r.operator}: TIMED OUT: {r.completed_children}/{r.jobs} jobs had all "
                f"children, {r.completed_succeeded}/{r.jobs} Succeeded"
            )
        lines.extend(f"\n{r.operator}: {note}" for note in r.notes)
    return "\n".join(lines) + "\n"


def loaded_table(results: Sequence[LoadedResult]) -> str:
    """The markdown report of the responsiveness run."""
    by_op = _by_operator(results)
    any_r: LoadedResult = next(iter(by_op.values()))
    title = (
        f"**One more job while {any_r.jobs} jobs x {any_r.replicas} replicas run** "
        f"({any_r.probes} jobs created one at a time)"
    )
    lines = _markdown(title, by_op, LOADED_ROWS)
    for op in COLUMN_ORDER:
        if op in by_op:
            lines.extend(f"\n{op}: {note}" for note in by_op[op].notes)
    return "\n".join(lines) + "\n"


RESULTS_HEADER: Final = """\
# Operator scale benchmark: TrainJob operator vs Kubeflow training-operator v1

Generated by `{command}` (bench/operator_scale.py; method in its docstring). Each size runs
the operators one after the other on the same control plane (real etcd + kube-apiserver +
kube-controller-manager + kube-scheduler, kwok fake nodes), each in its own namespace, each
after one unmeasured warm-up job. Times are from the benchmark's create request to the
arrival of the watch event; "children" are the job's Pods and headless Services (one each per
replica, for both operators). Operator API requests are counted by the API server (API
Priority and Fairness dispatches of a FlowSchema that matches only that operator's service
account). The ratio column is training-operator / ours: above 1 means ours is faster or
cheaper (with our TFJob run as a third column, the ratios are those of the TFJob section).
training-operator runs with its shipped defaults (QPS 20, burst 30, 1 worker thread);
ours runs as in its image, where the `kubernetes` Python package is not installed.
The machine may be shared with other work (see the load average): compare the columns
of one run, not figures across runs.

## Machine

{machine}

## Results
"""


def _other_sections(path: Path) -> str:
    """What `path` holds after this benchmark's report: every section from the first heading
    or section marker after its `## Results` (the other benchmarks' sections); "" for none."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    results = text.find("\n## Results\n")
    if results < 0:
        return ""
    offset = results + len("\n## Results\n")
    starts = [text.find(m, offset) for m in ("\n## ", "\n<!-- ")]
    found = [i for i in starts if i >= 0]
    return text[min(found) :].strip() + "\n" if found else ""


def write_results(path: Path, command: str, info: dict[str, str], tables: Sequence[str]) -> None:
    """The scale report at the top of `path`; the sections after it (other benchmarks', the
    TFJob section) are kept."""
    machine = "\n".join(f"- {k}: {v}" for k, v in info.items())
    text = RESULTS_HEADER.format(command=command, machine=machine)
    text += "\n" + "\n".join(tables)
    rest = _other_sections(path)
    path.write_text(text + ("\n" + rest if rest else ""), encoding="utf-8")


TFJOB_BEGIN: Final = "<!-- operator-scale-tfjob:begin -->"
TFJOB_END: Final = "<!-- operator-scale-tfjob:end -->"


def tfjob_section(command: str, info: Mapping[str, str], tables: Sequence[str]) -> str:
    """The TFJob comparison as its own section of RESULTS.md, between its markers."""
    machine = "; ".join(f"{k} {v}" for k, v in info.items())
    rendered = "\n".join(tables)
    return f"""{TFJOB_BEGIN}
## TFJobs: the TrainJob operator's TFJob door vs training-operator {kubeflow_version()}

`{command}` (bench/operator_scale.py; method in its docstring). One run, on one control
plane, one after the other, each in its own namespace after one unmeasured warm-up job: our
operator on the TrainJob workload, our operator started with `--tfjob` on the same workload
as TFJobs (`kubeflow.org/v1`), and training-operator on the very same TFJobs (same bodies;
kwok ends the chief of either operator's TFJob by the same Stage, after 500 ms; the job
Succeeds and its running Pods are deleted, cleanPodPolicy Running). A TFJob counts as Succeeded
when its last condition is Succeeded True (what KFP's launcher and `kubectl get tfjob` read),
and a list of the jobs after each run confirms it. Ratios are baseline / candidate, above 1
meaning the candidate is faster or cheaper: "TFJob (theirs / ours)" is training-operator /
our TFJob door, "ours (TrainJob / TFJob)" is our TrainJob run / our TFJob run (below 1: the
TFJob door costs more than the TrainJob door). Other columns and methods as in the scale
benchmark above. The machine may be shared with other work (see its load average): compare
the columns of one run. machine: {machine}

{rendered}{TFJOB_END}
"""


# --------------------------------------------------------------------------- main


def operator_list(value: str) -> list[str]:
    """--operator: the runs named, in COLUMN_ORDER."""
    aliases = {"all": list(COLUMN_ORDER), "both": [OURS, KUBEFLOW]}
    named = {n for part in value.split(",") for n in aliases.get(part.strip(), [part.strip()])}
    unknown = named - set(COLUMN_ORDER)
    if unknown or not named:
        raise argparse.ArgumentTypeError(
            f"unknown run(s) {', '.join(sorted(unknown)) or value!r}: choose from "
            f"{', '.join(COLUMN_ORDER)}, all, both"
        )
    return [op for op in COLUMN_ORDER if op in named]


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
        type=operator_list,
        default=list(COLUMN_ORDER),
        help=f"which runs, comma-separated, run in the order {', '.join(COLUMN_ORDER)}: "
        f"{OURS} (TrainJobs), {OURS_TFJOB} (TFJobs, our operator with --tfjob), {KUBEFLOW} "
        "(TFJobs, training-operator); 'all' (the default) or 'both' (the first and the last)",
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
    p.add_argument(
        "--write-results",
        type=Path,
        help="write the scale report at the top of this markdown file (bench/RESULTS.md), "
        "keeping the sections after it",
    )
    p.add_argument(
        "--write-tfjob-section",
        type=Path,
        help=f"write this run's tables as the TFJob section of this markdown file (needs "
        f"{OURS_TFJOB} among the runs; replaces an earlier one, keeps the rest)",
    )
    p.add_argument("--json", type=Path, help="write the raw figures as JSON")
    p.add_argument("--workdir", type=Path, help="keep the control plane state and logs here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.jobs]
    operators: list[str] = args.operator
    if args.write_tfjob_section is not None and OURS_TFJOB not in operators:
        raise SystemExit(f"--write-tfjob-section needs {OURS_TFJOB} among --operator's runs")
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
                bench = ScaleBench(plane, workdir, args.replicas, timeout)
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
                bench = ScaleBench(plane, workdir, args.replicas, timeout)
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
    if args.write_tfjob_section is not None:
        report_sections.write_section(
            args.write_tfjob_section,
            tfjob_section(command.strip(), info, tables),
            TFJOB_BEGIN,
            TFJOB_END,
        )
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
