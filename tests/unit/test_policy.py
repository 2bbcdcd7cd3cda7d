"""The lifecycle policy engine, as data: restart policy x exit code, restart scope, backoff,
success policies, clean-up, deadline, TTL, startup deadline and suspend/resume, with injected
time. A tiny in-memory "cluster" applies each decision the way an executor would."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from trainjob.core import policy, spec
from trainjob.core import status as st

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
Key = tuple[str, int]


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def make_job(
    replicas: dict[str, int],
    restart_policy: str = "Never",
    run_policy: dict[str, Any] | None = None,
    success_policy: str | None = None,
) -> spec.TrainJob:
    manifest: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {
            "image": "img",
            "replicaSpecs": {
                rtype: {"replicas": count, "restartPolicy": restart_policy}
                for rtype, count in replicas.items()
            },
            "runPolicy": run_policy or {},
        },
    }
    if success_policy:
        manifest["spec"]["successPolicy"] = success_policy
    return spec.parse(manifest)


@dataclasses.dataclass
class World:
    """Pods and Services as an executor would hold them; decisions are applied to it."""

    job: spec.TrainJob
    status: st.JobStatus = dataclasses.field(default_factory=st.JobStatus)
    pods: dict[Key, policy.ObservedReplica] = dataclasses.field(default_factory=dict)
    services: set[Key] = dataclasses.field(default_factory=set)
    deleted_job: bool = False
    last: policy.Decision | None = None
    # Replicas whose Pod's node is not Ready, as the operator's node informer reports them.
    lost: dict[Key, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # (reason, message) while the executor holds Pod creation (a gang not admitted yet).
    held: tuple[str, str] | None = None

    def reconcile(self, now: datetime.datetime) -> policy.Decision:
        decision = policy.reconcile(
            self.job, self.status, self.pods, self.services, now, lost=self.lost, held=self.held
        )
        for key in decision.delete_pods:
            # Deletion is asynchronous on a real cluster: the Pod first shows deletionTimestamp.
            self.pods[key] = dataclasses.replace(self.pods[key], deleting=True)
        for rtype, index, attempt in decision.create_pods:
            self.pods[(rtype, index)] = policy.ObservedReplica(phase="Pending", attempt=attempt)
        self.services |= set(decision.create_services)
        self.services -= set(decision.delete_services)
        self.deleted_job = decision.delete_job
        self.status = decision.status
        self.last = decision
        return decision

    def finish_deletions(self) -> None:
        self.pods = {k: p for k, p in self.pods.items() if not p.deleting}

    def set_phase(
        self,
        key: Key,
        phase: str,
        exit_code: int | None = None,
        reason: str | None = None,
        finished_at: datetime.datetime | None = None,
    ) -> None:
        self.pods[key] = dataclasses.replace(
            self.pods[key], phase=phase, exit_code=exit_code, reason=reason, finished_at=finished_at
        )

    def run_all(self, now: datetime.datetime) -> None:
        for key in list(self.pods):
            if not self.pods[key].deleting:
                self.set_phase(key, "Running")
        self.reconcile(now)

    def settle(self, now: datetime.datetime) -> None:
        """Deletions complete, recreated pods come up: what a kubelet does between events."""
        self.finish_deletions()
        self.reconcile(now)
        self.run_all(now)

    def state(self) -> str:
        return st.state_of(self.status)

    def condition(self, ctype: str) -> st.Condition:
        condition = self.status.condition(ctype)
        assert condition is not None, ctype
        return condition


def started(job: spec.TrainJob) -> World:
    world = World(job)
    world.reconcile(at(0))
    world.run_all(at(1))
    assert world.state() == "Running"
    return world


def test_fresh_job_creates_every_service_and_pod_and_is_created() -> None:
    world = World(make_job({"chief": 1, "worker": 2, "ps": 1}))
    decision = world.reconcile(at(0))
    keys = [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    assert sorted(decision.create_services) == keys
    assert sorted((t, i) for t, i, _ in decision.create_pods) == keys
    assert all(attempt == 0 for *_, attempt in decision.create_pods)
    assert world.state() == "Created"
    assert world.status.start_time == at(0)
    assert [e.reason for e in decision.events] == ["Created"]
    # Reconciling again with everything present creates nothing (idempotent).
    again = world.reconcile(at(1))
    assert again.create_pods == () and again.create_services == ()


def test_a_job_created_suspended_is_created_and_suspended_and_created_only_once() -> None:
    """Its first decision tells Created whatever the spec says by then (an Event posted for
    it before a crash is the one posted again after a suspend), and the resume does not."""
    world = World(make_job({"chief": 1, "worker": 1}, run_policy={"suspend": True}))
    decision = world.reconcile(at(0))
    assert [e.reason for e in decision.events] == ["Created", "Suspended"]
    assert decision.create_pods == () and world.condition(st.CREATED).status
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=False)
    )
    resumed = world.reconcile(at(5))
    assert [e.reason for e in resumed.events] == ["Resumed"]
    assert len(resumed.create_pods) == 2


def test_suspended_before_it_started_it_deleted_nothing_and_stays_at_attempt_0() -> None:
    """Created suspended (or queued by Kueue): it never had a Pod or Service, so its Event
    does not claim it deleted them, and its first Pods, once resumed, are attempt 0."""
    world = World(make_job({"chief": 1, "worker": 2}, run_policy={"suspend": True}))
    decision = world.reconcile(at(0))
    suspended = [e.message for e in decision.events if e.reason == "Suspended"]
    assert suspended == ["Suspended TrainJob before it started: no Pod or Service was created"]
    assert decision.delete_pods == () and decision.delete_services == ()
    assert [world.status.record(key).attempt for key in world.job.replica_keys()] == [0, 0, 0]
    assert world.status.start_time is None
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=False)
    )
    resumed = world.reconcile(at(5))
    assert sorted(resumed.create_pods) == [("chief", 0, 0), ("worker", 0, 0), ("worker", 1, 0)]


def test_a_job_suspended_after_it_ran_still_says_it_deleted_its_pods() -> None:
    world = started(make_job({"worker": 1}))
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=True)
    )
    decision = world.reconcile(at(10))
    suspended = [e.message for e in decision.events if e.reason == "Suspended"]
    assert suspended == ["Suspended TrainJob: deleted its Pods and Services"]
    assert world.status.record(("worker", 0)).attempt == 1  # its Pod's exit is now stale


def test_all_replicas_running_makes_the_job_running() -> None:
    world = World(make_job({"worker": 2}))
    world.reconcile(at(0))
    world.set_phase(("worker", 0), "Running")
    world.reconcile(at(1))
    assert world.state() == "Created"  # one replica is still pending
    world.run_all(at(2))
    assert world.state() == "Running"
    assert st.to_dict(world.job, world.status)["ready"] == "2/2"


# restart policy, exit code, reason -> restart (True) or fail the job (False)
MATRIX = [
    ("Never", 1, None, False),
    ("Never", 137, "OOMKilled", False),
    ("Never", None, "Evicted", False),
    ("OnFailure", 1, None, True),
    ("OnFailure", 137, None, True),
    ("OnFailure", None, "Evicted", True),
    ("Always", 1, None, True),
    ("Always", 143, None, True),
    ("ExitCode", 1, None, False),
    ("ExitCode", 2, None, False),
    ("ExitCode", 127, None, False),
    ("ExitCode", 128, None, True),
    ("ExitCode", 130, None, True),
    ("ExitCode", 137, "OOMKilled", True),
    ("ExitCode", 143, None, True),
    ("ExitCode", 255, None, True),
    ("ExitCode", None, "Evicted", True),
]


@pytest.mark.parametrize(("restart_policy", "exit_code", "reason", "restarts"), MATRIX)
def test_restart_policy_by_exit_code(
    restart_policy: str, exit_code: int | None, reason: str | None, restarts: bool
) -> None:
    world = started(make_job({"worker": 2}, restart_policy))
    world.set_phase(("worker", 1), "Failed", exit_code, reason, at(5))
    decision = world.reconcile(at(6))
    record = world.status.record(("worker", 1))
    assert record.exit_code == exit_code  # the last exit code is in status (kubeflow #1749)
    if restarts:
        assert world.state() == "Restarting"
        assert world.status.restart_count == 1
        assert set(decision.delete_pods) == {("worker", 0), ("worker", 1)}
        world.settle(at(7))
        assert world.state() == "Running"
        assert world.pods[("worker", 1)].attempt == 1
    else:
        assert world.state() == "Failed"
        assert world.condition("Failed").reason == "ReplicaFailed"
        assert f"restartPolicy {restart_policy}" in world.condition("Failed").message
        assert world.status.restart_count == 0
        assert world.status.completion_time == at(6)


def test_always_restarts_a_replica_that_exits_zero_unless_it_decides_success() -> None:
    world = started(make_job({"chief": 1, "worker": 1, "ps": 1}, "Always"))
    world.set_phase(("ps", 0), "Succeeded", 0)
    world.reconcile(at(5))
    assert world.state() == "Restarting"
    world.settle(at(6))
    world.set_phase(("chief", 0), "Succeeded", 0)
    world.reconcile(at(7))
    assert world.state() == "Succeeded"


def test_every_restart_counts_toward_backoff_limit() -> None:
    world = started(make_job({"worker": 1, "ps": 1, "chief": 1}, "OnFailure", {"backoffLimit": 2}))
    for attempt in range(2):
        failed_at = 10.0 * (attempt + 1)
        world.set_phase(("worker", 0), "Failed", 1, None, at(failed_at))
        world.reconcile(at(failed_at))
        assert world.status.restart_count == attempt + 1
        world.settle(at(failed_at + policy.restart_delay(attempt + 1)))
    world.set_phase(("worker", 0), "Failed", 1, None, at(40))
    world.reconcile(at(40))
    assert world.state() == "Failed"
    assert world.condition("Failed").reason == "BackoffLimitExceeded"
    assert world.status.restart_count == 2


def test_restarts_after_the_first_wait_a_doubling_delay() -> None:
    """A Pod deleted in a loop must not use up backoffLimit in seconds (the Job controller's
    answer: an exponential delay before the next attempt). The first restart is immediate."""
    assert [policy.restart_delay(n) for n in range(1, 9)] == [0, 2, 4, 8, 16, 32, 60, 60]
    world = started(make_job({"worker": 2}, "ExitCode", {"backoffLimit": 6}))
    world.set_phase(("worker", 1), "Failed", 137, None, at(5))
    world.reconcile(at(5))
    world.finish_deletions()
    assert len(world.reconcile(at(5)).create_pods) == 2  # first restart: at once
    world.run_all(at(6))
    world.set_phase(("worker", 0), "Failed", 137, None, at(10))
    world.reconcile(at(10))
    world.finish_deletions()
    held = world.reconcile(at(10.5))
    assert held.create_pods == () and held.requeue_after == pytest.approx(1.5)
    assert world.status.restart_count == 2
    assert len(world.reconcile(at(12)).create_pods) == 2


def test_backoff_limit_zero_fails_on_first_retryable_failure() -> None:
    world = started(make_job({"worker": 2}, "ExitCode", {"backoffLimit": 0}))
    world.set_phase(("worker", 0), "Failed", 137, None, at(3))
    world.reconcile(at(3))
    assert world.condition("Failed").reason == "BackoffLimitExceeded"


def test_all_reduce_job_restarts_the_whole_group_once() -> None:
    world = started(make_job({"chief": 1, "worker": 2, "evaluator": 1}, "ExitCode"))
    world.set_phase(("worker", 1), "Failed", 137, "Error", at(5))
    decision = world.reconcile(at(5))
    assert set(decision.delete_pods) == {("chief", 0), ("worker", 0), ("worker", 1)}
    assert world.status.restart_count == 1
    assert [e.reason for e in decision.events] == ["Restarting"]
    # A survivor fails *because* the collective broke, before its deletion lands: stale, so
    # neither counted nor judged under ExitCode (its exit 1 would otherwise fail the job).
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=1, deleting=False
    )
    world.reconcile(at(6))
    assert world.state() == "Restarting"
    assert world.status.restart_count == 1
    world.settle(at(8))
    assert world.state() == "Running"
    assert world.condition("Restarting").status is False
    assert world.pods[("evaluator", 0)].attempt == 0  # the evaluator was left alone


def test_root_cause_is_the_earliest_failure_of_a_group() -> None:
    world = started(make_job({"worker": 3}, "ExitCode"))
    # Worker 2 was OOM-killed first; workers 0 and 1 then failed with exit 1 within seconds.
    world.set_phase(("worker", 2), "Failed", 137, "OOMKilled", at(10))
    world.set_phase(("worker", 0), "Failed", 1, None, at(12))
    world.set_phase(("worker", 1), "Failed", 1, None, at(13))
    world.reconcile(at(14))
    assert world.state() == "Restarting"
    assert world.status.restart_count == 1
    assert "worker 2 exited with code 137" in world.condition("Restarting").message


def test_a_user_error_first_fails_the_all_reduce_job() -> None:
    world = started(make_job({"worker": 2}, "ExitCode"))
    world.set_phase(("worker", 0), "Failed", 1, None, at(10))
    world.set_phase(("worker", 1), "Failed", 137, None, at(11))
    world.reconcile(at(12))
    assert world.state() == "Failed"
    assert "worker 0 exited with code 1" in world.condition("Failed").message


def test_parameter_server_job_restarts_a_lost_worker_alone() -> None:
    world = started(make_job({"chief": 1, "worker": 2, "ps": 2}, "ExitCode"))
    world.set_phase(("worker", 1), "Failed", 137, None, at(5))
    decision = world.reconcile(at(5))
    assert decision.delete_pods == (("worker", 1),)
    world.settle(at(6))
    assert world.state() == "Running"
    assert {k: p.attempt for k, p in world.pods.items()} == {
        ("chief", 0): 0,
        ("ps", 0): 0,
        ("ps", 1): 0,
        ("worker", 0): 0,
        ("worker", 1): 1,
    }


def test_parameter_server_job_restarts_chief_and_ps_when_a_ps_is_lost() -> None:
    world = started(make_job({"chief": 1, "worker": 2, "ps": 2}, "ExitCode"))
    world.set_phase(("ps", 1), "Failed", 137, None, at(5))
    decision = world.reconcile(at(5))
    assert set(decision.delete_pods) == {("chief", 0), ("ps", 0), ("ps", 1)}
    assert world.status.restart_count == 1


def test_chief_success_succeeds_and_stops_running_ps_and_workers() -> None:
    world = started(make_job({"chief": 1, "worker": 2, "ps": 1}))
    world.set_phase(("worker", 0), "Succeeded", 0)
    world.set_phase(("chief", 0), "Succeeded", 0)
    decision = world.reconcile(at(30))
    assert world.state() == "Succeeded"
    assert world.status.completion_time == at(30)
    # cleanPodPolicy Running (default): still-running replicas are stopped, finished ones kept.
    assert set(decision.delete_pods) == {("ps", 0), ("worker", 1)}
    assert set(decision.delete_services) == {("ps", 0), ("worker", 1)}
    # The stopped pods exit 143: never judged as failures after the job finished.
    world.pods[("ps", 0)] = dataclasses.replace(
        world.pods[("ps", 0)], phase="Failed", exit_code=143, deleting=False
    )
    world.reconcile(at(31))
    assert world.state() == "Succeeded"
    assert world.status.record(("ps", 0)).state == "Stopped"


@pytest.mark.parametrize(
    ("clean_pod_policy", "deleted"),
    [
        ("None", set()),
        ("Running", {("ps", 0)}),
        ("All", {("ps", 0), ("chief", 0), ("worker", 0)}),
    ],
)
def test_clean_pod_policy(clean_pod_policy: str, deleted: set[Key]) -> None:
    world = started(
        make_job(
            {"chief": 1, "worker": 1, "ps": 1}, run_policy={"cleanPodPolicy": clean_pod_policy}
        )
    )
    world.set_phase(("worker", 0), "Succeeded", 0)
    world.set_phase(("chief", 0), "Succeeded", 0)
    decision = world.reconcile(at(30))
    assert set(decision.delete_pods) == deleted
    if clean_pod_policy == "All":
        assert set(decision.delete_services) == {("ps", 0), ("chief", 0), ("worker", 0)}


def test_worker0_decides_success_without_a_chief() -> None:
    world = started(make_job({"worker": 3}))
    world.set_phase(("worker", 0), "Succeeded", 0)
    world.reconcile(at(9))
    assert world.state() == "Succeeded"


def test_all_workers_policy_waits_for_every_worker_and_never_recreates_a_succeeded_one() -> None:
    world = started(make_job({"worker": 2}, success_policy="AllWorkers"))
    world.set_phase(("worker", 0), "Succeeded", 0)
    world.reconcile(at(9))
    assert world.state() == "Running"
    # Worker 0's pod is garbage-collected: completion is recorded, so it is not recreated.
    del world.pods[("worker", 0)]
    decision = world.reconcile(at(10))
    assert decision.create_pods == ()
    assert world.status.record(("worker", 0)).state == "Succeeded"
    world.set_phase(("worker", 1), "Succeeded", 0)
    world.reconcile(at(11))
    assert world.state() == "Succeeded"


def test_a_succeeded_replica_is_never_recreated_in_a_group_restart() -> None:
    world = started(make_job({"chief": 1, "worker": 2}, "OnFailure", success_policy="AllWorkers"))
    world.set_phase(("worker", 0), "Succeeded", 0)
    world.reconcile(at(5))
    world.set_phase(("worker", 1), "Failed", 137, None, at(6))
    decision = world.reconcile(at(6))
    assert set(decision.delete_pods) == {("chief", 0), ("worker", 1)}
    world.finish_deletions()
    decision = world.reconcile(at(7))
    assert sorted((t, i) for t, i, _ in decision.create_pods) == [("chief", 0), ("worker", 1)]


def test_active_deadline_fires_from_a_timer_without_any_event() -> None:
    world = started(make_job({"worker": 2}, run_policy={"activeDeadlineSeconds": 60}))
    decision = world.reconcile(at(30))
    assert decision.requeue_after == pytest.approx(30)
    decision = world.reconcile(at(60))
    assert world.state() == "Failed"
    assert world.condition("Failed").reason == "DeadlineExceeded"
    assert set(decision.delete_pods) == {("worker", 0), ("worker", 1)}


def test_ttl_deletes_the_finished_job_after_its_seconds() -> None:
    world = started(
        make_job({"worker": 1, "ps": 1, "chief": 1}, run_policy={"ttlSecondsAfterFinished": 100})
    )
    world.set_phase(("chief", 0), "Succeeded", 0)
    decision = world.reconcile(at(50))
    assert decision.requeue_after == pytest.approx(100)
    assert not decision.delete_job
    decision = world.reconcile(at(120))
    assert decision.requeue_after == pytest.approx(30)
    assert world.reconcile(at(150)).delete_job


def test_startup_deadline_fails_a_job_whose_replicas_never_run() -> None:
    world = World(make_job({"worker": 2}, run_policy={"startupDeadlineSeconds": 120}))
    world.reconcile(at(0))
    world.set_phase(("worker", 0), "Running")
    decision = world.reconcile(at(60))
    assert decision.requeue_after == pytest.approx(60)
    world.reconcile(at(121))
    assert world.state() == "Failed"
    assert world.condition("Failed").reason == "StartupDeadlineExceeded"
    assert "worker 1" in world.condition("Failed").message


def test_startup_deadline_restarts_its_clock_on_each_restart() -> None:
    world = started(make_job({"worker": 2}, "OnFailure", {"startupDeadlineSeconds": 100}))
    world.set_phase(("worker", 0), "Failed", 1, None, at(500))
    world.reconcile(at(500))
    world.finish_deletions()
    world.reconcile(at(550))
    assert world.state() == "Restarting"  # 550 > 100 after start, but only 50 after restart


def test_suspend_deletes_pods_and_services_and_resume_recreates_them() -> None:
    world = started(make_job({"chief": 1, "worker": 1}, run_policy={"suspend": False}))
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=True)
    )
    decision = world.reconcile(at(10))
    assert set(decision.delete_pods) == {("chief", 0), ("worker", 0)}
    assert set(decision.delete_services) == {("chief", 0), ("worker", 0)}
    assert world.state() == "Suspended"
    # The suspended pods exit 143 on their way out: not failures.
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=143
    )
    world.reconcile(at(11))
    assert world.state() == "Suspended"
    world.finish_deletions()
    assert world.reconcile(at(12)).create_pods == ()
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=False)
    )
    decision = world.reconcile(at(100))
    assert world.condition("Suspended").status is False
    assert world.status.start_time == at(100)  # resume resets startTime (what Kueue expects)
    assert sorted(decision.create_pods) == [("chief", 0, 1), ("worker", 0, 1)]
    assert sorted(decision.create_services) == [("chief", 0), ("worker", 0)]
    assert world.status.restart_count == 0  # suspension is not a failure
    world.run_all(at(101))
    assert world.state() == "Running"


def test_suspend_stops_deadline_clock_and_resume_restarts_it() -> None:
    world = started(make_job({"worker": 1}, run_policy={"activeDeadlineSeconds": 50}))
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=True)
    )
    assert world.reconcile(at(10)).requeue_after is None
    world.finish_deletions()
    world.job = dataclasses.replace(
        world.job, run_policy=dataclasses.replace(world.job.run_policy, suspend=False)
    )
    world.reconcile(at(1000))
    world.run_all(at(1001))
    assert world.state() == "Running"


def test_a_terminating_pod_is_not_a_failure_until_it_is_gone() -> None:
    world = started(make_job({"worker": 2}, "Never"))
    world.pods[("worker", 1)] = dataclasses.replace(world.pods[("worker", 1)], deleting=True)
    world.reconcile(at(5))
    assert world.state() == "Running"
    # Deleted by someone else (kubectl delete pod): recreated under any policy, and counted.
    world.finish_deletions()
    world.reconcile(at(6))
    assert world.state() == "Restarting"
    assert world.status.restart_count == 1
    assert "worker 1 was deleted" in world.condition("Restarting").message


def test_pods_of_a_newer_attempt_are_adopted_after_a_lost_status_write() -> None:
    job = make_job({"worker": 2})
    pods = {
        ("worker", 0): policy.ObservedReplica(phase="Running", attempt=2),
        ("worker", 1): policy.ObservedReplica(phase="Running", attempt=2),
    }
    decision = policy.reconcile(job, st.JobStatus(), pods, {("worker", 0), ("worker", 1)}, at(0))
    assert decision.create_pods == () and decision.delete_pods == ()
    assert decision.status.record(("worker", 1)).attempt == 2


def test_stale_pods_are_deleted_and_never_counted() -> None:
    job = make_job({"worker": 1}, "ExitCode")
    status = st.JobStatus(replicas={("worker", 0): st.ReplicaRecord(attempt=3)}, restart_count=3)
    pods = {("worker", 0): policy.ObservedReplica(phase="Failed", attempt=2, exit_code=1)}
    decision = policy.reconcile(job, status, pods, set(), at(0))
    assert decision.delete_pods == (("worker", 0),)
    assert decision.status.restart_count == 3
    assert st.state_of(decision.status) == "Created"


def test_status_round_trips_through_its_api_form() -> None:
    world = started(make_job({"chief": 1, "worker": 2}, "ExitCode"))
    world.set_phase(("worker", 1), "Failed", 137, "OOMKilled", at(5))
    world.reconcile(at(5))
    as_dict = st.to_dict(world.job, world.status)
    assert as_dict["replicaStatuses"]["worker"]["indexes"][1] == {
        "index": 1,
        "attempt": 1,
        "state": "",
        "exitCode": 137,
        "reason": "OOMKilled",
    }
    assert as_dict["state"] == "Restarting"
    assert as_dict["restartCount"] == 1
    assert st.from_dict(as_dict) == world.status


def test_invalid_spec_status_is_failed_with_reason_invalid_spec() -> None:
    status = policy.invalid_spec(st.JobStatus(), "spec.image: required", at(0), 3)
    assert st.state_of(status) == "Failed"
    failed = status.condition("Failed")
    assert failed is not None and failed.reason == "InvalidSpec"
    assert status.observed_generation == 3


# -- issue 21: a job that goes wrong says why ------------------------------------------------


def wait(world: World, key: Key, reason: str | None, message: str | None = None) -> None:
    """What the kubelet (or the scheduler) says of a Pending Pod that does not start."""
    world.pods[key] = dataclasses.replace(
        world.pods[key], phase="Pending", waiting_reason=reason, waiting_message=message
    )


def test_image_pull_backoff_shows_in_running_false_with_the_image_and_one_event() -> None:
    world = World(make_job({"worker": 2}))
    world.reconcile(at(0))
    world.set_phase(("worker", 0), "Running")
    wait(world, ("worker", 1), "ErrImagePull", 'failed to pull image "nope:1": not found')
    first = world.reconcile(at(5))
    running = world.condition(st.RUNNING)
    assert (running.status, running.reason) == (False, "ErrImagePull")
    assert running.message == 'worker 1: ErrImagePull: failed to pull image "nope:1": not found'
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "ErrImagePull")]
    assert first.events[0].message.startswith("worker 1: ErrImagePull")
    # The kubelet flips to ImagePullBackOff while it backs off: the same cause, no new Event,
    # but the condition quotes its current words.
    wait(world, ("worker", 1), "ImagePullBackOff", 'Back-off pulling image "nope:1"')
    second = world.reconcile(at(10))
    assert second.events == ()
    assert world.condition(st.RUNNING).reason == "ImagePullBackOff"
    assert world.condition(st.RUNNING).message == (
        'worker 1: ImagePullBackOff: Back-off pulling image "nope:1"'
    )
    assert world.reconcile(at(11)).events == ()  # nothing new: nothing posted again
    as_dict = st.to_dict(world.job, world.status)
    entry = as_dict["replicaStatuses"]["worker"]["indexes"][1]
    assert entry["waitingReason"] == "ImagePullBackOff"
    assert st.from_dict(as_dict).record(("worker", 1)) == world.status.record(("worker", 1))


def test_a_new_cause_gets_its_own_event_and_a_fixed_one_clears_the_reason() -> None:
    world = World(make_job({"worker": 1}))
    world.reconcile(at(0))
    wait(
        world,
        ("worker", 0),
        "Unschedulable",
        "0/3 nodes are available: insufficient nvidia.com/gpu",
    )
    decision = world.reconcile(at(1))
    assert [e.reason for e in decision.events] == ["Unschedulable"]
    assert "insufficient nvidia.com/gpu" in world.condition(st.RUNNING).message
    wait(world, ("worker", 0), "CreateContainerConfigError", 'secret "creds" not found')
    decision = world.reconcile(at(2))
    assert [e.reason for e in decision.events] == ["CreateContainerConfigError"]
    assert world.condition(st.RUNNING).reason == "CreateContainerConfigError"
    wait(world, ("worker", 0), None)  # the Secret now exists: the container is being created
    decision = world.reconcile(at(3))
    assert decision.events == ()
    assert (world.condition(st.RUNNING).status, world.condition(st.RUNNING).reason) == (
        False,
        "ReplicasStarting",
    )
    world.set_phase(("worker", 0), "Running")
    world.reconcile(at(4))
    assert world.condition(st.RUNNING).status and world.state() == "Running"


def test_every_waiting_replica_is_named_and_the_first_gives_the_reason() -> None:
    world = World(make_job({"chief": 1, "worker": 2}))
    world.reconcile(at(0))
    wait(world, ("worker", 0), "ImagePullBackOff", 'Back-off pulling image "a:1"')
    wait(world, ("chief", 0), "Unschedulable", "0/3 nodes are available")
    decision = world.reconcile(at(1))
    assert world.condition(st.RUNNING).reason == "Unschedulable"  # chief first, replica order
    assert world.condition(st.RUNNING).message == (
        "chief 0: Unschedulable: 0/3 nodes are available; "
        'worker 0: ImagePullBackOff: Back-off pulling image "a:1"'
    )
    assert sorted(e.reason for e in decision.events) == ["ImagePullBackOff", "Unschedulable"]


def test_startup_deadline_names_the_cause_in_its_message() -> None:
    world = World(make_job({"worker": 2}, run_policy={"startupDeadlineSeconds": 60}))
    world.reconcile(at(0))
    world.set_phase(("worker", 0), "Running")
    wait(world, ("worker", 1), "ImagePullBackOff", 'Back-off pulling image "nope:1"')
    world.reconcile(at(30))
    world.reconcile(at(61))
    failed = world.condition(st.FAILED)
    assert failed.reason == "StartupDeadlineExceeded"
    assert failed.message.endswith(
        'still waiting for: worker 1 (ImagePullBackOff: Back-off pulling image "nope:1")'
    )
    assert world.condition(st.RUNNING).reason == "StartupDeadlineExceeded"


def test_a_waiting_replica_after_a_restart_shows_its_cause_then_restarting_again() -> None:
    world = started(make_job({"worker": 2}, "OnFailure"))
    world.set_phase(("worker", 1), "Failed", 1, None, at(5))
    world.reconcile(at(5))
    world.finish_deletions()
    world.reconcile(at(6))  # recreated (the first restart waits for nothing)
    wait(world, ("worker", 1), "Unschedulable", "0/3 nodes are available")
    wait(world, ("worker", 0), None)
    world.reconcile(at(7))
    assert world.condition(st.RUNNING).reason == "Unschedulable"
    assert world.state() == "Restarting"
    wait(world, ("worker", 1), None)
    world.reconcile(at(8))
    assert world.condition(st.RUNNING).reason == "ReplicasRestarting"


def disrupt(world: World, key: Key, reason: str, message: str = "") -> None:
    """A Pod taken away: the DisruptionTarget condition, then deletion."""
    world.pods[key] = dataclasses.replace(
        world.pods[key], disruption_reason=reason, disruption_message=message, deleting=True
    )


def test_a_preempted_worker_restarts_uncounted_with_reason_preempted() -> None:
    world = started(make_job({"worker": 2}))  # restartPolicy Never: a failure would end it
    disrupt(world, ("worker", 1), "PreemptionByScheduler", "Preempted by pod abc on node n1")
    world.reconcile(at(10))  # still terminating: nothing judged yet, but remembered
    assert world.status.record(("worker", 1)).disruption_reason == "PreemptionByScheduler"
    world.finish_deletions()
    decision = world.reconcile(at(11))
    assert world.state() == "Restarting"
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert world.condition(st.RESTARTING).reason == "Preempted"
    assert world.condition(st.RUNNING).reason == "Preempted"
    assert [e.reason for e in decision.events] == ["Preempted"]
    assert "worker 1 was preempted (PreemptionByScheduler: Preempted by pod abc" in (
        decision.events[0].message
    )
    assert "not counted toward backoffLimit" in decision.events[0].message
    world.settle(at(12))
    assert world.state() == "Running"
    assert st.to_dict(world.job, world.status)["disruptionCount"] == 1


def test_a_disruption_after_backoff_limit_was_lowered_below_the_restarts_used_is_not_counted() -> (
    None
):
    """backoffLimit counts failures, never disruptions: with the limit edited below the
    restarts already used, a preemption still restarts uncounted (it crashed the reconcile)."""
    world = started(make_job({"worker": 2}))
    world.status = dataclasses.replace(world.status, restart_count=3)
    run_policy = dataclasses.replace(world.job.run_policy, backoff_limit=1)
    world.job = dataclasses.replace(world.job, run_policy=run_policy)
    disrupt(world, ("worker", 1), "PreemptionByScheduler", "Preempted by pod abc on node n1")
    world.reconcile(at(10))
    world.finish_deletions()
    world.reconcile(at(11))
    assert world.state() == "Restarting"
    assert (world.status.restart_count, world.status.disruption_count) == (3, 1)
    assert world.condition(st.RESTARTING).reason == "Preempted"


def test_peers_that_fail_because_a_worker_was_evicted_are_not_counted_either() -> None:
    """All-reduce: worker 0 exits 1 within seconds of losing worker 1, whose Pod is still
    terminating under DisruptionTarget; the eviction is the cause, not worker 0's exit."""
    world = started(make_job({"worker": 2}))
    disrupt(world, ("worker", 1), "EvictionByEvictionAPI", "Eviction API: evicting")
    world.reconcile(at(10))
    world.set_phase(("worker", 0), "Failed", 1, None, at(11))
    decision = world.reconcile(at(11))
    assert world.state() == "Restarting"
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert [e.reason for e in decision.events] == ["Evicted"]
    assert set(decision.delete_pods) == {("worker", 0)}  # worker 1 is already going


def test_a_node_pressure_eviction_of_a_failed_pod_is_a_disruption() -> None:
    world = started(make_job({"worker": 1}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)],
        phase="Failed",
        reason="Evicted",
        disruption_reason="TerminationByKubelet",
        disruption_message="The node was low on resource: memory.",
    )
    decision = world.reconcile(at(10))
    assert world.state() == "Restarting" and world.status.restart_count == 0
    assert [e.reason for e in decision.events] == ["Evicted"]


def test_the_condition_is_remembered_before_the_pod_goes_away() -> None:
    """The Eviction API sets DisruptionTarget, then deletes; a Pod with no node (or a short
    grace period) can be gone before any reconcile sees it terminating."""
    world = started(make_job({"worker": 1}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], disruption_reason="EvictionByEvictionAPI"
    )
    world.reconcile(at(10))
    assert world.state() == "Running"  # a condition alone changes nothing yet
    assert world.status.record(("worker", 0)).disruption_reason == "EvictionByEvictionAPI"
    del world.pods[("worker", 0)]
    decision = world.reconcile(at(11))
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert [e.reason for e in decision.events] == ["Evicted"]
    world.settle(at(12))
    assert world.status.record(("worker", 0)).disruption_reason is None  # the new attempt's


def test_a_condition_removed_from_a_running_pod_is_forgotten() -> None:
    world = started(make_job({"worker": 1}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], disruption_reason="EvictionByEvictionAPI"
    )
    world.reconcile(at(10))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], disruption_reason=None
    )
    world.reconcile(at(200))  # never deleted; the stale condition went away
    assert world.status.record(("worker", 0)).disruption_reason is None
    del world.pods[("worker", 0)]  # now a user's kubectl delete pod: counted
    world.reconcile(at(201))
    assert (world.status.restart_count, world.status.disruption_count) == (1, 0)


def test_a_plain_pod_delete_still_counts_toward_backoff_limit() -> None:
    world = started(make_job({"worker": 1}))
    world.pods[("worker", 0)] = dataclasses.replace(world.pods[("worker", 0)], deleting=True)
    world.reconcile(at(10))
    world.finish_deletions()
    decision = world.reconcile(at(11))
    assert (world.status.restart_count, world.status.disruption_count) == (1, 0)
    assert [e.reason for e in decision.events] == ["Restarting"]


def test_a_disruption_loop_ends_at_disruption_limit() -> None:
    world = started(make_job({"worker": 1}, run_policy={"disruptionLimit": 2, "backoffLimit": 0}))
    for n in range(3):
        disrupt(world, ("worker", 0), "PreemptionByScheduler")
        world.reconcile(at(10 + 10 * n))
        world.finish_deletions()
        world.reconcile(at(11 + 10 * n))
        world.settle(at(15 + 10 * n))
    assert world.state() == "Failed"
    failed = world.condition(st.FAILED)
    assert failed.reason == "DisruptionLimitExceeded"
    assert "disruptionLimit=2" in failed.message and "worker 0 was preempted" in failed.message
    assert (world.status.restart_count, world.status.disruption_count) == (0, 2)


def test_failed_condition_quotes_the_replicas_last_words() -> None:
    world = started(make_job({"chief": 1, "worker": 1}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)],
        phase="Failed",
        exit_code=1,
        finished_at=at(5),
        cause="ValueError: learning rate must be > 0",
    )
    world.reconcile(at(5))
    failed = world.condition(st.FAILED)
    assert failed.message == (
        "worker 0 exited with code 1; restartPolicy Never does not retry it; "
        "cause: worker-0: ValueError: learning rate must be > 0"
    )
    # Recorded in status, so it survives cleanPodPolicy All and a restart of the operator.
    restored = st.from_dict(st.to_dict(world.job, world.status))
    assert restored.record(("worker", 0)).message == "ValueError: learning rate must be > 0"
    assert restored.condition(st.FAILED) is not None
    assert "ValueError" in restored.condition(st.FAILED).message  # type: ignore[union-attr]


def test_backoff_exceeded_quotes_the_cause_too() -> None:
    world = started(make_job({"worker": 1}, "OnFailure", {"backoffLimit": 0}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=1, cause="KeyError: 'images'"
    )
    world.reconcile(at(5))
    assert world.condition(st.FAILED).reason == "BackoffLimitExceeded"
    assert world.condition(st.FAILED).message.endswith("; cause: worker-0: KeyError: 'images'")


def stalling_job(action: str | None = None, backoff: int = 3) -> World:
    run_policy: dict[str, Any] = {"progressDeadlineSeconds": 60, "backoffLimit": backoff}
    if action:
        run_policy["progressDeadlineAction"] = action
    return started(make_job({"chief": 1, "worker": 2}, run_policy=run_policy))


def reconcile_with_progress(
    world: World, now: datetime.datetime, progress_at: datetime.datetime | None
) -> policy.Decision:
    decision = policy.reconcile(
        world.job, world.status, world.pods, world.services, now, progress_at
    )
    world.status = decision.status
    for key in decision.delete_pods:
        world.pods[key] = dataclasses.replace(world.pods[key], deleting=True)
    return decision


def test_a_job_whose_chief_reports_new_steps_is_not_stalled() -> None:
    world = stalling_job()
    decision = reconcile_with_progress(world, at(50), at(40))  # a step 10 s ago
    assert world.state() == "Running"
    assert decision.requeue_after == pytest.approx(50)  # looked at again when it would stall
    reconcile_with_progress(world, at(99), at(40))
    assert world.state() == "Running"


def test_no_progress_known_is_never_judged_a_hang() -> None:
    world = stalling_job()
    reconcile_with_progress(world, at(10_000), None)
    assert world.state() == "Running"


def test_a_stalled_job_restarts_its_chiefs_group_counted() -> None:
    world = stalling_job()
    decision = reconcile_with_progress(world, at(101), at(40))  # 61 s without a new step
    assert world.state() == "Restarting"
    assert world.status.restart_count == 1
    assert world.condition(st.RESTARTING).reason == "Stalled"
    assert world.condition(st.RUNNING).reason == "Stalled"
    assert set(decision.delete_pods) == {("chief", 0), ("worker", 0), ("worker", 1)}
    assert [e.reason for e in decision.events] == ["Restarting"]
    assert "no new step from chief 0 for 60 s" in decision.events[0].message
    # Running again: the deadline starts over from then, whatever the old step's time.
    world.settle(at(102))
    assert world.state() == "Running"
    reconcile_with_progress(world, at(150), at(40))
    assert world.state() == "Running"


def test_a_stalled_job_fails_when_its_action_is_fail_or_backoff_is_used() -> None:
    world = stalling_job("Fail")
    reconcile_with_progress(world, at(101), at(40))
    failed = world.condition(st.FAILED)
    assert (failed.reason, world.condition(st.RUNNING).reason) == ("Stalled", "Stalled")
    assert failed.message.startswith("Stalled: no new step from chief 0 for 60 s")
    world = stalling_job(backoff=0)
    reconcile_with_progress(world, at(101), at(40))
    assert world.condition(st.FAILED).reason == "BackoffLimitExceeded"
    assert "Stalled" in world.condition(st.FAILED).message


def test_a_big_job_that_fits_no_node_is_one_event_and_a_short_message() -> None:
    world = World(make_job({"worker": 50}))
    world.reconcile(at(0))
    for index in range(50):
        wait(world, ("worker", index), "Unschedulable", "0/3 nodes are available")
    decision = world.reconcile(at(1))
    assert [e.reason for e in decision.events] == ["Unschedulable"]
    assert decision.events[0].message.endswith("; and 47 more replicas")
    message = world.condition(st.RUNNING).message
    assert message.startswith("worker 0: Unschedulable: 0/3 nodes are available; worker 1")
    assert message.endswith("; and 47 more replicas")


# ----- Pods the API server refuses -----


REFUSAL = (
    'pods "job-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
    "runAsNonRoot != true (pod or container must set securityContext.runAsNonRoot=true)"
)


def test_a_refused_pod_is_a_waiting_cause_with_the_api_servers_words_and_is_retried() -> None:
    job = make_job({"worker": 2})
    refused = {("worker", 0): REFUSAL, ("worker", 1): REFUSAL}
    first = policy.reconcile(job, st.JobStatus(), {}, set(), at(0), refused=refused)
    # Still created again (the refusal may clear: a quota freed, a label fixed).
    assert {(t, i) for t, i, _ in first.create_pods} == {("worker", 0), ("worker", 1)}
    running = first.status.condition(st.RUNNING)
    assert running is not None and not running.status
    assert running.reason == "FailedCreate"
    assert "violates PodSecurity" in running.message and "worker 1" in running.message
    warnings = [e for e in first.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["FailedCreate"]  # one Event for both replicas
    again = policy.reconcile(job, first.status, {}, set(), at(5), refused=refused)
    assert not [e for e in again.events if e.reason == "FailedCreate"]
    assert again.status.restart_count == 0  # a refusal is never a failure
    # The refusal clears: the Pods exist now.
    pods = {key: policy.ObservedReplica(phase="Pending", attempt=0) for key in refused}
    cleared = policy.reconcile(job, again.status, pods, set(), at(10), refused={})
    running = cleared.status.condition(st.RUNNING)
    assert running is not None and running.reason != "FailedCreate"


def test_the_startup_deadline_quotes_the_refusal() -> None:
    job = make_job({"worker": 1}, run_policy={"startupDeadlineSeconds": 60})
    refused = {("worker", 0): REFUSAL}
    status = policy.reconcile(job, st.JobStatus(), {}, set(), at(0), refused=refused).status
    late = policy.reconcile(job, status, {}, set(), at(61), refused=refused)
    failed = late.status.condition(st.FAILED)
    assert failed is not None and failed.status
    assert "FailedCreate" in failed.message and "violates PodSecurity" in failed.message


NAN_CAUSE = "NonFiniteLossError: loss became nan at step 57 (epoch 2)"


@pytest.mark.parametrize("restart_policy", ["Never", "ExitCode"])
def test_a_nonfinite_loss_fails_the_job_with_its_own_reason(restart_policy: str) -> None:
    world = started(make_job({"chief": 1, "worker": 2}, restart_policy))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=6, finished_at=at(5), cause=NAN_CAUSE
    )
    decision = world.reconcile(at(5))
    failed = world.condition(st.FAILED)
    assert failed.reason == "NonFiniteLoss"
    assert failed.message == (
        f"worker 0 exited with code 6; restartPolicy {restart_policy} does not retry it; "
        f"cause: worker-0: {NAN_CAUSE}"
    )
    assert world.condition(st.RUNNING).reason == "NonFiniteLoss"
    assert [e.reason for e in decision.events if e.type == "Warning"] == ["NonFiniteLoss"]
    assert world.status.restart_count == 0 and decision.create_pods == ()


def test_the_peers_exit_after_a_nonfinite_loss_do_not_hide_it() -> None:
    """worker 1 fails because worker 0 left the collective: the earliest failure names it."""
    world = started(make_job({"worker": 2}, "ExitCode"))
    world.set_phase(("worker", 1), "Failed", exit_code=190, finished_at=at(7))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=6, finished_at=at(5), cause=NAN_CAUSE
    )
    world.reconcile(at(8))
    assert world.condition(st.FAILED).reason == "NonFiniteLoss"


def test_other_permanent_codes_stay_replica_failed() -> None:
    world = started(make_job({"worker": 1}, "ExitCode"))
    world.set_phase(("worker", 0), "Failed", exit_code=5, finished_at=at(5))
    world.reconcile(at(5))
    assert world.condition(st.FAILED).reason == "ReplicaFailed"


def test_a_retrying_policy_restarts_a_nonfinite_loss_until_the_backoff_limit() -> None:
    """OnFailure retries whatever the code (the user's choice): the limit ends it, as today."""
    world = started(make_job({"worker": 1}, "OnFailure", {"backoffLimit": 0}))
    world.pods[("worker", 0)] = dataclasses.replace(
        world.pods[("worker", 0)], phase="Failed", exit_code=6, cause=NAN_CAUSE
    )
    world.reconcile(at(5))
    assert world.condition(st.FAILED).reason == "BackoffLimitExceeded"
    assert world.condition(st.FAILED).message.endswith(f"; cause: worker-0: {NAN_CAUSE}")


UNREACHABLE = ("NodeUnreachable", "node n3 unreachable since 2026-01-01T00:00:10Z")


def test_a_replica_on_a_lost_node_is_shown_waiting_on_its_node_and_left_alone() -> None:
    world = started(make_job({"worker": 2}))
    world.lost = {("worker", 1): UNREACHABLE}
    decision = world.reconcile(at(20))
    running = world.condition(st.RUNNING)
    assert not running.status and running.reason == "NodeUnreachable"
    assert running.message == "worker 1: node n3 unreachable since 2026-01-01T00:00:10Z"
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "NodeUnreachable")]
    assert decision.delete_pods == () and decision.create_pods == ()  # Kubernetes decides
    record = world.status.record(("worker", 1))
    assert (record.state, record.waiting_reason) == ("Running", "NodeUnreachable")
    shown = st.to_dict(world.job, world.status)
    assert shown["replicaStatuses"]["worker"]["indexes"][1]["waitingMessage"] == UNREACHABLE[1]
    assert shown["ready"] == "1/2"  # kubectl get tj's READY: the lost replica is not
    again = world.reconcile(at(30))
    assert again.events == ()  # one Event per cause, not per reconcile
    # The node comes back: Running again, the cause cleared.
    world.lost = {}
    world.reconcile(at(40))
    assert world.condition(st.RUNNING).status
    assert world.status.record(("worker", 1)).waiting_reason is None
    assert world.status.restart_count == 0 and world.status.disruption_count == 0


def test_a_not_ready_node_changes_the_cause_and_says_so_again() -> None:
    world = started(make_job({"worker": 1}))
    world.lost = {("worker", 0): ("NodeNotReady", "node n3 not ready since X")}
    first = world.reconcile(at(10))
    assert [e.reason for e in first.events] == ["NodeNotReady"]
    world.lost = {("worker", 0): UNREACHABLE}
    second = world.reconcile(at(20))
    assert [e.reason for e in second.events] == ["NodeUnreachable"]
    assert world.condition(st.RUNNING).reason == "NodeUnreachable"


def test_a_pod_taint_evicted_from_a_lost_node_restarts_uncounted() -> None:
    world = started(make_job({"worker": 2}))
    world.lost = {("worker", 1): UNREACHABLE}
    world.reconcile(at(20))
    disrupt(world, ("worker", 1), "DeletionByTaintManager", "Taint manager: deleting due to")
    world.reconcile(at(320))
    world.finish_deletions()
    world.lost = {}
    decision = world.reconcile(at(321))
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert [e.reason for e in decision.events] == ["Evicted"]
    assert "DeletionByTaintManager" in decision.events[0].message
    # All-reduce: worker 0 restarts with it, from the checkpoint; worker 1's Pod is gone.
    assert decision.delete_pods == (("worker", 0),)
    assert [(t, i) for t, i, _ in decision.create_pods] == [("worker", 1)]
    world.settle(at(322))
    assert world.state() == "Running"


def test_a_pod_gone_with_its_lost_node_unseen_by_any_condition_is_a_disruption() -> None:
    """The Node deleted, the pod GC removed the Pod before we saw its DisruptionTarget (or
    someone force-deleted it): the replica was on a lost node, so it is not a failure."""
    world = started(make_job({"worker": 2}))  # restartPolicy Never: a failure would end it
    world.lost = {("worker", 1): UNREACHABLE}
    world.reconcile(at(20))
    del world.pods[("worker", 1)]
    world.lost = {}
    decision = world.reconcile(at(30))
    assert world.state() == "Restarting"
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert world.condition(st.RESTARTING).reason == "Evicted"
    assert "worker 1 was evicted (NodeUnreachable: node n3 unreachable since" in (
        decision.events[0].message
    )
    # Never two live Pods for one replica: worker 1's new Pod comes only now it is gone.
    assert ("worker", 1, 1) in decision.create_pods
    world.settle(at(31))
    assert world.state() == "Running"
    assert world.status.record(("worker", 1)).waiting_reason is None


def test_a_restarted_replica_whose_old_pod_hangs_on_a_lost_node_names_the_node() -> None:
    """A worker's node goes away; its peer's collective breaks within seconds, before the node
    lifecycle controller calls the node lost (40 s): the group restarts, counted. The lost
    worker's old Pod then stays Terminating, as no kubelet confirms its end, and its replica
    cannot be created again until Kubernetes removes that Pod: the job says which node and
    what removes it (seen on a 3-node kind cluster, tests/e2e/test_multinode.py)."""
    world = started(make_job({"worker": 2}, restart_policy="ExitCode"))
    world.set_phase(("worker", 1), "Failed", exit_code=190, reason="Error", finished_at=at(10))
    world.reconcile(at(10))  # the group restarts: both old Pods deleted
    assert world.state() == "Restarting" and world.status.restart_count == 1
    del world.pods[("worker", 1)]  # its kubelet confirms; worker 0's never will
    world.reconcile(at(11))
    world.run_all(at(12))
    world.lost = {("worker", 0): UNREACHABLE}
    decision = world.reconcile(at(60))
    running = world.condition(st.RUNNING)
    assert not running.status and running.reason == "NodeUnreachable", running
    assert running.message.startswith("worker 0: node n3 unreachable since"), running.message
    assert "node.kubernetes.io/out-of-service" in running.message, running.message
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "NodeUnreachable")]
    assert world.reconcile(at(70)).events == ()  # said once
    # The Node is deleted (as a cloud does): the pod GC removes the Pod, worker 0 comes back.
    del world.pods[("worker", 0)]
    world.lost = {}
    decision = world.reconcile(at(90))
    assert [(t, i) for t, i, _ in decision.create_pods] == [("worker", 0)]
    world.settle(at(91))
    assert world.state() == "Running"
    assert world.status.record(("worker", 0)).waiting_reason is None


def test_a_pod_deleted_after_its_node_came_back_counts_as_before() -> None:
    world = started(make_job({"worker": 1}))
    world.lost = {("worker", 0): UNREACHABLE}
    world.reconcile(at(20))
    world.lost = {}
    world.reconcile(at(30))
    del world.pods[("worker", 0)]
    world.reconcile(at(40))
    # Its node was Ready when last seen: a plain delete, counted toward backoffLimit.
    assert (world.status.restart_count, world.status.disruption_count) == (1, 0)


def test_many_replicas_on_one_lost_node_are_one_event() -> None:
    world = started(make_job({"worker": 5}))
    world.lost = {("worker", i): UNREACHABLE for i in range(5)}
    decision = world.reconcile(at(20))
    assert [e.reason for e in decision.events] == ["NodeUnreachable"]
    assert decision.events[0].message.endswith("; and 2 more replicas")


def test_peers_that_fail_because_a_node_was_lost_are_a_disruption_and_its_pod_is_left() -> None:
    """All-reduce: worker 0 exits 1 once worker 1's node is unreachable. The lost node is the
    cause (uncounted); worker 1's Pod is not deleted by us, and its new attempt comes only
    once Kubernetes has removed the old one."""
    world = started(make_job({"worker": 2}))  # restartPolicy Never: a failure would end it
    world.lost = {("worker", 1): UNREACHABLE}
    world.reconcile(at(20))
    world.set_phase(("worker", 0), "Failed", 1, None, at(25))
    decision = world.reconcile(at(25))
    assert world.state() == "Restarting"
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    assert [e.reason for e in decision.events] == ["Evicted"]
    assert "worker 1 was evicted (NodeUnreachable: node n3" in decision.events[0].message
    assert decision.delete_pods == (("worker", 0),)  # not worker 1: Kubernetes decides
    world.finish_deletions()
    again = world.reconcile(at(26))
    assert [(t, i) for t, i, _ in again.create_pods] == [("worker", 0)]  # never two Pods
    assert again.delete_pods == ()
    # The node is deleted, the pod GC removes the stale Pod: worker 1 comes back.
    del world.pods[("worker", 1)]
    world.lost = {}
    third = world.reconcile(at(60))
    assert [(t, i, a) for t, i, a in third.create_pods] == [("worker", 1, 1)]
    assert (world.status.restart_count, world.status.disruption_count) == (0, 1)
    world.run_all(at(61))
    assert world.state() == "Running"


def unschedulable(world: World, key: Key) -> None:
    world.pods[key] = dataclasses.replace(
        world.pods[key],
        phase="Pending",
        waiting_reason=policy.REASON_UNSCHEDULABLE,
        waiting_message="0/10 nodes are available: 10 Insufficient cpu.",
    )


def test_the_startup_deadline_waits_while_no_replica_has_a_node() -> None:
    """A job none of whose Pods fits a node holds nothing and no peer waits for it (a gang
    waiting for room, a busy cluster): it waits, saying Unschedulable, however long, and the
    startup clock starts once a replica is placed."""
    job = make_job({"chief": 1, "worker": 1}, run_policy={"startupDeadlineSeconds": 60})
    world = World(job)
    world.reconcile(at(0))
    for key in list(world.pods):
        unschedulable(world, key)
    world.reconcile(at(10))
    assert world.condition(st.RUNNING).reason == policy.REASON_UNSCHEDULABLE
    waiting = world.reconcile(at(3600))
    assert world.state() not in ("Failed", "Succeeded")
    assert world.status.attempt_start_time == at(0)  # not moved: no status write per wait
    assert waiting.requeue_after is None  # and no timer while it waits
    # Placed at last: one replica runs, the other still waits; the clock runs from here.
    world.set_phase(("chief", 0), "Running")
    world.reconcile(at(3610))
    assert world.status.attempt_start_time == at(3610)
    world.reconcile(at(3669))
    assert world.state() not in ("Failed", "Succeeded")
    world.reconcile(at(3671))
    assert world.state() == "Failed"
    assert world.condition(st.FAILED).reason == policy.REASON_STARTUP


def test_a_held_job_creates_no_pod_says_why_and_its_startup_clock_waits() -> None:
    job = make_job({"chief": 1, "worker": 3}, run_policy={"startupDeadlineSeconds": 60})
    world = World(job, held=(policy.REASON_GANG_PENDING, "Waiting for Volcano to enqueue"))
    decision = world.reconcile(at(0))
    assert decision.create_pods == ()
    assert len(decision.create_services) == 4  # Services hold nothing
    assert world.condition(st.RUNNING).reason == policy.REASON_GANG_PENDING
    assert [e.reason for e in decision.events] == ["Created", policy.REASON_GANG_PENDING]
    again = world.reconcile(at(600))
    assert world.state() == "Created"
    assert world.status.attempt_start_time == at(0)  # not moved while held: no writes
    assert policy.REASON_GANG_PENDING not in [e.reason for e in again.events]  # told once
    world.held = None
    released = world.reconcile(at(601))
    assert len(released.create_pods) == 4
    assert world.condition(st.RUNNING).reason == policy.REASON_STARTING
    assert world.status.attempt_start_time == at(601)
    world.reconcile(at(650))
    assert world.state() != "Failed"  # the clock started at 601, not at 0
