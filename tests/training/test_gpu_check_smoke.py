"""bench/gpu_check.py end to end on this CPU machine: ``--allow-cpu`` at its smallest size runs
the whole flow (preflight probe, the fallback replica, runtime and plain tf-keras on 1 and 2
MultiWorkerMirrored workers) as real processes and writes its JSON; without ``--allow-cpu`` it
stops at the preflight with one error line. Not timed: the rates only have to be real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import training_harness as harness

# Six TensorFlow process groups one after another: on 2 loaded cores (the tiers run side by
# side) the flow took 138 s here; the limits leave room for a slower machine.
pytestmark = [pytest.mark.training, pytest.mark.beside_e2e, pytest.mark.timeout(480)]

SCRIPT = harness.REPO_ROOT / "bench" / "gpu_check.py"


def _gpu_check(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=harness.REPO_ROOT,
        env=harness.base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_allow_cpu_runs_the_whole_flow_and_writes_its_figures(
    tmp_path: Path, mnist_data_dir: Path
) -> None:
    report = tmp_path / "gpu-check.json"
    done = _gpu_check(
        "--allow-cpu",
        "--quick",
        "--epochs=2",
        "--steps=10",
        f"--data-dir={mnist_data_dir}",
        f"--out={tmp_path / 'out'}",
        f"--json={report}",
        timeout=420,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU: not a GPU measurement" in done.stdout
    figures = json.loads(report.read_text())
    assert {"mode", "label", "ok", "host", "tensorflow", "rows", "checks", "wall_s"} <= set(figures)
    assert figures["mode"] == "cpu" and figures["ok"] is True
    assert figures["label"] == "CPU: not a GPU measurement"
    rows = {row["name"]: row for row in figures["rows"]}
    assert list(rows) == ["1 worker, batch 64", "2 workers, batch 64"]
    for row in rows.values():
        assert row["runtime_steps_per_sec"] > 0 and row["plain_steps_per_sec"] > 0
        assert row["ratio"] > 0
        assert row["runtime"]["first_epoch_s"][0] > 0
        assert len(row["runtime_devices"]) == len(row["plain_devices"]) == row["workers"]
        assert all(d["gpus"] == 0 for d in row["runtime_devices"] + row["plain_devices"])
    # The runtime said which all-reduce it built: ring, with no GPU.
    assert rows["2 workers, batch 64"]["collective"] == ["ring", "ring"]
    checks = {check["name"]: check["status"] for check in figures["checks"]}
    assert checks["no silent CPU fallback"] == "pass"
    assert checks["all-reduce (2 workers)"] == "pass"
    assert checks["devices (runtime)"] == checks["devices (plain)"] == "skip"


def test_without_a_gpu_it_stops_at_the_preflight_in_one_line(tmp_path: Path) -> None:
    report = tmp_path / "gpu-check.json"
    done = _gpu_check(f"--out={tmp_path / 'out'}", f"--json={report}", timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("gpu_check: error: "), done.stderr
    assert "--allow-cpu" in error[0]
    assert json.loads(report.read_text())["exit_code"] == 2
