"""Build the tf.distribute strategy a replica trains under (TensorFlow side effects only here)."""

from __future__ import annotations

import logging
import os
from typing import Any

from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import UnsupportedError

log = logging.getLogger(__name__)


def detect_devices(tf: Any) -> tuple[int, bool]:
    """(number of GPUs, whether a TPU is reachable) as TF sees them."""
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    has_tpu = bool(os.environ.get("TPU_NAME") or os.environ.get("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"))
    return num_gpus, has_tpu


def build(tf: Any, name: str, config: dict[str, Any] | Any) -> Any:
    """The strategy object for a resolved strategy name (see settings.resolve_strategy)."""
    if name == settings_mod.MULTI_WORKER_MIRRORED:
        # A bound on each collective turns a silently hung peer into a DeadlineExceeded error
        # (retryable); unset, TF relies on its heartbeat (~10 s) for dead peers only.
        timeout = config.get("collective_timeout_seconds")
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=float(timeout) if timeout else None
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
