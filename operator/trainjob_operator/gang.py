"""Gang scheduling: the PodGroup of a TrainJob, for Volcano or scheduler-plugins (pure).

The Pods carry the matching references (rendered by the core from RenderOptions):
`schedulerName`, the annotation `scheduling.k8s.io/group-name` (Volcano) and the label
`scheduling.x-k8s.io/pod-group` (scheduler-plugins coscheduling).
"""

from __future__ import annotations

from typing import Any

from trainjob.core import naming, render, spec
from trainjob_operator import config, kube


def pod_group_name(job: spec.TrainJob) -> str:
    return job.name


def wanted(job: spec.TrainJob, settings: config.Settings) -> bool:
    return (
        settings.gang_scheduler != config.GANG_NONE and job.run_policy.scheduling_policy is not None
    )


def render_options(
    job: spec.TrainJob,
    settings: config.Settings,
    namespace: str,
    progress: render.ProgressEndpoint | None = None,
) -> render.RenderOptions:
    gang = wanted(job, settings)
    return render.RenderOptions(
        namespace=namespace,
        cluster_domain=settings.cluster_domain,
        default_image=settings.default_image,
        scheduler_name=settings.effective_scheduler_name if gang else None,
        pod_group_name=pod_group_name(job) if gang else None,
        progress=progress,
        restricted_defaults=settings.restricted_pod_defaults,
    )


def render_pod_group(
    job: spec.TrainJob, settings: config.Settings, namespace: str, owner: render.Owner
) -> dict[str, Any]:
    policy = job.run_policy.scheduling_policy
    min_member = job.total_replicas
    if policy is not None and policy.min_available is not None:
        min_member = policy.min_available
    metadata: dict[str, Any] = {
        "name": pod_group_name(job),
        "namespace": namespace,
        "labels": naming.job_selector(job.name),
        "ownerReferences": [render.owner_reference(owner)],
    }
    body: dict[str, Any] = {"minMember": min_member}
    if settings.gang_scheduler == config.GANG_VOLCANO:
        if policy is not None and policy.queue:
            body["queue"] = policy.queue
        if policy is not None and policy.priority_class:
            body["priorityClassName"] = policy.priority_class
        api_version = f"{kube.VOLCANO_GROUP}/{kube.VOLCANO_VERSION}"
    else:
        if policy is not None and policy.schedule_timeout_seconds is not None:
            body["scheduleTimeoutSeconds"] = policy.schedule_timeout_seconds
        api_version = f"{kube.PLUGINS_GROUP}/{kube.PLUGINS_VERSION}"
    return {"apiVersion": api_version, "kind": "PodGroup", "metadata": metadata, "spec": body}
