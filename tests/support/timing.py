"""Where the test run's time went: each test's tier, wall-clock span and outcome, one JSON line
per test, and the table ``bash tests/run`` prints at its end from those lines.

The plugin (tests/conftest.py loads it) writes only when ``TRAINJOB_TIMINGS`` names a file. It
records in the process that runs the test, so under pytest-xdist every worker appends its own
lines (each line is one ``write`` to a file opened for appending: whole lines, never mixed) and
the controller writes none. A tier's wall time is the span from its first test's start to its
last test's end, which is what a tier costs when its tests run side by side; the sum of its
tests' durations says how much work that span held.

On 2 cores the tiers side by side are CPU-bound, so a test's CPU time says more of what it
costs the run than its wall time: each line has the CPU seconds that the process running the
test and its children (a `trainjob run` and the TensorFlow replicas it waited for, a
module's operator, a session's control plane) used while the test ran. getrusage counts a
child only once it is waited for, all its life at once, which put a session's control plane
in the worker's last test and an unwaited process in whichever later test reaped it (a 1.6 s
unit test once showed 226 s); so the children still running are read from /proc at each
test's start and end as well, and a long-lived child's CPU is spread over the tests it ran
beside. A grandchild is counted when its own parent waits for it.

``python -m tests.support.timing report FILE [PHASES]`` prints the table; PHASES is the file in
which ``tests/run`` wrote one ``name seconds`` line per phase (set-up, each pytest session).
It exits 1 when a test took longer than the budget (tests/budgets.py) and is not listed there
with its reason. ``--machine-seconds S`` scales the budget for a machine slower than the usual
one: S is what ``python -m tests.support.timing calibrate`` printed on it (``tests/run`` runs it
first, on CPUs nothing else is using yet).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from tests import budgets

TIMINGS_ENV: Final = "TRAINJOB_TIMINGS"
TIERS: Final = ("unit", "integration", "training", "local", "e2e")
BESIDE_E2E: Final = "beside e2e"
BESIDE_E2E_ENV: Final = "TRAINJOB_BESIDE_E2E"
SLOWEST: Final = 10
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")

_outcomes: dict[str, str] = {}


@dataclass(frozen=True)
class TestTiming:
    nodeid: str
    tier: str
    outcome: str
    start: float  # seconds since the epoch: comparable across xdist workers
    seconds: float  # set-up, call and tear-down
    cpu: float = 0.0  # CPU seconds of this process and its children while the test ran


def tier_of(item: pytest.Item) -> str:
    """The tier is the test's folder (tests/<tier>/...), as tests/conftest.py marks it: a
    test may carry a second tier's marker too (a local test of real training). The full
    run's session of `beside_e2e` tests (tests/run sets TRAINJOB_BESIDE_E2E) is a row of its
    own: it runs after its tiers, beside the e2e tier."""
    if os.environ.get(BESIDE_E2E_ENV) == "1":
        return BESIDE_E2E
    for tier in TIERS:
        if tier in item.path.parts:
            return tier
    return "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The worst phase outcome of each test run in this process (failed beats passed)."""
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def running_children_cpu() -> float:
    """CPU seconds so far of this process's children that have not been waited for (running
    or exited), with what they in turn waited for: their share that getrusage does not yet
    hold. /proc/self/task/*/children lists each thread's children; /proc/PID/stat fields
    14-17 are utime, stime, cutime and cstime in clock ticks."""
    total_ticks = 0
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids = (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile, or the kernel lacks the file
            continue
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:  # waited for meanwhile: getrusage holds it now
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
            total_ticks += sum(int(tick) for tick in fields[11:15])
    return total_ticks / CLOCK_TICKS


def cpu_seconds() -> float:
    """User and system CPU so far of this process and of all its children, waited for or not.
    A child moves from running_children_cpu to getrusage's count when it is waited for, so
    the sum only grows and a test's share is its difference."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = children.ru_utime + children.ru_stime
    return own.ru_utime + own.ru_stime + waited + running_children_cpu()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    target = os.environ.get(TIMINGS_ENV)
    started, clock, cpu = time.time(), time.monotonic(), cpu_seconds()
    try:
        return (yield)
    finally:
        if target:
            record = TestTiming(
                nodeid=item.nodeid,
                tier=tier_of(item),
                outcome=_outcomes.get(item.nodeid, "passed"),
                start=started,
                seconds=round(time.monotonic() - clock, 3),
                cpu=round(cpu_seconds() - cpu, 2),
            )
            line = json.dumps(record.__dict__) + "\n"
            # one write of one line to a file opened for appending (O_APPEND)
            with open(target, "a", encoding="utf-8") as out:
                out.write(line)


# -- the report ------------------------------------------------------------------------------


def read_timings(lines: Iterable[str]) -> list[TestTiming]:
    found = []
    for line in lines:
        if line.strip():
            found.append(TestTiming(**json.loads(line)))
    return found


@dataclass(frozen=True)
class TierFigures:
    tier: str
    tests: int
    wall: float
    work: float
    cpu: float


def tier_figures(timings: Sequence[TestTiming]) -> list[TierFigures]:
    figures = []
    for tier in (*TIERS, BESIDE_E2E, "other"):
        mine = [t for t in timings if t.tier == tier]
        if mine:
            wall = max(t.start + t.seconds for t in mine) - min(t.start for t in mine)
            work = sum(t.seconds for t in mine)
            figures.append(TierFigures(tier, len(mine), wall, work, sum(t.cpu for t in mine)))
    return figures


def over_budget(timings: Sequence[TestTiming], budget: float) -> list[TestTiming]:
    """Tests slower than `budget` seconds that tests/budgets.py does not list."""
    return [
        t
        for t in timings
        if t.seconds > budget and budgets.listed_reason(t.nodeid, budgets.SLOW_TESTS) is None
    ]


def reference_workload() -> int:
    """A fixed piece of pure Python (dict updates and integer arithmetic, about 0.3 s
    on the usual machine): how long it takes says how fast this machine runs a test's own
    Python, the bulk of what the tiers do."""
    table: dict[int, int] = {}
    total = 0
    for i in range(2_000_000):
        key = i & 1023
        table[key] = table.get(key, 0) + i
        total ^= (i * i) & 0xFFFF
    return total + len(table)


def calibrate(rounds: int = 5) -> float:
    """The fastest of `rounds` runs of the reference workload, in seconds: the fastest, because
    anything else on the machine can only make a round slower."""
    fastest = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        reference_workload()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def machine_factor(measured_seconds: float | None, reference_seconds: float) -> float:
    """How many times slower than the usual machine this one ran the reference workload; 1 for
    a machine as fast or faster, or when it was not measured."""
    if not measured_seconds or reference_seconds <= 0:
        return 1.0
    return max(1.0, measured_seconds / reference_seconds)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


@dataclass(frozen=True)
class Phase:
    """One phase of tests/run: its wall time and, when measured, the share of the machine's
    CPU time that was busy during it (100: every core busy throughout; a phase that mostly
    waits shows a low share, one that more workers would only slow down a high one)."""

    name: str
    seconds: float
    cpu_busy_percent: int | None = None


def report(timings: Sequence[TestTiming], phases: Sequence[Phase]) -> str:
    rows = ["", "== where the time went =="]
    if phases:
        rows.append(f"{'phase':<50}{'wall':>8}{'cpu busy':>10}")
        for p in phases:
            busy = "" if p.cpu_busy_percent is None else f"{p.cpu_busy_percent}%"
            rows.append(f"{p.name:<50}{minutes(p.seconds):>8}{busy:>10}")
        rows.append("")
    rows.append(f"{'tier':<14}{'tests':>7}{'wall':>9}{'test time':>11}{'cpu':>9}")
    for fig in tier_figures(timings):
        rows.append(
            f"{fig.tier:<14}{fig.tests:>7}{minutes(fig.wall):>9}{minutes(fig.work):>11}"
            f"{minutes(fig.cpu):>9}"
        )
    rows.append("")
    rows.append(f"the {SLOWEST} slowest tests:")
    for t in sorted(timings, key=lambda t: -t.seconds)[:SLOWEST]:
        rows.append(f"{t.seconds:>8.1f}s  {t.tier:<12}{t.nodeid}")
    rows.append("")
    rows.append(f"the {SLOWEST} tests that cost the most CPU (seconds of CPU, of wall):")
    for t in sorted(timings, key=lambda t: -t.cpu)[:SLOWEST]:
        rows.append(f"{t.cpu:>8.1f}s {t.seconds:>7.1f}s  {t.tier:<12}{t.nodeid}")
    failed = [t for t in timings if t.outcome == "failed"]
    if failed:
        rows.append(f"{len(failed)} failed")
    return "\n".join(rows)


def read_phases(path: Path | None) -> list[Phase]:
    """tests/run's lines: NAME, seconds and the CPU's busy share ("-": not measured), tab
    separated."""
    if path is None or not path.exists():
        return []
    phases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, seconds, busy = [*line.split("\t"), "", ""][:3]
        if name and seconds:
            phases.append(Phase(name, float(seconds), int(busy) if busy.isdigit() else None))
    return phases


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.timing")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="print where the time went; 1 if over budget")
    rep.add_argument("timings", type=Path)
    rep.add_argument("phases", type=Path, nargs="?")
    rep.add_argument(
        "--machine-seconds",
        type=float,
        default=None,
        help="what `calibrate` measured on this machine: the budget is scaled by it",
    )
    sub.add_parser("calibrate", help="time the reference workload (seconds, to stdout)")
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        print(f"{calibrate():.3f}")
        return 0
    timings = read_timings(
        args.timings.read_text(encoding="utf-8").splitlines() if args.timings.exists() else []
    )
    print(report(timings, read_phases(args.phases)))
    factor = machine_factor(args.machine_seconds, budgets.REFERENCE_WORKLOAD_SECONDS)
    budget = budgets.TEST_BUDGET_SECONDS * factor
    if args.machine_seconds:
        print(
            f"\nthis machine ran the reference workload in {args.machine_seconds:.3f}s "
            f"({budgets.REFERENCE_WORKLOAD_SECONDS:.3f}s on the usual one): a test's budget "
            f"is {budget:.0f}s"
        )
    late = over_budget(timings, budget)
    if late:
        print(
            f"\n{len(late)} test(s) took longer than the budget of "
            f"{budget:.0f}s (tests/budgets.py, {budgets.TEST_BUDGET_SECONDS:.0f}s on the usual "
            f"machine x {factor:.2f}): make them cheaper, or "
            "list them there with the reason they need the time:"
        )
        for t in late:
            print(f"  {t.seconds:.1f}s  {t.nodeid}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
