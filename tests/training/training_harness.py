"""Start real trainjob replicas on loopback and watch them (for the training tests).

Every wait polls real state (process exit, progress lines) against a deadline; nothing sleeps
blindly. Peak RSS of each replica is sampled from /proc while it runs so tests can report it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.support import ports, waits
from trainjob.core import constants, forkwire
from trainjob.local import supervisor
from trainjob.runtime import forkserver

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.05
T = TypeVar("T")


def cluster_spec(roles: Mapping[str, int]) -> dict[str, list[str]]:
    free = iter(ports.free_port() for _ in range(sum(roles.values())))
    return {role: [f"127.0.0.1:{next(free)}" for _ in range(n)] for role, n in roles.items() if n}


def base_env(python_path: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINJOB_", "DTENSOR_"))}
    env.pop("TF_CONFIG", None)
    # pytest's own note of the test running (it changes from set-up to call): no replica reads
    # it, and replicas differing in it would not be forked from one server.
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(
        PYTHONPATH=str(REPO_ROOT) if python_path is None else python_path,
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_ENABLE_ONEDNN_OPTS="0",
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
    )
    return env


def replica_env(
    cluster: Mapping[str, list[str]],
    task_type: str,
    index: int,
    *,
    entrypoint: str,
    config: Mapping[str, Any],
    checkpoint_dir: Path,
    progress_file: Path,
    strategy: str = "Auto",
    framework: str = "Keras",
) -> dict[str, str]:
    env = base_env()
    if cluster:
        env[constants.ENV_TF_CONFIG] = json.dumps(
            {
                "cluster": cluster,
                "task": {"type": task_type, "index": index},
                "environment": "cloud",
            }
        )
    env.update(
        {
            constants.ENV_JOB_NAME: "test",
            constants.ENV_NAMESPACE: "default",
            constants.ENV_REPLICA_TYPE: task_type,
            constants.ENV_REPLICA_INDEX: str(index),
            constants.ENV_ENTRYPOINT: entrypoint,
            constants.ENV_STRATEGY: strategy,
            constants.ENV_FRAMEWORK: framework,
            constants.ENV_CONFIG: json.dumps(dict(config)),
            constants.ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            constants.ENV_PROGRESS_FILE: str(progress_file),
        }
    )
    return env


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes] | supervisor.ForkedProcess
    log_path: Path
    started: float = field(default_factory=time.monotonic)
    peak_rss_mb: float = 0.0
    ended: float | None = None

    def sample(self) -> int | None:
        """Poll the process: record peak RSS, return its exit code when it has ended."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_mb = max(self.peak_rss_mb, int(line.split()[1]) / 1024)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=30)


# The fork servers of this test process, one for each environment replicas start in (their
# identities aside): the runtime's replicas are forked from them as `trainjob run` forks its
# own (tests/training/test_fork_server.py shows a forked replica is the process it would be).
_fork_servers: dict[frozenset[tuple[str, str]], supervisor.ForkServer | None] = {}


def _forked(
    cmd: Sequence[str], env: Mapping[str, str], cwd: Path, output_fd: int
) -> supervisor.ForkedProcess | None:
    """The replica forked from this test process's server for its environment; None when it
    is not the runtime's train command or the server refuses it (then it runs on its own)."""
    if not forkwire.enabled(os.environ) or forkwire.forkable_module(cmd, sys.executable) is None:
        return None
    # Keyed as the server compares: the environment the runtime prepares for the import.
    prepared = forkserver.prepared(env)
    if isinstance(prepared, str):
        return None  # the replica reports its refused configuration itself
    key = frozenset(forkwire.import_env(prepared).items())
    if key not in _fork_servers:
        started = supervisor.ForkServer.start(env, str(cwd))
        _fork_servers[key] = started if isinstance(started, supervisor.ForkServer) else None
    server = _fork_servers[key]
    if server is None:
        return None
    pid = server.spawn(cmd, env, str(cwd), output_fd)
    if isinstance(pid, str):
        return None
    # No stdout to read, as a Popen writing to a file has none: the output is in the log.
    return supervisor.ForkedProcess(pid, None, server)


def start(
    name: str, env: Mapping[str, str], log_dir: Path, command: Sequence[str] | None = None
) -> Replica:
    log_path = log_dir / f"{name}.log"
    cmd = list(command or [sys.executable, "-m", "trainjob.runtime", "train"])
    with open(log_path, "ab") as log:
        process = _forked(cmd, env, log_dir, log.fileno()) or subprocess.Popen(
            cmd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(log_dir),
            start_new_session=True,
        )
    return Replica(name, process, log_path)


def wait_until(
    predicate: Callable[[], T | None], timeout: float, what: str, replicas: Sequence[Replica] = ()
) -> T:
    """Poll ``predicate`` until it returns a truthy value, sampling each replica (peak RSS,
    exit) before each try; fail with the replicas' logs."""

    def sampled() -> T | None:
        for replica in replicas:
            replica.sample()
        return predicate()

    return waits.wait_until(
        sampled,
        timeout=timeout,
        what=what,
        interval=POLL_S,
        on_timeout=lambda: "\n" + dump_logs(replicas),
    )


def wait_exit(replicas: Sequence[Replica], timeout: float) -> dict[str, int]:
    def done() -> dict[str, int] | None:
        codes = {r.name: r.sample() for r in replicas}
        return None if any(c is None for c in codes.values()) else codes  # type: ignore[return-value]

    return wait_until(done, timeout, f"{[r.name for r in replicas]} to exit", replicas)


def dump_logs(replicas: Sequence[Replica], tail: int = 4000) -> str:
    return "\n".join(
        f"--- {r.name} (exit {r.process.poll()}) ---\n{r.log[-tail:]}" for r in replicas
    )


def stop_all(replicas: Sequence[Replica]) -> None:
    for replica in replicas:
        if replica.process.poll() is None:
            replica.kill()


def read_events(progress_file: Path) -> list[dict[str, Any]]:
    if not progress_file.exists():
        return []
    events = []
    for line in progress_file.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being appended right now
    return events


def events_of(events: Sequence[Mapping[str, Any]], replica: str, kind: str) -> list[Any]:
    return [e for e in events if e["replica"] == replica and e["event"] == kind]


def report(replicas: Sequence[Replica]) -> str:
    """One line per replica: wall time and peak RSS (printed by tests; see with -s or -rA)."""
    return "; ".join(
        f"{r.name}: {((r.ended or time.monotonic()) - r.started):.1f}s, "
        f"peak RSS {r.peak_rss_mb:.0f} MiB"
        for r in replicas
    )
