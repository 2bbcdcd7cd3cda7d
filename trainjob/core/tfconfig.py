"""TF_CONFIG and DTensor environment, byte-compatible with Kubeflow's TFJob.

The cluster spec is built from a host function so that the operator (Service DNS names) and the
local executor (127.0.0.1 and free ports) share one implementation of everything else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from trainjob.core import constants, naming, spec

ClusterSpec = dict[str, list[str]]
HostFn = Callable[[str, int], str]


def kubernetes_host(job: spec.TrainJob, namespace: str, cluster_domain: str) -> HostFn:
    """`<job>-<type>-<i>.<namespace>.svc[.<domain>]:<port>`, as Kubeflow renders it."""

    def host(replica_type: str, index: int) -> str:
        suffix = f".svc.{cluster_domain}" if cluster_domain else ".svc"
        port = spec.tf_port(job.replica_specs[replica_type].template)
        name = naming.child_name(job.name, job.task_type(replica_type), index)
        return f"{name}.{namespace}{suffix}:{port}"

    return host


def local_host(ports: Mapping[tuple[str, int], int]) -> HostFn:
    """Loopback addresses for local mode: every task binds its own port on one machine."""

    def host(replica_type: str, index: int) -> str:
        return f"127.0.0.1:{ports[(replica_type, index)]}"

    return host


def cluster_spec(job: spec.TrainJob, host: HostFn) -> ClusterSpec:
    """Every replica type with at least one replica, evaluator included (Kubeflow #1146)."""
    return {
        rtype: [host(rtype, index) for index in range(job.replicas(rtype))]
        for rtype in sorted(job.replica_specs)
        if job.replicas(rtype) > 0
    }


def is_distributed(job: spec.TrainJob) -> bool:
    """Kubeflow sets no TF_CONFIG when the whole job has exactly one replica."""
    return job.total_replicas != 1


def tf_config(cluster: ClusterSpec, replica_type: str, index: int) -> str:
    """TF_CONFIG exactly as Kubeflow's Go json.Marshal writes it: compact, keys sorted."""
    document = {
        "cluster": {rtype: cluster[rtype] for rtype in sorted(cluster)},
        "task": {"type": replica_type, "index": index},
        "environment": "cloud",
    }
    return json.dumps(document, separators=(",", ":"))


def dtensor_env(cluster: ClusterSpec, replica_type: str, index: int) -> dict[str, str]:
    """Multi-client DTensor: every training task (chief first, then workers) is one client.

    DTensor numbers clients 0..N-1 over a single job; the chief, when present, is client 0 so the
    client that writes checkpoints is the same one Keras treats as chief.
    """
    clients = [(constants.CHIEF, i) for i in range(len(cluster.get(constants.CHIEF, [])))] + [
        (constants.WORKER, i) for i in range(len(cluster.get(constants.WORKER, [])))
    ]
    if (replica_type, index) not in clients:
        return {}
    hosts = [cluster[rtype][i] for rtype, i in clients]
    return {
        constants.ENV_DTENSOR_CLIENT_ID: str(clients.index((replica_type, index))),
        constants.ENV_DTENSOR_NUM_CLIENTS: str(len(clients)),
        constants.ENV_DTENSOR_JOB_NAME: constants.WORKER,
        constants.ENV_DTENSOR_JOBS: ",".join(hosts),
    }


def replica_env(
    job: spec.TrainJob,
    cluster: ClusterSpec,
    replica_type: str,
    index: int,
    namespace: str,
    checkpoint_dir: str | None,
) -> dict[str, str]:
    """Every environment variable an executor gives one replica, in a stable order."""
    env: dict[str, str] = {}
    if is_distributed(job):
        spelled = {job.task_type(rtype): hosts for rtype, hosts in cluster.items()}
        env[constants.ENV_TF_CONFIG] = tf_config(spelled, job.task_type(replica_type), index)
    env[constants.ENV_JOB_NAME] = job.name
    env[constants.ENV_NAMESPACE] = namespace
    env[constants.ENV_REPLICA_TYPE] = replica_type
    env[constants.ENV_REPLICA_INDEX] = str(index)
    if job.runtime is not None:
        env[constants.ENV_ENTRYPOINT] = job.runtime.entrypoint
        env[constants.ENV_STRATEGY] = job.runtime.strategy
        env[constants.ENV_FRAMEWORK] = job.runtime.framework
        env[constants.ENV_CONFIG] = json.dumps(dict(job.runtime.config), sort_keys=True)
        if job.runtime.strategy == "DTensor":
            env.update(dtensor_env(cluster, replica_type, index))
        fewest = worker_gpus(job)
        if fewest > 0:
            env[constants.ENV_WORKER_GPUS] = str(fewest)
    if checkpoint_dir is not None:
        env[constants.ENV_CHECKPOINT_DIR] = checkpoint_dir
    if job.checkpoint is not None and job.checkpoint.credentials_secret is not None:
        env[constants.ENV_CHECKPOINT_CREDENTIALS_DIR] = constants.CHECKPOINT_CREDENTIALS_MOUNT_PATH
    return env


def template_gpus(job: spec.TrainJob, replica_type: str) -> int:
    """GPUs the tensorflow container of a replica type asks for (``nvidia.com/gpu``, the limit,
    else the request: the device plugin's resource is an integer with no overcommit)."""
    container = spec.tf_container(job.replica_specs[replica_type].template) or {}
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return 0
    for kind in ("limits", "requests"):
        values = resources.get(kind)
        value = values.get(constants.GPU_RESOURCE) if isinstance(values, Mapping) else None
        if value is not None:
            try:
                return max(0, int(str(value)))
            except ValueError:
                return 0
    return 0


def worker_gpus(job: spec.TrainJob) -> int:
    """The fewest GPUs any all-reduce task (chief, worker) asks for; 0 when one asks for none.

    Each replica sees only its own devices; this tells every one of them whether all its peers
    have GPUs too, which NCCL needs (the runtime picks NCCL only then)."""
    types = [t for t in (constants.CHIEF, constants.WORKER) if job.replica_specs.get(t)]
    counts = [template_gpus(job, t) for t in types if job.replica_specs[t].replicas > 0]
    return min(counts) if counts else 0
