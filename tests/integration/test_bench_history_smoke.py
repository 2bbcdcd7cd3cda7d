"""Smoke size of the history benchmark (bench/operator_history.py): 40 TrainJobs (4 running x
2 replicas, 36 finished) in 20 namespaces, our operator only, on the benchmark's own control
plane with kwok. Not timed: it checks that every phase runs end to end (the running jobs, the
history written while no operator runs, the restart on it, the rest, new jobs one by one and
in a burst) and that the figures it reports are measured, not left out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration.operator_harness import run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.beside_e2e]


def test_history_benchmark_smoke_size_completes_and_prints_figures(tmp_path: Path) -> None:
    stdout, figures = run_benchmark(
        "operator_history.py",
        "--sizes=40",
        "--replicas=2",
        "--operator=trainjob",
        "--rest=5",
        "--probes=2",
        "--burst=3",
        json_out=tmp_path / "figures.json",
        timeout=600,
    )
    for figure in ("start-up -> every job looked at", "CPU at rest", "burst: create -> all"):
        assert figure in stdout, f"{figure!r} missing from:\n{stdout}"
    (run,) = figures["results"]
    assert (run["operator"], run["jobs"], run["running"], run["replicas"]) == ("trainjob", 40, 4, 2)
    assert not run["notes"], run["notes"]
    for name in (
        "running_ready_seconds",
        "seed_seconds",
        "startup_seconds",
        "startup_peak_rss_mib",
        "rest_cpu_cores",
        "rest_requests_per_minute",
        "steady_rss_mib",
        "probe_p50",
        "burst_total",
        "relist_seconds",
    ):
        assert math.isfinite(run[name]) and run[name] >= 0, (name, run[name])
    assert 0 < run["probe_p50"] <= run["probe_p99"]
    assert run["burst"] == 3 and 0 < run["burst_p50"] <= run["burst_p99"] <= run["burst_total"]
    # The peak is VmHWM read when start-up ends; the steady figure is VmRSS read after the rest,
    # which may have grown since (a few KiB of caches), so each is only checked to be real.
    assert run["startup_peak_rss_mib"] > 0 and run["steady_rss_mib"] > 0
