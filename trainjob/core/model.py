"""The TrainJob spec model: a parsed, defaulted, valid job as frozen, typed data, the values
its enum fields allow, its defaults and limits, and where a replica's TensorFlow container and
port are in its Pod template.

Pure data: :func:`trainjob.core.spec.parse` makes a :class:`TrainJob` from a manifest, and
:mod:`trainjob.core.spec` re-exports every name here, so `spec.TrainJob` stays the one name
callers use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants

RESTART_POLICIES: Final = ("Never", "OnFailure", "Always", "ExitCode")
CLEAN_POD_POLICIES: Final = ("All", "Running", "None")
# What runPolicy.progressDeadlineSeconds does to a job whose chief reports no new step.
PROGRESS_DEADLINE_ACTIONS: Final = ("Restart", "Fail")
SUCCESS_POLICIES: Final = ("ChiefOrWorker0", "AllWorkers")
# spec.networkIsolation (trainjob.core.isolation): Job (default) or None.
NETWORK_ISOLATIONS: Final = ("Job", "None")
STRATEGIES: Final = (
    "Auto",
    "MultiWorkerMirrored",
    "ParameterServer",
    "Mirrored",
    "OneDevice",
    "DTensor",
)
FRAMEWORKS: Final = ("Keras", "Estimator")

DEFAULT_BACKOFF_LIMIT: Final = 6  # the same default as a Kubernetes batch/v1 Job
# The backoffLimit of a job whose kind leaves it unset for "no limit" (a TFJob's): the
# engine counts against a number, and its words say "no limit" for this one.
UNLIMITED_BACKOFF: Final = 2**31 - 1
DEFAULT_STARTUP_DEADLINE_SECONDS: Final = 600
# Restarts after a preemption or eviction (not counted toward backoffLimit): a bound of their
# own, so a job preempted in a loop still ends.
DEFAULT_DISRUPTION_LIMIT: Final = 10
# Longest child name is "<job>-evaluator-<index>"; with up to 4 index digits it must fit the
# 63-character DNS label that both Pod hostnames and Service names require.
MAX_JOB_NAME_LENGTH: Final = 48
MAX_REPLICAS: Final = 9999
# The fields of a Kubernetes ObjectMeta (their values are the API server's to check).
OBJECT_META_FIELDS: Final = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest, at a dotted field path such as `spec.replicaSpecs.ps`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A manifest that cannot run; carries every problem found, not only the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    replicas: int
    restart_policy: str
    # The PodTemplateSpec exactly as the user wrote it; rendering copies it, never mutates it.
    template: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    entrypoint: str
    strategy: str
    framework: str
    config: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    path: str
    claim_name: str | None
    sub_path: str | None
    # A Secret with an object store's keys (s3:// or gs:// paths only): its name, never its data.
    credentials_secret: str | None = None


@dataclasses.dataclass(frozen=True)
class SchedulingPolicy:
    min_available: int | None
    queue: str | None
    priority_class: str | None
    schedule_timeout_seconds: int | None
    # What the whole gang needs at once (a ResourceList); None: the operator sums the
    # requests of the first minAvailable Pods, as training-operator does.
    min_resources: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    clean_pod_policy: str = "Running"
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    startup_deadline_seconds: int = DEFAULT_STARTUP_DEADLINE_SECONDS
    disruption_limit: int = DEFAULT_DISRUPTION_LIMIT
    # A Running job whose chief reported no new step for this long is stalled (a hung
    # collective, a dead input pipeline): restarted from its checkpoint (counted) or failed.
    progress_deadline_seconds: int | None = None
    progress_deadline_action: str = "Restart"
    suspend: bool = False
    scheduling_policy: SchedulingPolicy | None = None


@dataclasses.dataclass(frozen=True)
class TrainJob:
    """A parsed, defaulted, valid TrainJob."""

    name: str
    namespace: str | None
    uid: str | None
    generation: int | None
    image: str | None
    runtime: RuntimeSpec | None
    replica_specs: Mapping[str, ReplicaSpec]
    checkpoint: CheckpointSpec | None
    run_policy: RunPolicy
    success_policy: str
    labels: Mapping[str, str]
    # The controller that runs the job (spec.managedBy): None is this operator.
    managed_by: str | None = None
    # spec.networkIsolation: whether only the job's replicas reach its TensorFlow ports.
    network_isolation: str = NETWORK_ISOLATIONS[0]
    # What the chief is called in its children's names and in TF_CONFIG: "master" for a
    # Kubeflow TFJob's Master replica (trainjob.core.tfjob), as training-operator names it.
    chief_name: str = constants.CHIEF
    # The kind the job came in by, as every word about it names it ("TrainJob", or "TFJob"
    # for a Kubeflow TFJob: trainjob.core.tfjob), in conditions, Events and logs.
    kind: str = constants.KIND

    def task_type(self, replica_type: str) -> str:
        """A replica type as its Pods' names and TF_CONFIG spell it."""
        return self.chief_name if replica_type == constants.CHIEF else replica_type

    def replicas(self, replica_type: str) -> int:
        spec = self.replica_specs.get(replica_type)
        return spec.replicas if spec else 0

    def replica_keys(self) -> list[tuple[str, int]]:
        """Every (replica type, index) of the job, in TF_CONFIG order."""
        return [
            (rtype, index)
            for rtype in constants.REPLICA_TYPES
            for index in range(self.replicas(rtype))
        ]

    @property
    def uses_parameter_servers(self) -> bool:
        return self.replicas(constants.PS) > 0

    @property
    def total_replicas(self) -> int:
        return sum(self.replicas(rtype) for rtype in constants.REPLICA_TYPES)


def tf_container(template: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container that runs TensorFlow: the one named `tensorflow`, else the only one."""
    pod_spec = template.get("spec")
    if not isinstance(pod_spec, Mapping):
        return None
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return None
    for container in containers:
        if (
            isinstance(container, Mapping)
            and container.get("name") == constants.DEFAULT_CONTAINER_NAME
        ):
            return container
    only = containers[0]
    return only if len(containers) == 1 and isinstance(only, Mapping) else None


def tf_port(template: Mapping[str, Any]) -> int:
    """TensorFlow's port: `tfjob-port` of the TF container, else 2222 (Kubeflow's rule)."""
    container = tf_container(template)
    if container is None:
        return constants.DEFAULT_PORT
    for port in container.get("ports") or []:
        if (
            isinstance(port, Mapping)
            and port.get("name") == constants.DEFAULT_PORT_NAME
            and isinstance(port.get("containerPort"), int)
        ):
            return int(port["containerPort"])
    return constants.DEFAULT_PORT
