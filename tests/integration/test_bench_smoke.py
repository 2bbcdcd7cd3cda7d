"""Smoke size of the operator scale benchmark (bench/operator_scale.py): 3 TrainJobs x 8
replicas (then 2 jobs timed one by one while 3 run), our operator only, on the benchmark's own
control plane with kwok. Not timed: it checks that the benchmark runs end to end and prints
its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane.cluster import REPO_ROOT, Tools, ToolsMissingError

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
    try:
        Tools.locate().require()
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "operator_scale.py"),
            "--jobs=3",
            "--replicas=8",
            "--operator=trainjob",
            "--timeout=180",
            "--loaded=3",
            "--probes=2",
            f"--json={out}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for figure in FIGURES:
        assert figure in result.stdout, f"{figure!r} missing from:\n{result.stdout}"
    (run,) = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert run["operator"] == "trainjob"
    assert (run["jobs"], run["replicas"]) == (3, 8)
    assert run["completed_children"] == run["completed_succeeded"] == 3
    assert not run["timed_out"] and not run["notes"]
    assert 0 < run["children_p50"] <= run["children_p99"] <= run["succeeded_p99"]
    assert run["operator_requests_per_job"] > 0
    assert run["peak_rss_mib"] > 0
    (loaded,) = json.loads(out.read_text(encoding="utf-8"))["loaded"]
    assert (loaded["jobs"], loaded["probes"]) == (3, 2) and not loaded["notes"]
    assert 0 < loaded["children_p50"] <= loaded["children_p99"] == loaded["children_max"]
    assert "One more job while 3 jobs x 8 replicas run" in result.stdout
