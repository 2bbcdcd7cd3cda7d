"""The 2-worker example on real pods vs `trainjob run` of the same file: where the time goes.

    sudo .venv/bin/python bench/e2e_timings.py [--runs 2] [--write-results bench/RESULTS.md]

On real pods (the node of tests/controlplane/node.py, brought up here, with the images of
``bash images/build.sh`` and the chart's operator): ``kubectl apply`` -> both worker pods
Running (kubelet) -> both replicas printed their ``start`` event (TensorFlow imported, strategy
built) -> the first progress event with a step >= 1 ("first steps reported": the runtime
reports at epoch ends and every few steps; in this example that is the end of the first
40-step epoch) -> the TrainJob's Succeeded condition. Locally: ``trainjob run`` started -> both
``start`` events -> first steps reported -> the command's exit. Step and start times
come from the runtime's own progress events (their ``time`` field; pods share this machine's
clock); pod phases and conditions are polled every 0.2 s. Each run uses a fresh namespace (and
run dir); the first run of each side counts like the others, so the table shows its spread.
``--write-results`` replaces the e2e section of that markdown file (between its markers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench import report_sections  # noqa: E402 - the repository root is put on sys.path above
from tests.controlplane.e2e_cluster import (  # noqa: E402
    Cluster,
    create_job_namespace,
    install_operator,
    open_cluster,
)

EXAMPLE = REPO_ROOT / "examples" / "mnist-multiworker.yaml"
JOB = "mnist-multiworker"
WORKERS = (f"{JOB}-worker-0", f"{JOB}-worker-1")
BEGIN = "<!-- e2e-timings:begin -->"
END = "<!-- e2e-timings:end -->"
PHASES = ("all Running", "all started", "first steps reported", "Succeeded")


def _first_step(events: list[dict[str, Any]]) -> float | None:
    times = [e["time"] for e in events if (e.get("step") or 0) >= 1 and e.get("event") != "start"]
    return min(times) if times else None


def _all_started(events: list[dict[str, Any]], replicas: int) -> float | None:
    starts: dict[str, float] = {}
    for e in events:
        if e.get("event") == "start":
            starts.setdefault(str(e.get("replica")), float(e["time"]))
    return max(starts.values()) if len(starts) >= replicas else None


def on_pods(cluster: Cluster) -> dict[str, float]:
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    create_job_namespace(cluster, namespace)
    try:
        t0 = time.time()
        cluster.apply(namespace, EXAMPLE)
        marks: dict[str, float] = {}
        # Read while the job runs: once it succeeds, the operator stops and deletes pods that
        # are still running, and their logs go with them.
        logs: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKERS}
        deadline = time.monotonic() + 900
        while "Succeeded" not in marks:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{namespace}/{JOB} did not succeed in 900 s")
            now = time.time()
            if "all Running" not in marks:
                pods = cluster.job_pods(namespace, JOB)
                phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
                if all(phases.get(w) == "Running" for w in WORKERS):
                    marks["all Running"] = now
            events = [e for w in WORKERS for e in logs[w]]
            if _all_started(events, len(WORKERS)) is None or _first_step(events) is None:
                for w in WORKERS:
                    logs[w] = cluster.progress(namespace, w) or logs[w]
            conditions = cluster.conditions(namespace, JOB)
            if conditions.get("Failed") == "True":
                raise RuntimeError(f"{namespace}/{JOB} failed")
            if conditions.get("Succeeded") == "True":
                marks["Succeeded"] = now
            time.sleep(0.2)
        events = [e for w in WORKERS for e in logs[w]]
        started, step = _all_started(events, len(WORKERS)), _first_step(events)
        if started is None or step is None:
            raise RuntimeError(f"no start/step events in the workers' logs: {events}")
        marks["all started"], marks["first steps reported"] = started, step
        return {k: v - t0 for k, v in marks.items()}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def local() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        trainjob = Path(sys.executable).parent / "trainjob"
        t0 = time.time()
        result = subprocess.run(
            [trainjob, "run", "-f", EXAMPLE, "--run-dir", Path(tmp) / "run", "--no-tty", "-q"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        end = time.time()
        if result.returncode != 0:
            raise RuntimeError(f"trainjob run failed:\n{result.stdout[-3000:]}{result.stderr}")
        # The local executor collects every replica's progress events in the run dir.
        progress = (Path(tmp) / "run" / "progress.jsonl").read_text(encoding="utf-8")
        events = [json.loads(line) for line in progress.splitlines() if line.strip()]
        started, step = _all_started(events, len(WORKERS)), _first_step(events)
        if started is None or step is None:
            raise RuntimeError(f"no start/step events in the run's progress.jsonl: {events}")
        return {
            "all started": started - t0,
            "first steps reported": step - t0,
            "Succeeded": end - t0,
        }


def _median(runs: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def table(pods: list[dict[str, float]], procs: list[dict[str, float]]) -> str:
    lines = [
        "| from `kubectl apply` / `trainjob run` to | real pods (median) | runs | "
        "`trainjob run` (median) | runs | ratio pods / local |",
        "|---|---:|---|---:|---|---:|",
    ]
    for key in PHASES:
        a, b = _median(pods, key), _median(procs, key)
        runs_a = ", ".join(f"{r[key]:.1f}" for r in pods if key in r) or "-"
        runs_b = ", ".join(f"{r[key]:.1f}" for r in procs if key in r) or "-"
        ratio = f"{a / b:.2f}x" if a is not None and b else "-"
        lines.append(f"| {key} | {_seconds(a)} | {runs_a} | {_seconds(b)} | {runs_b} | {ratio} |")
    return "\n".join(lines)


def image_sizes() -> str:
    flags = subprocess.run(
        ["bash", REPO_ROOT / "images" / "build.sh", "--storage-flags"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = subprocess.run(
        ["buildah", *flags, "images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split(" ", 1) for line in out.splitlines() if line.startswith("docker.io/")]
    body = "\n".join(f"| `{name}` | {size.strip()} |" for name, size in sorted(rows))
    return "| image (built by `bash images/build.sh`) | size (uncompressed) |\n|---|---:|\n" + body


def section(
    command: str, pods: list[dict[str, float]], procs: list[dict[str, float]], sizes: str
) -> str:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"""{BEGIN}
## End to end on real pods: the 2-worker example

Generated by `{command}` (bench/e2e_timings.py; method in its docstring) on
{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, {os.cpu_count()} cores, kernel
{platform.release()}, load average at the end {load}. Real pods: the node built on this machine
(tests/controlplane/node.py: kubelet + kube-proxy v1.34, containerd, runc, CNI bridge, CoreDNS),
the operator installed by its Helm chart, the `trainjob/trainjob` image; the same file runs
locally with `trainjob run`. Times are seconds from `kubectl apply` (or from starting `trainjob
run`); "all started" and "first steps reported" (the end of the first 40-step epoch) come from
the runtime's progress events.

{table(pods, procs)}

{sizes}
{END}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--write-results", type=Path, default=None)
    args = parser.parse_args(argv)
    procs = []
    for i in range(args.runs):
        procs.append(local())
        print(f"trainjob run #{i + 1}: {procs[-1]}", flush=True)
    pods = []
    with open_cluster() as cluster:
        install_operator(cluster, "docker.io/trainjob/trainjob-operator", "0.1.0")
        sizes = image_sizes()
        for i in range(args.runs):
            pods.append(on_pods(cluster))
            print(f"real pods #{i + 1}: {pods[-1]}", flush=True)
    print(table(pods, procs))
    print(sizes)
    if args.write_results is not None:
        command = "python bench/e2e_timings.py " + " ".join(argv or sys.argv[1:])
        report_sections.write_section(
            args.write_results, section(command.strip(), pods, procs, sizes), BEGIN, END
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
