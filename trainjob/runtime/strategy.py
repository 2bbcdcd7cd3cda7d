"""Build the tf.distribute strategy a replica trains under (TensorFlow side effects only here)."""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from trainjob.runtime import devices as devices_mod
from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import UnsupportedError

log = logging.getLogger(__name__)


def detect_devices(tf: Any) -> tuple[int, bool]:
    """(number of GPUs, whether a TPU is reachable) as TF sees them."""
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    has_tpu = bool(os.environ.get("TPU_NAME") or os.environ.get("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"))
    return num_gpus, has_tpu


def inspect(tf: Any) -> devices_mod.Devices:
    """The GPUs TensorFlow registered and whether it can register any (its build info)."""
    info = tf.sysconfig.get_build_info()
    return devices_mod.Devices(
        gpus=tuple(d.name for d in tf.config.list_physical_devices("GPU")),
        cuda_build=bool(info.get("is_cuda_build")),
        cuda_version=info.get("cuda_version"),
        cudnn_version=info.get("cudnn_version"),
    )


def _runpath_dirs() -> list[str]:
    """Where TF's own RUNPATH finds pip's NVIDIA libraries (``site-packages/nvidia/*/lib``).

    Only the packages on ``libtensorflow_framework.so.2``'s / ``libtensorflow_cc.so.2``'s
    RUNPATH: a library found only elsewhere there (nvjitlink, curand, nvrtc) is missing for TF
    too, unless the loader path has it."""
    names = ("cublas", "cuda_cupti", "cuda_runtime", "cudnn", "cufft", "cusparse", "nccl")
    found: list[str] = []
    for entry in sys.path:
        for name in (*names, "cusolver"):
            found.extend(glob.glob(os.path.join(entry, "nvidia", name, "lib")))
    return found


def missing_libraries(libraries: tuple[str, ...]) -> list[tuple[str, str]]:
    """(library, loader error) of each CUDA library this process cannot load, as TF would try.

    The runtime sets TF_CPP_MIN_LOG_LEVEL=2 (and local mode hides TF's W lines), which drops
    TF's own "Could not load dynamic library ..." warnings: the runtime asks the loader itself,
    so the cause reaches the job's status instead of a log nobody reads."""
    missing: list[tuple[str, str]] = []
    dirs = _runpath_dirs()
    for library in libraries:
        try:
            ctypes.CDLL(library)
            continue
        except OSError as exc:
            error = str(exc)
        candidates = [os.path.join(d, library) for d in dirs]
        if not any(os.path.exists(path) for path in candidates):
            missing.append((library, error))
    return missing


def check_gpus(tf: Any, env: Mapping[str, str], config: Mapping[str, Any]) -> devices_mod.Devices:
    """The devices this replica trains on; stops it when it was given GPUs but sees none.

    Raises UnsupportedError (exit 4, permanent: the same image fails the same way on the same
    node) with one cause line, unless ``allow_cpu_fallback: true`` says a CPU run is fine."""
    seen = inspect(tf)
    given = devices_mod.given_gpus(env)
    if given is None or seen.gpus:
        return seen
    libraries = devices_mod.cuda_libraries(seen.cuda_version, seen.cudnn_version)
    missing = missing_libraries(libraries) if seen.cuda_build else []
    cause = devices_mod.fallback_cause(given, seen, tf_version=tf.__version__, missing=missing)
    if cause is None:
        return seen
    if devices_mod.allow_cpu_fallback(config):
        log.warning("Training on the CPU (allow_cpu_fallback): %s", cause)
        return seen
    raise UnsupportedError(cause)


def build(
    tf: Any,
    name: str,
    config: dict[str, Any] | Any,
    *,
    env: Mapping[str, str] | None = None,
    local_gpus: int = 0,
) -> Any:
    """The strategy object for a resolved strategy name (see settings.resolve_strategy)."""
    if name == settings_mod.MULTI_WORKER_MIRRORED:
        # A bound on each collective turns a silently hung peer into a DeadlineExceeded error
        # (retryable); unset, TF relies on its heartbeat (~10 s) for dead peers only.
        timeout = config.get("collective_timeout_seconds")
        collective = devices_mod.collective_implementation(
            config, os.environ if env is None else env, local_gpus=local_gpus
        )
        implementation = tf.distribute.experimental.CommunicationImplementation
        log.info("Built MultiWorkerMirrored with %s all-reduce", collective.upper())
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=float(timeout) if timeout else None,
            implementation=(
                implementation.NCCL if collective == devices_mod.NCCL else implementation.RING
            ),
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == settings_mod.PARAMETER_SERVER:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if name == settings_mod.MIRRORED:
        return tf.distribute.MirroredStrategy()
    if name == settings_mod.ONE_DEVICE:
        device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if name == settings_mod.TPU:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == settings_mod.DEFAULT:
        return tf.distribute.get_strategy()
    raise UnsupportedError(f"strategy {name} cannot be built for Keras on TF {tf.__version__}")
