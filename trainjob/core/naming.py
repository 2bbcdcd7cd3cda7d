"""Deterministic names and labels of a TrainJob's children.

Names are a pure function of (job, replica type, index), so creation is idempotent: a second
create of the same child gets 409 Conflict, which the executors treat as success.
"""

from __future__ import annotations

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


def child_labels(job_name: str, replica_type: str, index: int) -> dict[str, str]:
    return {
        **replica_selector(job_name, replica_type, index),
        constants.LABEL_APP_NAME: constants.APP_NAME,
        constants.LABEL_APP_INSTANCE: job_name,
        constants.LABEL_APP_COMPONENT: replica_type,
        constants.LABEL_APP_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_APP_PART_OF: constants.APP_NAME,
    }
