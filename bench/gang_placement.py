"""Gang placement benchmark: the default scheduler vs scheduler-plugins' Coscheduling, same run.

On the test control plane with kwok, whose two big default nodes are replaced by ``--nodes``
small ones of ``--node-cpu`` CPUs each, our operator runs N TrainJobs of M replicas (1 chief,
M-1 workers, every container requesting 1 CPU) per *arm*, the arms one after the other on
the same plane, each in its own namespace with its own operator process:

- ``default``: the operator without ``--gang-scheduler``; the plane's kube-scheduler places
  every Pod on its own (what a cluster without a gang scheduler does);
- ``coscheduling:<s>``: the operator with ``--gang-scheduler=scheduler-plugins`` (a PodGroup
  per job, minMember = M, minResources = M CPUs) and scheduler-plugins v0.34.7 running as a
  second scheduler (tests/controlplane/gang.py), restarted per arm with
  ``podGroupBackoffSeconds: <s>``.

kwok plays the Pods: the chief succeeds ``--run-seconds`` after it is Running, the job
Succeeds and the operator deletes the still-running workers (cleanPodPolicy Running), so a job
holds its M CPUs for about the run time. Each arm starts with one unmeasured warm-up job.
Measured from a Pod watch (arrival time of the event in which a Pod first has
``spec.nodeName``: its bind as this client sees it):

- per job, its *spread*: first bind -> last bind, the time it is partially bound (some but not
  all of its Pods on a node); a job whose Pods never all bound (under the default scheduler a
  chief can run and "succeed" while workers are Pending, which a real TensorFlow job could
  not) counts as partially bound from its first bind until it Succeeded or the arm ended;
- how many jobs were partially bound for more than 1 s (the gang invariant: none under
  Coscheduling) and the most jobs partially bound at the same moment;
- makespan: first create -> last job Succeeded, against the ideal
  ``ceil(N*M / total CPUs) * run time`` (perfect waves that fill every CPU, no scheduling,
  start-up or clean-up latency);
- whether every job Succeeded. The workers run until deleted, as TensorFlow workers wait for
  their chief, so the default scheduler can deadlock: every CPU held by workers of jobs whose
  chief never gets a node. An arm ends when all jobs Succeeded, at ``--timeout``, or once
  nothing was bound and no job Succeeded for ``--stall-seconds``; the report then says how
  many CPUs the unfinished jobs held and how many of those had their chief placed (the
  operator's startupDeadlineSeconds, 600 s by default, would end such a deadlock by failing
  the jobs);
- Pods the scheduler marked Unschedulable at least once (PodScheduled=False, from the watch);
- for Coscheduling, from its log (--v=2): PostFilter gang rejections (a member failed to
  schedule while the group had fewer than minMember Pods placed, so the group is marked
  failed and its Pods waiting at Permit are released), the waiting Pods so released
  ("optimistic rejection in PostFilter"), and every failed scheduling attempt by cause;
  the default kube-scheduler of the test bed logs at --v=1, without these lines;
- the CPU seconds of the arm's scheduler process.

Usage (from the repository root)::

    .venv/bin/python bench/gang_placement.py                          # 100 x 8, 10 x 8 CPU
    .venv/bin/python bench/gang_placement.py --jobs 6 --replicas 4 --nodes 2 --node-cpu 4 \\
        --run-seconds 2 --arms default,coscheduling:0                 # smoke size
    .venv/bin/python bench/gang_placement.py --write-results bench/RESULTS.md

Needs ``bash tests/controlplane/install.sh`` (control plane, kwok, scheduler-plugins).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import operator_bench, report_sections  # noqa: E402 - after the sys.path line above
from tests.controlplane.cluster import KWOK_NODES, ControlPlane  # noqa: E402
from tests.controlplane.gang import (  # noqa: E402
    PERMIT_WAITING_SECONDS,
    GangScheduler,
    plugins_version,
    start_gang_scheduler,
)
from tests.controlplane.tools import Tools  # noqa: E402
from tests.support import manifests, waits  # noqa: E402

Obj = dict[str, Any]
JOB_LABEL: Final = "trainjob.dev/job-name"
RUN_DURATION_ANNOTATION: Final = "trainjob.dev/kwok-run-duration"
# scheduler-plugins v0.34.7's messages (pkg/coscheduling), as kube-scheduler logs each failed
# attempt ("Unable to schedule pod") at --v=2; the first cause found in a line counts.
FAILED_ATTEMPT: Final = "Unable to schedule pod"
GANG_REJECTED: Final = "is unschedulable even after PostFilter"
RELEASED: Final = "optimistic rejection in PostFilter"
CAUSES: Final[list[tuple[str, str]]] = [
    # Pods that waited at Permit (holding their node's CPU) and were sent back: by PostFilter
    # (a sibling fit nowhere), by a sibling's Unreserve, or at permitWaitingTimeSeconds.
    ("released by PostFilter", RELEASED),
    ("released by a sibling's Unreserve", "rejection in Unreserve"),
    ("Permit timed out", "rejected due to timeout after waiting"),
    ("siblings not all created", "cannot find enough sibling pods"),
    ("minResources above free capacity", "resource gap"),
    ("group in backoff", "failed recently"),
    ("no node fits", "Insufficient cpu"),
]
OTHER_CAUSE: Final = "other"
# The gang invariant: one Permit release binds a gang's Pods in parallel, well inside this.
PARTIAL_LIMIT_SECONDS: Final = 1.0
BEGIN: Final = "<!-- gang-placement:begin -->"
END: Final = "<!-- gang-placement:end -->"


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """One way of placing the jobs: the default scheduler (backoff None) or Coscheduling with
    podGroupBackoffSeconds = backoff."""

    backoff: int | None

    @property
    def gang(self) -> bool:
        return self.backoff is not None

    @property
    def slug(self) -> str:
        return "default" if self.backoff is None else f"cosched-b{self.backoff}"

    @property
    def label(self) -> str:
        if self.backoff is None:
            return "default-scheduler"
        return f"Coscheduling, podGroupBackoffSeconds {self.backoff}"


def parse_arms(text: str) -> list[Arm]:
    """`default,coscheduling:0,coscheduling:3` -> arms (`coscheduling` alone: backoff 0)."""
    arms = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, backoff = item.partition(":")
        if name == "default" and not backoff:
            arms.append(Arm(None))
        elif name == "coscheduling" and (not backoff or backoff.isdigit()):
            arms.append(Arm(int(backoff or 0)))
        else:
            raise argparse.ArgumentTypeError(
                f"unknown arm {item!r}: use default or coscheduling[:<backoff seconds>]"
            )
    if not arms:
        raise argparse.ArgumentTypeError("no arms")
    return arms


# --------------------------------------------------------------------------- workload


def node_manifests(count: int, cpu: int) -> list[Obj]:
    """`count` kwok nodes of `cpu` CPUs, shaped as the test bed's (tests/controlplane/kwok/
    nodes.yaml) but small, so that CPU, not the control plane, limits how many jobs run."""
    template = next(d for d in yaml.safe_load_all(KWOK_NODES.read_text(encoding="utf-8")) if d)
    nodes = []
    for i in range(count):
        node = copy.deepcopy(template)
        name = f"gang-node-{i}"
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        resources = {"cpu": str(cpu), "memory": "64Gi", "pods": "110"}
        node["status"] = {"allocatable": resources, "capacity": dict(resources)}
        nodes.append(node)
    return nodes


def create_nodes(bench: operator_bench.Bench, count: int, cpu: int) -> None:
    nodes = node_manifests(count, cpu)
    bench.kubectl_apply(nodes)
    names = [n["metadata"]["name"] for n in nodes]
    bench.plane.kubectl(
        "wait", "--for=condition=Ready", "--timeout=60s", "node", *names, timeout=70
    )


def job_body(name: str, replicas: int, run_seconds: float) -> Obj:
    """1 chief + (replicas - 1) workers, 1 CPU each. Only the chief has the kwok exit-code
    annotation: it succeeds `run_seconds` after it is Running, the workers run until the
    operator deletes them, so the job holds all its CPUs for about the run time."""

    def replica(count: int, chief: bool) -> Obj:
        annotations = (
            {operator_bench.EXIT_CODE_ANNOTATION: "0", RUN_DURATION_ANNOTATION: f"{run_seconds:g}s"}
            if chief
            else {}
        )
        container = manifests.container(operator_bench.IMAGE, resources={"requests": {"cpu": "1"}})
        template = {"metadata": {"annotations": annotations}, "spec": {"containers": [container]}}
        return manifests.replica(count, template)

    specs = {"chief": replica(1, True)}
    if replicas > 1:
        specs["worker"] = replica(replicas - 1, False)
    return manifests.trainjob(name, specs, {"cleanPodPolicy": "Running"})


# --------------------------------------------------------------------------- watching


class BindTracker(operator_bench.Tracker):
    """The operator benchmark's Tracker (children, Succeeded), plus, per job and Pod, the
    arrival time of the first watch event that shows the Pod with a node."""

    def __init__(self, api: operator_bench.Api, namespace: str, replicas: int) -> None:
        super().__init__(api, namespace, operator_bench.KINDS[operator_bench.OURS], replicas)
        self.binds: dict[str, dict[str, float]] = {}
        self.unschedulable: dict[tuple[str, str], float] = {}  # (job, Pod) -> first seen

    def _observe(self, what: str, obj: Obj, now: float) -> None:
        super()._observe(what, obj, now)
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        if what != "pods" or not job:
            return
        pod = meta.get("name", "")
        conditions = (obj.get("status") or {}).get("conditions") or []
        refused = any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in conditions
        )
        with self.lock:
            if refused:
                self.unschedulable.setdefault((job, pod), now)
            if (obj.get("spec") or {}).get("nodeName"):
                self.binds.setdefault(job, {}).setdefault(pod, now)


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Placement:
    """One job's binds: first and last, and until when it was partially bound."""

    first: float
    last: float
    complete: bool  # every replica got a node
    partial_until: float

    @property
    def spread(self) -> float:
        return self.partial_until - self.first


def placements(
    binds: Mapping[str, Mapping[str, float]],
    succeeded: Mapping[str, float],
    replicas: int,
    horizon: float,
) -> dict[str, Placement]:
    """Per job with at least one bind. A job that never had all its Pods bound stays partially
    bound until it Succeeded (its Pending Pods are deleted then) or until `horizon`."""
    result = {}
    for job, pods in binds.items():
        if not pods:
            continue
        first, last = min(pods.values()), max(pods.values())
        complete = len(pods) >= replicas
        until = last if complete else min(succeeded.get(job, horizon), horizon)
        result[job] = Placement(first, last, complete, max(until, first))
    return result


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most half-open intervals [start, end) covering one instant (empty ones never count)."""
    events = []
    for start, end in intervals:
        if end > start:
            events += [(start, 1), (end, -1)]
    # At equal times ends (-1) sort before starts: touching intervals do not overlap.
    events.sort()
    current = best = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def ideal_makespan(jobs: int, replicas: int, cpus: int, run_seconds: float) -> float:
    """Waves that fill every CPU, each lasting the run time: the bound no gang placement
    beats (scheduling, Pod start and clean-up latency ignored). Without gangs kwok lets a
    chief run out its time before its workers are placed, which no TensorFlow job can do,
    so the default scheduler may come in under it."""
    return math.ceil(jobs * replicas / cpus) * run_seconds


@dataclass
class SchedulerLog:
    """What a Coscheduling scheduler's log says about the failed attempts of one burst."""

    gang_rejections: int = 0
    released: int = 0
    causes: dict[str, int] = field(default_factory=dict)


def read_scheduler_log(log: Path, start: int, end: int) -> SchedulerLog:
    """Tally the failed scheduling attempts logged between bytes `start` and `end` of `log`."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(end - start).decode("utf-8", errors="replace")
    result = SchedulerLog(causes=dict.fromkeys([c for c, _ in CAUSES] + [OTHER_CAUSE], 0))
    for line in text.splitlines():
        if FAILED_ATTEMPT not in line:
            continue
        result.gang_rejections += GANG_REJECTED in line
        result.released += RELEASED in line
        cause = next((c for c, mark in CAUSES if mark in line), OTHER_CAUSE)
        result.causes[cause] += 1
    return result


@dataclass
class ArmResult:
    arm: str
    backoff: int | None
    jobs: int
    replicas: int
    makespan: float
    ideal: float
    spread_p50: float
    spread_max: float
    partial_over_limit: int
    max_partial_at_once: int
    never_all_bound: int
    succeeded: int
    unschedulable_pods: int
    gang_rejections: int | None
    released: int | None
    scheduler_cpu_seconds: float
    failed_attempts: dict[str, int] = field(default_factory=dict)
    # At the end, the jobs not Succeeded that had Pods on nodes, and the CPUs those held.
    stuck_jobs: int = 0
    stuck_cpus: int = 0
    stuck_with_chief: int = 0
    succeeded_unplaced: int = 0  # Succeeded though some of its Pods never got a node
    notes: list[str] = field(default_factory=list)  # what the arm showed (a deadlock)
    problems: list[str] = field(default_factory=list)  # what went wrong with the benchmark


def summarize(
    arm: Arm,
    names: Sequence[str],
    tracker: BindTracker,
    start: float,
    horizon: float,
    ideal: float,
) -> ArmResult:
    # Only what happened until `horizon`: clearing up an unfinished arm frees CPUs, and the
    # scheduler then binds Pods that are about to be deleted.
    with tracker.lock:
        binds = {
            n: {pod: t for pod, t in tracker.binds.get(n, {}).items() if t <= horizon}
            for n in names
        }
        done = {n: t.succeeded_at for n in names if (t := tracker.jobs.get(n)) and t.succeeded_at}
        refused = sum(
            1 for (job, _), t in tracker.unschedulable.items() if job in binds and t <= horizon
        )
    placed = placements(binds, done, tracker.replicas, horizon)
    spreads = [p.spread for p in placed.values()]
    # Every Pod of an unfinished job that got a node still holds its CPU: nothing deletes it.
    stuck = {n: pods for n, pods in binds.items() if pods and n not in done}
    return ArmResult(
        arm=arm.label,
        backoff=arm.backoff,
        jobs=len(names),
        replicas=tracker.replicas,
        makespan=(max(done.values()) - start) if len(done) == len(names) else float("nan"),
        ideal=ideal,
        spread_p50=operator_bench.percentile(spreads, 50),
        spread_max=max(spreads, default=float("nan")),
        partial_over_limit=sum(1 for s in spreads if s > PARTIAL_LIMIT_SECONDS),
        max_partial_at_once=max_overlap((p.first, p.partial_until) for p in placed.values()),
        never_all_bound=sum(1 for n in names if n not in placed or not placed[n].complete),
        succeeded=len(done),
        unschedulable_pods=refused,
        gang_rejections=None,
        released=None,
        scheduler_cpu_seconds=float("nan"),
        stuck_jobs=len(stuck),
        stuck_cpus=sum(len(pods) for pods in stuck.values()),
        stuck_with_chief=sum(1 for n, pods in stuck.items() if f"{n}-chief-0" in pods),
        succeeded_unplaced=sum(1 for n in done if n not in placed or not placed[n].complete),
    )


# --------------------------------------------------------------------------- one arm


@dataclass
class Plan:
    jobs: int
    replicas: int
    nodes: int
    node_cpu: int
    run_seconds: float
    permit_waiting_seconds: int
    timeout: float
    stall_seconds: float

    @property
    def ideal(self) -> float:
        return ideal_makespan(
            self.jobs, self.replicas, self.nodes * self.node_cpu, self.run_seconds
        )


def start_scheduler(plane: ControlPlane, arm: Arm, plan: Plan) -> GangScheduler | None:
    if arm.backoff is None:
        return None
    # A fresh process (and log) per arm: the backoff is a start-up setting.
    return start_gang_scheduler(
        plane,
        permit_waiting_seconds=plan.permit_waiting_seconds,
        backoff_seconds=arm.backoff,
        name=f"gang-{arm.slug}",
    )


def quiesce(bench: operator_bench.Bench, namespace: str, finished: bool) -> str | None:
    """Leave the nodes empty for the next arm, while the operator still runs (its finalizers):
    stop unfinished jobs, then wait until no Pod of the namespace is Pending or Running."""
    if not finished:
        bench.plane.kubectl("delete", "trainjobs", "--all", "-n", namespace, "--wait=false")

    def idle() -> bool:
        out = bench.plane.kubectl(
            "get",
            "pods",
            "-n",
            namespace,
            "--field-selector=status.phase!=Succeeded,status.phase!=Failed",
            "-o",
            "name",
            check=False,
        ).stdout
        return not out.strip()

    try:
        waits.wait_until(idle, timeout=120, what=f"the Pods of {namespace} to finish", interval=1.0)
    except waits.WaitTimeoutError as exc:  # reported: the next arm starts on busy nodes
        return f"Pods still active after the arm: {exc}"
    return None


def wait_for_jobs(tracker: BindTracker, names: Sequence[str], deadline: float, stall: float) -> str:
    """Wait until every job Succeeded ("finished"), the deadline ("timed out"), or nothing
    (no bind, no Succeeded) happened for `stall` seconds ("stalled": a deadlock, as the
    default scheduler can place a job's workers and never its chief)."""
    while True:
        now = time.monotonic()
        if tracker.wait(names, succeeded=True, deadline=min(deadline, now + 5)):
            return "finished"
        with tracker.lock:
            moments = [t for n in names for t in tracker.binds.get(n, {}).values()]
            moments += [
                t.succeeded_at for n in names if (t := tracker.jobs.get(n)) and t.succeeded_at
            ]
        if time.monotonic() >= deadline:
            return "timed out"
        if moments and time.monotonic() - max(moments) > stall:
            return "stalled"


def warm_up(
    bench: operator_bench.Bench, tracker: BindTracker, path: str, arm: Arm, plan: Plan
) -> None:
    """One unmeasured job: the operator's caches are synced, and the scheduler has placed a
    gang, before the clock starts."""
    name = f"{arm.slug}-warmup"
    bench.api.create(path, job_body(name, plan.replicas, plan.run_seconds))
    if not tracker.wait([name], succeeded=True, deadline=time.monotonic() + 120):
        raise BenchError(f"{arm.label}: the warm-up job did not succeed in 120 s")


def run_arm(plane: ControlPlane, workdir: Path, arm: Arm, plan: Plan) -> ArmResult:
    flags = {operator_bench.OURS: ["--gang-scheduler=scheduler-plugins"]} if arm.gang else {}
    bench = operator_bench.Bench(plane, workdir, plan.replicas, plan.timeout, operator_args=flags)
    gang = start_scheduler(plane, arm, plan)
    scheduler = gang.scheduler if gang is not None else plane.component("kube-scheduler")
    namespace = f"gang-{arm.slug}-{plan.jobs}x{plan.replicas}"
    kubeconfig = bench.operator_identity(operator_bench.OURS)
    bench.namespace(namespace)
    tracker = BindTracker(bench.api, namespace, plan.replicas)
    tracker.start()
    path = f"/apis/trainjob.dev/v1alpha1/namespaces/{namespace}/trainjobs"
    proc = bench.start_operator(operator_bench.OURS, namespace, kubeconfig)
    problems: list[str] = []
    # Job names unique across arms: scheduler-plugins' PodGroup controller pools equal names.
    names = [f"{arm.slug}-{i:04d}" for i in range(plan.jobs)]
    bodies = {n: job_body(n, plan.replicas, plan.run_seconds) for n in names}
    try:
        warm_up(bench, tracker, path, arm, plan)
        cpu_before = operator_bench.proc_stats(scheduler.process.pid).cpu_seconds
        log_offset = scheduler.log.stat().st_size
        start = time.monotonic()
        tracker.create_timed(path, bodies)
        outcome = wait_for_jobs(tracker, names, start + plan.timeout, plan.stall_seconds)
        horizon = time.monotonic()
        cpu = operator_bench.proc_stats(scheduler.process.pid).cpu_seconds - cpu_before
        log_end = scheduler.log.stat().st_size
        problems.extend(n for n in [quiesce(bench, namespace, outcome == "finished")] if n)
        if not proc.running():
            problems.append(f"the operator exited during the run:\n{proc.log_tail()}")
    finally:
        proc.stop()
        tracker.stop()
        if gang is not None:
            gang.stop()
    result = summarize(arm, names, tracker, start, horizon, plan.ideal)
    result.scheduler_cpu_seconds = cpu
    if outcome != "finished":
        result.notes.append(unfinished_note(result, outcome, horizon - start, plan))
    if result.succeeded_unplaced:
        result.notes.append(
            f"{result.succeeded_unplaced} jobs Succeeded with some workers never placed (kwok "
            "ran the chief alone; a TensorFlow chief would have waited for its workers)"
        )
    if gang is not None:
        read = read_scheduler_log(scheduler.log, log_offset, log_end)
        result.gang_rejections, result.released = read.gang_rejections, read.released
        result.failed_attempts = read.causes
        if result.partial_over_limit:
            result.notes.append(
                f"gang invariant broken: {result.partial_over_limit} jobs partially bound "
                f"for more than {PARTIAL_LIMIT_SECONDS:g} s"
            )
    if tracker.errors:
        problems.append("watch errors: " + "; ".join(tracker.errors[:5]))
    result.problems = problems
    return result


def unfinished_note(result: ArmResult, outcome: str, elapsed: float, plan: Plan) -> str:
    when = (
        f"no bind and no job Succeeded for {plan.stall_seconds:g} s"
        if outcome == "stalled"
        else f"the {plan.timeout:g} s limit"
    )
    return (
        f"{outcome} at {elapsed:.0f} s ({when}) with {result.succeeded}/{result.jobs} jobs "
        f"Succeeded; {result.stuck_jobs} unfinished jobs held {result.stuck_cpus} of "
        f"{plan.nodes * plan.node_cpu} CPUs, {result.stuck_with_chief} of them with their "
        "chief placed (unfinished jobs were then deleted)"
    )


# --------------------------------------------------------------------------- reporting


COLUMNS: Final[list[tuple[str, str]]] = [
    ("arm", "arm"),
    ("makespan", "makespan"),
    ("ideal", "ideal"),
    ("spread p50", "spread_p50"),
    ("max spread", "spread_max"),
    (f"jobs partially bound > {PARTIAL_LIMIT_SECONDS:g} s", "partial_over_limit"),
    ("max jobs partially bound at once", "max_partial_at_once"),
    ("jobs never all bound", "never_all_bound"),
    ("Succeeded", "succeeded"),
    ("Pods ever Unschedulable", "unschedulable_pods"),
    ("PostFilter gang rejections", "gang_rejections"),
    ("waiting Pods released by PostFilter", "released"),
    ("scheduler CPU s", "scheduler_cpu_seconds"),
]


def cell(result: ArmResult, attr: str) -> str:
    value = getattr(result, attr)
    if attr == "succeeded":
        return f"{value}/{result.jobs}"
    if value is None:
        return "-"
    if attr in ("makespan", "ideal", "spread_p50", "spread_max"):
        return operator_bench.fmt(value, "s")
    if isinstance(value, float):
        return operator_bench.fmt(value, "")
    return str(value)


def causes_table(results: Sequence[ArmResult]) -> list[str]:
    """Failed scheduling attempts by cause, one row per Coscheduling arm."""
    gang = [r for r in results if r.failed_attempts]
    if not gang:
        return []
    causes = list(gang[0].failed_attempts)
    lines = [
        "",
        "Coscheduling's failed scheduling attempts during the burst, by cause (its log):",
        "",
        "| arm | " + " | ".join(causes) + " | failed attempts |",
        "|---|" + "---:|" * (len(causes) + 1),
    ]
    for r in gang:
        counts = [r.failed_attempts.get(c, 0) for c in causes]
        lines.append(f"| {r.arm} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    return lines


def table(results: Sequence[ArmResult], plan: Plan) -> str:
    title = (
        f"**{plan.jobs} TrainJobs x {plan.replicas} replicas (1 CPU each) on {plan.nodes} kwok "
        f"nodes x {plan.node_cpu} CPU, chief runs {plan.run_seconds:g} s** "
        f"(scheduler-plugins {plugins_version()}, permitWaitingTimeSeconds "
        f"{plan.permit_waiting_seconds})"
    )
    lines = [
        title,
        "",
        "| " + " | ".join(label for label, _ in COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(cell(r, a) for _, a in COLUMNS) + " |" for r in results]
    lines += causes_table(results)
    for r in results:
        lines.extend(f"\n{r.arm}: {note}" for note in [*r.notes, *r.problems])
    return "\n".join(lines) + "\n"


def section(command: str, info: Mapping[str, str], rendered: str) -> str:
    machine = "; ".join(f"{k} {v}" for k, v in info.items())
    return f"""{BEGIN}
## Gang placement: default scheduler vs Coscheduling

`{command}` (bench/gang_placement.py; method in its docstring). The arms run one after the
other on one control plane, each in its own namespace with its own operator process: the
default-scheduler arm runs the operator without `--gang-scheduler` (no PodGroups: what a
cluster without a gang scheduler gets), the Coscheduling arms with
`--gang-scheduler=scheduler-plugins` and a freshly started scheduler-plugins scheduler. kwok
ends each chief after the run time; workers run until the operator deletes them once the job
Succeeded, as TensorFlow workers wait for their chief. Spread = first -> last bind of a job as
a Pod watch sees it (a job never fully bound: until it Succeeded or the arm ended); ideal =
ceil(jobs x replicas / CPUs) x run time. An arm ends early once nothing was bound and no job
Succeeded for a minute (a deadlock). One run on a shared 2-core machine (other work
may run beside it, see the load average): treat the times as +-30 %. machine: {machine}

{rendered}{END}
"""


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/gang_placement.py",
        description="Default scheduler vs Coscheduling: partial placements and makespan.",
    )
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--replicas", type=int, default=8, help="1 chief + the rest workers")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--node-cpu", type=int, default=8)
    p.add_argument("--run-seconds", type=float, default=5.0, help="the chief's run time")
    p.add_argument(
        "--arms",
        type=parse_arms,
        default=parse_arms("default,coscheduling:0,coscheduling:3"),
        help="default and/or coscheduling:<podGroupBackoffSeconds>, in order "
        "(default: default,coscheduling:0,coscheduling:3)",
    )
    p.add_argument("--permit-waiting-seconds", type=int, default=PERMIT_WAITING_SECONDS)
    p.add_argument("--timeout", type=float, help="seconds per arm (default 120 + 6 x ideal)")
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=60.0,
        help="end an arm when nothing was bound and no job Succeeded for this long (default 60)",
    )
    p.add_argument("--write-results", type=Path, help="replace or append its RESULTS.md section")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    p.add_argument("--workdir", type=Path, help="keep the control plane state and logs here")
    args = p.parse_args(argv)
    if args.replicas > args.node_cpu * args.nodes:
        p.error("a job must fit the cluster: --replicas <= --nodes x --node-cpu")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan(
        jobs=args.jobs,
        replicas=args.replicas,
        nodes=args.nodes,
        node_cpu=args.node_cpu,
        run_seconds=args.run_seconds,
        permit_waiting_seconds=args.permit_waiting_seconds,
        timeout=0.0,
        stall_seconds=args.stall_seconds,
    )
    plan.timeout = args.timeout if args.timeout is not None else 120 + 6 * plan.ideal
    command = report_sections.shown_command(
        "bench/gang_placement.py", sys.argv[1:] if argv is None else argv, ("--json", "--workdir")
    )
    tools = Tools.locate().require()
    results: list[ArmResult] = []
    with operator_bench.bench_workdir(args.workdir) as workdir:
        plane = ControlPlane(tools=tools, workdir=workdir / "cp")
        with plane:
            plane.apply_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")))
            plane.start_kwok(nodes=None)  # the test bed's two 1000-CPU nodes would fit all
            create_nodes(
                operator_bench.Bench(plane, workdir, plan.replicas, 0), plan.nodes, plan.node_cpu
            )
            info = operator_bench.machine_info(plane)
            info.pop("training-operator", None)
            print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
            for arm in args.arms:
                print(f"== {arm.label}: {plan.jobs} jobs x {plan.replicas}", flush=True)
                t0 = time.monotonic()
                results.append(run_arm(plane, workdir, arm, plan))
                print(f"   done in {time.monotonic() - t0:.0f} s", flush=True)
    rendered = table(results, plan)
    print(rendered, flush=True)
    if args.write_results is not None:
        report_sections.write_section(
            args.write_results, section(command, info, rendered), BEGIN, END
        )
    if args.json is not None:
        plan_figures = {**asdict(plan), "ideal": plan.ideal}
        payload = {"machine": info, "plan": plan_figures, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    # A deadlock of the default scheduler is a finding; anything else going wrong is not.
    failed = any(r.problems or (r.backoff is not None and r.notes) for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
