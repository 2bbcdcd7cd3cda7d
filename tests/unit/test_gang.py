"""A TrainJob's gang as data: the PodGroup each scheduler needs (minMember, minResources as
training-operator computes them, the scheduler's own fields), when it is created and deleted,
and what the job says while its gang waits."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from fractions import Fraction
from typing import Any

import pytest

from trainjob.core import policy, quantity, render, spec
from trainjob.core import status as st
from trainjob_operator import children, config, gang

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
OWNER = render.Owner(name="mnist", uid="uid-1")
PLUGINS = config.Settings(gang_scheduler=config.GANG_SCHEDULER_PLUGINS)
VOLCANO = config.Settings(gang_scheduler=config.GANG_VOLCANO)
NO_GANG = config.Settings()


def container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "tensorflow", "resources": resources}


def make_job(
    replicas: dict[str, int],
    templates: dict[str, dict[str, Any]] | None = None,
    scheduling: dict[str, Any] | None = None,
    suspend: bool = False,
) -> spec.TrainJob:
    run_policy: dict[str, Any] = {"suspend": suspend}
    if scheduling is not None:
        run_policy["schedulingPolicy"] = scheduling
    return spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "mnist", "namespace": "team-a", "uid": "uid-1"},
            "spec": {
                "image": "trainjob:latest",
                "replicaSpecs": {
                    rtype: {
                        "replicas": count,
                        "template": copy.deepcopy((templates or {}).get(rtype, {})),
                    }
                    for rtype, count in replicas.items()
                },
                "runPolicy": run_policy,
            },
        }
    )


def options(settings: config.Settings, job: spec.TrainJob) -> render.RenderOptions:
    return gang.render_options(job, settings, "team-a")


# -- quantities ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        (3, Fraction(3)),
        ("1Gi", Fraction(2**30)),
        ("1.5G", Fraction(1_500_000_000)),
        ("1e3", Fraction(1000)),
        ("100n", Fraction(1, 10**7)),
        (".5", Fraction(1, 2)),
    ],
)
def test_quantities_are_read_exactly(text: Any, value: Fraction) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize("text", ["", "one", "1 Gi", "1GB", "--1", True, None, "1Gii"])
def test_a_non_quantity_says_so(text: Any) -> None:
    with pytest.raises(ValueError, match="quantity"):
        quantity.parse(text)


def test_sums_are_written_back_whole_or_in_milli_rounded_up() -> None:
    assert quantity.render(Fraction(3)) == "3"
    assert quantity.render(Fraction(3, 2)) == "1500m"
    assert quantity.render(Fraction(1, 10**7)) == "1m"  # never promise less than asked


# -- the PodGroup ----------------------------------------------------------------------------


def test_every_job_is_a_gang_when_a_gang_scheduler_is_configured() -> None:
    job = make_job({"chief": 1, "worker": 2})  # no schedulingPolicy
    assert gang.wanted(PLUGINS) and gang.wanted(VOLCANO) and not gang.wanted(NO_GANG)
    rendered = options(PLUGINS, job)
    assert rendered.scheduler_name == "scheduler-plugins-scheduler"
    assert rendered.pod_group_name == "mnist"
    pod = render.render_pod(job, "worker", 1, 0, rendered, None)
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "mnist"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "mnist"
    assert options(NO_GANG, job).scheduler_name is None


def test_min_member_is_min_available_or_every_replica() -> None:
    assert gang.min_member(make_job({"chief": 1, "worker": 4, "ps": 2, "evaluator": 1})) == 8
    assert gang.min_member(make_job({"worker": 4}, scheduling={"minAvailable": 3})) == 3


def test_min_resources_sum_the_requests_of_every_member() -> None:
    job = make_job(
        {"chief": 1, "worker": 3},
        templates={
            "chief": {"spec": {"containers": [container({"cpu": "500m", "memory": "1Gi"})]}},
            "worker": {
                "spec": {
                    "containers": [
                        # A limit stands for a missing request; a request wins over its limit.
                        container({"cpu": "2"}, {"cpu": "4", "nvidia.com/gpu": 1}),
                    ]
                }
            },
        },
    )
    resources = gang.min_resources(job, options(PLUGINS, job), {})
    assert resources == {"cpu": "6500m", "memory": str(2**30), "nvidia.com/gpu": "3"}


def test_min_resources_count_the_first_min_available_pods_by_priority() -> None:
    """minAvailable 3 of a chief and 4 workers: the workers' class is worth more, so three
    workers are counted and the chief is not (training-operator's CalcPGMinResources)."""
    templates = {
        "chief": {"spec": {"priorityClassName": "low", "containers": [container({"cpu": "8"})]}},
        "worker": {"spec": {"priorityClassName": "high", "containers": [container({"cpu": "1"})]}},
    }
    job = make_job({"chief": 1, "worker": 4}, templates=templates, scheduling={"minAvailable": 3})
    assert gang.priority_class_names(job) == {"low", "high"}
    by_priority = gang.min_resources(job, options(PLUGINS, job), {"high": 1000, "low": 10})
    assert by_priority == {"cpu": "3"}
    # Unknown classes count 0: equal values keep TFJob's order, the chief first.
    unknown = gang.min_resources(job, options(PLUGINS, job), {})
    assert unknown == {"cpu": "10"}


def test_given_min_resources_win_and_bad_ones_name_the_field() -> None:
    job = make_job({"worker": 2}, scheduling={"minResources": {"cpu": "3", "memory": "2Gi"}})
    assert gang.min_resources(job, options(PLUGINS, job), {}) == {"cpu": "3", "memory": "2Gi"}
    with pytest.raises(spec.SpecError, match=r"schedulingPolicy\.minResources\.cpu"):
        make_job({"worker": 2}, scheduling={"minResources": {"cpu": "lots"}})


def test_each_scheduler_gets_its_own_podgroup() -> None:
    job = make_job(
        {"chief": 1, "worker": 2},
        scheduling={
            "minAvailable": 2,
            "queue": "research",
            "priorityClass": "batch-high",
            "scheduleTimeoutSeconds": 30,
        },
    )
    resources = {"cpu": "2"}
    plugins = gang.render_pod_group(job, PLUGINS, "team-a", OWNER, resources)
    assert plugins["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert plugins["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "2"},
        "scheduleTimeoutSeconds": 30,
    }
    assert plugins["metadata"]["labels"] == {"trainjob.dev/job-name": "mnist"}
    assert plugins["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    volcano = gang.render_pod_group(job, VOLCANO, "team-a", OWNER, resources)
    assert volcano["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert volcano["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "2"},
        "queue": "research",
        "priorityClassName": "batch-high",
    }


# -- when the PodGroup is made, kept, held and deleted ----------------------------------------


def pod(key: tuple[str, int], phase: str) -> children.ChildPod:
    return children.ChildPod(key, policy.ObservedReplica(phase=phase), f"uid-{key}", "uid-1")


def group(phase: str = "", message: str = "") -> children.ChildPodGroup:
    return children.ChildPodGroup("mnist", "pg-uid", "uid-1", phase, 3, message)


FINISHED = st.JobStatus(
    conditions=(st.Condition(st.SUCCEEDED, True, "Succeeded", "done", T0),),
)


def test_the_podgroup_comes_first_and_is_updated_only_when_min_available_changes() -> None:
    job = make_job({"chief": 1, "worker": 2})
    assert gang.plan(job, PLUGINS, st.JobStatus(), [], None) == gang.Plan(create=True)
    running = [pod(("chief", 0), "Running"), pod(("worker", 0), "Running")]
    assert gang.plan(job, PLUGINS, st.JobStatus(), running, group("Running")) == gang.Plan()
    assert gang.plan(job, NO_GANG, st.JobStatus(), [], None) == gang.Plan()
    # The SDK's gang e2e: minAvailable 10 cannot be placed; changed to 1, the group follows.
    lowered = make_job({"chief": 1, "worker": 2}, scheduling={"minAvailable": 1})
    assert gang.plan(lowered, PLUGINS, st.JobStatus(), [], group("Pending")) == gang.Plan(
        update=True
    )


def test_the_podgroup_goes_after_the_last_running_pod() -> None:
    job = make_job({"chief": 1, "worker": 2})
    still = [pod(("chief", 0), "Succeeded"), pod(("worker", 0), "Running")]
    assert gang.plan(job, PLUGINS, FINISHED, still, group("Running")) == gang.Plan()
    done = [pod(("chief", 0), "Succeeded"), pod(("worker", 0), "Failed")]
    assert gang.plan(job, PLUGINS, FINISHED, done, group("Finished")) == gang.Plan(delete=True)
    assert gang.plan(job, PLUGINS, FINISHED, [], None) == gang.Plan()  # gone already
    suspended = make_job({"chief": 1, "worker": 2}, suspend=True)
    pending = [pod(("worker", 0), "Pending")]
    assert gang.plan(suspended, PLUGINS, st.JobStatus(), pending, group()) == gang.Plan()
    assert gang.plan(suspended, PLUGINS, st.JobStatus(), [], group()) == gang.Plan(delete=True)


def test_under_volcano_pods_wait_until_the_group_is_enqueued() -> None:
    job = make_job({"chief": 1, "worker": 2}, scheduling={"queue": "research"})
    first = gang.plan(job, VOLCANO, st.JobStatus(), [], None)
    assert first.create and first.hold is not None
    assert first.hold[0] == policy.REASON_GANG_PENDING
    assert "queue research" in first.hold[1] and "minMember 3" in first.hold[1]
    pending = gang.plan(job, VOLCANO, st.JobStatus(), [], group("Pending", "3/3 tasks unready"))
    assert not pending.create and pending.hold is not None
    assert "Volcano: 3/3 tasks unready" in pending.hold[1]
    assert gang.plan(job, VOLCANO, st.JobStatus(), [], group("Inqueue")) == gang.Plan()
    # scheduler-plugins never holds: its Pods wait at the scheduler's Permit stage.
    assert gang.plan(job, PLUGINS, st.JobStatus(), [], group("Pending")).hold is None


def test_a_waiting_gang_says_it_is_the_gang_that_waits() -> None:
    job = make_job({"chief": 1, "worker": 2})
    words = "chief 0: Unschedulable: 0/4 nodes are available: 4 Insufficient cpu."
    status = st.JobStatus(
        conditions=(st.Condition(st.RUNNING, False, policy.REASON_UNSCHEDULABLE, words, T0),)
    )
    decision = policy.Decision(status=status)
    told = gang.waiting_message(decision, job, group("Scheduling"), PLUGINS)
    running = told.status.condition(st.RUNNING)
    assert running is not None
    assert running.message == (
        "Gang mnist waits until all 3 Pods fit at once (PodGroup phase Scheduling): " + words
    )
    # Told again (the condition kept from before): the same words, not a second prefix.
    again = gang.waiting_message(told, job, group("Scheduling"), PLUGINS)
    assert again.status == told.status
    moved = gang.waiting_message(told, job, group("Pending"), PLUGINS)
    moved_running = moved.status.condition(st.RUNNING)
    assert moved_running is not None and moved_running.message.count("Gang mnist") == 1
    running_ok = dataclasses.replace(
        decision,
        status=st.JobStatus(conditions=(st.Condition(st.RUNNING, True, "Running", "up", T0),)),
    )
    assert gang.waiting_message(running_ok, job, group("Running"), PLUGINS) == running_ok
    # A template that names another scheduler: its Pods are not placed with the gang, and the
    # job does not say that they wait for it.
    bypass = make_job(
        {"chief": 1, "worker": 2},
        templates={"chief": {"spec": {"schedulerName": "default-scheduler"}}},
    )
    assert gang.waiting_message(decision, bypass, group("Scheduling"), PLUGINS) == decision


def test_a_podgroup_is_indexed_with_its_phase_and_volcanos_words() -> None:
    body = {
        "metadata": {
            "name": "mnist",
            "namespace": "team-a",
            "uid": "pg-uid",
            "labels": {"trainjob.dev/job-name": "mnist"},
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "spec": {"minMember": 3},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "message": "3/3 tasks in gang unschedulable",
                }
            ],
        },
    }
    index = children.ChildIndex()
    assert index.event(children.PODGROUPS, body) == ("team-a", "mnist")
    found = index.pod_group(("team-a", "mnist"), "mnist")
    assert found == children.ChildPodGroup(
        "mnist", "pg-uid", "uid-1", "Pending", 3, "3/3 tasks in gang unschedulable"
    )
    index.event(children.PODGROUPS, body, deleted=True)
    assert index.pod_group(("team-a", "mnist"), "mnist") is None


def test_a_template_with_its_own_scheduler_is_told_it_leaves_the_gang() -> None:
    job = make_job(
        {"chief": 1, "worker": 2},
        templates={"worker": {"spec": {"schedulerName": "default-scheduler"}}},
    )
    (event,) = gang.bypass_events(job, PLUGINS)
    assert event.type == "Warning" and event.reason == "GangBypassed"
    assert "spec.replicaSpecs.worker.template sets schedulerName default-scheduler" in event.message
    own = make_job(
        {"worker": 2},
        templates={"worker": {"spec": {"schedulerName": "scheduler-plugins-scheduler"}}},
    )
    assert gang.bypass_events(own, PLUGINS) == []
