"""Run a :class:`~trainjob.runtime.contract.DTensorTrainSpec` on a multi-client DTensor mesh.

Every client (one per replica) initializes the accelerator system from ``DTENSOR_CLIENT_ID``,
``DTENSOR_NUM_CLIENTS``, ``DTENSOR_JOB_NAME`` and ``DTENSOR_JOBS``, then all of them build the same
1-D mesh ``"batch"`` over every device of every client (data parallelism). Measured on TF 2.21,
CPU: two clients on loopback initialize in about a second and run collectives across the mesh;
``shutdown_accelerator_system`` is not supported in multi-client mode, so the process just ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainjob.runtime import contract, progress
from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import UnsupportedError
from trainjob.runtime.settings import RuntimeSettings

MESH_DIM = "batch"


def device_type(num_gpus: int, has_tpu: bool) -> str:
    """The one device type a DTensor mesh is built from (pure)."""
    if has_tpu:
        return "TPU"
    return "GPU" if num_gpus else "CPU"


def run(
    tf: Any, settings: RuntimeSettings, build: Any, emitter: progress.Emitter, checkpoint_dir: str
) -> dict[str, Any]:
    try:
        from tensorflow.experimental import dtensor
    except ImportError as exc:
        raise UnsupportedError(f"DTensor is not available in TF {tf.__version__}") from exc
    from trainjob.runtime import strategy as strategy_mod

    kind = device_type(*strategy_mod.detect_devices(tf))
    dtensor.initialize_accelerator_system(kind)
    devices = dtensor.num_global_devices(kind)
    mesh = dtensor.create_distributed_mesh([(MESH_DIM, devices)], device_type=kind)
    client = dtensor.client_id()
    ctx = contract.TrainContext(
        config=settings.config,
        strategy=settings_mod.DTENSOR,
        framework=settings.framework,
        task_type=settings.task_type,
        task_index=settings.task_index,
        is_chief=client == 0,
        num_workers=dtensor.num_clients(),
        num_replicas_in_sync=devices,
        checkpoint_dir=checkpoint_dir,
        data_dir=settings.data_dir,
    )
    spec = build(ctx)
    contract.validate_train_spec(spec, strategy=settings_mod.DTENSOR, framework=settings.framework)
    assert isinstance(spec, contract.DTensorTrainSpec)
    emitter.emit("start", step=0, initial_step=0, mesh_devices=devices, tf_version=tf.__version__)

    def report(step: int, logs: Mapping[str, Any]) -> None:
        emitter.emit("step", step=step, logs=logs)

    final = dict(spec.train_fn(mesh, report))
    step = final.pop("step", None)
    return {"step": step, "logs": final}
