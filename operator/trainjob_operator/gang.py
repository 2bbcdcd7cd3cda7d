"""Gang scheduling: the PodGroup of a TrainJob, for Volcano or scheduler-plugins (pure).

A TensorFlow job with 7 of its 8 Pods placed holds 7 nodes' worth of accelerators and trains
nothing; two such jobs half placed wait for each other for ever. With a gang scheduler
configured (`--gang-scheduler`), every TrainJob gets one PodGroup, so that its scheduler
places all of the job's Pods at once or none:

- `minMember`: runPolicy.schedulingPolicy.minAvailable, else every replica;
- `minResources`: schedulingPolicy.minResources, else what the first `minMember` Pods
  request (limits where a container requests nothing), the replica types of the highest
  PriorityClass value first, as training-operator computes it. Volcano enqueues a job only
  when its minResources fit the queue; scheduler-plugins rejects a gang early when they
  exceed the cluster's free capacity;
- `scheduleTimeoutSeconds` (scheduler-plugins), `queue` and `priorityClassName` (Volcano).

The PodGroup is created before the job's Pods (a Pod that names a missing group is not
scheduled), never updated, and deleted once no Pod of the job is left running (finished or
suspended jobs hold nothing; a resumed job gets a new one, rendered from the spec as it is
then). Under Volcano the Pods are created only once the group has left `Pending` (Volcano
has enqueued it): a job that does not fit its queue then holds no Pod at all, and its
Running condition says so (GangPending).

The Pods carry the references (rendered by the core from RenderOptions): `schedulerName`,
the annotation `scheduling.k8s.io/group-name` (Volcano) and the label
`scheduling.x-k8s.io/pod-group` (scheduler-plugins).
"""

from __future__ import annotations

import dataclasses
import fractions
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trainjob.core import constants, naming, policy, quantity, reasons, render, spec
from trainjob.core import status as st
from trainjob_operator import children, config

# The PodGroup APIs of the two schedulers.
VOLCANO_GROUP: Final = "scheduling.volcano.sh"
VOLCANO_VERSION: Final = "v1beta1"
PLUGINS_GROUP: Final = "scheduling.x-k8s.io"
PLUGINS_VERSION: Final = "v1alpha1"
# Volcano's phases before it has enqueued a group ("" until its controller first writes).
VOLCANO_WAITING_PHASES: Final = frozenset({"", "Pending"})
# The order of replica types of equal priority in minResources (TFJob's; the evaluator,
# which training needs least, last).
MIN_RESOURCES_ORDER: Final = (constants.CHIEF, constants.PS, constants.WORKER, constants.EVALUATOR)
# Touched on a waiting gang's PodGroup when room may have appeared (see `waits_for_room`).
REQUEUE_ANNOTATION: Final = "trainjob.dev/room-appeared-at"
# At most one such touch per PodGroup in this many seconds, however many Pods end; each
# sign of room is followed by this many touches, that far apart: the room may not be there
# yet at the first (its Pods still terminating), and a gang the scheduler has just rejected
# is refused without a look for its podGroupBackoffSeconds ("failed recently"), after which
# only a new touch makes it try again.
REQUEUE_INTERVAL_SECONDS: Final = 5.0
REQUEUES_PER_ROOM: Final = 2
# A Pod that is done holds no node: the gang's PodGroup may go once only these are left.
DONE_PHASES: Final = children.TERMINAL_PHASES


def pod_group_name(job: spec.TrainJob) -> str:
    return job.name


def wanted(settings: config.Settings) -> bool:
    """Every job is a gang when a gang scheduler is configured (a job without a
    schedulingPolicy is placed whole too: partial placement is never useful to TensorFlow)."""
    return settings.gang_scheduler != config.GANG_NONE


def render_options(
    job: spec.TrainJob,
    settings: config.Settings,
    namespace: str,
    progress: render.ProgressEndpoint | None = None,
) -> render.RenderOptions:
    gang = wanted(settings)
    return render.RenderOptions(
        namespace=namespace,
        cluster_domain=settings.cluster_domain,
        default_image=settings.default_image,
        scheduler_name=settings.effective_scheduler_name if gang else None,
        pod_group_name=pod_group_name(job) if gang else None,
        progress=progress,
        restricted_defaults=settings.restricted_pod_defaults,
    )


def min_member(job: spec.TrainJob) -> int:
    policy_ = job.run_policy.scheduling_policy
    if policy_ is not None and policy_.min_available is not None:
        return policy_.min_available
    return job.total_replicas


def priority_class_names(job: spec.TrainJob) -> set[str]:
    """The PriorityClasses the replica templates name (their values order minResources)."""
    names = set()
    for replica in job.replica_specs.values():
        name = (replica.template.get("spec") or {}).get("priorityClassName")
        if isinstance(name, str) and name:
            names.add(name)
    return names


def pod_requests(pod: Mapping[str, Any]) -> dict[str, fractions.Fraction]:
    """What one Pod's containers request, per resource (a limit stands for a missing request,
    as the API server defaults it; init containers are not counted, as training-operator)."""
    total: dict[str, fractions.Fraction] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        quantity.add(total, {**limits, **requests})
    return total


def min_resources(
    job: spec.TrainJob, options: render.RenderOptions, priorities: Mapping[str, int]
) -> dict[str, str]:
    """schedulingPolicy.minResources, else the requests of the first `min_member` Pods, the
    replica types of the highest PriorityClass value first (an unknown class counts 0; equal
    values keep TFJob's order: chief, ps, worker, evaluator). The Pods are the ones the
    operator renders, so the default container is counted as it will run."""
    policy_ = job.run_policy.scheduling_policy
    if policy_ is not None and policy_.min_resources is not None:
        return dict(policy_.min_resources)
    plain = dataclasses.replace(options, progress=None)

    def value(rtype: str) -> int:
        name = (job.replica_specs[rtype].template.get("spec") or {}).get("priorityClassName")
        return priorities.get(name, 0) if isinstance(name, str) else 0

    order = [t for t in MIN_RESOURCES_ORDER if job.replicas(t) > 0]
    order.sort(key=value, reverse=True)  # stable: equal values keep TFJob's order
    total: dict[str, fractions.Fraction] = {}
    left = min_member(job)
    for rtype in order:
        if left <= 0:
            break
        count = min(left, job.replicas(rtype))
        pod = render.render_pod(job, rtype, 0, 0, plain, None)
        for name, amount in pod_requests(pod).items():
            total[name] = total.get(name, fractions.Fraction(0)) + amount * count
        left -= count
    return quantity.render_all(total)


def render_pod_group(
    job: spec.TrainJob,
    settings: config.Settings,
    namespace: str,
    owner: render.Owner,
    resources: Mapping[str, str],
) -> dict[str, Any]:
    """The PodGroup of `job` for the configured scheduler; `resources`: its minResources."""
    policy_ = job.run_policy.scheduling_policy
    metadata: dict[str, Any] = {
        "name": pod_group_name(job),
        "namespace": namespace,
        "labels": naming.job_selector(job.name),
        "ownerReferences": [render.owner_reference(owner)],
    }
    body: dict[str, Any] = {"minMember": min_member(job)}
    if resources:
        body["minResources"] = dict(resources)
    if settings.gang_scheduler == config.GANG_VOLCANO:
        if policy_ is not None and policy_.queue:
            body["queue"] = policy_.queue
        if policy_ is not None and policy_.priority_class:
            body["priorityClassName"] = policy_.priority_class
        api_version = f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"
    else:
        if policy_ is not None and policy_.schedule_timeout_seconds is not None:
            body["scheduleTimeoutSeconds"] = policy_.schedule_timeout_seconds
        api_version = f"{PLUGINS_GROUP}/{PLUGINS_VERSION}"
    return {"apiVersion": api_version, "kind": "PodGroup", "metadata": metadata, "spec": body}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the executor does with a job's PodGroup in this reconcile."""

    create: bool = False
    delete: bool = False
    # The group's minMember is not the job's (schedulingPolicy.minAvailable was changed):
    # the group follows, as training-operator's SyncPodGroup does.
    update: bool = False
    # (reason, message) when the job's Pods must not be created yet (policy.reconcile's
    # `held`): the group is not admitted by its scheduler.
    hold: tuple[str, str] | None = None


def plan(
    job: spec.TrainJob,
    settings: config.Settings,
    status: st.JobStatus,
    pods: Iterable[children.ChildPod],
    group: children.ChildPodGroup | None,
) -> Plan:
    """`status`: the job's recorded status; `pods`: its Pods as indexed; `group`: its
    PodGroup as indexed (None: not seen)."""
    if not wanted(settings):
        return Plan()
    active = [p for p in pods if p.observed.phase not in DONE_PHASES]
    if status.finished or job.run_policy.suspend:
        # Deleted after the Pods: a Pod whose group is gone could not be scheduled again.
        return Plan(delete=group is not None and not group.deleting and not active)
    if group is None or group.deleting:
        hold = _volcano_hold(job, settings, None)
        return Plan(create=True, hold=hold)
    return Plan(
        update=group.min_member is not None and group.min_member != min_member(job),
        hold=_volcano_hold(job, settings, group),
    )


def _volcano_hold(
    job: spec.TrainJob, settings: config.Settings, group: children.ChildPodGroup | None
) -> tuple[str, str] | None:
    """Under Volcano a job's Pods wait until Volcano enqueues its PodGroup (phase Inqueue):
    created before, they would take nodes from jobs that fit (training-operator #1264)."""
    if settings.gang_scheduler != config.GANG_VOLCANO:
        return None
    if group is not None and group.phase not in VOLCANO_WAITING_PHASES:
        return None
    policy_ = job.run_policy.scheduling_policy
    queue = (policy_.queue if policy_ is not None else None) or "default"
    phase = (group.phase if group is not None else "") or "not scheduled yet"
    message = (
        f"Waiting for Volcano to enqueue PodGroup {pod_group_name(job)} "
        f"(queue {queue}, minMember {min_member(job)}; phase {phase}): "
        "its Pods are created once the queue has room for all of them"
    )
    if group is not None and group.message:
        message += f"; Volcano: {group.message}"
    return policy.REASON_GANG_PENDING, message


def waiting_message(
    decision: policy.Decision,
    job: spec.TrainJob,
    group: children.ChildPodGroup | None,
    settings: config.Settings,
) -> policy.Decision:
    """While the gang waits for nodes, the job's Running condition (reason Unschedulable,
    the scheduler's words per replica) also says that it is the gang that waits: all of
    minMember Pods at once, or none. Not when a template names a scheduler of its own: its
    Pods are placed one by one, and the scheduler's words per replica say it all."""
    running = decision.status.condition(st.RUNNING)
    if running is None or running.status or running.reason != policy.REASON_UNSCHEDULABLE:
        return decision
    if bypassing(job, settings):
        return decision
    lead = f"Gang {pod_group_name(job)} waits"
    prefix = f"{lead} until all {min_member(job)} Pods fit at once"
    if group is not None and group.phase:
        prefix += f" (PodGroup phase {group.phase})"
    words = running.message
    if words.startswith(lead):  # kept from an earlier reconcile: the prefix may be stale
        words = words.split(": ", 1)[-1]
    conditions = tuple(
        dataclasses.replace(c, message=f"{prefix}: {words}") if c is running else c
        for c in decision.status.conditions
    )
    return dataclasses.replace(
        decision, status=dataclasses.replace(decision.status, conditions=conditions)
    )


def waits_for_room(status: st.JobStatus) -> bool:
    """Whether the job's gang waits for nodes (the scheduler said Unschedulable).

    scheduler-plugins' Coscheduling, once it has rejected a gang, retries it only on a Pod
    or PodGroup event: a new node or a finished job does not wake it, and the gang would
    wait until the scheduler's periodic flush of unschedulable Pods (5 minutes). So when
    room may have appeared (a Node became Ready, some TrainJob Pod ended), the executor
    touches the waiting gangs' PodGroups (`requeue_patch`), which makes the scheduler try
    them again at once, and once more a little later (see REQUEUES_PER_ROOM)."""
    running = status.condition(st.RUNNING)
    return (
        running is not None
        and not running.status
        and running.reason == policy.REASON_UNSCHEDULABLE
        and not status.finished
    )


def requeue_patch(now: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {REQUEUE_ANNOTATION: now}}}


def bypassing(job: spec.TrainJob, settings: config.Settings) -> list[tuple[str, str]]:
    """(replica type, scheduler) of each replica template that names a scheduler other than
    the gang's: the user asked, so it is kept, but those Pods are not placed with the gang."""
    wanted_name = settings.effective_scheduler_name
    found = []
    for rtype in MIN_RESOURCES_ORDER:
        replica = job.replica_specs.get(rtype)
        own = (replica.template.get("spec") or {}).get("schedulerName") if replica else None
        if isinstance(own, str) and own and own != wanted_name:
            found.append((rtype, own))
    return found


def bypass_events(job: spec.TrainJob, settings: config.Settings) -> list[policy.Event]:
    """Say so, when the gang is made, for each template that bypasses it."""
    wanted_name = settings.effective_scheduler_name
    return [
        policy.Event(
            "Warning",
            reasons.EVENT_GANG_BYPASSED,
            f"spec.replicaSpecs.{rtype}.template sets schedulerName {own}: its Pods are "
            f"not placed with the gang by {wanted_name} (remove it to place them as one)",
        )
        for rtype, own in bypassing(job, settings)
    ]
