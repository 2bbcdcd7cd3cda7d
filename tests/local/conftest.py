"""Helpers for local-mode tests: write TrainJobs, run `trainjob run`, poll run directories."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

import pytest
import yaml

from tests.support import waits
from trainjob import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05
T = TypeVar("T")


def job_manifest(name: str, replica_specs: Mapping[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"replicaSpecs": dict(replica_specs), **spec},
    }


def command_replica(
    code: str, replicas: int = 1, restart_policy: str = "Never", grace: int | None = None
) -> dict[str, Any]:
    """A replica type whose process is `python -c CODE` (no TensorFlow)."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "tensorflow", "image": "none", "command": ["python", "-c", code]}]
    }
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    return {"replicas": replicas, "restartPolicy": restart_policy, "template": {"spec": pod_spec}}


def run_main(argv: Sequence[str], *, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """`trainjob run ARGV` in this process (what `python -m trainjob run` does)."""
    return cli.main(["run", *argv], out=out, stdin=stdin)


def write_job(path: Path, manifest: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(manifest), sort_keys=False))
    return path


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINJOB_", "DTENSOR_"))}
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def start_run(args: Sequence[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """`trainjob run ARGS` as a process in its own session (signals reach only it)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainjob", "run", *args],
            cwd=str(cwd),
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish_run(run: subprocess.Popen[bytes], log: Path, timeout: float) -> tuple[int, str]:
    """Wait for a `start_run` process (killing its process group if it outlives `timeout`);
    (exit code, its output)."""
    try:
        code = run.wait(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    return code, log.read_text()


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    on_fail: Callable[[], str] = lambda: "",
) -> T:
    """The tests' one wait, polling every POLL_S, failing with what `on_fail` tells."""
    return waits.wait_until(
        predicate, timeout=timeout, what=what, interval=POLL_S, on_timeout=lambda: f"\n{on_fail()}"
    )


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "progress.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no port and no memory)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_alive(pgid: int) -> list[int]:
    """Pids of live processes in a process group."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


@pytest.fixture
def run_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path
