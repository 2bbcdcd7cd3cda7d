"""Whether any Pod of a job may still run: the one question behind every decision that
gives something back once a job's Pods are gone (Kueue's admission of an evicted job, the
quota of a finished one, a Workload that no longer matches or is being deleted, the gang's
PodGroup).

Why the child index alone cannot answer it: the index is a watch cache, and a watch shows
the operator's own creates some milliseconds after they were made (longer under load).
A reconcile that runs in between (Kueue evicted the job right after admitting it) read
"no Pods" while three were starting, cleared the admission, and Kueue gave the quota to
another job while those Pods ran (issue: a cohort over-committed for up to 3.6 s).

The rule, the Kubernetes Job controller's concern answered by a read instead of
in-memory *expectations*: "some" from the index is believed as it is (a Pod the index
still holds after it is gone only delays the release until its DELETED event, which
wakes the job again); "none" is confirmed by a list from the API server at the moment of
the decision. That list carries no resourceVersion, so the API server reads it from etcd
(a quorum read): it sees every create that was answered, by this incarnation or by a
predecessor killed a moment ago, which in-memory expectations could not know of. It costs
one list call, made only when the index says none and something is about to be given
back (once per eviction, finish or PodGroup), never per reconcile at rest.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainjob.core import constants
from trainjob_operator import children, kube


def still_running(pods: Iterable[children.ChildPod]) -> list[children.ChildPod]:
    """The Pods that may still run a container (see children.holds_resources)."""
    return [pod for pod in pods if children.holds_resources(pod)]


async def gone(
    api: kube.Kube,
    namespace: str,
    job_name: str,
    job_uid: str,
    indexed: Iterable[children.ChildPod],
) -> bool:
    """Whether no Pod of the job (controlled by `job_uid`, or by no one: adopted as ours)
    may still run, `indexed` being what the child index holds of it. Raises
    kube.TransientError when the API server cannot say (the decision waits: a reconcile
    retried later, never a release made blind)."""
    if still_running(pod for pod in indexed if pod.owner_uid in (job_uid, None)):
        return False
    listing = await api.list_labelled(
        namespace,
        children.PODS,
        f"{constants.LABEL_JOB_NAME}={job_name}",
        keep=children.index_pod,
    )
    found = [pod for pod in listing.items if isinstance(pod, children.ChildPod)]
    return not still_running(pod for pod in found if pod.owner_uid in (job_uid, None))
