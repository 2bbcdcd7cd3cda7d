"""The in-memory index of every TrainJob's Pods and Services, fed by watch events.

One kopf event handler per kind (handlers.py) feeds this index and wakes the job's loop; the
loop reads its children from here, never with a list call per reconcile.

Why not kopf's own `@kopf.index`: kopf holds *every* handler of the operator until every
indexed watch stream (one per resource kind per watched namespace) has finished its first
listing, and in kopf 1.45 a stream that is stopped before its listing ends (a namespace that
matches `--namespace=team-*` and is deleted while its streams start) never releases that gate:
the whole operator then waits forever. An index also cost a second handler call per child
event on top of the wake-up handler. Here nothing waits on a global gate; what the gate gave
(a restarted operator sees existing children before it decides anything) comes from
`begin_seed` / `finish_seed`: a job that already has a status is seeded with one list call
when its loop starts.

Pure bookkeeping, no I/O: the caller does the list call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from trainjob.core import observe, policy

JobKey = tuple[str, str]  # (namespace, TrainJob name)
ReplicaKey = tuple[str, int]


@dataclasses.dataclass(frozen=True)
class ChildPod:
    """A Pod of some TrainJob, as kept in the index."""

    key: ReplicaKey
    observed: policy.ObservedReplica
    uid: str
    owner_uid: str | None


@dataclasses.dataclass(frozen=True)
class ChildService:
    key: ReplicaKey
    uid: str
    owner_uid: str | None


def controller_uid(metadata: Mapping[str, Any]) -> str | None:
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


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

    def __init__(self) -> None:
        self.by_job: dict[JobKey, dict[str, C]] = {}
        # Names that got an event while a seed of their job was in flight: events are newer
        # than (or as new as) the list, so the list must not overwrite or revive them.
        self.touched: dict[JobKey, set[str]] = {}

    def apply(self, job: JobKey, name: str, child: C | None) -> None:
        """An event: `child` is the object now, None when it is gone (or no longer ours)."""
        touched = self.touched.get(job)
        if touched is not None:
            touched.add(name)
        children = self.by_job.get(job)
        if child is None:
            if children is not None:
                children.pop(name, None)
                if not children:
                    del self.by_job[job]
            return
        self.by_job.setdefault(job, {})[name] = child

    def seed(self, job: JobKey, listed: Mapping[str, C]) -> None:
        touched = self.touched.pop(job, set())
        current = self.by_job.get(job, {})
        merged = {n: c for n, c in listed.items() if n not in touched}
        merged.update({n: c for n, c in current.items() if n in touched})
        if merged:
            self.by_job[job] = merged
        else:
            self.by_job.pop(job, None)


class ChildIndex:
    """Pods and Services of every TrainJob, keyed by (namespace, job name)."""

    def __init__(self) -> None:
        self._pods: _Kind[ChildPod] = _Kind()
        self._services: _Kind[ChildService] = _Kind()

    def pod_event(self, job: JobKey, name: str, body: Mapping[str, Any] | None) -> None:
        """A Pod event; `body` None for DELETED."""
        self._pods.apply(job, name, index_pod(body) if body is not None else None)

    def service_event(self, job: JobKey, name: str, body: Mapping[str, Any] | None) -> None:
        """A Service event; `body` None for DELETED."""
        self._services.apply(job, name, index_service(body) if body is not None else None)

    def pods(self, job: JobKey) -> list[ChildPod]:
        return list(self._pods.by_job.get(job, {}).values())

    def services(self, job: JobKey) -> list[ChildService]:
        return list(self._services.by_job.get(job, {}).values())

    def begin_seed(self, job: JobKey) -> None:
        """Call right before listing `job`'s children; then `finish_seed` with the result."""
        self._pods.touched[job] = set()
        self._services.touched[job] = set()

    def finish_seed(
        self,
        job: JobKey,
        pods: Iterable[Mapping[str, Any]],
        services: Iterable[Mapping[str, Any]],
    ) -> None:
        """Merge a list taken after `begin_seed`: listed objects replace what the index had,
        except objects that got an event meanwhile (the event is at least as new)."""
        self._pods.seed(job, _by_name(pods, index_pod))
        self._services.seed(job, _by_name(services, index_service))

    def abandon_seed(self, job: JobKey) -> None:
        """The list call failed: stop tracking events for a seed that will not finish."""
        self._pods.touched.pop(job, None)
        self._services.touched.pop(job, None)


def _by_name(
    bodies: Iterable[Mapping[str, Any]], index: Callable[[Mapping[str, Any]], C | None]
) -> dict[str, C]:
    found: dict[str, C] = {}
    for body in bodies:
        name = (body.get("metadata") or {}).get("name")
        child = index(body)
        if name and child is not None:
            found[str(name)] = child
    return found
