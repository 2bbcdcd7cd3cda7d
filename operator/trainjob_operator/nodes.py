"""Which nodes are not Ready, from a cluster-wide list+watch of Nodes (informer.reflect).

Why the Node and not the Pod: on a lost node the node lifecycle controller only sets the
Pod's Ready condition False (no node name, no reason a user can act on), and much later
(tolerationSeconds, 300 s by default) taint-based eviction deletes the Pod. The Node's own
Ready condition says at once what happened and since when: Unknown (the kubelet stopped
reporting: unreachable) or False (the kubelet reports it not ready).

Per node only its readiness and since when are kept (not the object): a few bytes a node.
A readiness change wakes the jobs with a Pod bound to that node (the child index knows
them). The operator never deletes such a Pod: Kubernetes decides (taint eviction, the pod
GC of a deleted Node), and the policy restarts the replica, uncounted, once it is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from trainjob.core import policy, times
from trainjob_operator import informer, kube

logger = logging.getLogger(__name__)

READY_UNKNOWN: Final = "Unknown"
READY_FALSE: Final = "False"
# A Node deleted while Pods are bound to it: kept as lost until the pod GC removes them (it
# runs every 20 s); bounded so that a cluster churning nodes does not grow this forever.
DELETED: Final = "Deleted"
MAX_DELETED_KEPT: Final = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Readiness:
    status: str  # the Ready condition's status: True | False | Unknown; or DELETED
    since: datetime.datetime | None  # its lastTransitionTime (the deletion seen, if deleted)


def readiness_of(body: Mapping[str, Any]) -> Readiness:
    """A Node's Ready condition; a Node without one (just registered) counts as Ready: its
    kubelet has not said anything yet, and no Pod runs there before it does."""
    for condition in (body.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return Readiness(
                str(condition.get("status") or READY_UNKNOWN),
                times.parse_time(condition.get("lastTransitionTime")),
            )
    return Readiness("True", None)


def loss_of(name: str, readiness: Readiness) -> tuple[str, str] | None:
    """(reason, words) for the policy when a Pod's node is lost; None when it is Ready."""
    when = times.format_time(readiness.since) if readiness.since else ""
    since = f" since {when}" if when else ""
    if readiness.status == DELETED:
        return policy.REASON_NODE_UNREACHABLE, f"node {name} deleted" + (
            f" at {when}" if when else ""
        )
    if readiness.status == READY_UNKNOWN:
        return policy.REASON_NODE_UNREACHABLE, f"node {name} unreachable{since}"
    if readiness.status == READY_FALSE:
        return policy.REASON_NODE_NOT_READY, f"node {name} not ready{since}"
    return None


class NodeIndex:
    """Readiness by node name. Pure bookkeeping: every method returns the nodes whose
    readiness changed (their jobs must look again)."""

    def __init__(self) -> None:
        self._nodes: dict[str, Readiness] = {}

    def loss(self, name: str) -> tuple[str, str] | None:
        readiness = self._nodes.get(name)
        return None if readiness is None else loss_of(name, readiness)

    def event(self, body: Mapping[str, Any], deleted: bool, now: datetime.datetime) -> set[str]:
        name = str((body.get("metadata") or {}).get("name") or "")
        if not name:
            return set()
        new = Readiness(DELETED, now) if deleted else readiness_of(body)
        old = self._nodes.get(name)
        self._nodes[name] = new
        self._trim()
        changed = old is None or old.status != new.status
        return {name} if changed else set()

    def replace(self, bodies: Iterable[Mapping[str, Any]], now: datetime.datetime) -> set[str]:
        """A fresh list: nodes absent from it were deleted while nobody watched."""
        listed = {str((b.get("metadata") or {}).get("name") or ""): b for b in bodies}
        listed.pop("", None)
        changed: set[str] = set()
        for name, old in list(self._nodes.items()):
            if name not in listed and old.status != DELETED:
                changed |= self.event({"metadata": {"name": name}}, True, now)
        for body in listed.values():
            changed |= self.event(body, False, now)
        return changed

    def _trim(self) -> None:
        deleted = [name for name, r in self._nodes.items() if r.status == DELETED]
        for name in deleted[: max(0, len(deleted) - MAX_DELETED_KEPT)]:
            del self._nodes[name]  # the oldest first: dicts keep insertion order


class NodeInformer:
    """Keeps a NodeIndex current; `changed` gets the names of nodes whose readiness moved."""

    def __init__(self, api: kube.Kube, changed: Callable[[set[str]], None]) -> None:
        self._api = api
        self._changed = changed
        self.index = NodeIndex()
        self.health = informer.WatchHealth("nodes")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="nodes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        def now() -> datetime.datetime:
            return datetime.datetime.now(datetime.timezone.utc)

        def on_list(items: list[dict[str, Any]]) -> None:
            self._tell(self.index.replace(items, now()))

        def on_event(event_type: str, body: dict[str, Any]) -> None:
            self._tell(self.index.event(body, event_type == "DELETED", now()))

        await informer.reflect(
            self.health.what,
            lambda: self._api.list_labelled(None, "nodes", ""),
            lambda version: self._api.watch_labelled(None, "nodes", "", version),
            on_list,
            on_event,
            self.health,
        )

    def _tell(self, names: set[str]) -> None:
        for name in sorted(names):
            loss = self.index.loss(name)
            if loss is not None:
                logger.info("Node %s: %s", name, loss[1])
        if names:
            self._changed(names)
