"""The in-memory index of every TrainJob's Pods and Services, kept by informer.py from a
list and then a watch of the objects labelled trainjob.dev/job-name.

A job's reconcile reads its children from here (no list call per reconcile). Only what the
policy engine needs of each object is kept (a few small fields), never the object itself:
at 1,000 jobs x 8 replicas that is 16,000 small records instead of 16,000 bodies.

Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar

from trainjob.core import constants, observe, policy

JobKey = tuple[str, str]  # (namespace, TrainJob name)

PODS: Final = "pods"
SERVICES: Final = "services"


@dataclasses.dataclass(frozen=True, slots=True)
class ChildPod:
    """A Pod of some TrainJob, as kept in the index."""

    key: policy.ReplicaKey
    observed: policy.ObservedReplica
    uid: str
    owner_uid: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ChildService:
    key: policy.ReplicaKey
    uid: str
    owner_uid: str | None


def controller_uid(metadata: Mapping[str, Any]) -> str | None:
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def job_of(body: Mapping[str, Any]) -> tuple[JobKey, str] | None:
    """(the job's key, the object's name) for an object labelled with a job name."""
    metadata = body.get("metadata") or {}
    job = (metadata.get("labels") or {}).get(constants.LABEL_JOB_NAME)
    name = metadata.get("name")
    if not job or not name:
        return None
    return (str(metadata.get("namespace") or ""), str(job)), str(name)


def index_pod(body: Mapping[str, Any]) -> ChildPod | None:
    """What the policy engine needs of a Pod; None for a Pod without replica labels."""
    found = observe.observe_pod(body)
    if found is None:
        return None
    metadata = body.get("metadata") or {}
    key, observed = found
    return ChildPod(key, observed, str(metadata.get("uid") or ""), controller_uid(metadata))


def index_service(body: Mapping[str, Any]) -> ChildService | None:
    metadata = body.get("metadata") or {}
    key = observe.replica_key(metadata.get("labels") or {})
    if key is None:
        return None
    return ChildService(key, str(metadata.get("uid") or ""), controller_uid(metadata))


C = TypeVar("C", ChildPod, ChildService)


class _Kind(Generic[C]):
    """The children of one kind, by job and then by object name."""

    def __init__(self, index: Callable[[Mapping[str, Any]], C | None]) -> None:
        self.by_job: dict[JobKey, dict[str, C]] = {}
        self._index: Callable[[Mapping[str, Any]], C | None] = index

    def apply(self, body: Mapping[str, Any], deleted: bool) -> JobKey | None:
        """A watch event; returns the job it concerns (None: not a child of any job)."""
        found = job_of(body)
        if found is None:
            return None
        job, name = found
        child = None if deleted else self._index(body)
        children = self.by_job.get(job)
        if child is None:
            if children is not None:
                children.pop(name, None)
                if not children:
                    del self.by_job[job]
            return job
        self.by_job.setdefault(job, {})[name] = child
        return job

    def replace(self, namespace: str | None, bodies: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        """A fresh list of `namespace` (None: every namespace) replaces what the index had
        there; returns every job whose children were or are now there."""
        touched = {job for job in self.by_job if namespace is None or job[0] == namespace}
        for job in touched:
            del self.by_job[job]
        for body in bodies:
            listed = self.apply(body, deleted=False)
            if listed is not None:
                touched.add(listed)
        return touched


class ChildIndex:
    """Pods and Services of every TrainJob, keyed by (namespace, job name)."""

    def __init__(self) -> None:
        self._kinds: dict[str, _Kind[Any]] = {
            PODS: _Kind(index_pod),
            SERVICES: _Kind(index_service),
        }
        # Called with every Pod watch event's job and body (progress_status reads final
        # progress from termination messages here, so it needs no watch of its own).
        self.pod_listeners: list[Callable[[JobKey, Mapping[str, Any]], None]] = []

    def event(self, plural: str, body: Mapping[str, Any], deleted: bool = False) -> JobKey | None:
        """A watch event of a Pod or Service (`plural`); returns the job to wake, if any."""
        job = self._kinds[plural].apply(body, deleted)
        if job is not None and plural == PODS and not deleted:
            for listener in self.pod_listeners:
                listener(job, body)
        return job

    def replace(
        self, plural: str, namespace: str | None, bodies: Iterable[Mapping[str, Any]]
    ) -> set[JobKey]:
        """A list of `plural` in `namespace` (None: all) replaces the index's content there;
        returns the jobs to wake."""
        return self._kinds[plural].replace(namespace, bodies)

    def forget_namespace(self, namespace: str) -> None:
        """Nobody watches `namespace` any more: drop what the index had there."""
        for kind in self._kinds.values():
            kind.replace(namespace, ())

    def pods(self, job: JobKey) -> list[ChildPod]:
        children: dict[str, ChildPod] = self._kinds[PODS].by_job.get(job, {})
        return list(children.values())

    def services(self, job: JobKey) -> list[ChildService]:
        children: dict[str, ChildService] = self._kinds[SERVICES].by_job.get(job, {})
        return list(children.values())
