"""Smoke size of the operator scale benchmark (bench/operator_scale.py): 3 TrainJobs x 8
replicas (then 2 jobs timed one by one while 3 run), our operator only, on the benchmark's own
control plane with kwok. Not timed: it checks that the benchmark runs end to end and prints
its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.operator_harness import run_benchmark

pytestmark = pytest.mark.integration

FIGURES = (
    "create -> all children, p50",
    "create -> all children, p99",
    "first create -> last Succeeded (total)",
    "operator API requests per job",
    "operator peak RSS",
    "operator CPU seconds (workload)",
)


def test_benchmark_smoke_size_completes_and_prints_figures(tmp_path: Path) -> None:
    stdout, figures = run_benchmark(
        "operator_scale.py",
        "--jobs=3",
        "--replicas=8",
        "--operator=trainjob",
        "--timeout=180",
        "--loaded=3",
        "--probes=2",
        json_out=tmp_path / "figures.json",
        timeout=420,
    )
    for figure in FIGURES:
        assert figure in stdout, f"{figure!r} missing from:\n{stdout}"
    (run,) = figures["results"]
    assert run["operator"] == "trainjob"
    assert (run["jobs"], run["replicas"]) == (3, 8)
    assert run["completed_children"] == run["completed_succeeded"] == 3
    assert not run["timed_out"] and not run["notes"]
    assert 0 < run["children_p50"] <= run["children_p99"] <= run["succeeded_p99"]
    assert run["operator_requests_per_job"] > 0
    assert run["peak_rss_mib"] > 0
    (loaded,) = figures["loaded"]
    assert (loaded["jobs"], loaded["probes"]) == (3, 2) and not loaded["notes"]
    assert 0 < loaded["children_p50"] <= loaded["children_p99"] == loaded["children_max"]
    assert "One more job while 3 jobs x 8 replicas run" in stdout
