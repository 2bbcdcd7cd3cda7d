"""The fork server (`trainjob.runtime.forkserver`, driven by `trainjob.local.supervisor`): a
replica forked from the process that imported TensorFlow once sees what `python -m trainjob
train` as a process of its own would, and ends the same way; what it cannot start the same
way it refuses, naming why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from tests.support import waits
from trainjob.core import constants
from trainjob.local import supervisor

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent
ARGV = [sys.executable, "-m", "trainjob", "train"]
ENV_KEYS = [
    constants.ENV_REPLICA_INDEX,
    "TF_USE_LEGACY_KERAS",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF2_BEHAVIOR",
    "TRAINJOB_ONLY_IN_REPLICA",
]


def _env(tmp: Path, name: str, then: str = "exit", code: int = 7) -> dict[str, str]:
    # No cluster: the probe runs at once (a worker of a cluster would wait for its peers).
    env = harness.replica_env(
        {},
        "worker",
        0,
        entrypoint="fork_probe:probe",
        config={
            "report": str(tmp / f"{name}.json"),
            "then": then,
            "code": code,
            "env_keys": ENV_KEYS,
        },
        checkpoint_dir=tmp / "ckpt",
        progress_file=tmp / "progress.jsonl",
    )
    env["PYTHONPATH"] = f"{HERE}{os.pathsep}{harness.REPO_ROOT}"
    return env


@pytest.fixture
def server(tmp_path: Path) -> Iterator[supervisor.ForkServer]:
    # Started with another replica's identity and without the probe's folder on its path:
    # what a replica may differ in.
    env = _env(tmp_path, "server")
    env["PYTHONPATH"] = str(harness.REPO_ROOT)
    started = supervisor.ForkServer.start(env, str(tmp_path))
    assert isinstance(started, supervisor.ForkServer), started
    try:
        yield started
    finally:
        started.close()


def _fork(
    server: supervisor.ForkServer, env: dict[str, str], cwd: Path
) -> supervisor.ForkedProcess:
    read_fd, write_fd = os.pipe()
    try:
        pid = server.spawn(ARGV, env, str(cwd), write_fd)
    finally:
        os.close(write_fd)
    assert isinstance(pid, int), pid
    return supervisor.ForkedProcess(pid, os.fdopen(read_fd, "rb"), server)


def _report(path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return report


def test_a_forked_replica_sees_what_its_own_process_would_and_exits_alike(
    tmp_path: Path, server: supervisor.ForkServer
) -> None:
    own_dir, forked_dir = tmp_path / "own", tmp_path / "forked"
    own_dir.mkdir()
    forked_dir.mkdir()
    env = _env(tmp_path, "forked")
    env["TRAINJOB_ONLY_IN_REPLICA"] = "yes"
    own = subprocess.run(
        ARGV,
        env={**env, "TRAINJOB_CONFIG": env["TRAINJOB_CONFIG"].replace("forked.json", "own.json")},
        cwd=own_dir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        check=False,
    )
    assert own.returncode == 7, own.stdout + own.stderr
    expected = _report(tmp_path / "own.json")

    forked = _fork(server, env, forked_dir)
    assert forked.wait(120) == 7
    assert forked.stdout is not None
    output = forked.stdout.read().decode()
    seen = _report(tmp_path / "forked.json")

    assert "probe: stdout line" in output and "probe: stderr line" in output, output
    assert seen["pid"] == forked.pid != server._popen.pid
    for case, cwd in ((seen, forked_dir), (expected, own_dir)):
        assert case["sid"] == case["pgid"] == case["pid"], case  # its own session and group
        assert case["cwd"] == str(cwd)
        assert case["path_head"] == [str(cwd), str(HERE), str(harness.REPO_ROOT)], case
    for key in ("argv", "main", "env", "stdin", "sigterm_blocked", "log_handlers", "tf_handlers"):
        assert seen[key] == expected[key], key
    assert seen["env"]["TRAINJOB_ONLY_IN_REPLICA"] == "yes"
    assert seen["env"]["TF2_BEHAVIOR"] == "1"  # what TensorFlow's import set stays set
    assert seen["stdin"] == os.devnull

    # Two children of one server draw different numbers, as two processes would.
    other = _fork(server, _env(tmp_path, "other"), forked_dir)
    assert other.wait(120) == 7
    assert _report(tmp_path / "other.json")["random"] != seen["random"]


def test_a_forked_replica_ended_by_a_signal_reports_it_as_popen_would(
    tmp_path: Path, server: supervisor.ForkServer
) -> None:
    replica = _fork(server, _env(tmp_path, "waiting", then="wait"), tmp_path)
    report = tmp_path / "waiting.json"
    waits.wait_until(report.exists, timeout=60, what="the probe's report")
    assert replica.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        replica.wait(0.2)
    os.killpg(replica.pid, signal.SIGKILL)
    assert replica.wait(30) == -signal.SIGKILL
    assert supervisor.container_exit_code(-signal.SIGKILL) == 137


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"TF_ENABLE_ONEDNN_OPTS": "1"}, "TF_ENABLE_ONEDNN_OPTS"),  # read by TensorFlow's import
        ({"PYTHONHASHSEED": "3"}, "PYTHONHASHSEED"),  # read by Python's start
        ({"ONLY_IN_REPLICA": "yes"}, "ONLY_IN_REPLICA"),  # anything not known to be read late
        ({constants.ENV_FRAMEWORK: "Estimator"}, "TF_USE_LEGACY_KERAS"),  # the runtime sets it
    ],
)
def test_a_replica_that_would_start_differently_is_refused_naming_why(
    tmp_path: Path, server: supervisor.ForkServer, change: dict[str, str], named: str
) -> None:
    read_fd, write_fd = os.pipe()
    try:
        answer = server.spawn(
            ARGV, {**_env(tmp_path, "refused"), **change}, str(tmp_path), write_fd
        )
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert isinstance(answer, str) and named in answer, answer
    # The server goes on serving.
    replica = _fork(server, _env(tmp_path, "after"), tmp_path)
    assert replica.wait(120) == 7


def _children(pid: int) -> list[int]:
    """The live children of a process (a forked replica's environment is not in its /proc
    environ: that shows the server's, from its exec)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    return [int(child) for child in text.split()]


def test_a_replica_started_for_a_request_given_up_on_is_stopped(
    tmp_path: Path, server: supervisor.ForkServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server too busy to answer in time: stopped, really, until after the request gave up.
    monkeypatch.setattr(supervisor, "FORK_SERVER_ANSWER_SECONDS", 0.5)
    late_env = _env(tmp_path, "late", then="wait")
    os.kill(server._popen.pid, signal.SIGSTOP)
    # Its output to a file: a replica writing to a pipe nobody reads would end by itself.
    output = os.open(tmp_path / "late.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        answer = server.spawn(ARGV, late_env, str(tmp_path), output)
    finally:
        os.kill(server._popen.pid, signal.SIGCONT)
        os.close(output)
    assert answer == "the fork server did not answer"
    monkeypatch.setattr(supervisor, "FORK_SERVER_ANSWER_SECONDS", 30.0)
    # The server answers the old request first, then this one: each goes to its own.
    replica = _fork(server, _env(tmp_path, "after"), tmp_path)
    assert replica.wait(120) == 7
    waits.wait_until(
        lambda: not _children(server._popen.pid),
        timeout=30,
        what="the replica nobody claimed to be stopped",
    )
