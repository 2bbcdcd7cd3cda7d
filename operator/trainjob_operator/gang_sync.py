"""Gang scheduling's API calls (the decisions are gang.py's, pure): create a job's PodGroup,
delete it, and touch the PodGroups of waiting gangs when room may have appeared.

`Requeue` keeps which gangs wait for nodes, which of them owe their scheduler a touch, and
when each was last touched (see gang.waits_for_room for why the touch exists); the reconciler
tells it every decision, and the OperatorContext tells it every sign of room (a Node Ready, a
TrainJob Pod ended).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainjob.core import policy, render, spec, times
from trainjob_operator import children, config, gang, informer, kube

logger = logging.getLogger(__name__)

JobKey = children.JobKey


async def create_pod_group(
    api: kube.Kube,
    settings: config.Settings,
    job: spec.TrainJob,
    namespace: str,
    options: render.RenderOptions,
    owner: render.Owner,
) -> str | None:
    """The job's PodGroup, its minResources ordered by the templates' PriorityClass values
    (read here: a class that cannot be read counts 0, as in training-operator). Returns the
    API server's words when it refuses the group (403: a quota, RBAC, a webhook), for the
    job's status; None when the group exists now."""
    resources = await _min_resources(api, job, options)
    manifest = gang.render_pod_group(job, settings, namespace, owner, resources)
    try:
        await api.create_object(manifest, children.PODGROUPS)
    except kube.TransientError as exc:
        if not exc.refused():
            raise
        logger.warning("Could not create PodGroup %s/%s: %s", namespace, job.name, exc)
        return exc.api_message or str(exc)
    return None


async def update_pod_group(
    api: kube.Kube,
    settings: config.Settings,
    job: spec.TrainJob,
    namespace: str,
    options: render.RenderOptions,
    group: children.ChildPodGroup,
) -> None:
    """The group's minMember and minResources as the job's spec says now (its
    schedulingPolicy.minAvailable was changed: a job that could never be placed can be)."""
    resources = await _min_resources(api, job, options)
    manifest = gang.render_pod_group(job, settings, namespace, render.Owner("", ""), resources)
    resource = informer.pod_groups(settings.gang_scheduler)
    await api.patch_object(
        resource.group,
        resource.version,
        namespace,
        resource.plural,
        group.name,
        {"spec": manifest["spec"]},
    )
    logger.info("Updated PodGroup %s/%s: minMember %d", namespace, group.name, gang.min_member(job))


async def _min_resources(
    api: kube.Kube, job: spec.TrainJob, options: render.RenderOptions
) -> dict[str, str]:
    priorities: dict[str, int] = {}
    for class_name in sorted(gang.priority_class_names(job)):
        try:
            found = await api.get_object(
                "scheduling.k8s.io", "v1", None, "priorityclasses", class_name
            )
        except (kube.TransientError, kube.RejectedError) as exc:
            logger.warning("Could not read PriorityClass %s: %s", class_name, exc)
            found = None
        value = (found or {}).get("value")
        priorities[class_name] = value if isinstance(value, int) else 0
    return gang.min_resources(job, options, priorities)


async def delete_pod_group(
    api: kube.Kube, settings: config.Settings, namespace: str, group: children.ChildPodGroup
) -> None:
    resource = informer.pod_groups(settings.gang_scheduler)
    await api.delete_object(
        resource.group, resource.version, namespace, resource.plural, group.name, group.uid
    )


@dataclasses.dataclass
class Requeue:
    """Which gangs wait for nodes, and the touches they are owed (gang.waits_for_room)."""

    api: kube.Kube
    settings: config.Settings
    wake: Callable[[JobKey], None]
    waiting: set[JobKey] = dataclasses.field(default_factory=set)
    owed: dict[JobKey, int] = dataclasses.field(default_factory=dict)
    touched_at: dict[JobKey, float] = dataclasses.field(default_factory=dict)
    # Gangs whose PodGroup the operator just changed (its minMember): touched like a waiting
    # gang, whatever the job's status says (see group_changed).
    changed: set[JobKey] = dataclasses.field(default_factory=set)

    def room_appeared(self) -> None:
        """Room for a waiting gang may have appeared: each one asks its scheduler again."""
        for key in self.waiting:
            self.owed[key] = gang.REQUEUES_PER_ROOM
            self.wake(key)

    def pod_changed(self, key: JobKey, body: Mapping[str, Any]) -> None:
        """A TrainJob Pod that ends (or goes) gives its node's room back."""
        phase = (body.get("status") or {}).get("phase")
        if phase in gang.DONE_PHASES or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.room_appeared()

    def group_changed(self, key: JobKey) -> None:
        """The operator just changed the job's PodGroup (schedulingPolicy.minAvailable was
        lowered). The change's own event requeues the gang's Pods, but Coscheduling reads
        the group from a cache of its own, which may not hold the change yet when it looks:
        the gang is then rejected with the old minMember and waits for the next event. The
        touches that follow (now, and REQUEUE_INTERVAL_SECONDS later) are such events."""
        self.changed.add(key)
        self.owed[key] = gang.REQUEUES_PER_ROOM
        self.wake(key)

    def forget(self, key: JobKey) -> None:
        self.changed.discard(key)
        self.waiting.discard(key)
        self.owed.pop(key, None)
        self.touched_at.pop(key, None)

    async def step(
        self, key: JobKey, decision: policy.Decision, group: children.ChildPodGroup | None
    ) -> float | None:
        """After a decision: remember whether the gang waits and, when room may have
        appeared since it was rejected, touch its PodGroup so that the scheduler tries it
        again, at most once per gang.REQUEUE_INTERVAL_SECONDS. Returns when to look again,
        if a touch is due later."""
        waits = gang.waits_for_room(decision.status)
        if group is None or decision.status.finished or not (waits or key in self.changed):
            self.changed.discard(key)
            self.waiting.discard(key)
            self.owed.pop(key, None)
            return None
        if waits:
            self.waiting.add(key)
        owed = self.owed.get(key, 0)
        if owed <= 0:
            self.changed.discard(key)
            return None
        clock = time.monotonic()
        wait = self.touched_at.get(key, -math.inf) + gang.REQUEUE_INTERVAL_SECONDS - clock
        if wait > 0:
            return wait
        self.owed[key] = owed - 1
        self.touched_at[key] = clock
        resource = informer.pod_groups(self.settings.gang_scheduler)
        now = times.format_time(datetime.datetime.now(datetime.timezone.utc))
        await self.api.patch_object(
            resource.group,
            resource.version,
            key[0],
            resource.plural,
            group.name,
            gang.requeue_patch(now),
        )
        logger.info("Room may have appeared: asked the scheduler to retry gang %s/%s", *key)
        return gang.REQUEUE_INTERVAL_SECONDS if owed > 1 else None
