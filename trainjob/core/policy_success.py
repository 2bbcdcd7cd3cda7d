"""Rule: when a job succeeds. Its successPolicy names the replicas whose success is the job's
(the chief, else worker 0; AllWorkers: the chief and every worker), and the job succeeds once
they all have, as recorded in status: success is never inferred from Pods, so a replica that
succeeded stays so however its Pod ends later.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainjob.core import constants, spec
from trainjob.core import status as st
from trainjob.core.policy_terms import REASON_SUCCEEDED, DecisionDraft, ReplicaKey


def success_deciders(job: spec.TrainJob) -> list[ReplicaKey]:
    """The replicas whose success makes the job succeed."""
    workers = [(constants.WORKER, i) for i in range(job.replicas(constants.WORKER))]
    chief = [(constants.CHIEF, 0)] if job.replicas(constants.CHIEF) > 0 else []
    if job.success_policy == "AllWorkers":
        return chief + workers
    return chief or workers[:1]


def is_success(job: spec.TrainJob, replicas: Mapping[ReplicaKey, st.ReplicaRecord]) -> bool:
    deciders = success_deciders(job)
    return bool(deciders) and all(
        replicas.get(key, st.ReplicaRecord()).state == st.STATE_SUCCEEDED for key in deciders
    )


def finish_if_succeeded(draft: DecisionDraft) -> bool:
    """Succeed the job once its deciders succeeded (True), naming them."""
    job = draft.job
    if not is_success(job, draft.replicas):
        return False
    deciders = ", ".join(f"{t} {i}" for t, i in success_deciders(job))
    draft.finish(st.SUCCEEDED, REASON_SUCCEEDED, f"{job.kind} {job.name} succeeded ({deciders})")
    return True
