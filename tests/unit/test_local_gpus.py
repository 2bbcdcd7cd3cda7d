"""Local mode shares GPUs out per process (pure: from replica lists and GPU ids, no GPU)."""

from __future__ import annotations

import pytest

from trainjob.core import constants
from trainjob.local import gpus

KEYS = [("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0)]
PS_KEYS = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]


def test_parameter_servers_and_their_coordinator_stay_on_the_cpu() -> None:
    plan = gpus.assign(PS_KEYS, ("0", "1"), source="the NVIDIA driver")
    assert plan.devices == {
        ("chief", 0): (),  # the coordinator schedules steps; the workers run them
        ("worker", 0): ("0",),
        ("worker", 1): ("1",),
        ("ps", 0): (),
    }
    assert plan.env(("ps", 0))["CUDA_VISIBLE_DEVICES"] == ""  # TF on it reserves no GPU
    assert plan.describe(("ps", 0)) == "CPU"
    assert gpus.assign(PS_KEYS, tuple("0123"), source="--gpus", ps_on_gpu=True).devices == {
        ("chief", 0): ("0",),
        ("worker", 0): ("1",),
        ("worker", 1): ("2",),
        ("ps", 0): ("3",),
    }


def test_as_many_gpus_as_trainers_gives_each_its_own() -> None:
    shared_out = gpus.assign(KEYS[:3], ("0", "1", "2"), source="the NVIDIA driver")
    assert shared_out.devices == {
        ("chief", 0): ("0",),
        ("worker", 0): ("1",),
        ("worker", 1): ("2",),
    }
    assert not shared_out.shared
    assert shared_out.env(("worker", 1)) == {
        "CUDA_VISIBLE_DEVICES": "2",
        constants.ENV_WORKER_GPUS: "1",  # every trainer has its own: the runtime picks NCCL
    }


def test_more_gpus_are_dealt_round_robin_the_same_number_each() -> None:
    plan = gpus.assign([("worker", 0), ("worker", 1)], tuple("01234567"), source="--gpus")
    assert plan.devices == {
        ("worker", 0): ("0", "2", "4", "6"),
        ("worker", 1): ("1", "3", "5", "7"),
    }
    assert plan.worker_gpus() == 4
    # MultiWorkerMirrored needs as many GPUs on every worker: the odd one out stays idle.
    odd = gpus.assign([("worker", 0), ("worker", 1)], ("0", "1", "2"), source="--gpus")
    assert odd.devices == {("worker", 0): ("0",), ("worker", 1): ("1",)}


def test_fewer_gpus_than_processes_are_shared_with_memory_growth_and_ring() -> None:
    plan = gpus.assign(KEYS, ("0", "1", "2"), source="the NVIDIA driver")
    assert plan.shared
    assert plan.devices == {
        ("chief", 0): ("0",),
        ("worker", 0): ("1",),
        ("worker", 1): ("2",),
        ("evaluator", 0): ("0",),  # round-robin: GPU 0 serves two processes
    }
    env = plan.env(("worker", 0))
    assert env[constants.ENV_GPU_SHARED] == "true"
    # NCCL refuses two ranks on one GPU: no hint, so the runtime keeps ring all-reduce.
    assert constants.ENV_WORKER_GPUS not in env
    assert plan.describe(("chief", 0)) == "GPU 0 (shared: memory growth on)"


@pytest.mark.parametrize(
    ("option", "caller", "detected", "pool"),
    [
        (None, None, 0, None),  # no GPU: the environment is left alone (CPU machines)
        (None, None, 2, ("0", "1")),
        (None, "3,5", 8, ("3", "5")),  # the caller's own selection is the pool
        (None, "", 8, None),  # the caller hid them: inherited as it is
        ("all", None, 2, ("0", "1")),
        ("none", None, 2, ()),  # every process on the CPU, GPUs hidden
        (("1",), None, 0, ("1",)),  # named ids are used as given
    ],
)
def test_where_the_gpu_ids_come_from(
    option: str | tuple[str, ...] | None,
    caller: str | None,
    detected: int,
    pool: tuple[str, ...] | None,
) -> None:
    assert gpus.gpu_pool(option, caller_visible=caller, detected=detected)[0] == pool


def test_the_gpus_option() -> None:
    assert gpus.parse_option("ALL") == "all"
    assert gpus.parse_option("none") == "none"
    assert gpus.parse_option("0, 2") == ("0", "2")
    assert gpus.parse_option("GPU-5e2f") == ("GPU-5e2f",)
    with pytest.raises(gpus.GpuOptionError, match="--gpus"):
        gpus.parse_option("0,,1")
