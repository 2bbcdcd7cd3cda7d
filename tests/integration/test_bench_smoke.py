"""Smoke size of the operator scale benchmark (bench/operator_scale.py): 3 jobs x 8 replicas
as TrainJobs and as TFJobs under our operator with `--tfjob` (then 2 jobs timed one by one
while 3 run, for each), on the benchmark's own control plane with kwok; training-operator's
column needs its build (bench/kubeflow/install.sh) and is left out. Not timed: it checks that
the benchmark runs end to end, prints its figures and writes its TFJob section."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.operator_harness import run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.beside_e2e]

FIGURES = (
    "create -> all children, p50",
    "create -> all children, p99",
    "first create -> last Succeeded (total)",
    "operator API requests per job",
    "operator peak RSS",
    "operator CPU seconds (workload)",
)


def test_benchmark_smoke_size_completes_and_prints_figures(tmp_path: Path) -> None:
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\n## Another benchmark\n\nkept as it is\n")
    stdout, figures = run_benchmark(
        "operator_scale.py",
        "--jobs=3",
        "--replicas=8",
        "--operator=trainjob,trainjob-tfjob",
        "--timeout=180",
        "--loaded=3",
        "--probes=2",
        f"--write-tfjob-section={results_md}",
        json_out=tmp_path / "figures.json",
        timeout=600,
    )
    for figure in FIGURES:
        assert figure in stdout, f"{figure!r} missing from:\n{stdout}"
    header = (
        "| TrainJob operator (TrainJob) | TrainJob operator (TFJob) "
        "| ratio ours (TrainJob / TFJob) |"
    )
    assert header in stdout, stdout
    runs = {run["operator"]: run for run in figures["results"]}
    assert list(runs) == ["trainjob", "trainjob-tfjob"]
    for run in runs.values():
        assert (run["jobs"], run["replicas"]) == (3, 8)
        assert run["completed_children"] == run["completed_succeeded"] == 3
        assert run["verified_succeeded"] == 3
        assert not run["timed_out"] and not run["notes"]
        assert 0 < run["children_p50"] <= run["children_p99"] <= run["succeeded_p99"]
        assert run["operator_requests_per_job"] > 0
        assert run["peak_rss_mib"] > 0
    # Our TFJobs end as training-operator's do: the last condition is Succeeded (True).
    tfjob_conditions = runs["trainjob-tfjob"]["final_conditions"]
    assert sum(tfjob_conditions.values()) == 3
    assert all(c.endswith(", Succeeded") for c in tfjob_conditions), tfjob_conditions
    loaded = {run["operator"]: run for run in figures["loaded"]}
    assert list(loaded) == ["trainjob", "trainjob-tfjob"]
    for run in loaded.values():
        assert (run["jobs"], run["probes"]) == (3, 2) and not run["notes"]
        assert 0 < run["children_p50"] <= run["children_p99"] == run["children_max"]
    assert "One more job while 3 jobs x 8 replicas run" in stdout
    written = results_md.read_text()
    assert written.startswith("# Results\n\n## Another benchmark\n\nkept as it is\n")
    assert "## TFJobs: the TrainJob operator's TFJob door vs training-operator" in written
    assert header in written and written.rstrip().endswith("<!-- operator-scale-tfjob:end -->")


def test_kueue_benchmark_smoke_size_completes_and_prints_figures(tmp_path: Path) -> None:
    """bench/kueue_queue.py at 6 jobs x 8 through a ClusterQueue that fits 2, our operator
    only (the TFJob baseline needs training-operator, built by bench/kubeflow/install.sh)."""
    stdout, figures = run_benchmark(
        "kueue_queue.py",
        "--jobs=6",
        "--replicas=8",
        "--fit=2",
        "--operator=trainjob",
        "--timeout=240",
        json_out=tmp_path / "figures.json",
        timeout=480,
    )
    for figure in ("create -> admitted, p50", "queue drain (first create -> last Succeeded)"):
        assert figure in stdout, f"{figure!r} missing from:\n{stdout}"
    (run,) = figures["results"]
    assert (run["operator"], run["jobs"], run["fit"]) == ("trainjob", 6, 2)
    assert run["completed"] == 6 and not run["notes"]
    assert 0 < run["admitted_p50"] <= run["admitted_p99"]
    assert 0 < run["admitted_to_children_p50"] <= run["children_p99"]
    # Three waves of two jobs: the queue cannot drain faster than its slowest admission.
    assert run["drain_seconds"] >= run["admitted_p99"]
