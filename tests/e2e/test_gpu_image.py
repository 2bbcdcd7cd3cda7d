"""The CUDA image (`trainjob:<version>-gpu`) on a machine without a GPU: it is TensorFlow's
CUDA build with every NVIDIA library on the loader's path, it trains the 2-worker example on
the CPU and says so, a replica given GPUs that its TensorFlow cannot use fails at once naming
the missing library, and the GPU example waits with the scheduler's words for `nvidia.com/gpu`
in status.

What the image does by itself needs no cluster: those tests run the Pods the operator renders
as containers from buildah's image store on this machine (tests/e2e/buildah_pods.py), so the
kind cluster never loads the 7 GB image. What the operator makes of a replica's report is
the same for every image and is tested with the CPU image and on a real API server: the
devices in status and the DEVICES column (tests/e2e/test_trainjob.py, tests/integration/
test_progress.py, tests/unit/test_progress_devices.py), a termination message and exit code
in the Failed condition and replicaStatuses (tests/integration/test_failures_operator.py,
tests/unit/test_policy.py). Only the wait for GPUs needs the scheduler: it runs on the
cluster, whose workers never pull the image (they stay Pending).

No GPU here: what needs one (NCCL, memory growth, throughput) is measured by
bench/gpu_check.py on a GPU host (docs: guides/gpus.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest

from tests.controlplane.e2e_cluster import Cluster, wait_until
from tests.e2e import buildah_pods
from tests.e2e.conftest import IMAGE_TAG
from tests.e2e.test_failures import mnist, waiting_because
from tests.e2e.test_images import RESTRICTED_CONTAINER
from tests.e2e.test_trainjob import example
from trainjob.core import termination

pytestmark = pytest.mark.e2e
# The tests that run the image, from buildah's store (root, `bash images/build.sh`): left out
# where the images are built elsewhere (.github/workflows/e2e.yaml builds them with Docker).
cuda_image = pytest.mark.cuda_image

GPU_IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}-gpu"
# Loaded cores: TensorFlow imports in ~4 s per process; the 2-worker job took ~20 s alone.
REPLICAS_TIMEOUT: Final = 150.0

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


@cuda_image
def test_gpu_image_is_tensorflows_cuda_build_with_its_libraries_on_the_loader_path(
    tmp_path: Path,
) -> None:
    pod = {
        "metadata": {"name": "gpu-probe"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": GPU_IMAGE,
                    "securityContext": RESTRICTED_CONTAINER,
                    "command": ["python", "-c", PROBE],
                }
            ],
        },
    }
    (exited,) = buildah_pods.run_pods([pod], tmp_path, REPLICAS_TIMEOUT)
    log = exited.log()
    assert exited.exit_code == 0, log
    lines = [line for line in exited.stdout.splitlines() if line.startswith("PROBE ")]
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


@cuda_image
def test_gpu_image_trains_the_two_worker_example_without_a_gpu_and_says_so(
    tmp_path: Path,
) -> None:
    """No GPU was asked for, so none is expected: the CUDA build trains on the CPU, and each
    worker's start event says which devices it saw (a CPU run is said, never silent): what the
    operator puts in status.progress.replicaDevices and the DEVICES column."""
    manifest = mnist("gpu-image-cpu", 2, epochs=2)
    manifest["spec"]["image"] = GPU_IMAGE
    pods = buildah_pods.rendered_pods(manifest)
    assert [p["metadata"]["name"] for p in pods] == [
        "gpu-image-cpu-worker-0",
        "gpu-image-cpu-worker-1",
    ]
    exited = buildah_pods.run_pods(pods, tmp_path, REPLICAS_TIMEOUT)
    logs = "\n".join(e.log() for e in exited)
    assert [e.exit_code for e in exited] == [0, 0], logs
    for worker in exited:
        starts = [e for e in worker.events() if e["event"] == "start"]
        assert starts, f"{worker.pod} logged no start event\n{logs}"
        devices = starts[-1]["devices"]
        assert devices["cuda_build"] is True and devices["gpus"] == 0, (worker.pod, starts[-1])
    # Worker 0 trained every step of both epochs (a 2-worker collective: worker 1 did too).
    end = [e for e in exited[0].events() if e["event"] == "end"]
    assert end and end[-1]["status"] == "succeeded" and end[-1]["step"] == 2 * 40, end


@cuda_image
def test_a_replica_given_a_gpu_its_tensorflow_cannot_use_fails_naming_the_driver_library(
    tmp_path: Path,
) -> None:
    """NVIDIA_VISIBLE_DEVICES naming a device is what the device plugin gives a container that
    asked for nvidia.com/gpu; on a node whose containers get no driver, the replica stops at
    once (exit 4, permanent under ExitCode) instead of training on its CPU, and its termination
    message says why: the cause the job's Failed condition quotes."""
    manifest = mnist("gpu-no-driver", 1, epochs=1)
    manifest["spec"]["image"] = GPU_IMAGE
    manifest["spec"]["replicaSpecs"]["worker"]["template"] = {
        "spec": {
            "containers": [
                {"name": "tensorflow", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}
            ],
        }
    }
    (exited,) = buildah_pods.run_pods(
        buildah_pods.rendered_pods(manifest), tmp_path, REPLICAS_TIMEOUT
    )
    log = exited.log()
    assert exited.exit_code == 4, log
    assert not [e for e in exited.events() if e["event"] in ("start", "step")], log
    cause = termination.read(exited.termination_message).cause
    assert cause is not None, (exited.termination_message, log)
    assert "NVIDIA_VISIBLE_DEVICES=0" in cause and "libcuda.so.1" in cause, cause


def test_the_gpu_example_waits_for_nvidia_gpus_with_the_schedulers_words(
    cluster: Cluster, namespace: str
) -> None:
    """The node advertises no nvidia.com/gpu: the workers stay Pending and status quotes the
    scheduler, naming the resource (the chief and the ps, which ask for none, are placed). The
    workers name the CUDA image, which no node holds: a Pod never placed pulls nothing."""
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
