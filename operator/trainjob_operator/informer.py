"""Keeps the child index (children.py) current: list, then watch, the Pods and Services
labelled trainjob.dev/job-name, as client-go's reflector does.

Why not kopf handlers for Pods and Services: kopf keeps per-object state for every object it
watches (memories, a throttler, a worker task holding the last body for a few seconds), about
two thirds of the operator's memory at 1,000 jobs x 8 replicas, and runs a handler call per
event. Here an event is parsed, reduced to a few fields in the index, and wakes its job.

Scope: one list+watch per kind for the whole cluster when the operator watches every
namespace; otherwise one per namespace that has at least one TrainJob (started by the
first job's loop, stopped after the last one's), so `--namespace` and per-namespace RBAC
work as they do for TrainJobs.

A job's loop decides nothing before its scope's first list is in (`ready`): a restarted
operator sees every existing child before deciding and adopts instead of duplicating.
After a dropped watch the stream resumes from the last resourceVersion seen (kept fresh by
bookmarks); when that is too old (410 Gone) the scope is listed again and the list
replaces what the index had there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Final

from trainjob.core import constants
from trainjob_operator import children, kube

logger = logging.getLogger("trainjob_operator.informer")

SELECTOR: Final = constants.LABEL_JOB_NAME
KINDS: Final = (children.PODS, children.SERVICES)
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 30.0


def backoff(failures: int) -> float:
    """Seconds to wait after `failures` consecutive failed list/watch calls."""
    return kube.retry_delay(failures, BACKOFF_FIRST, BACKOFF_MAX)


@dataclasses.dataclass
class _Scope:
    tasks: list[asyncio.Task[None]]
    listed: dict[str, asyncio.Event]
    ready: asyncio.Event
    users: int = 0


class ChildInformer:
    def __init__(
        self,
        api: kube.Kube,
        index: children.ChildIndex,
        wake: Callable[[children.JobKey], None],
        clusterwide: bool,
    ) -> None:
        self._api = api
        self._index = index
        self._wake = wake
        self._clusterwide = clusterwide
        self._scopes: dict[str | None, _Scope] = {}

    def _scope_of(self, namespace: str) -> str | None:
        return None if self._clusterwide else namespace

    def acquire(self, namespace: str) -> asyncio.Event:
        """A job in `namespace` starts: watch its scope (if nobody does yet). The returned
        event is set once the scope's Pods and Services have been listed."""
        scope_key = self._scope_of(namespace)
        scope = self._scopes.get(scope_key)
        if scope is None:
            listed = {plural: asyncio.Event() for plural in KINDS}
            scope = _Scope(tasks=[], listed=listed, ready=asyncio.Event())
            scope.tasks = [
                asyncio.get_running_loop().create_task(
                    self._run(scope_key, plural, scope), name=f"informer {plural} {scope_key}"
                )
                for plural in KINDS
            ]
            self._scopes[scope_key] = scope
        scope.users += 1
        return scope.ready

    def release(self, namespace: str) -> None:
        """A job in `namespace` is gone: stop watching its scope after the last one."""
        scope_key = self._scope_of(namespace)
        scope = self._scopes.get(scope_key)
        if scope is None:
            return
        scope.users -= 1
        if scope.users > 0 or scope_key is None:
            return  # the cluster-wide scope stays: the next job would list it all again
        del self._scopes[scope_key]
        for task in scope.tasks:
            task.cancel()
        self._index.forget_namespace(scope_key)

    async def close(self) -> None:
        tasks = [task for scope in self._scopes.values() for task in scope.tasks]
        self._scopes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, namespace: str | None, plural: str, scope: _Scope) -> None:
        where = namespace or "all namespaces"
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    listing = await self._api.list_labelled(namespace, plural, SELECTOR)
                    for listed in self._index.replace(plural, namespace, listing.items):
                        self._wake(listed)
                    version = listing.resource_version
                    scope.listed[plural].set()
                    if all(event.is_set() for event in scope.listed.values()):
                        scope.ready.set()
                async for event in self._api.watch_labelled(namespace, plural, SELECTOR, version):
                    body = event.get("object") or {}
                    kind = event.get("type")
                    if kind != "BOOKMARK":
                        job = self._index.event(plural, body, deleted=kind == "DELETED")
                        if job is not None:
                            self._wake(job)
                    seen = (body.get("metadata") or {}).get("resourceVersion")
                    if seen:
                        version = str(seen)
                    failures = 0
            except kube.GoneError:
                logger.info("Watch of %s in %s expired; listing again", plural, where)
                version = None
            except kube.TransientError as exc:
                failures += 1
                delay = backoff(failures)
                logger.warning(
                    "Watching %s in %s failed (%s); again in %.1fs", plural, where, exc, delay
                )
                await asyncio.sleep(delay)
            except Exception:  # a bug must not end the watch for good
                failures += 1
                delay = backoff(failures)
                logger.exception("Watching %s in %s crashed; again in %.1fs", plural, where, delay)
                await asyncio.sleep(delay)
