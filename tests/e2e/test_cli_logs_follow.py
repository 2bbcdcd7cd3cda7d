"""`trainjob logs JOB -f` on a real cluster: a running replica's lines stream as the kubelet
writes them, across a restart of its container (restartPolicy OnFailure: the kubelet restarts
it in place, a new log), until Ctrl-C, which ends the command with 130 and no traceback.

Found broken with kubernetes 37 (each stream's thread died on the client's check of
`_request_timeout=(30.0, None)`: nothing streamed, tracebacks on Ctrl-C). The integration tier
follows a Pod's log served by kwok (tests/integration/test_cluster_logs_follow.py); only a
real kubelet restarts a container and ends the old run's stream."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import pytest
import yaml

from tests.controlplane.e2e_cluster import REPO_ROOT, Cluster
from tests.e2e.conftest import IMAGE_TAG

pytestmark = pytest.mark.e2e

RUNTIME_IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}"
# Two container runs with the kubelet's 10 s back-off between them, image present.
FOLLOW_TIMEOUT: Final = 240.0
# Each run names itself, prints five lines a second apart, then fails (exit 3): OnFailure
# restarts it in place.
RUN: Final = (
    "import time, uuid\n"
    "run = uuid.uuid4().hex[:8]\n"
    "for i in range(5):\n"
    "    print(f'run {run} line {i}', flush=True)\n"
    "    time.sleep(1)\n"
    "raise SystemExit(3)\n"
)
JOB: Final = {
    "apiVersion": "trainjob.dev/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "chatty"},
    "spec": {
        "replicaSpecs": {
            "worker": {
                "replicas": 1,
                "restartPolicy": "OnFailure",
                "template": {
                    "spec": {
                        "securityContext": {"runAsNonRoot": True},
                        "containers": [
                            {
                                "name": "tensorflow",
                                "image": RUNTIME_IMAGE,
                                "command": ["python", "-c", RUN],
                            }
                        ],
                    }
                },
            }
        },
        "runPolicy": {"backoffLimit": 10},
    },
}
LAST_LINE: Final = re.compile(r"^worker-0 \| run ([0-9a-f]{8}) line 4$", re.MULTILINE)


def test_logs_follow_streams_across_a_container_restart_until_ctrl_c(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "chatty.yaml"
    manifest.write_text(yaml.safe_dump(JOB))
    env = {k: v for k, v in cluster.env.items() if not k.startswith("TRAINJOB_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    submitted = subprocess.run(
        [sys.executable, "-m", "trainjob", "submit", "-f", str(manifest), "-n", namespace],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "trainjob", "logs", "chatty", "-f", "-n", namespace],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    seen = b""
    try:
        deadline = time.monotonic() + FOLLOW_TIMEOUT
        while len(set(LAST_LINE.findall(seen.decode(errors="replace")))) < 2:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
            assert ready, f"two whole runs not followed in {FOLLOW_TIMEOUT:g}s: {seen.decode()}"
            chunk = os.read(process.stdout.fileno(), 65536)
            assert chunk, f"it ended before two runs: {seen.decode()}"
            seen += chunk
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    out = (seen + rest).decode(errors="replace")
    runs = list(dict.fromkeys(LAST_LINE.findall(out)))
    assert len(runs) >= 2, out
    for run in runs[:2]:  # each run's five lines, once each, in order
        mine = [line for line in out.splitlines() if f"run {run} " in line]
        assert mine == [f"worker-0 | run {run} line {i}" for i in range(5)], out
    assert process.returncode == 130, (out, err)
    assert b"Traceback" not in err, err.decode()
