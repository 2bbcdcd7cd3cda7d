"""Kubeflow's TFJob (`kubeflow.org/v1`) as a second front door to the same engine.

A TFJob is never converted on disk and its `spec` is never written: each reconcile reads it
as the TrainJob it means (`as_trainjob`, with training-operator v1.9.4's in-memory defaults),
the policy engine decides exactly as for a TrainJob, and the verdict is shown back in TFJob's
own status vocabulary (`trainjob.core.tfjob_status`). The engine's memory of the job (attempts,
counted restarts, exit codes: the TrainJob status) cannot live in the TFJob's status, whose
schema prunes unknown fields, so it is kept in one annotation on the TFJob
(`ANNOTATION_ENGINE_STATUS`).

What a TFJob's children look like (the Kubeflow profile): the same `<job>-<type>-<index>`
names, the five `training.kubeflow.org/*` labels (`kubeflow_labels`) beside ours, a controller
ownerReference to the TFJob, TF_CONFIG only in the `tensorflow` container and none for a
single replica. Facts: Kubeflow training-operator v1.9.4, pkg/controller.v1/tensorflow.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants, convert, fieldcheck, model, observe
from trainjob.core.model import Problem

GROUP: Final = "kubeflow.org"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TFJob"
PLURAL: Final = "tfjobs"

# runPolicy.managedBy: training-operator's own value, Kueue's MultiKueue, and ours (coexist
# mode: the only value served while training-operator still runs beside us).
TRAINING_OPERATOR: Final = convert.TFJOB_CONTROLLER
MULTIKUEUE: Final = convert.MULTIKUEUE
OURS: Final = f"{constants.GROUP}/trainjob-operator"
TAKEOVER: Final = "takeover"
COEXIST: Final = "coexist"
MODES: Final = (TAKEOVER, COEXIST)

# The engine's status of the TFJob (a TrainJob status, JSON): its memory between reconciles.
ANNOTATION_ENGINE_STATUS: Final = f"{constants.GROUP}/status"
# `None` lets every Pod of the cluster reach the job's TensorFlow ports (spec.networkIsolation
# of a TrainJob; a TFJob has no such field).
ANNOTATION_NETWORK_ISOLATION: Final = f"{constants.GROUP}/network-isolation"

LABEL_OPERATOR_NAME: Final = "training.kubeflow.org/operator-name"
LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
LABEL_JOB_ROLE: Final = "training.kubeflow.org/job-role"
OPERATOR_NAME: Final = "tfjob-controller"

# TFJob's canonical replica types, in the order its controller visits them.
CANONICAL_TYPES: Final = ("Chief", "Evaluator", "Master", "PS", "Worker")
# The engine's TF task type of each (Master is the old name of chief).
ENGINE_TYPE: Final = {
    "Chief": constants.CHIEF,
    "Master": constants.CHIEF,
    "PS": constants.PS,
    "Worker": constants.WORKER,
    "Evaluator": constants.EVALUATOR,
}
# training-operator defaults a TFJob in memory; these are its values where ours differ.
DEFAULT_CLEAN_POD_POLICY: Final = "None"
# Unset backoffLimit is unlimited in training-operator; a 32-bit int is as far as the CRD goes.
UNLIMITED_BACKOFF: Final = model.UNLIMITED_BACKOFF
# training-operator has no start-up deadline: a TFJob waits for its Pods as long as it takes.
NO_STARTUP_DEADLINE: Final = 10 * 365 * 24 * 3600

_DNS1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def canonical_type(key: object) -> str | None:
    """The canonical name of a `tfReplicaSpecs` key, matched case-insensitively as
    training-operator does (`setTensorflowTypeNamesToCamelCase`); None if it is none."""
    for name in CANONICAL_TYPES:
        if str(key).lower() == name.lower():
            return name
    return None


def replica_types(raw: Mapping[str, Any]) -> dict[str, str]:
    """engine type -> the canonical TFJob type the job names it by (Chief or Master)."""
    specs = (raw.get("spec") or {}).get("tfReplicaSpecs")
    result: dict[str, str] = {}
    if isinstance(specs, Mapping):
        for key in specs:
            name = canonical_type(key)
            if name is not None:
                result.setdefault(ENGINE_TYPE[name], name)
    return result


def managed_by(raw: Mapping[str, Any]) -> str | None:
    run_policy = (raw.get("spec") or {}).get("runPolicy")
    value = run_policy.get("managedBy") if isinstance(run_policy, Mapping) else None
    return str(value) if value else None


def served(value: str | None, mode: str) -> bool:
    """Whether this operator runs a TFJob whose runPolicy.managedBy is `value`: in takeover
    mode (no training-operator serves TFJobs) unset, training-operator's value and ours; in
    coexist mode (it still runs beside us) ours only. MultiKueue's and any other controller's
    jobs are never ours."""
    if mode == COEXIST:
        return value == OURS
    return value in (None, TRAINING_OPERATOR, OURS)


def engine_status(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's status of the TFJob, from its annotation ({} before the first write, or
    when someone else's edit left it unreadable: the engine starts again from what it sees)."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_ENGINE_STATUS) if isinstance(annotations, Mapping) else None
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def encode_status(status: Mapping[str, Any]) -> str:
    return json.dumps(status, sort_keys=True, separators=(",", ":"))


def as_trainjob(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainJob manifest a TFJob means, with training-operator's defaults where they
    differ from ours, its metadata (uid, generation) and the engine's status: what
    `spec.parse` and the reconciler read. Raises convert.ConvertError for a TFJob whose
    replica types cannot be read (the webhook's checks, `webhook_problems`, come first)."""
    tfjob_spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
    assert isinstance(tfjob_spec, Mapping)
    conversion = convert.convert_tfjob({**raw, "spec": _legacy_run_policy_dropped(tfjob_spec)})
    manifest = conversion.trainjob
    job_spec = manifest["spec"]
    job_spec.pop("managedBy", None)  # which TFJobs are ours is decided before (`served`)
    run_policy = job_spec.setdefault("runPolicy", {})
    run_policy.setdefault("cleanPodPolicy", DEFAULT_CLEAN_POD_POLICY)
    run_policy["backoffLimit"] = engine_backoff_limit(run_policy.get("backoffLimit"))
    run_policy["startupDeadlineSeconds"] = NO_STARTUP_DEADLINE
    if constants.CHIEF in replica_types(raw):
        # A Chief or Master decides success alone: training-operator reads successPolicy
        # only for a job without one.
        job_spec.pop("successPolicy", None)
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    if isinstance(annotations, Mapping) and annotations.get(ANNOTATION_NETWORK_ISOLATION) == "None":
        job_spec["networkIsolation"] = "None"
    metadata = dict(raw.get("metadata") or {})
    manifest["metadata"] = {
        key: metadata[key]
        for key in ("name", "namespace", "uid", "generation", "resourceVersion", "labels")
        if key in metadata
    }
    manifest["status"] = engine_status(raw)
    return manifest


def engine_backoff_limit(value: object) -> object:
    """The engine's backoffLimit (restarts allowed) for a TFJob's: training-operator fails the
    job once its replicas' restarts reach the limit, so the limit-th failure already fails it
    (0 and 1 alike: the first); unset is unlimited. Not an int: left to spec.parse to refuse."""
    if value is None:
        return UNLIMITED_BACKOFF
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value - 1, 0)
    return value


def restart_policies(raw: Mapping[str, Any]) -> dict[str, str]:
    """engine type -> the restartPolicy of its TFJob replica type (Never when unset)."""
    specs = (raw.get("spec") or {}).get("tfReplicaSpecs")
    result: dict[str, str] = {}
    if isinstance(specs, Mapping):
        for key, replica in specs.items():
            name = canonical_type(key)
            if name is not None and isinstance(replica, Mapping):
                result[ENGINE_TYPE[name]] = str(replica.get("restartPolicy") or "Never")
    return result


def _legacy_run_policy_dropped(tfjob_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The v1 CRD prunes the legacy top-level run-policy fields (KFP's launcher still writes
    them) before anyone reads them, so training-operator never honours them: neither do we."""
    return {
        key: value
        for key, value in tfjob_spec.items()
        if key
        not in (
            "cleanPodPolicy",
            "backoffLimit",
            "activeDeadlineSeconds",
            "ttlSecondsAfterFinished",
            "suspend",
        )
    }


def webhook_problems(raw: Mapping[str, Any]) -> list[Problem]:
    """training-operator v1.9.4's validating webhook's checks of a TFJob, with its field paths
    (`pkg/webhooks/tensorflow/tfjob_webhook.go`): what it refuses at the API server. Where no
    training-operator runs, ours refuses the same (webhook.py), and a TFJob that got in anyway
    (no webhook registered) is failed with these words."""
    problems: list[Problem] = []
    metadata = raw.get("metadata") or {}
    name = str(metadata.get("name") or "")
    if not _DNS1035.match(name) or len(name) > 63:
        problems.append(
            Problem(
                "metadata.name",
                f"Invalid value: {name!r}: a DNS-1035 label must consist of lower case "
                "alphanumeric characters or '-', start with an alphabetic character, and end "
                "with an alphanumeric character",
            )
        )
    spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    value = managed_by(raw)
    if value is not None and value not in (TRAINING_OPERATOR, MULTIKUEUE, OURS):
        problems.append(
            Problem(
                "spec.runPolicy.managedBy",
                f"Unsupported value: {value!r}: supported values: "
                f'"{MULTIKUEUE}", "{TRAINING_OPERATOR}", "{OURS}"',
            )
        )
    specs = spec.get("tfReplicaSpecs")
    if not isinstance(specs, Mapping) or not specs:
        problems.append(Problem("spec.tfReplicaSpecs", "Required value: must be required"))
        return problems
    chiefs = 0
    for key, replica in specs.items():
        path = f"spec.tfReplicaSpecs[{key}]"
        rtype = canonical_type(key)
        if rtype is None:
            problems.append(Problem(path, f"Unsupported value: {key!r}"))
            continue
        if rtype in ("Chief", "Master"):
            chiefs += 1
        template = (replica or {}).get("template") if isinstance(replica, Mapping) else None
        pod_spec = template.get("spec") if isinstance(template, Mapping) else None
        containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
        if not isinstance(containers, list) or not containers:
            problems.append(
                Problem(f"{path}.template.spec.containers", "Required value: must be specified")
            )
            continue
        for i, container in enumerate(containers):
            if not isinstance(container, Mapping) or not container.get("image"):
                problems.append(
                    Problem(
                        f"{path}.template.spec.containers[{i}].image",
                        "Required value: must be required",
                    )
                )
        if not any(
            isinstance(c, Mapping) and c.get("name") == constants.DEFAULT_CONTAINER_NAME
            for c in containers
        ):
            problems.append(
                Problem(
                    f"{path}.template.spec.containers",
                    f"Required value: There is no container named "
                    f"{constants.DEFAULT_CONTAINER_NAME} in {rtype}",
                )
            )
    if chiefs > 1:
        problems.append(
            Problem("spec.tfReplicaSpecs", "Forbidden: must not have more than 1 Chief or Master")
        )
    return problems


KUBEFLOW_LABELS: Final = (
    LABEL_OPERATOR_NAME,
    LABEL_JOB_NAME,
    LABEL_REPLICA_TYPE,
    LABEL_REPLICA_INDEX,
    LABEL_JOB_ROLE,
)
RESERVED_KUBEFLOW_LABEL: Final = (
    "is set by the TFJob's controller on every Pod (its Services, the Kubeflow SDK, Katib and "
    "kueuectl select the job's Pods by it; training-operator overwrites a template's value "
    "without a word); remove it from the template"
)


def template_problems(raw: Mapping[str, Any]) -> list[Problem]:
    """The labels and annotations a TFJob's replica template may not set, in the TFJob's own
    field names: training-operator's labels (it overwrites a template's value without a word,
    so whatever the user meant by it is lost) and ours (fieldcheck.reserved_keys). Not a
    webhook check of training-operator's: the operator fails such a job with InvalidSpec
    naming the field."""
    specs = (raw.get("spec") or {}).get("tfReplicaSpecs")
    problems: list[Problem] = []
    if not isinstance(specs, Mapping):
        return problems
    for key, replica in specs.items():
        template = replica.get("template") if isinstance(replica, Mapping) else None
        metadata = template.get("metadata") if isinstance(template, Mapping) else None
        if not isinstance(metadata, Mapping):
            continue
        path = f"spec.tfReplicaSpecs[{key}].template.metadata"
        labels = metadata.get("labels")
        if isinstance(labels, Mapping):
            problems.extend(
                Problem(f"{path}.labels[{label!r}]", RESERVED_KUBEFLOW_LABEL)
                for label in KUBEFLOW_LABELS
                if label in labels
            )
        problems.extend(
            Problem(f"{path}.{kind}[{name!r}]", why)
            for kind, name, why in fieldcheck.reserved_keys(metadata)
        )
    return problems


def is_master_role(types: Mapping[str, str], engine_type: str, index: int) -> bool:
    """training-operator's `IsMasterRole`: the chief (Chief or Master), or worker 0 of a job
    without one. Its Pod is the one `get_job_pods(is_master=True)` and Katib pick."""
    if engine_type == constants.CHIEF:
        return True
    return engine_type == constants.WORKER and index == 0 and constants.CHIEF not in types


# training-operator's replica-type label values (its types in lower case) as TF task types.
_LABELLED_TYPES: Final = {name.lower(): engine for name, engine in ENGINE_TYPE.items()}


def replica_key(labels: Mapping[str, Any]) -> tuple[str, int] | None:
    """Which replica a child is: by our labels, else by training-operator's (a TFJob's
    children it made before a takeover carry only its own)."""
    ours = observe.replica_key(labels)
    labelled = constants.LABEL_REPLICA_TYPE in labels or constants.LABEL_REPLICA_INDEX in labels
    if ours is not None or labelled:
        return ours
    rtype = _LABELLED_TYPES.get(str(labels.get(LABEL_REPLICA_TYPE)))
    return observe.labelled_key(rtype, labels.get(LABEL_REPLICA_INDEX))


@dataclasses.dataclass(frozen=True)
class KubeflowLabels:
    """render.KindLabels of a TFJob whose replica types are `types` (engine type -> TFJob's):
    training-operator's labels on its children."""

    types: Mapping[str, str]

    def pod_labels(self, job_name: str, replica_type: str, index: int) -> dict[str, str]:
        return kubeflow_labels(job_name, self.types, replica_type, index)

    def service_selector(self, job_name: str, replica_type: str, index: int) -> dict[str, str]:
        return replica_selector(job_name, self.types, replica_type, index)


def kubeflow_labels(
    job_name: str, types: Mapping[str, str], engine_type: str, index: int
) -> dict[str, str]:
    """The `training.kubeflow.org/*` labels of a TFJob's Pod (`GenLabels` + replica labels)."""
    labels = replica_selector(job_name, types, engine_type, index)
    if is_master_role(types, engine_type, index):
        labels[LABEL_JOB_ROLE] = "master"
    return labels


def replica_selector(
    job_name: str, types: Mapping[str, str], engine_type: str, index: int
) -> dict[str, str]:
    """A TFJob replica Service's selector: the four labels training-operator selects by."""
    return {
        LABEL_OPERATOR_NAME: OPERATOR_NAME,
        LABEL_JOB_NAME: job_name.replace("/", "-"),
        LABEL_REPLICA_TYPE: types.get(engine_type, engine_type).lower(),
        LABEL_REPLICA_INDEX: str(index),
    }
