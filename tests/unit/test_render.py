"""Rendering of Pods and headless Services: env, ports, labels, ownerReferences, checkpoint
volume; the user's template is kept and only added to."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import pytest
import yaml

from trainjob.core import convert, render, spec

ROOT = pathlib.Path(__file__).parents[2]


def load_example(name: str) -> spec.TrainJob:
    return spec.parse(yaml.safe_load((ROOT / "examples" / name).read_text()))


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


OPTIONS = render.RenderOptions(namespace="team-a", cluster_domain="cluster.local")
OWNER = render.Owner("mnist-parameter-server", "0b5a-uid")


def test_pod_carries_tf_config_runtime_env_labels_and_owner() -> None:
    job = load_example("mnist-parameter-server.yaml")
    pod = render.render_pod(job, "worker", 1, 2, OPTIONS, OWNER)
    assert pod["metadata"]["name"] == "mnist-parameter-server-worker-1"
    assert pod["metadata"]["namespace"] == "team-a"
    labels = pod["metadata"]["labels"]
    assert labels["trainjob.dev/job-name"] == "mnist-parameter-server"
    assert labels["trainjob.dev/replica-type"] == "worker"
    assert labels["trainjob.dev/replica-index"] == "1"
    assert labels["app.kubernetes.io/managed-by"] == "trainjob-operator"
    assert pod["metadata"]["annotations"]["trainjob.dev/attempt"] == "2"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "name": "mnist-parameter-server",
            "uid": "0b5a-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    env = env_of(pod)
    config = json.loads(env["TF_CONFIG"])
    assert config["task"] == {"type": "worker", "index": 1}
    assert config["cluster"]["ps"] == ["mnist-parameter-server-ps-0.team-a.svc.cluster.local:2222"]
    assert env["TRAINJOB_ENTRYPOINT"] == "trainjob.samples.mnist:build"
    assert env["TRAINJOB_STRATEGY"] == "ParameterServer"
    assert json.loads(env["TRAINJOB_CONFIG"])["epochs"] == 2
    assert env["TRAINJOB_CHECKPOINT_DIR"] == "/checkpoints"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "trainjob", "train"]
    assert container["image"] == "trainjob/trainjob:0.1.0"
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    assert container["volumeMounts"] == [
        {
            "name": "trainjob-checkpoint",
            "mountPath": "/checkpoints",
            "subPath": "mnist-parameter-server",
        }
    ]
    assert pod["spec"]["volumes"] == [
        {
            "name": "trainjob-checkpoint",
            "persistentVolumeClaim": {"claimName": "trainjob-checkpoints"},
        }
    ]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_user_template_is_kept_and_user_env_wins() -> None:
    job = spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "own"},
            "spec": {
                "replicaSpecs": {
                    "worker": {
                        "replicas": 2,
                        "template": {
                            "metadata": {"labels": {"team": "a"}, "annotations": {"x": "y"}},
                            "spec": {
                                "nodeSelector": {"gpu": "a100"},
                                "containers": [
                                    {"name": "sidecar", "image": "busybox"},
                                    {
                                        "name": "tensorflow",
                                        "image": "mine:1",
                                        "command": ["python", "train.py"],
                                        "env": [{"name": "TRAINJOB_NAME", "value": "mine"}],
                                        "ports": [{"name": "tfjob-port", "containerPort": 3000}],
                                    },
                                ],
                            },
                        },
                    }
                }
            },
        }
    )
    pod = render.render_pod(job, "worker", 0, 0, OPTIONS, None)
    assert "ownerReferences" not in pod["metadata"]
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["annotations"]["x"] == "y"
    assert pod["spec"]["nodeSelector"] == {"gpu": "a100"}
    sidecar, tf = pod["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert tf["command"] == ["python", "train.py"]
    names = [e["name"] for e in tf["env"]]
    assert names.count("TRAINJOB_NAME") == 1 and tf["env"][0]["value"] == "mine"
    assert "TRAINJOB_ENTRYPOINT" not in names  # no spec.runtime: nothing for the runtime
    assert json.loads(next(e["value"] for e in tf["env"] if e["name"] == "TF_CONFIG"))["cluster"][
        "worker"
    ][0].endswith(":3000")
    assert tf["ports"] == [{"name": "tfjob-port", "containerPort": 3000}]


def test_service_is_headless_selects_one_replica_and_publishes_not_ready() -> None:
    job = load_example("mnist-multiworker.yaml")
    service = render.render_service(job, "worker", 1, OPTIONS, OWNER)
    assert service["metadata"]["name"] == "mnist-multiworker-worker-1"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        "trainjob.dev/job-name": "mnist-multiworker",
        "trainjob.dev/replica-type": "worker",
        "trainjob.dev/replica-index": "1",
    }
    assert service["spec"]["ports"] == [{"name": "tfjob-port", "port": 2222, "targetPort": 2222}]


def test_render_all_lists_services_then_pods_for_every_replica() -> None:
    job = load_example("mnist-parameter-server.yaml")
    manifests = render.render_all(job, OPTIONS, OWNER)
    kinds = [m["kind"] for m in manifests]
    assert kinds == ["Service"] * 4 + ["Pod"] * 4


def test_dtensor_job_gets_dtensor_env() -> None:
    job = load_example("mnist-dtensor.yaml")
    env = env_of(render.render_pod(job, "worker", 1, 0, OPTIONS, None))
    assert env["DTENSOR_CLIENT_ID"] == "1"
    assert env["DTENSOR_NUM_CLIENTS"] == "2"
    assert env["DTENSOR_JOBS"] == (
        "mnist-dtensor-worker-0.team-a.svc.cluster.local:2222,"
        "mnist-dtensor-worker-1.team-a.svc.cluster.local:2222"
    )


def test_pods_meet_pod_security_restricted_by_default() -> None:
    """seccomp RuntimeDefault, no privilege escalation, all capabilities dropped; the runtime's
    own image runs as non-root; the checkpoint volume is writable through fsGroup."""
    job = load_example("mnist-multiworker.yaml")
    pod = render.render_pod(job, "worker", 0, 0, OPTIONS, OWNER)
    assert pod["spec"]["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_users_security_context_wins_and_own_images_may_run_as_root() -> None:
    """A user's own command (no spec.runtime) gets no runAsNonRoot: most TensorFlow images run
    as root and kubelet would refuse them. Keys the user set are kept as they are."""
    job = spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "own"},
            "spec": {
                "replicaSpecs": {
                    "worker": {
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "securityContext": {"fsGroup": 2000, "runAsUser": 0},
                                "containers": [
                                    {
                                        "name": "tensorflow",
                                        "image": "tensorflow/tensorflow:2.15.0",
                                        "command": ["python", "train.py"],
                                        "securityContext": {
                                            "capabilities": {"add": ["SYS_PTRACE"]}
                                        },
                                    }
                                ],
                            }
                        },
                    }
                },
                "checkpoint": {"claimName": "ckpt", "path": "/ckpt"},
            },
        }
    )
    pod = render.render_pod(job, "worker", 0, 0, OPTIONS, None)
    assert pod["spec"]["securityContext"] == {
        "fsGroup": 2000,
        "runAsUser": 0,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "capabilities": {"add": ["SYS_PTRACE"]},
        "allowPrivilegeEscalation": False,
    }


def kubeflow_keras_api_job() -> spec.TrainJob:
    """Kubeflow's keras-API example as `trainjob convert` makes it: the template mounts its
    own claim at /train; no spec.checkpoint, no securityContext."""
    tfjob = yaml.safe_load((ROOT / "tests/corpus/tfjob/keras-api-volume.yaml").read_text())
    return spec.parse(convert.convert_tfjob(tfjob).trainjob)


def with_volumes(volumes: list[dict[str, Any]], security: dict[str, Any] | None = None) -> Any:
    """A one-worker job of one's own image whose template declares `volumes`."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "tensorflow", "image": "tf:1", "command": ["python", "t.py"]}],
        "volumes": volumes,
    }
    if security is not None:
        pod_spec["securityContext"] = security
    return spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "own"},
            "spec": {"replicaSpecs": {"worker": {"replicas": 1, "template": {"spec": pod_spec}}}},
        }
    )


def test_a_templates_own_claim_is_writable_through_fs_group() -> None:
    """Issue 32: a converted Kubeflow job that mounts its own claim (no spec.checkpoint) got
    no fsGroup, so a fresh root-owned volume refused the non-root user's checkpoint."""
    pod = render.render_pod(kubeflow_keras_api_job(), "worker", 0, 0, OPTIONS, None)
    security = pod["spec"]["securityContext"]
    assert security["fsGroup"] == render.RUNTIME_IMAGE_UID
    assert security["fsGroupChangePolicy"] == "OnRootMismatch"


@pytest.mark.parametrize(
    "source",
    [
        {"persistentVolumeClaim": {"claimName": "data"}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
        {"csi": {"driver": "disk.csi.example.com"}},
        {"gcePersistentDisk": {"pdName": "disk-1"}},
    ],
)
def test_every_disk_like_volume_gets_fs_group(source: dict[str, Any]) -> None:
    pod = render.render_pod(with_volumes([{"name": "v", **source}]), "worker", 0, 0, OPTIONS, None)
    assert pod["spec"]["securityContext"]["fsGroup"] == render.RUNTIME_IMAGE_UID


@pytest.mark.parametrize(
    "source",
    [
        {},  # no source: an emptyDir, writable by everyone already
        {"emptyDir": {}},
        {"configMap": {"name": "c"}},
        {"secret": {"secretName": "s"}},
        {"hostPath": {"path": "/data"}},  # the kubelet never changes its ownership
        {"nfs": {"server": "nfs", "path": "/"}},  # nor an NFS share's
    ],
)
def test_volumes_fs_group_cannot_help_get_none(source: dict[str, Any]) -> None:
    pod = render.render_pod(with_volumes([{"name": "v", **source}]), "worker", 0, 0, OPTIONS, None)
    assert "fsGroup" not in pod["spec"]["securityContext"]


def test_a_templates_own_fs_group_wins_without_a_change_policy_of_ours() -> None:
    job = with_volumes([{"name": "v", "persistentVolumeClaim": {"claimName": "d"}}], {"fsGroup": 7})
    security = render.render_pod(job, "worker", 0, 0, OPTIONS, None)["spec"]["securityContext"]
    assert security["fsGroup"] == 7
    assert "fsGroupChangePolicy" not in security


def test_mount_paths_are_the_tf_containers_and_the_checkpoint() -> None:
    assert render.mount_paths(kubeflow_keras_api_job(), "worker") == ("/train",)
    assert render.mount_paths(load_example("mnist-multiworker.yaml"), "worker") == ("/checkpoints",)


def byo_job(image: str | None, runtime: bool) -> spec.TrainJob:
    """A replica with its own command (the runtime is not run), in `image`."""
    container: dict[str, Any] = {"name": "tensorflow", "command": ["python", "train.py"]}
    if image is not None:
        container["image"] = image
    manifest: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "byo"},
        "spec": {
            "image": "ghcr.io/x/trainjob:1",
            "replicaSpecs": {
                "worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}
            },
        },
    }
    if runtime:
        manifest["spec"]["runtime"] = {"entrypoint": "m:f"}
    return spec.parse(manifest)


def test_a_script_in_the_runtime_image_finds_the_offline_mnist_like_trainjob_run() -> None:
    pod = render.render_pod(byo_job(None, runtime=True), "worker", 0, 0, OPTIONS, None)
    assert env_of(pod)["TFDS_DATA_DIR"] == "/data"
    default = render.RenderOptions(namespace="n", default_image="ghcr.io/x/trainjob:1")
    pod = render.render_pod(byo_job("ghcr.io/x/trainjob:1", False), "worker", 0, 0, default, None)
    assert env_of(pod)["TFDS_DATA_DIR"] == "/data"


def test_another_image_keeps_tfds_default_data_dir() -> None:
    pod = render.render_pod(
        byo_job("tensorflow/tensorflow:2.15", True), "worker", 0, 0, OPTIONS, None
    )
    assert "TFDS_DATA_DIR" not in env_of(pod)
    pod = render.render_pod(byo_job(None, runtime=False), "worker", 0, 0, OPTIONS, None)
    assert "TFDS_DATA_DIR" not in env_of(pod)  # spec.image without spec.runtime: unknown image


def test_termination_message_falls_back_to_the_logs_tail_unless_the_user_chose() -> None:
    pod = render.render_pod(byo_job("mine:1", False), "worker", 0, 0, OPTIONS, None)
    assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    job = byo_job("mine:1", False)
    template = job.replica_specs["worker"].template
    template["spec"]["containers"][0]["terminationMessagePolicy"] = "File"
    pod = render.render_pod(job, "worker", 0, 0, OPTIONS, None)
    assert pod["spec"]["containers"][0]["terminationMessagePolicy"] == "File"


def test_restricted_defaults_let_an_image_of_ones_own_run_under_restricted() -> None:
    """Kubeflow's keras example as converted: its own image and command, no securityContext.
    Without the operator's --restricted-pod-defaults the API server refuses such a Pod in a
    namespace enforcing "restricted" (runAsNonRoot != true); with it, every field that
    profile checks is set, and what the template sets wins."""
    manifest: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "keras"},
        "spec": {
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "initContainers": [{"name": "fetch", "image": "busybox"}],
                            "containers": [
                                {
                                    "name": "tensorflow",
                                    "image": "tensorflow/tensorflow:2.15.0",
                                    "command": ["python", "/train.py"],
                                },
                                {
                                    "name": "sidecar",
                                    "image": "busybox",
                                    "securityContext": {"capabilities": {"drop": ["NET_RAW"]}},
                                },
                            ],
                        }
                    },
                }
            }
        },
    }
    job = spec.parse(manifest)
    plain = render.render_pod(job, "worker", 0, 0, OPTIONS, OWNER)
    assert "runAsNonRoot" not in plain["spec"]["securityContext"]
    restricted = dataclasses.replace(OPTIONS, restricted_defaults=True)
    pod = render.render_pod(job, "worker", 0, 0, restricted, OWNER)
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (1000, 1000)
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container
    sidecar = pod["spec"]["containers"][1]
    assert sidecar["securityContext"]["capabilities"] == {"drop": ["NET_RAW"]}  # theirs wins
    assert pod["spec"]["initContainers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    manifest["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["securityContext"] = {
        "runAsUser": 2000
    }
    own = render.render_pod(spec.parse(manifest), "worker", 0, 0, restricted, OWNER)
    assert own["spec"]["securityContext"]["runAsUser"] == 2000
    assert "runAsGroup" not in own["spec"]["securityContext"]
