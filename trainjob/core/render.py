"""Render the Pod and headless Service of each replica, as plain Kubernetes manifests.

Used by the operator (create calls), by `trainjob render` (a reviewable dry run) and by tests.
The user's PodTemplateSpec is deep-copied and only added to; whatever the user set wins.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from trainjob.core import constants, naming, progress, spec, tfconfig

# The user the runtime images (images/trainjob*, `USER 1000`) run as, and its group.
RUNTIME_IMAGE_UID = 1000
# Where the runtime images bake the offline MNIST (`trainjob data prepare mnist --data-dir`).
RUNTIME_IMAGE_DATA_DIR = "/data"
# tensorflow-datasets' own variable for its default data_dir (`trainjob run` sets it too).
TFDS_DATA_DIR = "TFDS_DATA_DIR"


@dataclasses.dataclass(frozen=True)
class Owner:
    """The job that owns the children (controller ownerReference): a TrainJob, or a TFJob."""

    name: str
    uid: str
    api_version: str = constants.API_VERSION
    kind: str = constants.KIND


@dataclasses.dataclass(frozen=True)
class ProgressEndpoint:
    """Where the Pods of a job report progress: the operator's HTTPS base URL, the CA bundle
    (PEM) that verifies it, and how often to report (seconds)."""

    url: str
    ca_pem: str
    interval_seconds: float = 5.0


class KindLabels(Protocol):
    """A job kind's own labels on its children, beside ours: a TFJob's are training-operator's
    (trainjob.core.tfjob.KubeflowLabels, given by its door). The engine renders them without
    knowing the kind."""

    def pod_labels(self, job_name: str, replica_type: str, index: int) -> dict[str, str]: ...

    def service_selector(self, job_name: str, replica_type: str, index: int) -> dict[str, str]:
        """The labels a replica's Service selects its Pod by (and carries)."""
        ...


@dataclasses.dataclass(frozen=True)
class RenderOptions:
    namespace: str
    cluster_domain: str = constants.DEFAULT_CLUSTER_DOMAIN
    # Image for replicas that set none, when the TrainJob sets no spec.image either.
    default_image: str | None = None
    scheduler_name: str | None = None
    pod_group_name: str | None = None
    progress: ProgressEndpoint | None = None
    # Fill in what Pod Security "restricted" requires and a template leaves unset, for every
    # image (runAsNonRoot with a non-root user, no privilege escalation, no capabilities), so
    # bring-your-own images run in restricted namespaces (an operator flag, off by default).
    restricted_defaults: bool = False
    # The Kubeflow profile, for a TFJob's children: its labels (given by the TFJob's door).
    # Its Pods are what training-operator v1.9.4 makes of the same template: its labels beside
    # ours, TF_CONFIG only in the `tensorflow` container, and no defaults of ours in the
    # template. None: a TrainJob's children.
    kind_labels: KindLabels | None = None


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def checkpoint_dir(job: spec.TrainJob) -> str | None:
    return job.checkpoint.path if job.checkpoint else None


def cluster_of(job: spec.TrainJob, options: RenderOptions) -> tfconfig.ClusterSpec:
    """The job's cluster spec with Kubernetes hosts (the same for every pod)."""
    return tfconfig.cluster_spec(
        job, tfconfig.kubernetes_host(job, options.namespace, options.cluster_domain)
    )


def render_pod(
    job: spec.TrainJob,
    replica_type: str,
    index: int,
    attempt: int,
    options: RenderOptions,
    owner: Owner | None,
    cluster: tfconfig.ClusterSpec | None = None,
) -> dict[str, Any]:
    """The Pod of one replica. Pods never restart in place (restartPolicy Never): the policy
    engine decides every restart, the same way in the operator and in local mode.

    `cluster`: the job's cluster spec when the caller renders many pods (computing it per pod
    made rendering a 1,000-replica job quadratic in time, 61 s)."""
    replica = job.replica_specs[replica_type]
    template = copy.deepcopy(dict(replica.template))
    meta = dict(template.get("metadata") or {})
    pod_spec: dict[str, Any] = dict(template.get("spec") or {})
    name = naming.child_name(job.name, job.task_type(replica_type), index)
    if cluster is None:
        cluster = cluster_of(job, options)
    env = tfconfig.replica_env(
        job, cluster, replica_type, index, options.namespace, checkpoint_dir(job)
    )
    containers = [dict(c) for c in pod_spec.get("containers") or []]
    if not containers:
        containers = [{"name": constants.DEFAULT_CONTAINER_NAME}]
    tf_index = _tf_container_index(containers)
    port = spec.tf_port(replica.template)
    kubeflow = options.kind_labels
    if kubeflow is not None:
        containers[tf_index] = _kubeflow_tf_container(containers[tf_index], env, port)
    else:
        containers[tf_index] = _tf_container(job, containers[tf_index], env, port, options)
    pod_spec["containers"] = containers
    pod_spec["restartPolicy"] = "Never"
    if kubeflow is None:
        pod_spec["securityContext"] = _pod_security_context(
            job, dict(pod_spec.get("securityContext") or {}), pod_spec.get("volumes") or []
        )
    elif options.restricted_defaults:
        pod_spec["securityContext"] = dict(pod_spec.get("securityContext") or {})
    if options.restricted_defaults:
        _restrict(pod_spec)
    if job.checkpoint is not None and job.checkpoint.claim_name is not None:
        volumes = list(pod_spec.get("volumes") or [])
        if not any(v.get("name") == constants.CHECKPOINT_VOLUME_NAME for v in volumes):
            volumes.append(
                {
                    "name": constants.CHECKPOINT_VOLUME_NAME,
                    "persistentVolumeClaim": {"claimName": job.checkpoint.claim_name},
                }
            )
        pod_spec["volumes"] = volumes
    secret = job.checkpoint.credentials_secret if job.checkpoint is not None else None
    if secret is not None:
        volumes = list(pod_spec.get("volumes") or [])
        if not any(v.get("name") == constants.CHECKPOINT_CREDENTIALS_VOLUME_NAME for v in volumes):
            volumes.append(
                {
                    "name": constants.CHECKPOINT_CREDENTIALS_VOLUME_NAME,
                    "secret": {"secretName": secret},
                }
            )
        pod_spec["volumes"] = volumes
    if options.progress is not None:
        _add_progress_volume(job, pod_spec, options)
    if options.scheduler_name and "schedulerName" not in pod_spec:
        pod_spec["schedulerName"] = options.scheduler_name
    # The template's annotations and labels are the user's: ours go beside them. The keys we
    # set ourselves are refused in a template by spec validation (RESERVED_TEMPLATE_*).
    annotations = {
        **dict(meta.get("annotations") or {}),
        constants.ANNOTATION_ATTEMPT: str(attempt),
    }
    if options.pod_group_name:
        annotations["scheduling.k8s.io/group-name"] = options.pod_group_name
    if options.progress is not None:
        annotations[constants.ANNOTATION_PROGRESS_CA] = options.progress.ca_pem
    template_labels = dict(meta.get("labels") or {})
    if kubeflow is not None:
        # As training-operator v1.9.4 makes them: the template's labels and its own (which
        # a TFJob's template cannot set: its door refuses them), no recommended labels.
        labels = {
            **template_labels,
            **naming.replica_selector(job.name, replica_type, index),
            **kubeflow.pod_labels(job.name, replica_type, index),
        }
    else:
        labels = naming.child_labels(job.name, replica_type, index, template_labels)
    if options.pod_group_name:
        labels["scheduling.x-k8s.io/pod-group"] = options.pod_group_name
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": options.namespace,
        "labels": labels,
        "annotations": annotations,
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _add_progress_volume(
    job: spec.TrainJob, pod_spec: dict[str, Any], options: RenderOptions
) -> None:
    """The projected volume of progress reporting: a service-account token whose audience is
    this job (useless against the API server and for any other job; bound to this Pod, so it
    dies with it) and the CA bundle of the operator's certificate. Training needs no API
    access at all, so the default API token is not mounted unless the template asks for it."""
    pod_spec.setdefault("automountServiceAccountToken", False)
    volumes = list(pod_spec.get("volumes") or [])
    if not any(v.get("name") == constants.PROGRESS_VOLUME_NAME for v in volumes):
        volumes.append(
            {
                "name": constants.PROGRESS_VOLUME_NAME,
                "projected": {
                    # Readable by the container's user whoever it is (the image's USER, not
                    # the pod's runAsUser), as the kubelet's own API-token volume is.
                    "defaultMode": 0o644,
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": progress.audience(options.namespace, job.name),
                                "expirationSeconds": constants.PROGRESS_TOKEN_SECONDS,
                                "path": constants.PROGRESS_TOKEN_FILE,
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": constants.PROGRESS_CA_FILE,
                                        "fieldRef": {
                                            "fieldPath": "metadata.annotations['"
                                            + constants.ANNOTATION_PROGRESS_CA
                                            + "']"
                                        },
                                    }
                                ]
                            }
                        },
                    ],
                },
            }
        )
    pod_spec["volumes"] = volumes


def progress_env(
    job: spec.TrainJob, container: Mapping[str, Any], options: RenderOptions
) -> dict[str, str]:
    """The environment that tells the runtime (or a script's helper) where to report."""
    if options.progress is None:
        return {}
    mount = constants.PROGRESS_MOUNT_PATH
    return {
        constants.ENV_PROGRESS_URL: options.progress.url.rstrip("/")
        + progress.report_path(options.namespace, job.name),
        constants.ENV_PROGRESS_TOKEN_FILE: f"{mount}/{constants.PROGRESS_TOKEN_FILE}",
        constants.ENV_PROGRESS_CA_FILE: f"{mount}/{constants.PROGRESS_CA_FILE}",
        constants.ENV_PROGRESS_INTERVAL: f"{options.progress.interval_seconds:g}",
        constants.ENV_TERMINATION_MESSAGE_PATH: str(
            container.get("terminationMessagePath") or constants.DEFAULT_TERMINATION_MESSAGE_PATH
        ),
    }


# Volume sources whose files fsGroup cannot or need not make writable: read-only by design
# (configMap, secret, projected, downwardAPI, image), writable by everyone already (emptyDir;
# a volume with no source is one), or never chowned by the kubelet (hostPath, nfs: their owner
# is changed on the host or the server). Every other source (persistentVolumeClaim, ephemeral,
# csi, a cloud disk) may be a fresh disk whose root only root can write.
_NO_FS_GROUP_NEEDED: Final = frozenset(
    {
        "name",
        "configMap",
        "secret",
        "projected",
        "downwardAPI",
        "image",
        "emptyDir",
        "hostPath",
        "nfs",
        "gitRepo",
    }
)


def needs_fs_group(volumes: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a Pod with `volumes` mounts a volume that fsGroup makes writable."""
    return any(set(volume) - _NO_FS_GROUP_NEEDED for volume in volumes)


def _pod_security_context(
    job: spec.TrainJob, given: dict[str, Any], volumes: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Defaults that let the pod run in a namespace enforcing the Pod Security Standard
    "restricted"; every key the user set wins.

    runAsNonRoot only when the trainjob runtime runs (its images run as user 1000): forced on
    a user's own image that runs as root (most TensorFlow images do), kubelet would refuse to
    start the container. fsGroup makes a fresh, root-owned volume (a cloud disk, a local PV)
    writable by the runtime's group, whichever volume it is: spec.checkpoint's claim or one
    the template mounts itself (Kubeflow's keras-API example checkpoints to its own claim at
    /train; without it, a non-root image's first checkpoint failed with Permission denied:
    issue 32). fsGroup adds its group to every process of the Pod, so any user of any image
    can write there. OnRootMismatch skips the recursive chown when the volume's root already
    has that group (a resumed job with many checkpoint files)."""
    result = dict(given)
    result.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    if job.runtime is not None:
        result.setdefault("runAsNonRoot", True)
    has_claim = job.checkpoint is not None and job.checkpoint.claim_name is not None
    if (has_claim or needs_fs_group(volumes)) and "fsGroup" not in result:
        result["fsGroup"] = RUNTIME_IMAGE_UID
        result.setdefault("fsGroupChangePolicy", "OnRootMismatch")
    return result


def _template_tf_container(job: spec.TrainJob, replica_type: str) -> Mapping[str, Any]:
    """The template's container that render_pod makes the TensorFlow one."""
    template = job.replica_specs[replica_type].template
    containers = [dict(c) for c in (template.get("spec") or {}).get("containers") or []]
    if not containers:
        return {"name": constants.DEFAULT_CONTAINER_NAME}
    return containers[_tf_container_index(containers)]


def tf_container_name(job: spec.TrainJob, replica_type: str) -> str:
    """The name of the TensorFlow container in the Pods of `replica_type`."""
    return str(_template_tf_container(job, replica_type).get("name") or "")


def runs_runtime(job: spec.TrainJob, replica_type: str) -> bool:
    """Whether the Pods of `replica_type` run the trainjob runtime (which writes its own
    exception line to the termination message), not a command of the template's own."""
    return job.runtime is not None and "command" not in _template_tf_container(job, replica_type)


def mount_paths(job: spec.TrainJob, replica_type: str) -> tuple[str, ...]:
    """Where the TensorFlow container of `replica_type` has volumes mounted (the template's
    and spec.checkpoint's claim): a write refused under one of them is the volume's owner
    refusing it (`trainjob.core.lastwords.ownership_hint`)."""
    container = _template_tf_container(job, replica_type)
    paths = [
        str(m["mountPath"])
        for m in container.get("volumeMounts") or []
        if isinstance(m, Mapping) and m.get("mountPath")
    ]
    if job.checkpoint is not None and job.checkpoint.claim_name is not None:
        paths.append(job.checkpoint.path)
    return tuple(dict.fromkeys(paths))


def _restrict(pod_spec: dict[str, Any]) -> None:
    """What Pod Security "restricted" asks of a Pod that its template leaves unset: a non-root
    user (runAsNonRoot, and the runtime images' user 1000 when the template names none: an
    image built to run as root would otherwise be refused by the kubelet), and for every
    container, init containers included, no privilege escalation and no capabilities. What
    the template sets wins, key by key."""
    security = pod_spec["securityContext"]
    security.setdefault("runAsNonRoot", True)
    if "runAsUser" not in security:
        security["runAsUser"] = RUNTIME_IMAGE_UID
        security.setdefault("runAsGroup", RUNTIME_IMAGE_UID)
    for key in ("initContainers", "containers"):
        containers = []
        for given in pod_spec.get(key) or []:
            container = dict(given)
            own = dict(container.get("securityContext") or {})
            own.setdefault("allowPrivilegeEscalation", False)
            own.setdefault("capabilities", {"drop": ["ALL"]})
            container["securityContext"] = own
            containers.append(container)
        if containers:
            pod_spec[key] = containers


def _tf_container_index(containers: list[dict[str, Any]]) -> int:
    for i, container in enumerate(containers):
        if container.get("name") == constants.DEFAULT_CONTAINER_NAME:
            return i
    return 0


def _tf_container(
    job: spec.TrainJob,
    container: dict[str, Any],
    env: Mapping[str, str],
    port: int,
    options: RenderOptions,
) -> dict[str, Any]:
    result = dict(container)
    image = result.get("image") or job.image or options.default_image
    if image:
        result["image"] = image
    if job.runtime is not None and "command" not in result:
        result["command"] = list(constants.DEFAULT_RUNTIME_COMMAND)
    env = {**env, **progress_env(job, result, options)}
    if image and ships_offline_data(job, str(image), options):
        # A script of one's own in the runtime image (a tutorial's unchanged
        # `tfds.load("mnist")`, no data_dir) finds the baked-in data instead of downloading.
        env[TFDS_DATA_DIR] = RUNTIME_IMAGE_DATA_DIR
    user_env = list(result.get("env") or [])
    user_names = {e.get("name") for e in user_env}
    # The user's own value wins: appending ours after theirs would silently override it.
    result["env"] = user_env + [
        {"name": key, "value": value} for key, value in env.items() if key not in user_names
    ]
    ports = list(result.get("ports") or [])
    if not any(p.get("name") == constants.DEFAULT_PORT_NAME for p in ports):
        ports.append({"name": constants.DEFAULT_PORT_NAME, "containerPort": port})
    result["ports"] = ports
    # "restricted" also asks every container to drop all capabilities and never gain
    # privileges; TensorFlow needs neither. The user's own settings win key by key.
    security = dict(result.get("securityContext") or {})
    security.setdefault("allowPrivilegeEscalation", False)
    security.setdefault("capabilities", {"drop": ["ALL"]})
    result["securityContext"] = security
    # A crash that left no termination message (a script of one's own, a segfault, an OOM
    # kill) still leaves its log's tail there, ending in Python's exception line: the job's
    # status quotes it after cleanPodPolicy deleted the Pod and its log. The runtime writes
    # its own message, which the kubelet prefers.
    result.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if job.checkpoint is not None and job.checkpoint.claim_name is not None:
        mounts = list(result.get("volumeMounts") or [])
        if not any(m.get("name") == constants.CHECKPOINT_VOLUME_NAME for m in mounts):
            mount: dict[str, Any] = {
                "name": constants.CHECKPOINT_VOLUME_NAME,
                "mountPath": job.checkpoint.path,
            }
            if job.checkpoint.sub_path:
                mount["subPath"] = job.checkpoint.sub_path
            mounts.append(mount)
        result["volumeMounts"] = mounts
    if job.checkpoint is not None and job.checkpoint.credentials_secret is not None:
        mounts = list(result.get("volumeMounts") or [])
        if not any(m.get("name") == constants.CHECKPOINT_CREDENTIALS_VOLUME_NAME for m in mounts):
            mounts.append(
                {
                    "name": constants.CHECKPOINT_CREDENTIALS_VOLUME_NAME,
                    "mountPath": constants.CHECKPOINT_CREDENTIALS_MOUNT_PATH,
                    "readOnly": True,
                }
            )
        result["volumeMounts"] = mounts
    if options.progress is not None:
        mounts = list(result.get("volumeMounts") or [])
        if not any(m.get("name") == constants.PROGRESS_VOLUME_NAME for m in mounts):
            mounts.append(
                {
                    "name": constants.PROGRESS_VOLUME_NAME,
                    "mountPath": constants.PROGRESS_MOUNT_PATH,
                    "readOnly": True,
                }
            )
        result["volumeMounts"] = mounts
    return result


def _kubeflow_tf_container(
    container: dict[str, Any], env: Mapping[str, str], port: int
) -> dict[str, Any]:
    """A TFJob's TensorFlow container as training-operator renders it: TF_CONFIG (none for a
    single replica) only in the container named `tensorflow`, and `tfjob-port` added when
    missing; nothing else of ours. The termination message falls back to the log's tail, so
    a failure's cause reaches the TFJob's status and Events even after its Pod is gone."""
    result = dict(container)
    if result.get("name") == constants.DEFAULT_CONTAINER_NAME and constants.ENV_TF_CONFIG in env:
        user_env = list(result.get("env") or [])
        if not any(e.get("name") == constants.ENV_TF_CONFIG for e in user_env):
            user_env.append(
                {"name": constants.ENV_TF_CONFIG, "value": env[constants.ENV_TF_CONFIG]}
            )
        result["env"] = user_env
    ports = list(result.get("ports") or [])
    if not any(p.get("name") == constants.DEFAULT_PORT_NAME for p in ports):
        ports.append({"name": constants.DEFAULT_PORT_NAME, "containerPort": port})
    result["ports"] = ports
    result.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    return result


def ships_offline_data(job: spec.TrainJob, image: str, options: RenderOptions) -> bool:
    """Whether `image` is a trainjob runtime image (which has the offline MNIST in
    RUNTIME_IMAGE_DATA_DIR): the job's image when it runs the runtime, or the operator's
    default image. Another image may keep its own data in tfds' default place: left alone."""
    runtime_image = job.image if job.runtime is not None else None
    return image in (runtime_image, options.default_image)


def render_service(
    job: spec.TrainJob, replica_type: str, index: int, options: RenderOptions, owner: Owner | None
) -> dict[str, Any]:
    """A headless Service per replica gives each task the stable DNS name TF_CONFIG lists."""
    template = job.replica_specs[replica_type].template
    port = spec.tf_port(template)
    selector = naming.replica_selector(job.name, replica_type, index)
    if options.kind_labels is not None:
        # training-operator's Service selects by its own four labels and carries only them.
        kubeflow = options.kind_labels.service_selector(job.name, replica_type, index)
        labels = {**selector, **kubeflow}
        selector = kubeflow
    else:
        # The Service describes the same application as its Pod: the same recommended labels.
        template_labels = (template.get("metadata") or {}).get("labels") or {}
        labels = {
            **selector,
            **naming.app_labels(template_labels, job.name, replica_type),
        }
    metadata: dict[str, Any] = {
        "name": naming.child_name(job.name, job.task_type(replica_type), index),
        "namespace": options.namespace,
        "labels": labels,
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": constants.DEFAULT_PORT_NAME, "port": port, "targetPort": port}],
            # Peers must resolve each other while TF starts, before any readiness probe passes.
            "publishNotReadyAddresses": True,
        },
    }


def render_all(
    job: spec.TrainJob, options: RenderOptions, owner: Owner | None
) -> list[dict[str, Any]]:
    """Every Service and Pod of a fresh job (attempt 0), Services first so DNS exists early."""
    keys = job.replica_keys()
    services = [render_service(job, rtype, index, options, owner) for rtype, index in keys]
    cluster = cluster_of(job, options)
    pods = [render_pod(job, rtype, index, 0, options, owner, cluster) for rtype, index in keys]
    return services + pods
