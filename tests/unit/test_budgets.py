"""The slow-test list (tests/budgets.py) names tests that exist, and the report of
tests/support/timing.py adds up tiers and catches a test over budget."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests import budgets
from tests.support import timing

REPO = Path(__file__).resolve().parents[2]


def test_every_listed_slow_test_exists_and_says_why() -> None:
    for nodeid, reason in budgets.SLOW_TESTS.items():
        path, _, function = nodeid.partition("::")
        source = REPO / path
        assert source.is_file(), f"tests/budgets.py lists {nodeid}: no file {path}"
        names = {
            node.name
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef)
        }
        assert function in names, f"tests/budgets.py lists {nodeid}: no such test"
        assert len(reason.split()) >= 5, f"{nodeid}: say why it needs the time"


def timing_of(nodeid: str, tier: str, start: float, seconds: float) -> timing.TestTiming:
    return timing.TestTiming(nodeid, tier, "passed", start, seconds)


def test_a_tier_wall_time_is_the_span_of_its_tests_run_side_by_side() -> None:
    timings = [
        timing_of("a", "integration", 100.0, 30.0),
        timing_of("b", "integration", 110.0, 40.0),  # beside a: ends at 150
        timing_of("c", "unit", 0.0, 5.0),
    ]
    figures = {f.tier: f for f in timing.tier_figures(timings)}
    assert figures["integration"].wall == 50.0
    assert figures["integration"].work == 70.0
    assert figures["unit"].tests == 1


def test_the_smokes_run_beside_the_e2e_tier_are_a_row_of_their_own_not_in_their_tiers() -> None:
    timings = [
        timing_of("tests/integration/test_a.py::test_a", "integration", 0.0, 10.0),
        # The beside_e2e session, after the tiers: it must not stretch integration's span.
        timing_of("tests/integration/test_b.py::test_b", timing.BESIDE_E2E, 2000.0, 50.0),
        timing_of("tests/training/test_c.py::test_c", timing.BESIDE_E2E, 2050.0, 60.0),
    ]
    figures = {f.tier: f for f in timing.tier_figures(timings)}
    assert figures["integration"].wall == 10.0
    assert figures[timing.BESIDE_E2E].tests == 2
    assert figures[timing.BESIDE_E2E].wall == 110.0


def test_a_test_over_budget_is_caught_unless_listed_with_its_parameters_ignored() -> None:
    listed = next(iter(budgets.SLOW_TESTS))
    budget = budgets.TEST_BUDGET_SECONDS
    timings = [
        timing_of("tests/unit/test_x.py::test_slow", "unit", 0.0, budget + 1),
        timing_of(f"{listed}[param]", "e2e", 0.0, budget + 1),
        timing_of("tests/unit/test_x.py::test_fast", "unit", 0.0, budget - 1),
    ]
    late = timing.over_budget(timings, budget)
    assert [t.nodeid for t in late] == ["tests/unit/test_x.py::test_slow"]


def test_the_report_reads_back_what_the_plugin_wrote(tmp_path: Path) -> None:
    lines = [
        '{"nodeid": "t::a", "tier": "unit", "outcome": "passed", "start": 1.0, "seconds": 2.0}',
        '{"nodeid": "t::b", "tier": "e2e", "outcome": "failed", "start": 1.0, "seconds": 9.0}',
    ]
    phases = tmp_path / "phases"
    # tests/run's phase lines: name, seconds, the CPU's busy share ("-": not measured).
    phases.write_text("set-up (tools, images)\t65\t38\ne2e tier\t600.5\t-\n", encoding="utf-8")
    read = timing.read_phases(phases)
    assert read == [
        timing.Phase("set-up (tools, images)", 65.0, 38),
        timing.Phase("e2e tier", 600.5, None),
    ]
    text = timing.report(timing.read_timings(lines), read)
    assert "set-up (tools, images)" in text and "10:00" in text and "38%" in text
    assert text.index("t::b") < text.index("t::a")  # slowest first
    assert "1 failed" in text


def test_the_report_ranks_tests_by_cpu_and_sums_it_per_tier() -> None:
    lines = [
        '{"nodeid": "t::waits", "tier": "integration", "outcome": "passed", "start": 0.0,'
        ' "seconds": 90.0, "cpu": 3.0}',
        '{"nodeid": "t::trains", "tier": "training", "outcome": "passed", "start": 0.0,'
        ' "seconds": 40.0, "cpu": 75.5}',
    ]
    timings = timing.read_timings(lines)
    figures = {f.tier: f for f in timing.tier_figures(timings)}
    assert figures["training"].cpu == 75.5 and figures["integration"].cpu == 3.0
    text = timing.report(timings, [])
    ranked = text[text.index("cost the most CPU") :]
    assert ranked.index("t::trains") < ranked.index("t::waits")
    assert "75.5s" in ranked


def test_a_tests_cpu_counts_the_processes_it_started_and_waited_for() -> None:
    before = timing.cpu_seconds()
    child = subprocess.run(
        [sys.executable, "-c", "import time\nsum(range(3_000_000))\nprint(time.process_time())"],
        capture_output=True,
        text=True,
        check=True,
    )
    spent = timing.cpu_seconds() - before
    assert spent >= float(child.stdout) > 0, (spent, child.stdout)


def test_a_child_still_running_is_counted_while_it_runs_not_when_it_is_waited_for() -> None:
    """A long-lived child (a session's control plane) used to land whole in the test that
    reaped it; its CPU now counts in the span in which it was used."""
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    before = timing.cpu_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", busy + "print(time.process_time(), flush=True)\ninput()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        used = float(child.stdout.readline())  # it has spun and now waits, unwaited for
        while_running = timing.cpu_seconds() - before
        # clock ticks are 10 ms: allow one tick of rounding in each reading
        assert while_running >= used - 0.02 > 0, (while_running, used)
    finally:
        child.communicate("\n", timeout=30)
    after_wait = timing.cpu_seconds()
    # Waited for now: it moves from /proc's count to getrusage's, and is not counted twice
    # (twice would add another 0.3 s; its exit costs a few ms).
    assert after_wait - before < while_running + 0.15, (after_wait - before, while_running)


def test_a_slower_machine_scales_the_budget_and_a_faster_or_unmeasured_one_keeps_it() -> None:
    assert timing.machine_factor(0.875, 0.5) == 1.75
    assert timing.machine_factor(0.25, 0.5) == 1.0  # faster: never a tighter budget
    assert timing.machine_factor(None, 0.5) == 1.0
    assert timing.machine_factor(0.0, 0.5) == 1.0


def test_the_usual_machines_reference_time_is_recorded() -> None:
    # The scaled budget needs it: a measured figure (0.30 s here), not a placeholder.
    assert 0.05 < budgets.REFERENCE_WORKLOAD_SECONDS < 5.0


def test_the_report_fails_a_test_over_the_budget_scaled_for_this_machines_speed(
    tmp_path: Path,
) -> None:
    budget = budgets.TEST_BUDGET_SECONDS
    timings = tmp_path / "timings"
    line = (
        '{"nodeid": "tests/unit/test_x.py::test_slow", "tier": "unit", "outcome": "passed",'
        f' "start": 0.0, "seconds": {budget * 1.5}}}\n'
    )
    timings.write_text(line, encoding="utf-8")
    reference = budgets.REFERENCE_WORKLOAD_SECONDS
    usual = ["report", str(timings), "--machine-seconds", str(reference)]
    twice_as_slow = ["report", str(timings), "--machine-seconds", str(reference * 2)]
    assert timing.main(usual) == 1  # 1.5 budgets on the usual machine: over
    assert timing.main(twice_as_slow) == 0  # the same time where everything takes twice as long
    assert timing.main(["report", str(timings)]) == 1  # unmeasured: the usual machine's budget


def test_calibration_times_a_workload_that_does_the_same_work_each_time() -> None:
    assert timing.reference_workload() == timing.reference_workload()
    assert timing.calibrate(rounds=1) > 0
