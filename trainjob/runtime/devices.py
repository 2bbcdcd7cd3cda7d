"""What a replica decides from the devices it was given and the devices TensorFlow sees (pure).

No TensorFlow here: :mod:`trainjob.runtime.strategy` reads the device list, the build info and
the CUDA libraries it can load, and passes them in. Each decision is a function of that data,
unit-tested from device lists without a GPU (``tests/unit/test_runtime_devices.py``):

- which all-reduce MultiWorkerMirrored uses (:func:`collective_implementation`);
- whether GPU memory grows on demand (:func:`memory_growth`);
- when the NaN/Inf loss check reads the loss on the host (:func:`loss_check_mode`);
- whether a replica given GPUs but seeing none must stop (:func:`fallback_cause`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from trainjob.core import constants
from trainjob.runtime.exitcodes import ConfigError

CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
# Set by the NVIDIA device plugin (GPU indices or UUIDs) for the container toolkit.
NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
# TensorFlow's own switch, read when it creates its GPU devices.
TF_FORCE_GPU_ALLOW_GROWTH: Final = "TF_FORCE_GPU_ALLOW_GROWTH"

# spec.runtime.config keys.
COLLECTIVE_IMPLEMENTATION: Final = "collective_implementation"  # auto | ring | nccl
GPU_MEMORY_GROWTH: Final = "gpu_memory_growth"  # auto | true | false
LOSS_CHECK: Final = "loss_check"  # auto | every_step | at_reports
ALLOW_CPU_FALLBACK: Final = "allow_cpu_fallback"  # false | true

AUTO: Final = "auto"
RING: Final = "ring"
NCCL: Final = "nccl"
COLLECTIVES: Final = (AUTO, RING, NCCL)
EVERY_STEP: Final = "every_step"
AT_REPORTS: Final = "at_reports"
LOSS_CHECKS: Final = (AUTO, EVERY_STEP, AT_REPORTS)

# NVIDIA_VISIBLE_DEVICES values that give no GPU (the container toolkit's words).
_NO_GPU_VALUES: Final = frozenset({"", "void", "none"})


@dataclass(frozen=True)
class Devices:
    """What TensorFlow sees in this process."""

    gpus: tuple[str, ...]  # physical device names, e.g. /physical_device:GPU:0
    cuda_build: bool
    cuda_version: str | None = None
    cudnn_version: str | None = None

    def event_fields(self) -> dict[str, Any]:
        """The ``devices`` field of the ``start`` event."""
        return {
            "gpus": len(self.gpus),
            "names": list(self.gpus),
            "cuda_build": self.cuda_build,
            "cuda_version": self.cuda_version,
        }


def given_gpus(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) when the container was given GPUs by name, else None.

    ``CUDA_VISIBLE_DEVICES`` wins (CUDA applies it last): empty or ``-1`` hides every GPU on
    purpose (the training tier and local mode's CPU replicas set it). ``NVIDIA_VISIBLE_DEVICES``
    counts when it names devices, as the device plugin sets it; ``all`` does not, because images
    bake it in (the nvidia/cuda ones do) and it then says nothing about this Pod's request.
    """
    cuda = env.get(CUDA_VISIBLE_DEVICES)
    if cuda is not None:
        ids = [part.strip() for part in cuda.split(",") if part.strip()]
        if not ids or ids[0] == "-1":
            return None
        return CUDA_VISIBLE_DEVICES, cuda
    nvidia = env.get(NVIDIA_VISIBLE_DEVICES)
    if nvidia is None or nvidia.strip().lower() in _NO_GPU_VALUES | {"all"}:
        return None
    return NVIDIA_VISIBLE_DEVICES, nvidia


def cuda_libraries(cuda_version: str | None, cudnn_version: str | None) -> tuple[str, ...]:
    """The shared libraries a CUDA build of TensorFlow opens to register GPUs, driver first.

    Sonames as TF's dso_loader asks for them (``tsl/platform/default/dso_loader.cc``): by the
    CUDA major version, except cuFFT/cuSOLVER/cuSPARSE, which have their own majors (CUDA 12
    ships cuFFT 11, cuSOLVER 11, cuSPARSE 12)."""
    libs = ["libcuda.so.1"]
    major = (cuda_version or "").split(".")[0]
    if major.isdigit():
        libs += [f"libcudart.so.{major}", f"libcublas.so.{major}", f"libcublasLt.so.{major}"]
        own = {"12": ("11", "11", "12"), "11": ("10", "11", "11")}.get(major)
        if own is not None:
            libs += [f"libcufft.so.{own[0]}", f"libcusolver.so.{own[1]}"]
            libs += [f"libcusparse.so.{own[2]}"]
    cudnn = (cudnn_version or "").split(".")[0]
    if cudnn.isdigit():
        libs.append(f"libcudnn.so.{cudnn}")
    return tuple(libs)


def fallback_cause(
    given: tuple[str, str] | None,
    devices: Devices,
    *,
    tf_version: str,
    missing: Sequence[tuple[str, str]],
) -> str | None:
    """Why a replica given GPUs would train on its CPU, or None when it would not.

    ``missing``: (library, loader error) of each CUDA library that could not be loaded, in
    :func:`cuda_libraries` order; the first one is named (the driver's absence explains the
    rest)."""
    if given is None or devices.gpus:
        return None
    variable, value = given
    head = f"{variable}={value} gives this replica GPUs but TensorFlow {tf_version} sees none"
    if not devices.cuda_build:
        return (
            f"{head}: it is not a CUDA build (the tensorflow-cpu wheel?); use the trainjob GPU "
            "image or install tensorflow[and-cuda]"
        )
    if missing:
        library, error = missing[0]
        if library == "libcuda.so.1":
            return (
                f"{head}: the NVIDIA driver library {library} cannot be loaded ({error}); the "
                "container needs the NVIDIA container runtime (toolkit) and a driver on the node"
            )
        return (
            f"{head}: cannot load {library} ({error}); install tensorflow[and-cuda] or put "
            "site-packages/nvidia/*/lib on the loader path (ldconfig or LD_LIBRARY_PATH)"
        )
    return (
        f"{head}: every CUDA library loaded, so TensorFlow's own log says why "
        "(run with TF_CPP_MIN_LOG_LEVEL=0)"
    )


def allow_cpu_fallback(config: Mapping[str, Any]) -> bool:
    value = config.get(ALLOW_CPU_FALLBACK, False)
    if not isinstance(value, bool):
        raise ConfigError(f"config key {ALLOW_CPU_FALLBACK} must be true or false, got {value!r}")
    return value


def _choice(config: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = config.get(key, AUTO)
    if isinstance(value, bool) or not isinstance(value, str) or value.lower() not in choices:
        raise ConfigError(f"config key {key} must be one of {', '.join(choices)}, got {value!r}")
    return value.lower()


def collective_implementation(
    config: Mapping[str, Any], env: Mapping[str, str], *, local_gpus: int
) -> str:
    """``ring`` or ``nccl``: the all-reduce MultiWorkerMirrored is built with.

    TensorFlow's AUTO resolves to ring all-reduce over gRPC on GPUs too (it picks NCCL only
    when told: ``AssignCollectiveType``), so the runtime says NCCL itself when every all-reduce
    task has a GPU of its own. Each worker sees only its own devices, so "every" comes from the
    executor: ``TRAINJOB_WORKER_GPUS`` (the fewest GPUs any chief/worker was given, rendered
    only when that is at least one and no GPU is shared); NCCL refuses a worker without a GPU
    and two ranks on one GPU. ``collective_implementation: ring|nccl`` forces either.
    """
    chosen = _choice(config, COLLECTIVE_IMPLEMENTATION, COLLECTIVES)
    if chosen != AUTO:
        return chosen
    every_worker = env.get(constants.ENV_WORKER_GPUS, "").strip()
    all_have_gpus = every_worker.isdigit() and int(every_worker) > 0
    return NCCL if all_have_gpus and local_gpus > 0 else RING


def memory_growth(config: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether TensorFlow grows its GPU memory on demand instead of reserving it all.

    Off for a GPU of one's own (Kubernetes' device plugin: TF's reservation is fastest there);
    on when processes may share a GPU: local mode sets ``TRAINJOB_GPU_SHARED=true`` then, since
    the first process would otherwise take nearly all of it and the next one run out. The config
    key ``gpu_memory_growth: true|false`` wins, and so does a user's TF_FORCE_GPU_ALLOW_GROWTH.
    """
    value = config.get(GPU_MEMORY_GROWTH, AUTO)
    if isinstance(value, bool):
        return value
    if value != AUTO:
        raise ConfigError(f"config key {GPU_MEMORY_GROWTH} must be true, false or auto")
    own = env.get(TF_FORCE_GPU_ALLOW_GROWTH)
    if own is not None:
        return own.strip().lower() == "true"
    return env.get(constants.ENV_GPU_SHARED, "").strip().lower() == "true"


def loss_check_mode(config: Mapping[str, Any], *, on_gpu: bool) -> str:
    """When the NaN/Inf check reads the loss on the host: ``every_step`` or ``at_reports``.

    On a GPU any host read of a device value waits for everything queued on the device
    (``gpu_util.cc``: the copy stream waits for the compute stream), so reading each step's
    loss stalls the GPU each step: there the check reads at step events and epoch ends (Keras'
    ``loss`` is the epoch's running mean, so a NaN step keeps it NaN) or an on-device flag
    (custom loops). On the CPU the every-step check costs nothing and names the step at once.
    """
    chosen = _choice(config, LOSS_CHECK, LOSS_CHECKS)
    if chosen != AUTO:
        return chosen
    return AT_REPORTS if on_gpu else EVERY_STEP


def validate(config: Mapping[str, Any]) -> None:
    """Fail on a typo'd device key before TensorFlow is imported."""
    _choice(config, COLLECTIVE_IMPLEMENTATION, COLLECTIVES)
    _choice(config, LOSS_CHECK, LOSS_CHECKS)
    memory_growth(config, {})
    allow_cpu_fallback(config)


def report_due(previous_step: int, step: int, every: int) -> bool:
    """Whether a report falls between two step counts (exclusive, inclusive).

    With ``steps_per_execution=N`` Keras calls batch hooks once per N steps, so the step moves
    by N between calls: a report is due when a multiple of ``every`` was passed, not only hit,
    which keeps reports every ``every`` steps rather than every ``every`` executions."""
    return every > 0 and step // every > previous_step // every
