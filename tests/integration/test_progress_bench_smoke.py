"""Smoke size of the progress-report benchmark (bench/progress_load.py): 5 running TrainJobs,
a 5 s window without reports, then 5 s with each job reporting every 2 s, on the benchmark's
own control plane. Not timed: it checks that the benchmark runs end to end, that every report
was accepted and became visible in status, and that it prints its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane.cluster import REPO_ROOT, Tools, ToolsMissingError

pytestmark = pytest.mark.integration


def test_progress_benchmark_smoke_size_completes(tmp_path: Path) -> None:
    try:
        Tools.locate().require()
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "progress_load.py"),
            "--jobs=5",
            "--interval=2",
            "--window=5",
            f"--json={out}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "report -> visible p50 / p99 / max" in result.stdout, result.stdout
    baseline, loaded = json.loads(out.read_text(encoding="utf-8"))["phases"]
    assert baseline["codes"] == {} and baseline["progress_writes_per_s"] == 0
    assert set(loaded["codes"]) == {"202"} and loaded["codes"]["202"] >= 10, loaded
    assert loaded["unseen"] == 0 and loaded["visible_p99"] < 5, loaded
