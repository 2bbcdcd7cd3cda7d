"""Which GPUs each local replica process sees (pure): ``trainjob run --gpus``.

On a Kubernetes node the device plugin gives each Pod its own GPUs; locally every process
would see every GPU, so two MultiWorkerMirrored workers on an 8-GPU box would each build 8
replicas on the same 8 GPUs. Local mode shares the GPUs out instead, as a pure function of the
replica list and the GPU ids (tested without a GPU, ``tests/unit/test_local_gpus.py``):

- round-robin over the processes that train (chief, worker, evaluator): with at least as many
  GPUs as processes, process i gets ids ``i, i+n, i+2n, ...`` (each its own); with fewer, they
  share (process i gets GPU ``i mod count``) and memory growth is turned on, since TensorFlow
  would otherwise reserve nearly all of a GPU for the first process;
- parameter servers, and their coordinator (the chief), on the CPU (``CUDA_VISIBLE_DEVICES=""``)
  unless ``--ps-on-gpu``: they hold variables and serve them over gRPC, or schedule steps, as
  Arena and Kubeflow's examples place them;
- ``TRAINJOB_WORKER_GPUS`` tells the runtime whether every trainer has a GPU of its own (it then
  picks NCCL); never when GPUs are shared, because NCCL refuses two ranks on one GPU.

The GPU ids come from ``--gpus`` (``all``, ``none`` or a list such as ``0,2``), else from the
caller's ``CUDA_VISIBLE_DEVICES``, else from the GPUs the NVIDIA driver lists
(``/proc/driver/nvidia/gpus``: no TensorFlow, no process started by the CLI).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Final

from trainjob.core import constants

ReplicaKey = tuple[str, int]

CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
ALL: Final = "all"
NONE: Final = "none"
_TRAINERS: Final = frozenset({constants.CHIEF, constants.WORKER})


class GpuOptionError(ValueError):
    """A ``--gpus`` value that names no GPUs the right way."""


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """GPU ids per process (``()``: the CPU), and whether a GPU serves several processes."""

    devices: Mapping[ReplicaKey, tuple[str, ...]]
    shared: bool
    source: str  # where the ids came from, for the dry run

    def env(self, key: ReplicaKey) -> dict[str, str]:
        """What one process gets: its CUDA_VISIBLE_DEVICES, and the runtime's GPU hints."""
        ids = self.devices.get(key, ())
        env = {CUDA_VISIBLE_DEVICES: ",".join(ids)}
        if self.shared and ids:
            env[constants.ENV_GPU_SHARED] = "true"
        fewest = self.worker_gpus()
        if fewest > 0:
            env[constants.ENV_WORKER_GPUS] = str(fewest)
        return env

    def worker_gpus(self) -> int:
        """GPUs of the trainer with the fewest, when each has its own; else 0 (ring)."""
        counts = [len(ids) for (rtype, _), ids in self.devices.items() if rtype in _TRAINERS]
        if self.shared or not counts:
            return 0
        return min(counts)

    def describe(self, key: ReplicaKey) -> str:
        ids = self.devices.get(key, ())
        if not ids:
            return "CPU"
        shared = " (shared: memory growth on)" if self.shared else ""
        return f"GPU {','.join(ids)}{shared}"


def parse_option(text: str) -> str | tuple[str, ...]:
    """``--gpus``: ``all``, ``none``, or comma-separated GPU ids (indices or UUIDs)."""
    value = text.strip()
    if value.lower() in (ALL, NONE):
        return value.lower()
    ids = tuple(part.strip() for part in value.split(","))
    if not ids or any(not part for part in ids):
        raise GpuOptionError(f"--gpus {text!r}: give all, none, or GPU ids such as 0,1")
    return ids


def gpu_pool(
    option: str | tuple[str, ...] | None,
    *,
    caller_visible: str | None,
    detected: int,
) -> tuple[tuple[str, ...] | None, str]:
    """(GPU ids to share out, where they came from); ids None: leave the environment alone.

    ``caller_visible``: the caller's CUDA_VISIBLE_DEVICES (its GPUs are the only ones this run
    may use); ``detected``: how many GPUs the driver lists."""
    if option == NONE:
        return (), "--gpus none"
    if isinstance(option, tuple):
        return option, "--gpus"
    if caller_visible is not None:
        ids = tuple(p.strip() for p in caller_visible.split(",") if p.strip())
        if not ids or ids[0] == "-1":
            # The caller hid its GPUs: every process inherits that as it is.
            return None, "CUDA_VISIBLE_DEVICES hides every GPU"
        return ids, "CUDA_VISIBLE_DEVICES"
    if detected > 0:
        return tuple(str(i) for i in range(detected)), "the NVIDIA driver"
    if option == ALL:
        return (), "--gpus all (no GPU found)"
    return None, "no GPU found"


def assign(
    keys: Sequence[ReplicaKey], pool: tuple[str, ...], *, source: str, ps_on_gpu: bool = False
) -> GpuPlan:
    """Share ``pool`` out over the processes (see the module docstring).

    With parameter servers the chief is the coordinator (it schedules steps, the workers run
    them), so it stays on the CPU with the ps."""
    has_ps = any(rtype == constants.PS for rtype, _ in keys)
    on_cpu = {constants.PS, constants.CHIEF} if has_ps and not ps_on_gpu else set()
    users = [key for key in keys if key[0] not in on_cpu]
    devices: dict[ReplicaKey, tuple[str, ...]] = dict.fromkeys(keys, ())
    shared = False
    if pool and users:
        if len(users) <= len(pool):
            # As many GPUs each: MultiWorkerMirrored needs the same number on every worker.
            each = len(pool) // len(users)
            for i, key in enumerate(users):
                devices[key] = pool[i :: len(users)][:each]
        else:
            shared = True
            for i, key in enumerate(users):
                devices[key] = (pool[i % len(pool)],)
    return GpuPlan(devices=devices, shared=shared, source=source)
