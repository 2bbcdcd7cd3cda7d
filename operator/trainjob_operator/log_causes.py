"""The cause of a failed replica, read from its container's log when its termination message
names none (issue 32), and the hint for a write a mounted volume refused.

A replica of one's own command (no trainjob runtime) has only the kubelet's 2 KiB tail of its
log as its termination message, and Keras' progress bar fills it after the traceback. So, as a
person would run `kubectl logs --tail`, the operator reads the log's tail once through the API
server and quotes the last exception line there (`trainjob.core.lastwords`). Bounded: one read
per failed Pod (Pods never restart in place, so one per failed container instance), remembered
by the job's loop (`writes.Seen.log_causes`); at most MAX_READS per reconcile, the earliest
failures first (the root cause is the earliest); each at most TAIL_LINES lines and
LIMIT_BYTES, within READ_TIMEOUT seconds. A read that fails is not tried again: the job's
verdict does not wait on a kubelet that is gone, and quotes what the termination message had.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Final

from trainjob.core import lastwords, naming, policy, render, spec
from trainjob_operator import children, kube

logger = logging.getLogger(__name__)

# `kubectl logs --tail=100`: a traceback (10-60 lines, chained ones more) and the progress
# bar after it. A line is one entry of the container runtime's log (a line longer than 16 KiB
# is several), so these lines are at most 1.6 MB: LIMIT_BYTES keeps the read below that, from
# the first of them (the kubelet counts limitBytes from the start of the tail).
TAIL_LINES: Final = 100
LIMIT_BYTES: Final = 1024 * 1024
READ_TIMEOUT: Final = 10.0
MAX_READS: Final = 3
# Pods leave a process's own exception when they exit 1-127; 128 and up is a signal (killed,
# OOM-killed), after which the log's last exception, if any, is not why it stopped.
_SIGNAL_EXIT: Final = 128


def wants_log(job: spec.TrainJob, key: policy.ReplicaKey, pod: policy.ObservedReplica) -> bool:
    """Whether a Pod's failure is judged now with no exception line to quote: its container
    exited 1-127 by itself (not a signal; not a Pod being deleted, judged once it is gone),
    it ran no trainjob runtime, and its termination message named no exception."""
    return (
        pod.phase == policy.PHASE_FAILED
        and not pod.deleting
        and pod.exit_code is not None
        and 0 < pod.exit_code < _SIGNAL_EXIT
        and key[0] in job.replica_specs
        and not render.runs_runtime(job, key[0])
        and not lastwords.is_exception_line(pod.cause)
    )


def to_read(
    job: spec.TrainJob, pods: Iterable[children.ChildPod], known: Mapping[str, str | None]
) -> list[children.ChildPod]:
    """The Pods whose log to read now: those that want one and were not read yet, the
    earliest failures first, at most MAX_READS."""
    never = datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
    wanted = [p for p in pods if p.uid not in known and wants_log(job, p.key, p.observed)]
    wanted.sort(key=lambda p: (p.observed.finished_at or never, p.key))
    return wanted[:MAX_READS]


def with_hint(
    job: spec.TrainJob, key: policy.ReplicaKey, pod: policy.ObservedReplica
) -> policy.ObservedReplica:
    """A failed Pod whose cause is a write refused under one of its volumes: the cause says
    which setting fixes it (securityContext.fsGroup)."""
    if pod.phase != policy.PHASE_FAILED or not pod.cause or key[0] not in job.replica_specs:
        return pod
    hint = lastwords.ownership_hint(pod.cause, render.mount_paths(job, key[0]), key[0])
    return pod if hint is None else dataclasses.replace(pod, cause=f"{pod.cause} (hint: {hint})")


async def observed_with_causes(
    api: kube.Kube,
    namespace: str,
    job: spec.TrainJob,
    pods: list[children.ChildPod],
    finished: bool,
    known: MutableMapping[str, str | None],
) -> dict[policy.ReplicaKey, policy.ObservedReplica]:
    """What the policy engine observes of `pods`, a failed replica's cause taken from its
    log where its termination message named none. `known`: the causes read so far, by Pod
    uid (None: read, nothing found); kept for the Pods still here, read for new ones."""
    for uid in set(known) - {p.uid for p in pods}:
        del known[uid]
    if not finished:
        reading = to_read(job, pods, known)
        found = await asyncio.gather(*(_read(api, namespace, job, pod) for pod in reading))
        known.update(zip((pod.uid for pod in reading), found, strict=True))
    observed: dict[policy.ReplicaKey, policy.ObservedReplica] = {}
    for pod in pods:
        replica = pod.observed
        cause = known.get(pod.uid)
        if cause is not None:
            replica = dataclasses.replace(replica, cause=cause)
        observed[pod.key] = with_hint(job, pod.key, replica)
    return observed


async def _read(
    api: kube.Kube, namespace: str, job: spec.TrainJob, pod: children.ChildPod
) -> str | None:
    """The last exception line in the Pod's log tail; None when none can be read or found."""
    name = naming.child_name(job.name, job.task_type(pod.key[0]), pod.key[1])
    container = render.tf_container_name(job, pod.key[0])
    try:
        tail = await api.read_log_tail(
            namespace, name, container, TAIL_LINES, LIMIT_BYTES, READ_TIMEOUT
        )
    except kube.TransientError as exc:
        logger.info("Could not read the log of Pod %s/%s for its cause: %s", namespace, name, exc)
        return None
    found = lastwords.last_exception(tail) if tail else None
    if found is not None:
        logger.info("Read the cause of Pod %s/%s from its log: %s", namespace, name, found)
    return lastwords.cut_cause(found) if found else None
