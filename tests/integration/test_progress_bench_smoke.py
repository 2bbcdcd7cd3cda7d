"""Smoke size of the progress-report benchmark (bench/progress_load.py): 5 running TrainJobs,
a 5 s window without reports, then 5 s with each job reporting every 2 s, on the benchmark's
own control plane. Not timed: it checks that the benchmark runs end to end, that every report
was accepted and became visible in status, and that it prints its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.operator_harness import run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.beside_e2e]


def test_progress_benchmark_smoke_size_completes(tmp_path: Path) -> None:
    stdout, figures = run_benchmark(
        "progress_load.py",
        "--jobs=5",
        "--interval=2",
        "--window=5",
        json_out=tmp_path / "figures.json",
        timeout=300,
    )
    assert "report -> visible p50 / p99 / max" in stdout, stdout
    baseline, loaded = figures["phases"]
    assert baseline["codes"] == {} and baseline["progress_writes_per_s"] == 0
    assert set(loaded["codes"]) == {"202"} and loaded["codes"]["202"] >= 10, loaded
    assert loaded["unseen"] == 0 and loaded["visible_p99"] < 5, loaded
