"""The executor with real, tiny, non-TensorFlow processes: policy applied to processes."""

from __future__ import annotations

import io
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from trainjob.local import supervisor

from .conftest import (
    command_replica,
    group_alive,
    job_manifest,
    pid_alive,
    read_json,
    run_main,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.training

# Worker 0 fails with SIGKILL (137) on its first attempt and succeeds on the next: a marker file
# in the checkpoint dir stands for "training state survived the restart". Worker 1 serves until
# it is stopped (by the group restart, then by worker 0's success): were it to kill itself too,
# it could be stopped before doing so on one attempt and do it on the next, a second restart.
KILLED_ONCE = (
    "import os, signal, pathlib, time\n"
    "if os.environ['TRAINJOB_REPLICA_INDEX'] != '0':\n"
    "    print('serving', flush=True)\n"
    "    while True: time.sleep(0.1)\n"
    "m = pathlib.Path(os.environ['TRAINJOB_CHECKPOINT_DIR'], 'worker0')\n"
    "if not m.exists():\n"
    "    m.write_text('1'); print('first attempt', flush=True); os.kill(os.getpid(), 9)\n"
    "print('resumed', flush=True)\n"
)
SLEEP_FOREVER = "import time\nprint('serving', flush=True)\nwhile True: time.sleep(1)"


def _run(tmp_path: Path, manifest: dict[str, object]) -> tuple[int, str]:
    path = write_job(tmp_path / "job.yaml", manifest)
    out = io.StringIO()
    code = run_main(["-f", str(path), "--run-dir", str(tmp_path / "run")], out=out)
    return code, out.getvalue()


def test_exit_code_mapping() -> None:
    assert supervisor.container_exit_code(0) == 0
    assert supervisor.container_exit_code(3) == 3
    assert supervisor.container_exit_code(-9) == 137
    assert supervisor.container_exit_code(-15) == 143


def test_success_with_prefixed_logs_saved_to_files(tmp_path: Path) -> None:
    manifest = job_manifest("ok", {"worker": command_replica("print('hello from worker')", 2)})
    code, out = _run(tmp_path, manifest)
    assert code == 0, out
    # worker-0's line: its success ends the job, so worker-1 may be stopped before it prints
    # (it was, once, on a loaded machine).
    assert "worker-0 | hello from worker" in out
    assert "TrainJob ok Succeeded" in out
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert "hello from worker" in log
    assert read_json(tmp_path / "run" / "status.json")["state"] == "Succeeded"


def test_killed_group_restarts_under_exit_code_and_succeeds(tmp_path: Path) -> None:
    manifest = job_manifest(
        "restart",
        {"worker": command_replica(KILLED_ONCE, 2, "ExitCode")},
        runPolicy={"backoffLimit": 2},
    )
    code, out = _run(tmp_path, manifest)
    assert code == 0, out
    assert "Restarting worker 0, worker 1 after worker 0 exited with code 137" in out
    assert "! worker-0 exited with code 137: killed by SIGKILL" in out
    assert "restarts:   1 (backoffLimit 2)" in out
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert "attempt 0 started" in log and "attempt 1 started" in log
    assert "resumed" in log


def test_permanent_error_fails_at_once_with_its_exit_code(tmp_path: Path) -> None:
    manifest = job_manifest(
        "bug",
        {"worker": command_replica("raise SystemExit(3)", 1, "ExitCode")},
        runPolicy={"backoffLimit": 5},
    )
    code, out = _run(tmp_path, manifest)
    assert code == 1
    assert "worker 0 exited with code 3; restartPolicy ExitCode does not retry it" in out
    assert "worker-0=3 (Failed, attempt 0)" in out
    assert "restarts:   0" in out


def test_backoff_limit_stops_retrying(tmp_path: Path) -> None:
    manifest = job_manifest(
        "flaky",
        {"worker": command_replica("import os; os.kill(os.getpid(), 9)", 1, "ExitCode")},
        runPolicy={"backoffLimit": 2},
    )
    code, out = _run(tmp_path, manifest)
    assert code == 1
    assert "BackoffLimitExceeded" in out
    assert "worker-0=137 (Failed, attempt 2)" in out


def test_ps_is_stopped_after_the_chief_succeeds(tmp_path: Path) -> None:
    manifest = job_manifest(
        "ps",
        {
            "chief": command_replica("print('done')"),
            "ps": command_replica(SLEEP_FOREVER, grace=5),
        },
    )
    started = time.monotonic()
    code, out = _run(tmp_path, manifest)
    assert code == 0, out
    assert time.monotonic() - started < 20
    assert "ps-0=- (Stopped, attempt 0)" in out
    pid = read_json(tmp_path / "run" / "processes.json")["ps-0"]["pid"]
    assert not pid_alive(pid)


def test_active_deadline_fails_the_job(tmp_path: Path) -> None:
    manifest = job_manifest(
        "slow",
        {"worker": command_replica(SLEEP_FOREVER, 2, grace=5)},
        runPolicy={"activeDeadlineSeconds": 1},
    )
    code, out = _run(tmp_path, manifest)
    assert code == 1
    assert "DeadlineExceeded" in out


def test_sigint_stops_every_child_group_and_exits_130(tmp_path: Path) -> None:
    # A replica that ignores SIGTERM and has a child of its own: SIGKILL after the grace period
    # must take the whole process group.
    stubborn = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    manifest = job_manifest(
        "stop",
        {"worker": command_replica(stubborn, 2, grace=2)},
    )
    write_job(tmp_path / "job.yaml", manifest)
    run = start_run(["-f", "job.yaml", "--run-dir", "run"], tmp_path, tmp_path / "out.log")
    try:

        def both_alive() -> dict[str, Any] | None:
            procs = read_json(tmp_path / "run" / "processes.json")
            ok = procs and len(procs) == 2 and all(v["alive"] for v in procs.values())
            return procs if ok else None

        processes = wait_until(
            both_alive,
            30,
            "both replicas started",
            (tmp_path / "out.log").read_text,
        )
        wait_until(
            lambda: (tmp_path / "out.log").read_text().count("| up") == 2,
            30,
            "both replicas up",
            (tmp_path / "out.log").read_text,
        )
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=30) == 130
    finally:
        if run.poll() is None:
            run.kill()
    out = (tmp_path / "out.log").read_text()
    assert "Interrupted" in out
    for info in processes.values():
        assert group_alive(info["pid"]) == [], out
