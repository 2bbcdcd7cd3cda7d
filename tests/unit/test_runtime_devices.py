"""The runtime's GPU decisions, from device lists and environments (no TensorFlow, no GPU)."""

from __future__ import annotations

from typing import Any

import pytest

from trainjob.core import constants, spec, tfconfig
from trainjob.runtime import devices
from trainjob.runtime.exitcodes import ConfigError
from trainjob.runtime.losscheck import LossCheck, loss_check_for

GPU0 = "/physical_device:GPU:0"
CUDA = devices.Devices(gpus=(), cuda_build=True, cuda_version="12.5.1", cudnn_version="9")
CPU_WHEEL = devices.Devices(gpus=(), cuda_build=False)


@pytest.mark.parametrize(
    ("env", "given"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),  # hidden on purpose (CPU replicas, tests)
        ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
        ({"CUDA_VISIBLE_DEVICES": "0"}, ("CUDA_VISIBLE_DEVICES", "0")),
        ({"CUDA_VISIBLE_DEVICES": "1,3"}, ("CUDA_VISIBLE_DEVICES", "1,3")),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-5e2f"}, ("NVIDIA_VISIBLE_DEVICES", "GPU-5e2f")),
        ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, ("NVIDIA_VISIBLE_DEVICES", "0,1")),
        # Baked into images (nvidia/cuda): says nothing about this Pod's request.
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, None),
        # CUDA applies CUDA_VISIBLE_DEVICES last: hiding wins over the device plugin's list.
        ({"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": ""}, None),
    ],
)
def test_which_environments_give_a_replica_gpus(
    env: dict[str, str], given: tuple[str, str] | None
) -> None:
    assert devices.given_gpus(env) == given


def test_a_replica_given_gpus_that_sees_one_trains_on_it() -> None:
    seen = devices.Devices(gpus=(GPU0,), cuda_build=True, cuda_version="12.5.1")
    given = ("CUDA_VISIBLE_DEVICES", "0")
    assert devices.fallback_cause(given, seen, tf_version="2.21.0", missing=[]) is None
    assert devices.fallback_cause(None, CPU_WHEEL, tf_version="2.21.0", missing=[]) is None
    assert seen.event_fields() == {
        "gpus": 1,
        "names": [GPU0],
        "cuda_build": True,
        "cuda_version": "12.5.1",
    }


def test_the_cpu_wheel_is_named_as_the_cause() -> None:
    cause = devices.fallback_cause(
        ("NVIDIA_VISIBLE_DEVICES", "GPU-1"), CPU_WHEEL, tf_version="2.21.0", missing=[]
    )
    assert cause is not None
    assert cause.startswith(
        "NVIDIA_VISIBLE_DEVICES=GPU-1 gives this replica GPUs but TensorFlow 2.21.0 sees none"
    )
    assert "not a CUDA build" in cause and "tensorflow[and-cuda]" in cause


def test_the_first_missing_library_is_named_the_driver_first() -> None:
    given = ("CUDA_VISIBLE_DEVICES", "0")
    driver = devices.fallback_cause(
        given,
        CUDA,
        tf_version="2.21.0",
        missing=[("libcuda.so.1", "libcuda.so.1: cannot open"), ("libcudnn.so.9", "x")],
    )
    assert driver is not None and "driver library libcuda.so.1" in driver
    assert "container runtime" in driver
    cudnn = devices.fallback_cause(
        given, CUDA, tf_version="2.21.0", missing=[("libcudnn.so.9", "libcudnn.so.9: no file")]
    )
    assert cudnn is not None
    assert "cannot load libcudnn.so.9 (libcudnn.so.9: no file)" in cudnn
    assert "LD_LIBRARY_PATH" in cudnn
    unknown = devices.fallback_cause(given, CUDA, tf_version="2.21.0", missing=[])
    assert unknown is not None and "TF_CPP_MIN_LOG_LEVEL=0" in unknown


def test_cuda_libraries_follow_the_build_versions() -> None:
    assert devices.cuda_libraries("12.5.1", "9") == (
        "libcuda.so.1",
        "libcudart.so.12",
        "libcublas.so.12",
        "libcublasLt.so.12",
        "libcufft.so.11",
        "libcusolver.so.11",
        "libcusparse.so.12",
        "libcudnn.so.9",
    )
    assert devices.cuda_libraries(None, None) == ("libcuda.so.1",)


@pytest.mark.parametrize(
    ("config", "worker_gpus", "local_gpus", "chosen"),
    [
        ({}, "1", 1, "nccl"),  # every worker has a GPU of its own
        ({}, "2", 2, "nccl"),
        ({}, None, 1, "ring"),  # a peer without a GPU (or not rendered by us): NCCL would fail
        ({}, "1", 0, "ring"),  # this worker sees none (allow_cpu_fallback)
        ({}, None, 0, "ring"),  # CPUs
        ({"collective_implementation": "ring"}, "1", 1, "ring"),
        ({"collective_implementation": "NCCL"}, None, 1, "nccl"),
    ],
)
def test_multi_worker_mirrored_collective(
    config: dict[str, Any], worker_gpus: str | None, local_gpus: int, chosen: str
) -> None:
    env = {} if worker_gpus is None else {constants.ENV_WORKER_GPUS: worker_gpus}
    assert devices.collective_implementation(config, env, local_gpus=local_gpus) == chosen


@pytest.mark.parametrize(
    ("config", "env", "growth"),
    [
        ({}, {}, False),  # a GPU of one's own (Kubernetes): TF's reservation
        ({}, {constants.ENV_GPU_SHARED: "true"}, True),  # local mode, processes share
        ({"gpu_memory_growth": False}, {constants.ENV_GPU_SHARED: "true"}, False),
        ({"gpu_memory_growth": True}, {}, True),
        ({}, {"TF_FORCE_GPU_ALLOW_GROWTH": "false", constants.ENV_GPU_SHARED: "true"}, False),
    ],
)
def test_memory_growth(config: dict[str, Any], env: dict[str, str], growth: bool) -> None:
    assert devices.memory_growth(config, env) is growth


def test_the_loss_is_read_every_step_on_the_cpu_and_at_reports_on_a_gpu() -> None:
    assert loss_check_for({}, parameter_server=False, on_gpu=False) is LossCheck.EVERY_STEP
    assert loss_check_for({}, parameter_server=False, on_gpu=True) is LossCheck.FETCHED
    assert loss_check_for({}, parameter_server=True, on_gpu=False) is LossCheck.FETCHED
    forced = {"loss_check": "at_reports"}
    assert loss_check_for(forced, parameter_server=False) is LossCheck.FETCHED
    every = {"loss_check": "every_step"}
    assert loss_check_for(every, parameter_server=False, on_gpu=True) is LossCheck.EVERY_STEP
    off = {"stop_on_nonfinite_loss": False}
    assert loss_check_for(off, parameter_server=False, on_gpu=True) is LossCheck.OFF


@pytest.mark.parametrize(
    "config",
    [
        {"collective_implementation": "hierarchical"},
        {"loss_check": True},
        {"gpu_memory_growth": "yes"},
        {"allow_cpu_fallback": "true"},
    ],
)
def test_typos_in_device_keys_fail_before_tensorflow(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(config))):
        devices.validate(config)


@pytest.mark.parametrize(
    ("previous", "step", "every", "due"),
    [
        (0, 1, 1, True),
        (99, 100, 100, True),
        (100, 101, 100, False),
        # steps_per_execution=32: hooks at 32, 64, 96, 128: the report at 100 is made at 128.
        (96, 128, 100, True),
        (64, 96, 100, False),
        (0, 500, 0, False),  # reports off
    ],
)
def test_reports_count_steps_not_executions(
    previous: int, step: int, every: int, due: bool
) -> None:
    assert devices.report_due(previous, step, every) is due


def _job(worker_gpus: int | None, chief_gpus: int | None = None) -> spec.TrainJob:
    def replica(gpus: int | None, replicas: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "tensorflow"}
        if gpus is not None:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        return {"replicas": replicas, "template": {"spec": {"containers": [container]}}}

    specs: dict[str, Any] = {"worker": replica(worker_gpus, 2), "ps": replica(None, 1)}
    if chief_gpus is not None or worker_gpus is None:
        specs["chief"] = replica(chief_gpus, 1)
    return spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "gpu", "namespace": "ns"},
            "spec": {
                "image": "trainjob:gpu",
                "runtime": {"entrypoint": "trainjob.samples.mnist:build"},
                "replicaSpecs": specs,
            },
        }
    )


@pytest.mark.parametrize(
    ("worker", "chief", "rendered"),
    [
        (1, None, "1"),
        (2, 1, "1"),  # the fewest
        (1, 0, None),  # a chief without a GPU: NCCL would fail, so ring
        (None, None, None),
    ],
)
def test_every_replica_is_told_whether_all_trainers_have_gpus(
    worker: int | None, chief: int | None, rendered: str | None
) -> None:
    job = _job(worker, chief)
    cluster = tfconfig.cluster_spec(job, tfconfig.local_host(dict.fromkeys(job.replica_keys(), 1)))
    for rtype, index in job.replica_keys():
        env = tfconfig.replica_env(job, cluster, rtype, index, "ns", None)
        assert env.get(constants.ENV_WORKER_GPUS) == rendered, (rtype, env)
