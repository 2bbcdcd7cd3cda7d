"""Kubeflow's TFJob through the one engine: how a TFJob is read (training-operator v1.9.4's
in-memory defaults, its webhook's checks), what its Pods and Services look like (the Kubeflow
profile), and its status as training-operator writes it, decided by the engine step by step
(test_policy's World) and shown with `tfjob_status.view` after each step, as the operator
does after each reconcile."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from typing import Any

import pytest

from tests.unit.test_policy import World, at
from trainjob.core import render, spec, tfjob, tfjob_status, times
from trainjob_operator import doors


def manifest(
    replicas: dict[str, int],
    restart_policy: str = "Never",
    run_policy: dict[str, Any] | None = None,
    **spec_fields: Any,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {
            "tfReplicaSpecs": {
                rtype: {
                    "replicas": count,
                    "restartPolicy": restart_policy,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "tensorflow", "image": "tf:2", "command": ["python"]}
                            ]
                        }
                    },
                }
                for rtype, count in replicas.items()
            },
            **spec_fields,
        },
    }
    if run_policy is not None:
        result["spec"]["runPolicy"] = run_policy
    return result


def parsed(raw: dict[str, Any]) -> spec.TrainJob:
    assert tfjob.webhook_problems(raw) == []
    return spec.parse(tfjob.as_trainjob(raw))


# -- reading a TFJob ------------------------------------------------------------------------


def test_a_tfjob_gets_training_operators_defaults_not_ours() -> None:
    job = parsed(manifest({"Worker": 2, "PS": 1}))
    assert job.run_policy.clean_pod_policy == "None"
    assert job.run_policy.backoff_limit == tfjob.UNLIMITED_BACKOFF
    assert job.run_policy.startup_deadline_seconds == tfjob.NO_STARTUP_DEADLINE
    assert job.success_policy == "ChiefOrWorker0"
    assert {k: v.replicas for k, v in job.replica_specs.items()} == {"worker": 2, "ps": 1}


def test_what_the_tfjob_sets_wins_and_legacy_top_level_fields_are_ignored_as_pruned() -> None:
    raw = manifest(
        {"worker": 2},
        run_policy={"cleanPodPolicy": "All", "backoffLimit": 2, "activeDeadlineSeconds": 60},
        successPolicy="AllWorkers",
    )
    raw["spec"]["ttlSecondsAfterFinished"] = 5  # KFP's launcher writes these; the CRD prunes
    job = parsed(raw)
    assert job.run_policy.clean_pod_policy == "All"
    # training-operator fails the job once restarts reach the limit: the 2nd failure.
    assert job.run_policy.backoff_limit == 1
    assert job.run_policy.active_deadline_seconds == 60
    assert job.run_policy.ttl_seconds_after_finished is None
    assert job.success_policy == "AllWorkers"
    # With a Chief (or Master), it alone decides: successPolicy is not read.
    with_chief = manifest({"Chief": 1, "Worker": 1}, successPolicy="AllWorkers")
    assert parsed(with_chief).success_policy == "ChiefOrWorker0"
    assert tfjob.engine_backoff_limit(0) == tfjob.engine_backoff_limit(1) == 0


def test_the_engines_status_is_read_from_the_annotation() -> None:
    raw = manifest({"Worker": 1})
    raw["metadata"]["annotations"] = {
        tfjob.ANNOTATION_ENGINE_STATUS: json.dumps({"restartCount": 3})
    }
    assert tfjob.as_trainjob(raw)["status"] == {"restartCount": 3}
    raw["metadata"]["annotations"][tfjob.ANNOTATION_ENGINE_STATUS] = "{not json"
    assert tfjob.as_trainjob(raw)["status"] == {}


@pytest.mark.parametrize(
    ("value", "takeover", "coexist"),
    [
        (None, True, False),
        (tfjob.TRAINING_OPERATOR, True, False),
        (tfjob.OURS, True, True),
        (tfjob.MULTIKUEUE, False, False),
        ("example.com/other", False, False),
    ],
)
def test_which_tfjobs_are_ours_by_managed_by_and_mode(
    value: str | None, takeover: bool, coexist: bool
) -> None:
    assert tfjob.served(value, tfjob.TAKEOVER) is takeover
    assert tfjob.served(value, tfjob.COEXIST) is coexist


def test_the_webhooks_checks_name_the_field_as_training_operator_does() -> None:
    raw = manifest({"Chief": 1, "Master": 1, "Worker": 1}, run_policy={"managedBy": "x.io/y"})
    raw["metadata"]["name"] = "1-bad"
    raw["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] = [
        {"name": "main", "image": ""}
    ]
    paths = [p.path for p in tfjob.webhook_problems(raw)]
    assert paths == [
        "metadata.name",
        "spec.runPolicy.managedBy",
        "spec.tfReplicaSpecs[Worker].template.spec.containers[0].image",
        "spec.tfReplicaSpecs[Worker].template.spec.containers",
        "spec.tfReplicaSpecs",
    ]
    assert [p.path for p in tfjob.webhook_problems({"metadata": {"name": "a"}, "spec": {}})] == [
        "spec.tfReplicaSpecs"
    ]


# -- its children: the Kubeflow profile -----------------------------------------------------


def children_of(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    job = parsed(raw)
    options = render.RenderOptions(
        namespace="team-a", kind_labels=tfjob.KubeflowLabels(tfjob.replica_types(raw))
    )
    owner = render.Owner("mnist", "u1", tfjob.API_VERSION, tfjob.KIND)
    rendered = render.render_all(job, options, owner)
    return [r for r in rendered if r["kind"] == "Pod"], [
        r for r in rendered if r["kind"] == "Service"
    ]


def env_of(pod: dict[str, Any], container: str = "tensorflow") -> dict[str, str]:
    for c in pod["spec"]["containers"]:
        if c["name"] == container:
            return {e["name"]: e["value"] for e in c.get("env") or []}
    raise AssertionError(container)


def test_pods_carry_kubeflows_labels_and_the_master_role_is_worker_0_without_a_chief() -> None:
    pods, services = children_of(manifest({"Worker": 2, "PS": 1}))
    by_name = {p["metadata"]["name"]: p for p in pods}
    assert sorted(by_name) == ["mnist-ps-0", "mnist-worker-0", "mnist-worker-1"]
    labels = by_name["mnist-worker-0"]["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if k.startswith("training.kubeflow.org/")} == {
        "training.kubeflow.org/operator-name": "tfjob-controller",
        "training.kubeflow.org/job-name": "mnist",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
        "training.kubeflow.org/job-role": "master",
    }
    assert "training.kubeflow.org/job-role" not in by_name["mnist-worker-1"]["metadata"]["labels"]
    assert "training.kubeflow.org/job-role" not in by_name["mnist-ps-0"]["metadata"]["labels"]
    owner = by_name["mnist-ps-0"]["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["controller"]) == (
        "kubeflow.org/v1",
        "TFJob",
        True,
    )
    service = next(s for s in services if s["metadata"]["name"] == "mnist-worker-1")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {
        "training.kubeflow.org/operator-name": "tfjob-controller",
        "training.kubeflow.org/job-name": "mnist",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "1",
    }


def test_the_chief_is_the_master_role_and_master_is_kept_in_the_labels() -> None:
    pods, _ = children_of(manifest({"Master": 1, "Worker": 1}))
    master = next(p for p in pods if "job-role" in str(p["metadata"]["labels"]))
    assert master["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master"


def test_tf_config_only_in_the_tensorflow_container_and_nothing_else_of_ours() -> None:
    raw = manifest({"Worker": 2})
    containers = raw["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    containers.append({"name": "sidecar", "image": "busybox"})
    pods, _ = children_of(raw)
    pod = pods[0]
    env = env_of(pod)
    assert set(env) == {"TF_CONFIG"}
    config = json.loads(env["TF_CONFIG"])
    assert config["cluster"]["worker"] == [
        "mnist-worker-0.team-a.svc:2222",
        "mnist-worker-1.team-a.svc:2222",
    ]
    assert env_of(pod, "sidecar") == {}
    tf = pod["spec"]["containers"][0]
    assert tf["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    assert "securityContext" not in tf and "securityContext" not in pod["spec"]


def test_a_master_keeps_its_name_in_pods_and_tf_config() -> None:
    raw = manifest({"Master": 1, "Worker": 1})
    job = tfjob_door_parse(raw)
    options = render.RenderOptions(
        namespace="team-a", kind_labels=tfjob.KubeflowLabels(tfjob.replica_types(raw))
    )
    pods = [r for r in render.render_all(job, options, None) if r["kind"] == "Pod"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["mnist-master-0", "mnist-worker-0"]
    config = json.loads(env_of(pods[0])["TF_CONFIG"])
    assert config["task"] == {"type": "master", "index": 0}
    assert config["cluster"]["master"] == ["mnist-master-0.team-a.svc:2222"]


def tfjob_door_parse(raw: dict[str, Any]) -> spec.TrainJob:
    """What the operator's TFJob door reads (doors.py)."""
    return doors.TFJobDoor().parse(doors.tfjob_view(raw))


def test_a_single_replica_gets_no_tf_config() -> None:
    pods, _ = children_of(manifest({"Worker": 1}))
    assert env_of(pods[0]) == {}


# -- its status, decided by the engine ------------------------------------------------------


@dataclasses.dataclass
class Shown:
    """A TFJob as the operator shows it: the engine's World, and after each reconcile the
    TFJob's status from the one before (`view`)."""

    raw: dict[str, Any]
    world: World
    status: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Shown:
        return cls(raw, World(parsed(raw)))

    def show(self, now: datetime.datetime) -> dict[str, Any]:
        pods = [
            tfjob_status.PodPhase(rtype, pod.phase, pod.deleting)
            for (rtype, _), pod in self.world.pods.items()
        ]
        self.status = tfjob_status.view(
            self.status,
            self.world.status,
            tfjob.replica_types(self.raw),
            pods,
            "team-a",
            "mnist",
            now,
        )
        return self.status

    def step(self, now: datetime.datetime) -> dict[str, Any]:
        self.world.reconcile(now)
        return self.show(now)

    def conditions(self) -> list[tuple[str, str, str]]:
        return [(c["type"], c["status"], c["reason"]) for c in self.status["conditions"]]


def test_a_normal_run_ends_created_running_false_succeeded_with_the_terminal_one_last() -> None:
    shown = Shown.of(manifest({"Worker": 2}))
    shown.step(at(0))
    assert shown.conditions() == [("Created", "True", "TFJobCreated")]
    shown.world.run_all(at(1))
    shown.show(at(1))
    assert shown.conditions()[-1] == ("Running", "True", "TFJobRunning")
    assert shown.status["replicaStatuses"] == {"Worker": {"active": 2}}
    assert "startTime" in shown.status
    shown.world.set_phase(("worker", 0), "Succeeded", exit_code=0)
    shown.step(at(5))
    assert shown.conditions() == [
        ("Created", "True", "TFJobCreated"),
        ("Running", "False", "TFJobRunning"),
        ("Succeeded", "True", "TFJobSucceeded"),
    ]
    assert shown.status["conditions"][-1]["message"] == "TFJob team-a/mnist successfully completed."
    # cleanPodPolicy None: worker 1 keeps running, and is counted as succeeded, as upstream.
    assert shown.status["replicaStatuses"] == {"Worker": {"succeeded": 2}}
    assert "completionTime" in shown.status
    frozen = copy.deepcopy(shown.status)
    shown.world.set_phase(("worker", 1), "Failed", exit_code=1)
    assert shown.step(at(9)) == frozen


def test_a_job_that_finishes_before_it_is_seen_running_has_two_conditions() -> None:
    shown = Shown.of(manifest({"Worker": 1}))
    shown.step(at(0))
    shown.world.set_phase(("worker", 0), "Succeeded", exit_code=0)
    shown.step(at(3))
    assert shown.conditions() == [
        ("Created", "True", "TFJobCreated"),
        ("Succeeded", "True", "TFJobSucceeded"),
    ]


def test_restarting_and_running_replace_each_other_and_failed_is_terminal() -> None:
    shown = Shown.of(manifest({"Worker": 2}, restart_policy="OnFailure", run_policy={}))
    shown.step(at(0))
    shown.world.run_all(at(1))
    shown.show(at(1))
    shown.world.set_phase(("worker", 1), "Failed", exit_code=1)
    shown.step(at(2))
    assert [t for t, _, _ in shown.conditions()] == ["Created", "Restarting"]
    assert "Worker replica(s) failed" in shown.status["conditions"][-1]["message"]
    shown.world.settle(at(3))
    shown.show(at(3))
    assert [t for t, _, _ in shown.conditions()] == ["Created", "Running"]


def test_a_failure_under_never_fails_it_with_the_cause_and_nothing_changes_after() -> None:
    shown = Shown.of(manifest({"Chief": 1, "Worker": 1}))
    shown.step(at(0))
    shown.world.run_all(at(1))
    shown.show(at(1))
    shown.world.set_phase(("worker", 0), "Failed", exit_code=3)
    shown.step(at(2))
    assert shown.conditions()[-1] == ("Failed", "True", "TFJobFailed")
    assert shown.conditions()[1] == ("Running", "False", "TFJobRunning")
    message = shown.status["conditions"][-1]["message"]
    # training-operator's words first (KFP, dashboards match on them), then the cause.
    assert message.startswith("TFJob team-a/mnist has failed because 1 Worker replica(s) failed. ")
    assert "exit" in message and "TrainJob" not in message, message
    after = tfjob_status.set_condition(
        shown.status["conditions"], "Running", True, "TFJobRunning", "x", at(3)
    )
    assert after == shown.status["conditions"]


def test_created_suspended_shows_created_and_suspended_only_then_resumes() -> None:
    shown = Shown.of(manifest({"Worker": 1}, run_policy={"suspend": True}))
    shown.step(at(0))
    assert shown.conditions() == [
        ("Created", "True", "TFJobCreated"),
        ("Suspended", "True", "TFJobSuspended"),
    ]
    assert "startTime" not in shown.status
    assert "replicaStatuses" not in shown.status  # none until its first run, as upstream
    resumed = manifest({"Worker": 1}, run_policy={"suspend": False})
    shown.world.job = parsed(resumed)
    shown.step(at(10))
    assert shown.conditions()[-1] == ("Suspended", "False", "TFJobResumed")
    assert shown.status["startTime"] == times.format_time(at(10))


def test_suspending_a_running_job_zeroes_active_at_once_and_turns_running_false() -> None:
    shown = Shown.of(manifest({"Worker": 2}))
    shown.step(at(0))
    shown.world.run_all(at(1))
    shown.show(at(1))
    shown.world.job = parsed(manifest({"Worker": 2}, run_policy={"suspend": True}))
    shown.step(at(2))
    # The Pods are still there, being deleted: not active, and not counted as failed.
    assert shown.status["replicaStatuses"] == {"Worker": {}}
    assert shown.conditions()[-2:] == [
        ("Running", "False", "TFJobSuspended"),
        ("Suspended", "True", "TFJobSuspended"),
    ]


def test_replica_statuses_count_phases_as_training_operator_does() -> None:
    types = {"chief": "Chief", "worker": "Worker"}
    pods = [
        tfjob_status.PodPhase("chief", "Running"),
        tfjob_status.PodPhase("worker", "Running", deleting=True),
        tfjob_status.PodPhase("worker", "Pending"),
        tfjob_status.PodPhase("worker", "Succeeded"),
        tfjob_status.PodPhase("worker", "Failed"),
    ]
    assert tfjob_status.replica_statuses(pods, types, False, False) == {
        "Chief": {"active": 1},
        "Worker": {"failed": 2, "succeeded": 1},
    }
    assert tfjob_status.replica_statuses(pods, types, True, False)["Chief"] == {}


def test_an_unchanged_condition_keeps_its_place_and_times() -> None:
    first = tfjob_status.set_condition([], "Created", True, "TFJobCreated", "m", at(0))
    running = tfjob_status.set_condition(first, "Running", True, "TFJobRunning", "m", at(1))
    assert tfjob_status.set_condition(running, "Running", True, "TFJobRunning", "m", at(5)) == (
        running
    )
    moved = tfjob_status.set_condition(running, "Created", True, "Other", "m", at(6))
    assert [c["type"] for c in moved] == ["Running", "Created"]
    assert moved[-1]["lastTransitionTime"] == times.format_time(at(0))


def test_the_backoff_limit_th_failure_fails_it_in_training_operators_words() -> None:
    shown = Shown.of(
        manifest({"Worker": 2}, restart_policy="OnFailure", run_policy={"backoffLimit": 2})
    )
    shown.step(at(0))
    shown.world.run_all(at(1))
    shown.show(at(1))
    shown.world.set_phase(("worker", 1), "Failed", exit_code=1)
    shown.step(at(2))
    assert shown.conditions()[-1][0] == "Restarting"
    shown.world.settle(at(3))
    shown.show(at(3))
    shown.world.set_phase(("worker", 1), "Failed", exit_code=1)
    shown.step(at(4))
    assert shown.conditions()[-1] == ("Failed", "True", "TFJobFailed")
    message = shown.status["conditions"][-1]["message"]
    assert message.startswith(
        "Job mnist has failed because it has reached the specified backoff limit"
    ), message
    assert "backoffLimit=" not in message, message  # the engine's count is not the TFJob's


def test_a_tfjob_the_engine_cannot_read_is_refused_in_its_own_field_names() -> None:
    raw = manifest({"Worker": 1}, successPolicy="Sometimes")
    with pytest.raises(spec.SpecError) as refused:
        tfjob_door_parse(raw)
    assert str(refused.value) == "spec.successPolicy: unknown value 'Sometimes'"
