"""What a GPU host's NVIDIA driver gives `trainjob run` and the runtime's CUDA library probe,
checked against the real driver, with no TensorFlow needed (bench/gpu_check.py measures
training on GPUs and needs TensorFlow's CUDA build).

    python bench/gpu_driver_check.py [--json FILE]

Checks, each printed with its evidence:

1. **detection**: the GPUs local mode counts (``/proc/driver/nvidia/gpus``, read without
   starting anything) are the GPUs ``nvidia-smi -L`` lists;
2. **sharing out**: ``trainjob run`` runs two jobs whose replicas print what they were given
   and what CUDA then shows them (through PyTorch or CuPy when one is installed, else the
   environment only): a ParameterServer-shaped job (chief, 2 workers, ps) whose workers get
   GPUs and whose chief and ps get none, and an all-reduce-shaped job (2 workers) whose
   workers get GPUs of their own when there are enough (``TRAINJOB_WORKER_GPUS``: the NCCL
   hint) or share with memory growth (``TRAINJOB_GPU_SHARED``) when there are not;
3. **the library probe**: the runtime's ``missing_libraries`` for TensorFlow 2.21's CUDA 12.5
   build loads the driver's ``libcuda.so.1``, and the cause line a replica given a GPU would
   stop with names the first CUDA library this host cannot load (none on a host with
   TensorFlow's NVIDIA wheels installed).

Exit 0 when every check passes, 1 when one fails, 2 when the host has no NVIDIA driver.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from trainjob.local import cli as local_cli  # noqa: E402 - after the sys.path line above
from trainjob.runtime import devices, strategy  # noqa: E402

# TensorFlow 2.21's wheel: build_info's cuda_version and cudnn_version.
TF_CUDA: Final = "12.5.1"
TF_CUDNN: Final = "9"
MARK: Final = "GPUPROBE "

# Runs in each replica process: what it was given and what CUDA shows it.
PROBE: Final = f"""
import json, os
seen = {{"given": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "shared": os.environ.get("TRAINJOB_GPU_SHARED"),
        "worker_gpus": os.environ.get("TRAINJOB_WORKER_GPUS"),
        "growth": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")}}
try:
    import torch
    seen["cuda_sees"] = torch.cuda.device_count()
    seen["names"] = [torch.cuda.get_device_name(i) for i in range(seen["cuda_sees"])]
    seen["via"] = "torch"
except ImportError:
    try:
        import cupy
        seen["cuda_sees"] = cupy.cuda.runtime.getDeviceCount()
        seen["via"] = "cupy"
    except Exception as exc:
        seen["via"] = "environment only (" + type(exc).__name__ + ")"
print({MARK!r} + json.dumps(seen), flush=True)
"""


def job_manifest(name: str, replicas: dict[str, int]) -> dict[str, Any]:
    container = {
        "name": "tensorflow",
        "image": "unused-locally",
        "command": ["python", "-c", PROBE],
    }
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "replicaSpecs": {
                rtype: {"replicas": count, "template": {"spec": {"containers": [container]}}}
                for rtype, count in replicas.items()
            }
        },
    }


def run_job(
    workdir: Path, name: str, replicas: dict[str, int], gpus: str | None
) -> tuple[str, dict[str, Any]]:
    """`trainjob run` (and its --dry-run plan) on a probe job: (plan text, replica -> probe)."""
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(job_manifest(name, replicas)), encoding="utf-8")
    base = [sys.executable, "-m", "trainjob", "run", "-f", str(path)]
    if gpus is not None:
        base += ["--gpus", gpus]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    plan = subprocess.run(
        [*base, "--dry-run"],
        check=False,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    done = subprocess.run(
        base, check=False, cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    probes: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        replica, sep, rest = line.partition("|")
        if sep and rest.strip().startswith(MARK):
            probes[replica.strip()] = json.loads(rest.strip()[len(MARK) :])
    if done.returncode != 0 or not probes:
        probes["_run"] = {"rc": done.returncode, "out": done.stdout[-2000:], "err": done.stderr}
    return plan.stdout + plan.stderr, probes


def smi_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(
        ["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=60
    )
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]


def sees(probe: dict[str, Any], count: int) -> bool:
    """The process was given ``count`` GPUs, and CUDA shows it that many where it can tell."""
    given = [part for part in (probe.get("given") or "").split(",") if part.strip()]
    return len(given) == count and probe.get("cuda_sees", count) == count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--gpus", help="pass --gpus to trainjob run (default: what it detects)")
    args = parser.parse_args(argv)

    listed = smi_gpus()
    detected = local_cli._detected_gpus()  # the CLI's own count
    if not listed and not detected:
        print("gpu_driver_check: no NVIDIA driver here (no nvidia-smi GPUs, no /proc entries)")
        return 2
    results: dict[str, Any] = {"nvidia_smi": listed, "proc_driver_gpus": detected}
    checks: list[tuple[str, bool, str]] = []
    checks.append(
        ("local mode detects the driver's GPUs", detected == len(listed), f"{detected} vs {listed}")
    )

    with tempfile.TemporaryDirectory(prefix="gpu-driver-check-") as tmp:
        workdir = Path(tmp)
        plan, ps_job = run_job(workdir, "ps-shaped", {"chief": 1, "worker": 2, "ps": 1}, args.gpus)
        results["ps_shaped"] = {"plan": plan, "probes": ps_job}
        workers_get = max(1, detected // 2)
        for replica in ("worker-0", "worker-1"):
            probe = ps_job.get(replica, {})
            checks.append((f"ps-shaped {replica} gets GPUs", sees(probe, workers_get), str(probe)))
        for replica in ("chief-0", "ps-0"):
            probe = ps_job.get(replica, {})
            checks.append((f"ps-shaped {replica} on the CPU", sees(probe, 0), str(probe)))

        plan, ar_job = run_job(workdir, "allreduce-shaped", {"worker": 2}, args.gpus)
        results["allreduce_shaped"] = {"plan": plan, "probes": ar_job}
        own = detected >= 2
        for replica in ("worker-0", "worker-1"):
            probe = ar_job.get(replica, {})
            flags_right = (
                probe.get("worker_gpus") == str(workers_get) and probe.get("shared") is None
                if own
                else probe.get("shared") == "true" and probe.get("worker_gpus") is None
            )
            checks.append(
                (
                    f"all-reduce {replica}: {'own GPU, NCCL hint' if own else 'shared, growth'}",
                    sees(probe, workers_get) and flags_right,
                    str(probe),
                )
            )

    wanted = devices.cuda_libraries(TF_CUDA, TF_CUDNN)
    missing = strategy.missing_libraries(wanted)
    cause = devices.fallback_cause(
        (devices.NVIDIA_VISIBLE_DEVICES, "0"),
        devices.Devices(gpus=(), cuda_build=True, cuda_version=TF_CUDA, cudnn_version=TF_CUDNN),
        tf_version="2.21.0",
        missing=missing,
    )
    results["library_probe"] = {"wanted": list(wanted), "missing": missing, "cause": cause}
    checks.append(
        (
            "the driver's libcuda.so.1 loads",
            "libcuda.so.1" not in [name for name, _ in missing],
            str(missing[:3]),
        )
    )
    if missing:
        first = missing[0][0]
        checks.append(
            (f"the cause names {first}", cause is not None and first in cause, cause or "")
        )

    results["checks"] = [{"check": c, "ok": ok, "evidence": e} for c, ok, e in checks]
    for check, ok, evidence in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {check}\n      {evidence}")
    print(f"cause a replica given a GPU would stop with here: {cause}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
