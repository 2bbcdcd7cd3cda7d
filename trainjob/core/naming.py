"""Deterministic names and labels of a TrainJob's children.

Names are a pure function of (job, replica type, index), so creation is idempotent: a second
create of the same child gets 409 Conflict, which the executors treat as success.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainjob.core import constants

# A replica: (replica type, index), e.g. ("worker", 0).
ReplicaKey = tuple[str, int]


def replica_label(key: ReplicaKey) -> str:
    """`worker-0`: how a replica is named in logs, tables and file names."""
    return f"{key[0]}-{key[1]}"


def child_name(job_name: str, replica_type: str, index: int) -> str:
    """The Pod and its headless Service share `<job>-<type>-<index>`."""
    return f"{job_name}-{replica_type}-{index}"


def job_selector(job_name: str) -> dict[str, str]:
    """Labels that select every child of one job."""
    return {constants.LABEL_JOB_NAME: job_name}


def replica_selector(job_name: str, replica_type: str, index: int) -> dict[str, str]:
    """Labels that select exactly one replica's Pod (the Service selector)."""
    return {
        constants.LABEL_JOB_NAME: job_name,
        constants.LABEL_REPLICA_TYPE: replica_type,
        constants.LABEL_REPLICA_INDEX: str(index),
    }


def recommended_labels(job_name: str, replica_type: str) -> dict[str, str]:
    """Our `app.kubernetes.io/*` labels of a TrainJob's child."""
    return {
        constants.LABEL_APP_NAME: constants.APP_NAME,
        constants.LABEL_APP_INSTANCE: job_name,
        constants.LABEL_APP_COMPONENT: replica_type,
        constants.LABEL_APP_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_APP_PART_OF: constants.APP_NAME,
    }


def template_app_labels(template_labels: Mapping[str, str]) -> dict[str, str]:
    """The template's own `app.kubernetes.io/*` labels."""
    return {
        key: value
        for key, value in template_labels.items()
        # A YAML key may be a number in a local manifest (`0: x`): not one of these.
        if isinstance(key, str) and key.startswith(constants.APP_LABEL_PREFIX)
    }


def app_labels(
    template_labels: Mapping[str, str], job_name: str, replica_type: str
) -> dict[str, str]:
    """A TrainJob child's `app.kubernetes.io/*` labels: the template's when it sets any (all
    of them, and none of ours: the set describes one application, and a platform that wrote it
    finds its Pods by it), else ours. No selector of ours reads them."""
    given = template_app_labels(template_labels)
    return given if given else recommended_labels(job_name, replica_type)


def child_labels(
    job_name: str, replica_type: str, index: int, template_labels: Mapping[str, str]
) -> dict[str, str]:
    """The labels of a TrainJob's Pod: the template's, ours beside them. Ours never replace
    the user's: the selector labels cannot be set by a template (spec validation refuses it)
    and the recommended ones are added only where the template sets none."""
    return {
        **app_labels(template_labels, job_name, replica_type),
        **template_labels,
        **replica_selector(job_name, replica_type, index),
    }
