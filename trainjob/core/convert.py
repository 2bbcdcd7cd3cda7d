"""Convert a Kubeflow TFJob (kubeflow.org/v1) into the equivalent TrainJob.

Capitalised replica keys become TF task types (Master is the old name of Chief), runPolicy and
successPolicy map field by field, pod templates are carried over untouched (they already use
the `tensorflow` container and `tfjob-port` names TrainJob reads). What has no equivalent is
reported as a note instead of silently dropped.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants

TFJOB_API_VERSION: Final = "kubeflow.org/v1"
_REPLICA_TYPES: Final = {
    "chief": constants.CHIEF,
    "master": constants.CHIEF,
    "worker": constants.WORKER,
    "ps": constants.PS,
    "evaluator": constants.EVALUATOR,
}
_RUN_POLICY_FIELDS: Final = (
    "cleanPodPolicy",
    "backoffLimit",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "suspend",
)
_SCHEDULING_FIELDS: Final = ("minAvailable", "queue", "priorityClass", "scheduleTimeoutSeconds")


class ConvertError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Conversion:
    trainjob: dict[str, Any]
    notes: tuple[str, ...]


def convert_tfjob(tfjob: Mapping[str, Any]) -> Conversion:
    if tfjob.get("kind") != "TFJob":
        raise ConvertError(f"kind: expected TFJob, got {tfjob.get('kind')!r}")
    if tfjob.get("apiVersion") != TFJOB_API_VERSION:
        raise ConvertError(
            f"apiVersion: expected {TFJOB_API_VERSION}, got {tfjob.get('apiVersion')!r}"
        )
    notes: list[str] = []
    source_meta = tfjob.get("metadata") or {}
    metadata = {
        key: copy.deepcopy(source_meta[key])
        for key in ("name", "namespace", "labels", "annotations")
        if key in source_meta
    }
    source_spec = tfjob.get("spec") or {}
    spec: dict[str, Any] = {"replicaSpecs": _replica_specs(source_spec, notes)}
    managed_by = _managed_by(source_spec, notes)
    if managed_by is not None:
        spec["managedBy"] = managed_by
    run_policy = _run_policy(source_spec, notes)
    if run_policy:
        spec["runPolicy"] = run_policy
    success = source_spec.get("successPolicy")
    if success == "AllWorkers":
        spec["successPolicy"] = "AllWorkers"
    elif success not in (None, ""):
        raise ConvertError(f"spec.successPolicy: unknown value {success!r}")
    if source_spec.get("enableDynamicWorker"):
        notes.append("spec.enableDynamicWorker: not supported by TrainJob; dropped")
    trainjob = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": metadata,
        "spec": spec,
    }
    return Conversion(trainjob=trainjob, notes=tuple(notes))


def _replica_specs(source_spec: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    source = source_spec.get("tfReplicaSpecs")
    if not isinstance(source, Mapping) or not source:
        raise ConvertError("spec.tfReplicaSpecs: required")
    result: dict[str, Any] = {}
    for key, replica in source.items():
        rtype = _REPLICA_TYPES.get(str(key).lower())
        if rtype is None:
            raise ConvertError(f"spec.tfReplicaSpecs.{key}: unknown replica type")
        if rtype in result:
            raise ConvertError(f"spec.tfReplicaSpecs.{key}: {rtype} given twice (Master is Chief)")
        if str(key).lower() == "master":
            notes.append(f"spec.tfReplicaSpecs.{key}: Master is the old name of chief")
        source_replica: Mapping[str, Any] = replica or {}
        result[rtype] = {
            key: copy.deepcopy(source_replica[key])
            for key in ("replicas", "restartPolicy", "template")
            if key in source_replica
        }
    return {rtype: result[rtype] for rtype in constants.REPLICA_TYPES if rtype in result}


# TFJob's runPolicy.managedBy values: its own controller (ours takes its place) and Kueue's
# MultiKueue, which a TrainJob names at the top of its spec (where Kueue reads it).
TFJOB_CONTROLLER: Final = "kubeflow.org/training-operator"
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"


def _managed_by(source_spec: Mapping[str, Any], notes: list[str]) -> str | None:
    """TFJob's `runPolicy.managedBy` as TrainJob's top-level `spec.managedBy`."""
    value = (source_spec.get("runPolicy") or {}).get("managedBy")
    if value in (None, "", TFJOB_CONTROLLER):
        return None
    if value == MULTIKUEUE:
        return MULTIKUEUE
    notes.append(
        f"runPolicy.managedBy: {value!r} names another controller; spec.managedBy keeps it "
        "(this operator then leaves the job alone)"
    )
    return str(value)


def _run_policy(source_spec: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    # Old TFJobs kept these fields on spec itself; runPolicy wins when both are set.
    merged = {key: source_spec[key] for key in _RUN_POLICY_FIELDS if key in source_spec}
    merged.update(dict(source_spec.get("runPolicy") or {}))
    result: dict[str, Any] = {key: merged[key] for key in _RUN_POLICY_FIELDS if key in merged}
    if "backoffLimit" not in result:
        notes.append(
            "runPolicy.backoffLimit: unset means unlimited restarts in Kubeflow; "
            "TrainJob defaults to 6 (set it explicitly to keep more)"
        )
    if "cleanPodPolicy" not in result:
        notes.append(
            "runPolicy.cleanPodPolicy: unset; TrainJob defaults to Running "
            "(stops ps/evaluator pods still running when the job ends)"
        )
    scheduling = merged.get("schedulingPolicy")
    if isinstance(scheduling, Mapping):
        kept = {key: scheduling[key] for key in _SCHEDULING_FIELDS if key in scheduling}
        for key in scheduling:
            if key not in _SCHEDULING_FIELDS:
                notes.append(f"runPolicy.schedulingPolicy.{key}: not supported; dropped")
        if kept:
            result["schedulingPolicy"] = kept
    for key in merged:
        if key not in (*_RUN_POLICY_FIELDS, "schedulingPolicy", "managedBy"):
            notes.append(f"runPolicy.{key}: not supported by TrainJob; dropped")
    return result
