"""One replica's end and its fate (policy_failure.failure_fate), as a table: restartPolicy x how
the replica ended. The engine's behaviour around it is specified in test_policy.py."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from tests.unit.test_policy import World, at, make_job, started
from trainjob.core import policy_failure, policy_terms
from trainjob.core import status as st
from trainjob.core.policy_failure import Fate
from trainjob.core.policy_terms import Failure

WORKER_1 = ("worker", 1)
EXITED_1 = Failure(WORKER_1, 1, "Error", at(10))
KILLED = Failure(WORKER_1, 137, "OOMKilled", at(10))
NO_CODE = Failure(WORKER_1, None, None, at(10))
DELETED = Failure.deleted(WORKER_1, at(10), None, None)
PREEMPTED = Failure(WORKER_1, 137, None, at(10), "PreemptionByScheduler", "m")
ON_LOST_NODE = Failure.deleted(WORKER_1, at(10), policy_terms.REASON_NODE_UNREACHABLE, "n3")
EXITED_0 = Failure(WORKER_1, 0, "Completed", at(10), succeeded=True)
CHIEF_EXITED_0 = Failure(("chief", 0), 0, "Completed", at(10), succeeded=True)


@pytest.mark.parametrize(
    ("restart_policy", "failure", "fate"),
    [
        ("Never", EXITED_1, Fate.FAIL_JOB),
        ("Never", KILLED, Fate.FAIL_JOB),
        ("ExitCode", EXITED_1, Fate.FAIL_JOB),
        ("ExitCode", KILLED, Fate.RESTART),
        ("ExitCode", NO_CODE, Fate.RESTART),
        ("OnFailure", EXITED_1, Fate.RESTART),
        ("Always", EXITED_1, Fate.RESTART),
        # A Pod deleted under us is recreated under any policy, and counted.
        ("Never", DELETED, Fate.RESTART),
        # A disruption is never the replica's fault: restarted under any policy, uncounted.
        ("Never", PREEMPTED, Fate.DISRUPTED),
        ("Never", ON_LOST_NODE, Fate.DISRUPTED),
        # Exit 0 is done, except under Always for a replica whose success decides nothing.
        ("Never", EXITED_0, Fate.COMPLETED),
        ("Always", EXITED_0, Fate.RESTART),
        ("Always", CHIEF_EXITED_0, Fate.COMPLETED),
    ],
)
def test_a_replica_end_has_one_fate(restart_policy: str, failure: Failure, fate: Fate) -> None:
    job = make_job({"chief": 1, "worker": 2}, restart_policy)
    assert policy_failure.failure_fate(job, failure) is fate


STORE_REFUSED = "CheckpointStorageError: cannot write s3://ckpt/job: access denied (AccessDenied)"
STORE_UNREACHABLE = (
    "StorageUnreachableError: cannot list s3://ckpt/job: the endpoint http://s3.local:8333 is "
    "unreachable (EndpointConnectionError)"
)


def _ended(
    world: World, key: tuple[str, int], code: int, when: datetime.datetime, cause: str
) -> None:
    """The replica's Pod failed with `code`, its termination message saying `cause`."""
    world.pods[key] = dataclasses.replace(
        world.pods[key], phase="Failed", exit_code=code, finished_at=when, cause=cause
    )


@pytest.mark.parametrize(
    ("code", "reason", "advice"),
    [
        (6, "NonFiniteLoss", None),
        (7, "CheckpointStorageRefused", "spec.checkpoint.credentialsSecret"),
        (192, "CheckpointStorageUnreachable", "AWS_ENDPOINT_URL_S3"),
        (1, "ReplicaFailed", None),
        (190, "ReplicaFailed", None),
    ],
)
def test_the_runtime_verdicts_name_the_failure_and_what_to_check(
    code: int, reason: str, advice: str | None
) -> None:
    failure = Failure(WORKER_1, code, "Error", at(10))
    assert policy_failure.failed_reason(failure) == reason
    described = policy_failure.describe(failure)
    assert described.startswith(f"worker 1 exited with code {code}, Error")
    if advice is None:
        assert described == f"worker 1 exited with code {code}, Error"
    else:
        assert advice in described and "checkpoint store" in described


def test_a_disrupted_replica_is_never_blamed_on_the_store() -> None:
    disrupted = Failure(WORKER_1, 192, None, at(10), "PreemptionByScheduler", "m")
    assert policy_failure.failed_reason(disrupted) == "ReplicaFailed"
    assert "checkpoint store" not in policy_failure.describe(disrupted)


def test_a_store_that_refuses_fails_the_job_with_its_reason_cause_and_event() -> None:
    world = started(make_job({"worker": 2}, "ExitCode"))
    world.set_phase(("worker", 1), "Failed", exit_code=190, finished_at=at(7))
    _ended(world, ("worker", 0), 7, at(5), STORE_REFUSED)
    decision = world.reconcile(at(8))
    failed = world.condition(st.FAILED)
    assert failed.reason == "CheckpointStorageRefused"
    assert "bucket of spec.checkpoint.path exists" in failed.message
    assert failed.message.endswith(f"; cause: worker-0: {STORE_REFUSED}")
    (event,) = [e for e in decision.events if e.type == "Warning"]
    assert event.reason == "CheckpointStorageRefused" and event.message == failed.message


def test_an_unreachable_store_restarts_under_exit_code_and_the_event_says_so() -> None:
    world = started(make_job({"worker": 1}, "ExitCode", {"backoffLimit": 1}))
    _ended(world, ("worker", 0), 192, at(5), STORE_UNREACHABLE)
    decision = world.reconcile(at(5))
    (event,) = [e for e in decision.events if e.type == "Warning"]
    assert event.reason == "Restarting"
    assert "could not be reached" in event.message and STORE_UNREACHABLE in event.message
    assert "could not be reached" in world.condition(st.RESTARTING).message
    assert world.status.restart_count == 1


def test_an_unreachable_store_fails_a_never_job_with_its_reason() -> None:
    world = started(make_job({"worker": 1}, "Never"))
    _ended(world, ("worker", 0), 192, at(5), STORE_UNREACHABLE)
    world.reconcile(at(5))
    assert world.condition(st.FAILED).reason == "CheckpointStorageUnreachable"
