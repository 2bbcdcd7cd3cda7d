"""bench/checkpoint_store.py end to end at its smallest size: the same 2-worker
MultiWorkerMirrored job with its checkpoints on a local directory, on versitygw's ``s3://`` and
on fake-gcs-server's ``gs://`` (one run each), printing and writing its figures. Not timed: the
figures only have to be real (positive, every store's ratios computed); speed is compared in
the benchmark's own run (bench/RESULTS.md), never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import training_harness as harness

# Three 2-worker TensorFlow jobs one after another: 114-147 s here on 2 cores at load 6-13
# (listed in tests/budgets.py); the limits leave room for a slower machine.
pytestmark = [pytest.mark.training, pytest.mark.beside_e2e, pytest.mark.timeout(450)]

SCRIPT = harness.REPO_ROOT / "bench" / "checkpoint_store.py"


def test_checkpoint_store_benchmark_runs_all_three_targets_and_prints_ratios(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    report = tmp_path / "figures.json"
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nkept\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--epochs=2",
            "--steps=2",
            "--ballast-mb=1",
            "--repeats=1",
            f"--data-dir={mnist_data_dir}",
            f"--json={report}",
            f"--write-results={results}",
        ],
        cwd=harness.REPO_ROOT,
        env=harness.base_env(),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("| local directory (baseline) |", "| s3:// (versitygw) |", "| gs:// (fake-gcs"):
        assert row in done.stdout, done.stdout
    figures = json.loads(report.read_text())
    targets = {t["target"]: t for t in figures["targets"]}
    assert list(targets) == ["local", "s3", "gs"]
    for target in targets.values():
        assert target["runs"] == 1 and target["checkpoints"] == 2  # one per epoch
        assert target["checkpoint_s_median"] > 0 and target["steps_per_sec_median"] > 0
    assert targets["local"]["checkpoint_ratio"] is None
    for store in ("s3", "gs"):
        assert targets[store]["checkpoint_ratio"] > 0
        assert targets[store]["steps_per_sec_ratio"] > 0
        assert targets[store]["overhead"] < 1
    # The checkpoint holds the 1 MiB ballast besides the model and its optimizer's slots.
    assert figures["checkpoint_bytes"] > 2**20
    (gs_run,) = [r for r in figures["runs"] if r["target"] == "gs"]
    assert gs_run["store_requests"] > 0  # TensorFlow really wrote through the fake GCS
    written = results.read_text()
    assert written.startswith("# Results\n\nkept\n")
    assert "## Checkpoints on object storage" in written
    assert "python bench/checkpoint_store.py --epochs=2" in written
    assert str(mnist_data_dir) not in written and str(report) not in written
