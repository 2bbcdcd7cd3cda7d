"""Kueue's side of a TrainJob as data: the Workload a job stands as in a queue, the patches
that start and stop it with an admission, and the Workload status writes of the protocol."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from trainjob.core import policy, render, spec
from trainjob.core import status as st
from trainjob_operator import kueue_patches as kp
from trainjob_operator import kueue_workload as kw

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
OPTIONS = render.RenderOptions(namespace="team-a")
OWNER = render.Owner(name="mnist", uid="uid-1")


def manifest(
    replicas: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    template: dict[str, Any] | None = None,
    run_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist",
            "namespace": "team-a",
            "uid": "uid-1",
            "labels": {kw.QUEUE_LABEL: "team-a-queue", **(labels or {})},
        },
        "spec": {
            "image": "trainjob:latest",
            "replicaSpecs": {
                rtype: {"replicas": count, "template": copy.deepcopy(template or {})}
                for rtype, count in (replicas or {"chief": 1, "worker": 2}).items()
            },
            "runPolicy": run_policy or {"suspend": True},
        },
    }


def parsed(raw: dict[str, Any]) -> spec.TrainJob:
    return spec.parse(raw)


GPU_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "a"}},
    "spec": {
        "containers": [
            {"name": "tensorflow", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}
        ]
    },
}


def test_workload_names_follow_kueues_algorithm() -> None:
    # Kueue's own test vectors (pkg/controller/jobframework/workload_names_test.go, v0.19.2).
    assert kw.workload_name("name", "uid", "Job", "batch") == "job-name-ef3a1"
    long_name = "x" * 300
    name = kw.workload_name(long_name, "uid")
    assert len(name) == 253 and name.startswith("trainjob-xxx")
    assert kw.workload_name("mnist", "uid-1") != kw.workload_name("mnist", "uid-2")


def test_a_job_is_managed_by_its_queue_label_or_by_manage_all() -> None:
    assert kw.is_managed({kw.QUEUE_LABEL: "q"}, manage_without_queue_name=False)
    assert not kw.is_managed({}, manage_without_queue_name=False)
    assert kw.is_managed({}, manage_without_queue_name=True)
    assert not kw.is_managed({kw.QUEUE_LABEL: ""}, manage_without_queue_name=False)


def test_managed_by_another_controller_only_for_foreign_values() -> None:
    assert not kw.managed_elsewhere(None)
    assert not kw.managed_elsewhere(kw.CONTROLLER_NAME)
    assert kw.managed_elsewhere(kw.MULTIKUEUE)


def test_the_workload_has_one_podset_per_replica_type_in_tfjob_order() -> None:
    raw = manifest({"worker": 4, "chief": 1, "ps": 2, "evaluator": 1}, template=GPU_TEMPLATE)
    workload = kw.build_workload(parsed(raw), "team-a", OWNER, OPTIONS, kw.Priority(None, None))
    sets = workload["spec"]["podSets"]
    assert [(p["name"], p["count"]) for p in sets] == [
        ("chief", 1),
        ("ps", 2),
        ("worker", 4),
        ("evaluator", 1),
    ]
    assert all("minCount" not in p for p in sets)
    container = sets[2]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}
    # The user's template metadata is the stash eviction restores from.
    assert sets[0]["template"]["metadata"] == {"labels": {"team": "a"}}


def test_an_empty_template_still_gets_the_container_that_will_run() -> None:
    workload = kw.build_workload(
        parsed(manifest({"worker": 2})), "team-a", OWNER, OPTIONS, kw.Priority(None, None)
    )
    containers = workload["spec"]["podSets"][0]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["tensorflow"]
    assert containers[0]["image"] == "trainjob:latest"


def test_the_workload_is_owned_labelled_and_finalized_as_kueue_expects() -> None:
    workload = kw.build_workload(
        parsed(manifest()), "team-a", OWNER, OPTIONS, kw.Priority("PriorityClass", "high", 1000)
    )
    meta = workload["metadata"]
    assert meta["name"] == kw.workload_name("mnist", "uid-1")
    assert meta["labels"][kw.JOB_UID_LABEL] == "uid-1"
    assert meta["finalizers"] == [kw.RESOURCE_IN_USE]
    [owner] = meta["ownerReferences"]
    assert owner["controller"] is True and owner["uid"] == "uid-1"
    assert owner["kind"] == "TrainJob"
    assert workload["spec"]["queueName"] == "team-a-queue"
    assert workload["spec"]["priority"] == 1000
    assert workload["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }


def test_priority_comes_from_the_workload_priority_class_label_first() -> None:
    raw = manifest(
        labels={kw.PRIORITY_CLASS_LABEL: "urgent"},
        run_policy={"suspend": True, "schedulingPolicy": {"priorityClass": "high"}},
    )
    assert kw.priority_source(parsed(raw)) == ("WorkloadPriorityClass", "urgent")
    raw = manifest(run_policy={"suspend": True, "schedulingPolicy": {"priorityClass": "high"}})
    assert kw.priority_source(parsed(raw)) == ("PriorityClass", "high")
    template = {"spec": {"priorityClassName": "low"}}
    assert kw.priority_source(parsed(manifest(template=template))) == ("PriorityClass", "low")
    assert kw.priority_source(parsed(manifest())) is None


def test_equivalence_is_by_hash_and_survives_kueues_reencoding() -> None:
    job = parsed(manifest(template=GPU_TEMPLATE))
    workload = kw.build_workload(job, "team-a", OWNER, OPTIONS, kw.Priority(None, None))
    wanted = kw.podsets_hash(kw.pod_sets(job, OPTIONS))
    stored = copy.deepcopy(workload)
    # What the API server and Kueue do to a stored Workload: defaults, re-encoded quantities.
    container = stored["spec"]["podSets"][1]["template"]["spec"]["containers"][0]
    container["resources"]["requests"]["cpu"] = "2000m"
    container["terminationMessagePath"] = "/dev/termination-log"
    assert kw.equivalent(stored, wanted, "uid-1")
    more = parsed(manifest({"chief": 1, "worker": 3}, template=GPU_TEMPLATE))
    assert not kw.equivalent(stored, kw.podsets_hash(kw.pod_sets(more, OPTIONS)), "uid-1")
    assert not kw.equivalent(stored, wanted, "another-uid")


def admitted_workload(flavor_of: dict[str, str]) -> dict[str, Any]:
    job = parsed(manifest(template=GPU_TEMPLATE))
    workload = kw.build_workload(job, "team-a", OWNER, OPTIONS, kw.Priority(None, None))
    workload["status"] = {
        "admission": {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [
                {"name": name, "flavors": {"cpu": flavor}, "count": 1}
                for name, flavor in flavor_of.items()
            ],
        },
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    }
    return workload


FLAVORS: dict[str, dict[str, Any]] = {
    "spot": {
        "spec": {
            "nodeLabels": {"pool": "spot"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        }
    },
    "on-demand": {"spec": {"nodeLabels": {"pool": "on-demand"}}},
}


def test_admission_merges_flavors_and_kueue_labels_into_the_templates_and_unsuspends() -> None:
    raw = manifest(template=GPU_TEMPLATE)
    workload = admitted_workload({"chief": "on-demand", "worker": "spot"})
    patch = kp.start_patch(raw, kp.admission_infos(workload, FLAVORS))
    assert patch["spec"]["runPolicy"] == {"suspend": False}
    worker = patch["spec"]["replicaSpecs"]["worker"]["template"]
    assert worker["spec"]["nodeSelector"] == {"pool": "spot"}
    assert worker["spec"]["tolerations"] == FLAVORS["spot"]["spec"]["tolerations"]
    assert worker["metadata"]["labels"] == {
        "team": "a",
        kw.PODSET_LABEL: "worker",
        kw.LOCAL_QUEUE_LABEL: "team-a-queue",
        kw.CLUSTER_QUEUE_LABEL: "cluster-queue",
    }
    assert worker["metadata"]["annotations"] == {
        kw.WORKLOAD_ANNOTATION: workload["metadata"]["name"]
    }
    chief = patch["spec"]["replicaSpecs"]["chief"]["template"]
    assert chief["spec"]["nodeSelector"] == {"pool": "on-demand"}
    assert "tolerations" not in chief["spec"]
    # The containers are untouched.
    assert worker["spec"]["containers"] == GPU_TEMPLATE["spec"]["containers"]


def test_an_admission_that_contradicts_the_template_is_a_conflict() -> None:
    template = copy.deepcopy(GPU_TEMPLATE)
    template["spec"]["nodeSelector"] = {"pool": "reserved"}
    raw = manifest(template=template)
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    with pytest.raises(kp.MergeConflictError, match="nodeSelector pool"):
        kp.start_patch(raw, kp.admission_infos(workload, FLAVORS))


def test_admission_checks_pod_set_updates_are_merged() -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    workload["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "state": "Ready",
            "podSetUpdates": [{"name": "worker", "annotations": {"cluster-autoscaler/x": "y"}}],
        }
    ]
    [_, worker] = kp.admission_infos(workload, FLAVORS)
    assert worker.annotations["cluster-autoscaler/x"] == "y"


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def test_eviction_restores_the_templates_from_the_workload_and_suspends() -> None:
    raw = manifest(template=GPU_TEMPLATE, run_policy={"suspend": True})
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    started = apply_merge_patch(raw, kp.start_patch(raw, kp.admission_infos(workload, FLAVORS)))
    assert started["spec"]["runPolicy"]["suspend"] is False
    stopped = apply_merge_patch(started, kp.stop_patch(started, workload))
    assert stopped["spec"]["runPolicy"]["suspend"] is True
    assert stopped["spec"]["replicaSpecs"] == raw["spec"]["replicaSpecs"]


def test_a_stopped_job_without_a_workload_is_only_suspended() -> None:
    assert kp.stop_patch(manifest(), None) == {"spec": {"runPolicy": {"suspend": True}}}


def test_clearing_an_evicted_admission_requeues_after_preemption_only() -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    workload["status"]["conditions"].append(
        {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "Preempted to accommodate a workload (UID: x) due to prioritization",
        }
    )
    cleared = kp.clear_admission_status(workload, T0 + datetime.timedelta(seconds=90))
    assert cleared["admission"] is None
    by_type = {c["type"]: c for c in cleared["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == "True"
    assert by_type["Requeued"]["reason"] == "Preempted"
    assert cleared["accumulatedPastExecutionTimeSeconds"] == 90
    workload["status"]["conditions"][-1]["reason"] = "PodsReadyTimeout"
    cleared = kp.clear_admission_status(workload, T0)
    assert {c["type"]: c for c in cleared["conditions"]}["Requeued"]["status"] == "False"


@pytest.mark.parametrize(
    ("admitted", "current", "running", "want"),
    [
        (False, None, False, (False, "WaitForStart")),
        (True, None, False, (False, "WaitForStart")),
        (True, None, True, (True, "Started")),
        (True, ("True", "Started"), False, (False, "WaitForRecovery")),
        (True, ("False", "WaitForRecovery"), False, (False, "WaitForRecovery")),
        (True, ("False", "WaitForRecovery"), True, (True, "Recovered")),
        (True, ("False", "WaitForStart"), True, (True, "Started")),
    ],
)
def test_pods_ready_follows_kueues_state_machine(
    admitted: bool, current: tuple[str, str] | None, running: bool, want: tuple[bool, str]
) -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    if not admitted:
        workload["status"]["conditions"][1]["status"] = "False"
    if current is not None:
        workload["status"]["conditions"].append(
            {"type": "PodsReady", "status": current[0], "reason": current[1]}
        )
    status, reason, _ = kp.pods_ready_condition(workload, running)
    assert (status, reason) == want


def test_pods_ready_is_written_only_when_it_changes() -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    patch = kp.pods_ready_status(workload, True, T0)
    assert patch is not None
    workload["status"]["conditions"] = patch["conditions"]
    assert kp.pods_ready_status(workload, True, T0) is None


def test_a_finished_workload_keeps_the_other_conditions() -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    finished = kp.finish_status(workload, "Succeeded", "TrainJob mnist succeeded", T0)
    types = [c["type"] for c in finished["conditions"]]
    assert types == ["QuotaReserved", "Admitted", "Finished"]


def test_the_hold_says_which_queue_and_kueues_reason() -> None:
    workload = admitted_workload({"chief": "spot", "worker": "spot"})
    workload["status"] = {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set worker: insufficient quota",
            }
        ]
    }
    reason, message = kp.hold_reason(workload, "team-a-queue")
    assert reason == kw.JOB_REASON_QUEUED
    assert "LocalQueue team-a-queue" in message
    assert "insufficient quota" in message
    workload["status"]["conditions"].append(
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by prio"}
    )
    reason, message = kp.hold_reason(workload, "team-a-queue")
    assert reason == kw.JOB_REASON_EVICTED
    assert "Preempted" in message


def test_a_held_job_says_queued_instead_of_suspended() -> None:
    job = parsed(manifest())
    decision = policy.reconcile(job, st.JobStatus(), {}, set(), T0)
    held = kp.held_decision(decision, st.JobStatus(), ("Queued", "Waiting for Kueue"), None, T0)
    suspended = held.status.condition(st.SUSPENDED)
    assert suspended is not None and suspended.reason == "Queued"
    assert [e.reason for e in held.events] == ["Created", "Queued"]
    # The same hold again posts nothing new.
    again = policy.reconcile(job, held.status, {}, set(), T0)
    held_again = kp.held_decision(again, held.status, ("Queued", "Waiting for Kueue"), None, T0)
    assert held_again.events == ()


def test_kueues_first_words_about_a_held_job_are_an_event_of_their_own() -> None:
    """The job's Queued Event comes when it is queued, before Kueue has looked at its
    Workload; Kueue's reason, when it first comes, gets an Event too (once)."""
    job = parsed(manifest())
    looking = (
        "Queued",
        f"Waiting for Kueue to admit Workload w in LocalQueue q: {kw.NOT_LOOKED_AT}",
    )
    said = (
        "Queued",
        "Waiting for Kueue to admit Workload w in LocalQueue q: couldn't assign flavors to pod "
        "set worker: insufficient quota for nvidia.com/gpu in flavor gpu",
    )
    first = kp.held_decision(
        policy.reconcile(job, st.JobStatus(), {}, set(), T0), st.JobStatus(), looking, None, T0
    )
    assert [e.reason for e in first.events] == ["Created", "Queued"]
    told = kp.held_decision(
        policy.reconcile(job, first.status, {}, set(), T0), first.status, said, None, T0
    )
    assert [(e.reason, e.message) for e in told.events] == [("Queued", said[1])]
    again = kp.held_decision(
        policy.reconcile(job, told.status, {}, set(), T0), told.status, said, None, T0
    )
    assert again.events == ()
