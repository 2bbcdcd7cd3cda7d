"""The CUDA image (`trainjob:<version>-gpu`) on a real node without a GPU: it is TensorFlow's
CUDA build with every NVIDIA library on the loader's path, it trains the 2-worker example on
the CPU and says so, a replica given GPUs that its TensorFlow cannot use fails at once with
the missing library in status, and the GPU example waits with the scheduler's words for
`nvidia.com/gpu` in status.

No GPU here: what needs one (NCCL, memory growth, throughput) is measured by
bench/gpu_check.py on a GPU host (README "GPUs")."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest

from tests.controlplane.e2e_cluster import Cluster, wait_until
from tests.e2e.conftest import IMAGE_TAG
from tests.e2e.test_failures import condition, mnist, waiting_because
from tests.e2e.test_images import run_pod
from tests.e2e.test_trainjob import JOB_TIMEOUT, example

# On kind, one worker alone holds the 7 GB image (e2e_cluster.KIND_ONE_WORKER_IMAGES): the
# Pods that run it are placed there (Cluster.node_selector). The marker lets a cluster
# without room for it leave these out (.github/workflows/e2e.yaml).
pytestmark = [pytest.mark.e2e, pytest.mark.cuda_image]

GPU_IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}-gpu"

# Run inside the image: what TensorFlow was built with and which CUDA libraries the loader
# finds, asked the way the runtime asks before it lets a replica given GPUs train.
PROBE: Final = """
import ctypes, json, os
import tensorflow as tf
from trainjob.runtime import devices, strategy
info = tf.sysconfig.get_build_info()
wanted = devices.cuda_libraries(info.get("cuda_version"), info.get("cudnn_version"))
off_runpath = {}
for name in ("libnvJitLink.so.12", "libcurand.so.10", "libnvrtc.so.12"):
    try:
        ctypes.CDLL(name)
        off_runpath[name] = "loaded"
    except OSError as exc:
        off_runpath[name] = str(exc)
print("PROBE " + json.dumps({
    "cuda_build": tf.test.is_built_with_cuda(),
    "cuda_version": info.get("cuda_version"),
    "wanted": list(wanted),
    "missing": [name for name, _ in strategy.missing_libraries(wanted)],
    "off_runpath": off_runpath,
    "gpus": len(tf.config.list_physical_devices("GPU")),
    "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    "cuda_cache": os.environ.get("CUDA_CACHE_PATH"),
    "cuda_cache_writable": os.access(os.environ.get("CUDA_CACHE_PATH", "/nonexistent"), os.W_OK),
}))
"""


def with_devices_of(
    cluster: Cluster, namespace: str, job: str, replicas: set[str]
) -> dict[str, Any] | None:
    """The job's status.progress once it holds the devices of every replica named."""
    status = cluster.get_json("trainjob", job, "-n", namespace).get("status") or {}
    progress: dict[str, Any] = status.get("progress") or {}
    return progress if set(progress.get("replicaDevices") or {}) >= replicas else None


def test_gpu_image_is_tensorflows_cuda_build_with_its_libraries_on_the_loader_path(
    cluster: Cluster, namespace: str
) -> None:
    phase, log = run_pod(
        cluster, namespace, "gpu-probe", GPU_IMAGE, command=["python", "-c", PROBE]
    )
    assert phase == "Succeeded", log
    lines = [line for line in log.splitlines() if line.startswith("PROBE ")]
    assert lines, log
    probe = json.loads(lines[-1].removeprefix("PROBE "))
    assert probe["cuda_build"] is True, probe
    assert str(probe["cuda_version"]).startswith("12."), probe
    # Every CUDA library TensorFlow opens loads, except the driver's: the node has no GPU, and
    # libcuda.so.1 comes from the node's driver through the NVIDIA container toolkit.
    assert "libcudnn.so.9" in probe["wanted"], probe
    assert probe["missing"] == ["libcuda.so.1"], probe
    # The libraries on none of TensorFlow's RUNPATHs load through the image's ld.so.conf.d.
    assert set(probe["off_runpath"].values()) == {"loaded"}, probe
    assert probe["gpus"] == 0, probe
    # Nothing baked in that would hand a Pod every GPU of its node.
    assert probe["nvidia_visible_devices"] is None, probe
    assert probe["cuda_cache"] == "/cuda-cache" and probe["cuda_cache_writable"], probe


def test_gpu_image_trains_the_two_worker_example_without_a_gpu_and_says_so(
    cluster: Cluster, namespace: str
) -> None:
    """No GPU was asked for, so none is expected: the CUDA build trains on the CPU, and its
    start event says which devices it saw (a CPU run is said, never silent)."""
    manifest = mnist("gpu-image-cpu", 2, epochs=2)
    manifest["spec"]["image"] = GPU_IMAGE
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {"nodeSelector": cluster.node_selector(GPU_IMAGE)}
    }
    cluster.apply(namespace, json.dumps(manifest))
    assert cluster.wait_finished(namespace, "gpu-image-cpu", JOB_TIMEOUT) == "Succeeded"
    # Worker 0's log (worker 1's Pod may be cleaned up already: cleanPodPolicy Running).
    starts = [
        e for e in cluster.progress(namespace, "gpu-image-cpu-worker-0") if e["event"] == "start"
    ]
    assert starts, "worker-0 logged no start event"
    devices = starts[-1]["devices"]
    assert devices["cuda_build"] is True and devices["gpus"] == 0, starts[-1]
    # Every replica's devices in status, and the DEVICES column says CPU.
    progress = wait_until(
        lambda: with_devices_of(cluster, namespace, "gpu-image-cpu", {"worker-0", "worker-1"}),
        timeout=60,
        what="both workers' devices in status",
    )
    assert progress["deviceSummary"] == "CPU", progress
    for replica, seen in progress["replicaDevices"].items():
        assert seen["gpus"] == 0 and seen["cudaBuild"] is True, (replica, seen)
    table = cluster.kubectl("get", "tj", "gpu-image-cpu", "-n", namespace)
    assert "DEVICES" in table and " CPU " in table, table


def test_a_replica_given_a_gpu_its_tensorflow_cannot_use_fails_naming_the_driver_library(
    cluster: Cluster, namespace: str
) -> None:
    """NVIDIA_VISIBLE_DEVICES naming a device is what the device plugin gives a container that
    asked for nvidia.com/gpu; on a node whose containers get no driver, the replica stops at
    once (exit 4, permanent) instead of training on its CPU, and the job's status says why."""
    manifest = mnist("gpu-no-driver", 1, epochs=1)
    manifest["spec"]["image"] = GPU_IMAGE
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {
            "nodeSelector": cluster.node_selector(GPU_IMAGE),
            "containers": [
                {"name": "tensorflow", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}
            ],
        }
    }
    cluster.apply(namespace, json.dumps(manifest))
    assert cluster.wait_finished(namespace, "gpu-no-driver", JOB_TIMEOUT) == "Failed"
    failed = condition(cluster, namespace, "gpu-no-driver", "Failed")
    assert failed is not None
    message = failed.get("message", "")
    assert "NVIDIA_VISIBLE_DEVICES=0" in message and "libcuda.so.1" in message, failed
    status: dict[str, Any] = cluster.get_json("trainjob", "gpu-no-driver", "-n", namespace)[
        "status"
    ]
    worker = status["replicaStatuses"]["worker"]
    assert [entry.get("exitCode") for entry in worker["indexes"]] == [4], worker


def test_the_gpu_example_waits_for_nvidia_gpus_with_the_schedulers_words(
    cluster: Cluster, namespace: str
) -> None:
    """The node advertises no nvidia.com/gpu: the workers stay Pending and status quotes the
    scheduler, naming the resource (the chief and the ps, which ask for none, are placed)."""
    manifest = example("mnist-gpu-parameter-server.yaml")
    name = manifest["metadata"]["name"]
    cluster.apply(namespace, json.dumps(manifest))
    cond = wait_until(
        lambda: waiting_because(cluster, namespace, name, {"Unschedulable"}),
        timeout=180,
        what="Unschedulable in status",
    )
    assert "nvidia.com/gpu" in cond["message"], cond
    pods = {p["metadata"]["name"]: p for p in cluster.job_pods(namespace, name)}
    images = {
        pod: p["spec"]["containers"][0]["image"] for pod, p in pods.items() if "-worker-" in pod
    }
    assert images and set(images.values()) == {GPU_IMAGE}, images
