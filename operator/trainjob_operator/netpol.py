"""Each job's NetworkPolicy (trainjob.core.isolation renders it): made before the job's Pods,
so that no replica's TensorFlow server is ever reachable from outside the job, not even
for the moment between a Pod's start and its policy.

When the API server refuses the policy (RBAC without `networkpolicies: create`, a quota, a
webhook or an admission policy), the job's Pods are not created — it never runs
unprotected unless its spec says so (spec.networkIsolation: None) — and every replica says
why, in the API server's words, as for a refused Pod (FailedCreate), tried again with the
same growing delay. The policy is created, never updated or deleted: the garbage collector
deletes it with the job, and spec.networkIsolation is immutable.
"""

from __future__ import annotations

import logging

from trainjob.core import isolation, render, spec
from trainjob_operator import config, kube

logger = logging.getLogger(__name__)


def wanted(settings: config.Settings, job: spec.TrainJob) -> bool:
    """Whether the job gets a policy: the operator makes them (no --no-network-policy)
    and the job did not opt out."""
    return settings.network_policy and job.network_isolation == isolation.ISOLATION_JOB


def refusal(words: str) -> str:
    """What each replica of a job whose policy was refused says."""
    return (
        f"NetworkPolicy refused: {words}; the job's Pods are not created without it "
        "(spec.networkIsolation: None runs the job without isolation)"
    )


async def ensure(
    api: kube.Kube, job: spec.TrainJob, namespace: str, owner: render.Owner
) -> str | None:
    """Create the job's NetworkPolicy (one already there is fine). Returns the API server's
    words when it refuses it; None when the policy exists now."""
    manifest = isolation.render_network_policy(job, namespace, render.owner_reference(owner))
    try:
        await api.create_object(manifest, isolation.PLURAL)
    except kube.RejectedError as exc:
        # A policy we render is valid: a 422 here is an admission policy or webhook saying
        # no, which a cluster admin can change, not a fault of the job's spec.
        words = str(exc)
    except kube.TransientError as exc:
        if not exc.refused():
            raise
        words = exc.api_message or str(exc)
    else:
        return None
    logger.warning("Could not create NetworkPolicy %s/%s: %s", namespace, job.name, words)
    return words
