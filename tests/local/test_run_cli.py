"""`trainjob run`, `status` and `logs` as a user meets them, with small real processes (no
TensorFlow): up-front refusals, the run-dir lock, a true status after Ctrl-C or a kill, the
failure cause, noise filtering, a port taken at a restart, re-running a Succeeded job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    REPO_ROOT,
    cli_env,
    command_replica,
    group_alive,
    job_manifest,
    read_json,
    start_run,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.local

SERVE = "import time\nprint('serving', flush=True)\nwhile True: time.sleep(0.2)"
TIMEOUT = 60


def trainjob(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainjob", *args],
        cwd=str(cwd),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _clean(result: subprocess.CompletedProcess[str]) -> str:
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    return text


def _alive(run_dir: Path, count: int) -> dict[str, Any] | None:
    procs = read_json(run_dir / "processes.json")
    ok = procs and len(procs) == count and all(v["alive"] for v in procs.values())
    return procs if ok else None


def _stop(run: subprocess.Popen[bytes]) -> None:
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def test_lock_status_logs_and_a_true_status_after_ctrl_c(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", job_manifest("serve", {"worker": command_replica(SERVE, 2)}))
    out = tmp_path / "out.log"
    run = start_run(["-f", "job.yaml"], tmp_path, out)
    run_dir = tmp_path / "trainjob-runs" / "serve"
    try:
        wait_until(lambda: _alive(run_dir, 2), TIMEOUT, "both replicas", out.read_text)
        # A second run on the same run dir is refused before it starts anything.
        second = trainjob("run", "-f", "job.yaml", cwd=tmp_path)
        assert second.returncode == 2, _clean(second)
        assert f"in use by another trainjob run (pid {run.pid})" in second.stderr
        # status and logs, while it runs
        status = trainjob("status", cwd=tmp_path)
        assert (
            status.stdout.splitlines()[0] == f"TrainJob serve: Running (trainjob run pid {run.pid})"
        )
        wait_until(
            lambda: "serving" in trainjob("logs", "worker-1", cwd=tmp_path).stdout,
            TIMEOUT,
            "worker-1's log",
        )
        logs = trainjob("logs", "serve", cwd=tmp_path).stdout
        assert "worker-0 | serving" in logs and "worker-1 | serving" in logs
        follow = subprocess.Popen(
            [sys.executable, "-m", "trainjob", "logs", "-f"],
            cwd=str(tmp_path),
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=TIMEOUT) == 130
        followed, follow_err = follow.communicate(timeout=TIMEOUT)  # ends with the run
        assert follow.returncode == 0 and "Traceback" not in follow_err
        assert "worker-0 | serving" in followed
    finally:
        _stop(run)
    text = out.read_text()
    assert "TrainJob serve Interrupted after" in text
    assert "No checkpoint was written yet" in text and "resume" not in text
    assert "worker-0=143 (Stopped, attempt 0)" in text
    saved = read_json(run_dir / "status.json")
    assert saved["state"] == "Interrupted"
    states = [i["state"] for i in saved["replicaStatuses"]["worker"]["indexes"]]
    assert states == ["Stopped", "Stopped"]
    after = trainjob("status", "serve", "-o", "json", cwd=tmp_path)
    data = json.loads(after.stdout)
    assert (data["state"], data["inProgress"]) == ("Interrupted", False)


def _signal_mask(pid: int, field: str) -> set[signal.Signals]:
    """The signals /proc says the process ignores (SigIgn) or catches (SigCgt)."""
    status = Path(f"/proc/{pid}/status").read_text()
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")]
    bits = int(mask, 16)
    return {s for s in signal.Signals if s < 64 and bits & (1 << (s - 1))}


def test_under_nohup_a_closed_terminal_does_not_stop_the_run(tmp_path: Path) -> None:
    """`nohup trainjob run ... &`: SIGHUP stays ignored, as nohup asked (the window may close
    mid-training); Ctrl-C and SIGTERM still stop it."""
    write_job(tmp_path / "job.yaml", job_manifest("hup", {"worker": command_replica(SERVE, 2)}))
    out = tmp_path / "out.log"
    with open(out, "wb") as log:
        run = subprocess.Popen(
            ["nohup", sys.executable, "-m", "trainjob", "run", "-f", "job.yaml"],
            cwd=str(tmp_path),
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run_dir = tmp_path / "trainjob-runs" / "hup"
    try:
        wait_until(lambda: _alive(run_dir, 2), TIMEOUT, "both replicas", out.read_text)
        assert signal.SIGHUP in _signal_mask(run.pid, "SigIgn")
        assert {signal.SIGINT, signal.SIGTERM} <= _signal_mask(run.pid, "SigCgt")
        run.send_signal(signal.SIGHUP)  # the terminal closing
        assert _alive(run_dir, 2) and run.poll() is None
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=TIMEOUT) == 143, out.read_text()  # not 129: SIGHUP did nothing
    finally:
        _stop(run)
    assert "TrainJob hup Interrupted after" in out.read_text()
    assert read_json(run_dir / "status.json")["state"] == "Interrupted"


def test_a_killed_run_is_unknown_not_running(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", job_manifest("lost", {"worker": command_replica(SERVE, 1)}))
    out = tmp_path / "out.log"
    run = start_run(["-f", "job.yaml", "--run-dir", "run"], tmp_path, out)
    try:
        procs = wait_until(
            lambda: _alive(tmp_path / "run", 1), TIMEOUT, "the replica", out.read_text
        )
        os.kill(run.pid, signal.SIGKILL)  # no chance to clean up or write status
        run.wait(timeout=TIMEOUT)
    finally:
        _stop(run)
        for info in procs.values():
            os.killpg(info["pid"], signal.SIGKILL)
    status = trainjob("status", "run", cwd=tmp_path)
    lines = _clean(status).splitlines()
    assert lines[0] == "TrainJob lost: Unknown"
    assert "but no trainjob run holds this run dir: it was killed" in lines[2]


def test_the_failure_summary_quotes_the_exception_and_the_log(tmp_path: Path) -> None:
    code = "print('loading', flush=True)\nraise ValueError('learning rate must be > 0, got -1')"
    write_job(tmp_path / "job.yaml", job_manifest("bad", {"worker": command_replica(code, 2)}))
    result = trainjob("run", "-f", "job.yaml", "--run-dir", "run", "--quiet", cwd=tmp_path)
    text = _clean(result)
    assert result.returncode == 1, text
    log = tmp_path / "run" / "logs"
    assert "cause:      worker-" in text
    assert ": ValueError: learning rate must be > 0, got -1" in text
    assert f"full log: {log}/worker-" in text
    assert "loading" not in text  # --quiet: the replica's own lines stay in its log


def test_tensorflow_noise_is_hidden_unless_verbose_and_always_logged(tmp_path: Path) -> None:
    noisy = (
        "print('WARNING: All log messages before absl::InitializeLog() is called are written "
        "to STDERR')\n"
        "print('E0000 00:00:1795439303.967021   18621 cuda_platform.cc:52] failed call to "
        "cuInit: INTERNAL: CUDA error')\n"
        "print('my training line', flush=True)\n"
        'print(\'TRAINJOB_PROGRESS {"event": "end", "status": "succeeded"}\')\n'
        "print('peer heartbeat lost after my own end', flush=True)\n"
    )
    write_job(tmp_path / "job.yaml", job_manifest("noisy", {"worker": command_replica(noisy)}))
    plain = _clean(trainjob("run", "-f", "job.yaml", "--run-dir", "a", cwd=tmp_path))
    assert "worker-0 | my training line" in plain
    assert "cuInit" not in plain and "absl::InitializeLog" not in plain
    assert "heartbeat" not in plain  # a replica's teardown after its own successful end
    verbose = _clean(trainjob("run", "-f", "job.yaml", "--run-dir", "b", "--verbose", cwd=tmp_path))
    assert "cuInit" in verbose and "absl::InitializeLog" in verbose and "heartbeat" in verbose
    log = (tmp_path / "a" / "logs" / "worker-0.log").read_text()
    assert "cuInit" in log and "heartbeat" in log


def test_a_succeeded_job_is_not_rerun_without_a_word(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", job_manifest("once", {"worker": command_replica("print(1)")}))
    assert trainjob("run", "-f", "job.yaml", cwd=tmp_path).returncode == 0
    again = trainjob("run", "-f", "job.yaml", cwd=tmp_path)
    assert again.returncode == 2, _clean(again)
    assert "TrainJob once already Succeeded in" in again.stderr and "--rerun" in again.stderr
    assert trainjob("run", "-f", "job.yaml", "--rerun", cwd=tmp_path).returncode == 0


def test_unusable_run_dirs_are_one_line(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", job_manifest("dirs", {"worker": command_replica("print(1)")}))
    (tmp_path / "afile").write_text("x")
    as_file = trainjob("run", "-f", "job.yaml", "--run-dir", "afile", cwd=tmp_path)
    assert as_file.returncode == 2, _clean(as_file)
    assert f"run directory {tmp_path}/afile exists and is not a directory" in as_file.stderr
    under_file = trainjob("run", "-f", "job.yaml", "--run-dir", "afile/run", cwd=tmp_path)
    assert under_file.returncode == 2, _clean(under_file)
    assert "a parent is not a directory" in under_file.stderr
    if os.geteuid() == 0:  # root writes through permission bits: use a place nobody can write
        target, why = "/proc/trainjob-run", "cannot create run directory /proc/trainjob-run"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        target, why = str(tmp_path / "ro" / "run"), "cannot create run directory"
    read_only = trainjob("run", "-f", "job.yaml", "--run-dir", target, cwd=tmp_path)
    assert read_only.returncode == 2, _clean(read_only)
    assert why in read_only.stderr


def test_jobs_this_machine_cannot_run_are_refused_up_front(tmp_path: Path) -> None:
    many = job_manifest("many", {"worker": command_replica("print(1)", replicas=9999)})
    write_job(tmp_path / "many.yaml", many)
    result = trainjob("run", "-f", "many.yaml", cwd=tmp_path)
    assert result.returncode == 2, _clean(result)
    assert "9999 replicas would be 9999 local processes" in result.stderr
    assert "--max-processes 9999" in result.stderr
    four = job_manifest("four", {"worker": command_replica("print(1)", replicas=4)})
    write_job(tmp_path / "four.yaml", four)
    limited = trainjob("run", "-f", "four.yaml", "--max-processes", "3", cwd=tmp_path)
    assert limited.returncode == 2 and "the limit here is 3" in limited.stderr
    assert not (tmp_path / "trainjob-runs").exists()
    # The bundled examples that need what this machine may lack say so in one line.
    custom = trainjob(
        "run", "-f", str(REPO_ROOT / "examples" / "mnist-estimator.yaml"), cwd=tmp_path
    )
    estimator_lines = _clean(custom).strip().splitlines()
    assert custom.returncode == 2 and len(estimator_lines) == 1, estimator_lines
    assert "framework Estimator needs TensorFlow <= 2.15 with tensorflow-estimator" in custom.stderr
    script = job_manifest(
        "script",
        {
            "worker": {
                "replicas": 2,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "tensorflow",
                                "image": "registry/train:1",
                                "command": ["python", "/opt/train/train.py"],
                            }
                        ]
                    }
                },
            }
        },
    )
    write_job(tmp_path / "script.yaml", script)
    missing = trainjob("run", "-f", "script.yaml", cwd=tmp_path)
    assert missing.returncode == 2, _clean(missing)
    assert "runs /opt/train/train.py, which does not exist on this machine" in missing.stderr
    assert "image registry/train:1" in missing.stderr


# A worker that binds its TF_CONFIG port like a TF server (exit 1 when the port is taken, as
# gRPC's "Could not start gRPC server" does), is killed once and succeeds on its restart.
BINDS_PORT = (
    "import json, os, pathlib, signal, socket, sys, time\n"
    "config = json.loads(os.environ['TF_CONFIG'])\n"
    "me = config['task']['index']\n"
    "port = int(config['cluster']['worker'][me].rsplit(':', 1)[1])\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.bind(('', port)); s.listen()\n"
    "except OSError as e:\n"
    "    sys.exit(f'Could not start gRPC server: {e}')\n"
    "marker = pathlib.Path(os.environ['TRAINJOB_CHECKPOINT_DIR'], f'started-{me}')\n"
    "if marker.exists():\n"
    "    print('second attempt', flush=True); sys.exit(0)\n"
    "marker.write_text('1')\n"
    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(3), sys.exit(143)))\n"
    "print('first attempt', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


def test_a_port_taken_at_a_restart_waits_instead_of_failing_the_job(tmp_path: Path) -> None:
    manifest = job_manifest(
        "ports",
        {"worker": command_replica(BINDS_PORT, 2, restart_policy="ExitCode", grace=10)},
    )
    write_job(tmp_path / "job.yaml", manifest)
    out = tmp_path / "out.log"
    # On this machine's network: in the run's own (the default) no other process can take it.
    run = start_run(["-f", "job.yaml", "--run-dir", "run", "--host-network"], tmp_path, out)
    blocker = socket.socket()
    try:
        procs = wait_until(lambda: _alive(tmp_path / "run", 2), TIMEOUT, "both", out.read_text)
        wait_until(lambda: out.read_text().count("first attempt") == 2, TIMEOUT, "both bound")
        port = procs["worker-0"]["port"]
        os.kill(procs["worker-0"]["pid"], signal.SIGKILL)  # 137: retryable, the group restarts
        # worker-1 takes 3 s to stop: time enough to take worker-0's port before the restart.
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wait_until(lambda: _bound(blocker, port), 5, f"port {port} free")
        blocker.listen()
        wait_until(
            lambda: f"port {port} is in use by another process" in out.read_text(),
            TIMEOUT,
            "the wait for the port",
            out.read_text,
        )
        assert run.poll() is None, out.read_text()  # not failed: waiting, like a Pending pod
        blocker.close()
        assert run.wait(timeout=TIMEOUT) == 0, out.read_text()
    finally:
        blocker.close()
        _stop(run)
    text = out.read_text()
    assert "TrainJob ports Succeeded" in text
    assert "second attempt" in text and "Could not start gRPC server" not in text


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("", port))
    except OSError:
        return False
    return True


def test_a_local_run_needs_no_image_and_an_unwritable_data_dir_is_one_line(
    tmp_path: Path,
) -> None:
    manifest = job_manifest(
        "noimage",
        {"worker": {"replicas": 2}},
        runtime={"entrypoint": "trainjob.samples.mnist:build"},
    )
    write_job(tmp_path / "job.yaml", manifest)
    dry = trainjob("run", "-f", "job.yaml", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, _clean(dry)
    assert "worker-1  (noimage-worker-1)" in dry.stdout
    if os.geteuid() == 0:
        data_dir = "/proc/trainjob-data"
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        data_dir = str(tmp_path / "ro" / "data")
    result = trainjob("run", "-f", "job.yaml", "--data-dir", data_dir, cwd=tmp_path)
    text = _clean(result)
    assert result.returncode == 2, text
    assert f"reason:     cannot write the offline MNIST into data dir {data_dir}" in text
    saved = read_json(tmp_path / "trainjob-runs" / "noimage" / "status.json")
    assert saved["state"] == "Failed" and "cannot write" in saved["problem"]


def run_piped(tmp_path: Path, name: str, reader: str) -> subprocess.CompletedProcess[str]:
    """`trainjob run` of a 2-replica job that prints one line per replica and then serves
    on, piped into `reader`; checks that the run stopped as SIGPIPE asks: exit 141, no
    traceback, Interrupted, no replica left."""
    write_job(tmp_path / "job.yaml", job_manifest(name, {"worker": command_replica(SERVE, 2)}))
    shell = subprocess.run(
        f"set -o pipefail; {sys.executable} -m trainjob run -f job.yaml --run-dir run 2>err.txt"
        f" | {reader}",
        shell=True,
        executable="/bin/bash",
        cwd=str(tmp_path),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert shell.returncode == 141, shell
    assert (tmp_path / "err.txt").read_text() == ""
    assert read_json(tmp_path / "run" / "status.json")["state"] == "Interrupted"
    for info in read_json(tmp_path / "run" / "processes.json").values():
        assert not info["alive"]
        assert group_alive(info["pid"]) == []
    return shell


def test_a_reader_that_leaves_after_the_last_line_stops_the_run(tmp_path: Path) -> None:
    """The reader takes every line the run will ever write (both replicas' `serving`) and
    closes the pipe: no later write can fail, yet the run notices and stops (it used to train
    on unseen until killed; CI saw it with `| head -3` reading a fourth line in its chunk)."""
    (tmp_path / "reader.py").write_text(
        "import sys\n"
        "seen = 0\n"
        "for line in sys.stdin:\n"
        "    seen += 'serving' in line\n"
        "    if seen == 2:\n"
        "        break\n"
    )
    run_piped(tmp_path, "quiet", f"{sys.executable} reader.py")


def test_a_closed_pipe_stops_the_run_cleanly(tmp_path: Path) -> None:
    """`trainjob run ... | head -3`: once the reader is gone, every replica is stopped and the
    run exits 141 (128 + SIGPIPE) without a traceback, instead of training on unseen."""
    shell = run_piped(tmp_path, "pipe", "head -3")
    assert len(shell.stdout.splitlines()) == 3


# A replica that reports three steps, then hangs: it neither steps nor exits (a stuck
# collective, a deadlocked input pipeline).
HANGS = (
    "import json, time\n"
    "for step in (1, 2, 3):\n"
    "    event = {'event': 'step', 'step': step, 'replica': 'worker-0', 'chief': True}\n"
    "    print('TRAINJOB_PROGRESS ' + json.dumps(event), flush=True)\n"
    "    time.sleep(0.1)\n"
    "while True: time.sleep(0.2)"
)


def test_a_replica_that_stops_stepping_is_stalled_as_on_a_cluster(tmp_path: Path) -> None:
    """runPolicy.progressDeadlineSeconds in local mode: the same core policy, fed from the
    lead replica's progress events instead of the operator's progress reports."""
    manifest = job_manifest(
        "hang",
        {"worker": command_replica(HANGS, 1)},
        runPolicy={"progressDeadlineSeconds": 3, "progressDeadlineAction": "Fail"},
    )
    write_job(tmp_path / "job.yaml", manifest)
    result = trainjob("run", "-f", "job.yaml", "--run-dir", "run", "--quiet", cwd=tmp_path)
    text = _clean(result)
    assert result.returncode == 1, text
    assert "Stalled" in text, text
    assert "progressDeadlineSeconds=3" in text, text
    assert read_json(tmp_path / "run" / "status.json")["state"] == "Failed"
