"""The TrainJob operator as a child process (`python -m trainjob_operator`, what its
Deployment runs), against a cluster named by a kubeconfig, logging to a file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tests.support import ports, processes, waits

REPO_ROOT: Final = Path(__file__).resolve().parents[2]


class Operator:
    """The operator as a subprocess (what a Deployment runs), logging to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.extra_env = env or {}
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = args
        self.metrics_port = ports.free_port()
        self.liveness_port = ports.free_port()
        self.child: processes.LoggedProcess | None = None

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The operator's process once started (its pid, its exit code)."""
        return self.child.process if self.child is not None else None

    def start(self) -> Operator:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "operator")]),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        argv = [
            sys.executable,
            "-m",
            "trainjob_operator",
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            *self.args,
        ]
        process = processes.spawn_logged(argv, self.log, env=env)
        self.child = processes.LoggedProcess(process, self.log)
        return self

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    def wait_serving(self, timeout: float = 30.0) -> Operator:
        """Wait until the liveness endpoint answers 200 (the operator has started up)."""
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        return self.wait_answering(
            lambda: waits.http_ok(url), "the operator's liveness endpoint", timeout
        )

    def wait_answering(
        self, probe: Callable[[], bool], what: str, timeout: float = 30.0
    ) -> Operator:
        """Wait until `probe` passes; fail with the operator's log if it exits first."""
        waits.wait_until(lambda: probe() or not self.running(), timeout=timeout, what=what)
        assert self.running(), self.log_tail()
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies under the operator."""
        if self.child is not None and self.running():
            self.child.kill()

    def stop(self) -> None:
        if self.child is not None and self.running():
            self.child.stop(grace=10.0)

    def log_tail(self, lines: int = 60) -> str:
        return processes.log_tail(self.log, lines)
