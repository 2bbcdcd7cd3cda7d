"""`trainjob tensorboard` on a cluster, the pure part: the short-lived TensorBoard Pod that
mounts a job's checkpoint volume read-only, and why such a Pod does not start.

The Pod runs the trainjob image (it ships TensorBoard) with TensorBoard bound to the Pod's
loopback only: the port-forward reaches it there, nothing else in the cluster does (no
Service, no Pod IP listener). It satisfies Pod Security "restricted" (non-root user 1000, no
privilege escalation, no capabilities, the runtime's seccomp profile), so it runs in the
same namespaces as the jobs. It carries no `trainjob.dev/job-name` label (the operator would
take it for a replica) and a non-controller ownerReference to the job: deleting the job removes
a Pod that a killed `trainjob tensorboard` left behind, and `activeDeadlineSeconds` ends one
whose job lives on.

A TrainJob's logs are on its checkpoint volume. A TFJob has none: its code writes its logs where
it chooses, so the Pod mounts every PersistentVolumeClaim its `tensorflow` containers mount,
each at LOGDIR + the path the job mounts it at (Kubeflow's mnist_with_summaries writes to
/train/logs: TensorBoard shows the run `train/logs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.cluster.objects import ref_of, source_of
from trainjob.core import constants, containers
from trainjob.core.policy_terms import CONTAINER_STUCK_REASONS

Obj = dict[str, Any]

PORT: Final = 6006  # TensorBoard's own default, inside the Pod
CONTAINER: Final = "tensorboard"
LOGDIR: Final = "/logs"  # the checkpoint volume (its subPath), read-only
LABEL_FOR_JOB: Final = f"{constants.GROUP}/tensorboard-for"
# A Pod whose `trainjob tensorboard` was killed (SIGKILL, a lost laptop) ends by itself.
MAX_SECONDS: Final = 12 * 3600
RUNTIME_UID: Final = 1000  # the user of the trainjob images
# Bound to the Pod's loopback: reached through the port-forward only.
COMMAND: Final = (
    "python", "-m", "tensorboard.main", "--logdir", LOGDIR, "--host", "127.0.0.1",
    "--port", str(PORT),
)  # fmt: skip


class BoardError(ValueError):
    """A job TensorBoard cannot be served for, with the reason in words."""


def pod_name(job: str, suffix: str) -> str:
    """`<job>-tensorboard-<suffix>`, within the 63 characters of a label value (the job name
    is one already: a DNS label)."""
    tail = f"-tensorboard-{suffix}"
    return job[: 63 - len(tail)].rstrip("-") + tail


def job_image(job: Mapping[str, Any]) -> str | None:
    """The image the job's replicas run: `spec.image`, else the first replica template's
    `tensorflow` container image."""
    spec = job.get("spec") or {}
    if spec.get("image"):
        return str(spec["image"])
    for replica in (spec.get("replicaSpecs") or {}).values():
        template = (replica or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or []:
            if container.get("name") == constants.DEFAULT_CONTAINER_NAME and container.get("image"):
                return str(container["image"])
    return None


def checkpoint_volume(job: Mapping[str, Any]) -> tuple[str, str | None]:
    """(claim name, sub-path) of the job's checkpoint volume; BoardError when it has none (its
    TensorBoard logs then lived in the Pods' own file systems, gone with them)."""
    name = (job.get("metadata") or {}).get("name", "?")
    checkpoint = (job.get("spec") or {}).get("checkpoint") or {}
    claim = checkpoint.get("claimName")
    if not claim:
        raise BoardError(
            f"TrainJob {name} has no checkpoint volume (spec.checkpoint.claimName), so its "
            "TensorBoard logs were written inside its Pods and are not kept; give the job a "
            "PersistentVolumeClaim in spec.checkpoint to see them"
        )
    return str(claim), checkpoint.get("subPath") or None


def tfjob_volumes(job: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """(where the TFJob mounts it, claim name, sub-path) of every PersistentVolumeClaim the
    `tensorflow` containers of a TFJob's view mount, in replica order, each once; BoardError
    when they mount none."""
    found: list[tuple[str, str, str | None]] = []
    for replica in ((job.get("spec") or {}).get("replicaSpecs") or {}).values():
        pod_spec = ((replica or {}).get("template") or {}).get("spec") or {}
        claims = {
            volume.get("name"): volume["persistentVolumeClaim"].get("claimName")
            for volume in pod_spec.get("volumes") or []
            if isinstance(volume.get("persistentVolumeClaim"), Mapping)
        }
        for container in pod_spec.get("containers") or []:
            if container.get("name") != constants.DEFAULT_CONTAINER_NAME:
                continue
            for mount in container.get("volumeMounts") or []:
                claim = claims.get(mount.get("name"))
                entry = (str(mount.get("mountPath") or ""), str(claim), mount.get("subPath"))
                if claim and entry[0] and entry not in found:
                    found.append(entry)
    if not found:
        name = (job.get("metadata") or {}).get("name", "?")
        raise BoardError(
            f"TFJob {name} mounts no PersistentVolumeClaim in its "
            f"{constants.DEFAULT_CONTAINER_NAME} containers, so its TensorBoard logs were "
            "written inside its Pods and are not kept; "
            "mount one and write the logs there (tf.summary, the TensorBoard callback) to see them"
        )
    return found


def _mounts(job: Mapping[str, Any]) -> tuple[list[Obj], list[Obj]]:
    """The TensorBoard container's read-only mounts and the Pod's volumes: a TrainJob's
    checkpoint volume at LOGDIR; each claim a TFJob mounts at LOGDIR + its mount path."""
    if not ref_of(job).is_tfjob:
        claim, sub_path = checkpoint_volume(job)
        mount: Obj = {"name": "checkpoints", "mountPath": LOGDIR, "readOnly": True}
        if sub_path:
            mount["subPath"] = sub_path
        volume = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}
        return [mount], [volume]
    mounts, volumes = [], []
    taken: set[str] = set()
    for i, (path, claim, sub_path) in enumerate(tfjob_volumes(job)):
        where = f"{LOGDIR}/{path.strip('/')}".rstrip("/")
        if where in taken:  # the same path, another claim (in another replica type)
            where = f"{where}-{i}"
        taken.add(where)
        mount = {"name": f"logs-{i}", "mountPath": where, "readOnly": True}
        if sub_path:
            mount["subPath"] = sub_path
        mounts.append(mount)
        volumes.append({"name": f"logs-{i}", "persistentVolumeClaim": {"claimName": claim}})
    return mounts, volumes


def tensorboard_pod(job: Mapping[str, Any], suffix: str, image: str | None = None) -> Obj:
    """The TensorBoard Pod for `job` (as read from the API server, with its uid; a TFJob as
    its view, `objects.tfjob_view`)."""
    metadata = job.get("metadata") or {}
    name = str(metadata.get("name") or "")
    mounts, volumes = _mounts(job)
    chosen = image or job_image(job)
    if not chosen:
        raise BoardError(
            f"{ref_of(job).kind} {name} names no image to run TensorBoard in; give --image "
            "(the trainjob image ships TensorBoard)"
        )
    owner: list[Obj] = []
    if metadata.get("uid"):
        # Not the controller: the operator counts only Pods it controls as replicas. The
        # kind is the job's own (a TFJob's): the garbage collector finds the owner by it.
        source = source_of(job)
        owner = [
            {
                "apiVersion": str(source.get("apiVersion") or constants.API_VERSION),
                "kind": str(source.get("kind") or constants.KIND),
                "name": name,
                "uid": metadata["uid"],
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, suffix),
            "labels": {
                LABEL_FOR_JOB: name,
                constants.LABEL_APP_NAME: constants.APP_NAME,
                constants.LABEL_APP_COMPONENT: "tensorboard",
                constants.LABEL_APP_INSTANCE: name,
            },
            "ownerReferences": owner,
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": MAX_SECONDS,
            # Beside the job's Pods when they run: a ReadWriteOnce volume (most cloud disks)
            # attaches to one node at a time. Preferred, not required: after the job, anywhere.
            "affinity": {
                "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": {constants.LABEL_JOB_NAME: name}},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNTIME_UID,
                "runAsGroup": RUNTIME_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": chosen,
                    "command": list(COMMAND),
                    # The trainjob image's TF quiet, and no TensorFlow banner in the log.
                    "env": [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "3"}],
                    "ports": [{"name": "tensorboard", "containerPort": PORT}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": False,
                    },
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def started(pod: Mapping[str, Any]) -> bool:
    """Whether TensorBoard's container is running."""
    container = containers.named(pod, CONTAINER)
    # `running: {startedAt: ...}`; present, even empty, is what counts
    return container is not None and container.running is not None


def failure(pod: Mapping[str, Any]) -> str | None:
    """Why the Pod will not serve (it ended, or its container cannot start), in the kubelet's
    words; None while it may still come up."""
    for container in containers.of_pod(pod):
        ended = container.terminated
        if ended:
            said = " ".join(str(ended.get("message") or "").split()[-40:])
            why = ended.get("reason") or "Error"
            return f"TensorBoard exited with code {ended.get('exitCode')} ({why})" + (
                f": {said}" if said else ""
            )
        waiting = container.waiting or {}
        if waiting.get("reason") in CONTAINER_STUCK_REASONS:
            return f"{waiting['reason']}: {waiting.get('message') or 'no message'}"
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"the Pod is {status['phase']}: {status.get('reason') or ''} " + str(
            status.get("message") or ""
        )
    return None


def waiting_reason(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str:
    """What the Pod waits for now (to say when it did not start in time): an unschedulable
    condition, the newest Warning Event (FailedMount, FailedScheduling...), or its phase."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason')}: {condition.get('message')}"
    warnings = [e for e in events if e.get("type") == "Warning"]
    if warnings:
        last = warnings[-1]
        return f"{last.get('reason')}: {last.get('message')}"
    return f"the Pod is {(pod.get('status') or {}).get('phase') or 'Pending'}"
