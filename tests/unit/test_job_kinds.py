"""A job's kind is a value the engine speaks in and decides by: the words of a TFJob, the
reasons of training-operator's vocabulary, "no limit" for an unset backoffLimit, and which of
two same-named jobs of two kinds keeps the name."""

from __future__ import annotations

import dataclasses

from tests.support import manifests
from trainjob.core import model, policy_backoff, spec, tfjob, tfjob_status
from trainjob_operator import children

TFJOB_REASONS = {
    "TFJobCreated",
    "TFJobRunning",
    "TFJobRestarting",
    "TFJobSucceeded",
    "TFJobFailed",
    "TFJobSuspended",
    "TFJobResumed",
    "FailedCreatePod",
}


def a_job(**run_policy: object) -> spec.TrainJob:
    replica = manifests.replica(1, {"spec": {"containers": [{"name": "tensorflow"}]}}, "Never")
    raw = manifests.trainjob("words", {"worker": replica}, dict(run_policy) or None)
    raw["spec"]["image"] = "example.com/train:1"
    return spec.parse(raw)


def test_every_transition_of_the_engine_has_a_tfjob_reason_and_no_trainjob_reason_leaks() -> None:
    transitions = [
        "Created",
        "Running",
        "Restarting",
        "Preempted",
        "Evicted",
        "Suspended",
        "Resumed",
        "TrainJobSucceeded",
        "ReplicaFailed",
        "BackoffLimitExceeded",
        "DeadlineExceeded",
        "StartupDeadlineExceeded",
        "Stalled",
        "NonFiniteLoss",
        "InvalidSpec",
        "NameInUse",
        "FailedCreate",
    ]
    told = {reason: tfjob_status.event_reason(reason) for reason in transitions}
    assert set(told.values()) <= TFJOB_REASONS, told
    assert told["Restarting"] == told["Preempted"] == "TFJobRestarting"
    assert told["BackoffLimitExceeded"] == told["NameInUse"] == "TFJobFailed"
    # What training-operator never says (a replica waiting on the scheduler) keeps its words.
    assert tfjob_status.event_reason("Unschedulable") == "Unschedulable"


def test_an_unset_backoff_limit_is_said_as_no_limit_and_a_set_one_as_its_number() -> None:
    words = policy_backoff.restart_words(a_job(backoffLimit=3), 1)
    assert words == "restart 1 of 3 allowed by backoffLimit"
    limit = tfjob.engine_backoff_limit(None)  # a TFJob's unset backoffLimit
    assert isinstance(limit, int)
    unset = dataclasses.replace(
        a_job(), run_policy=dataclasses.replace(a_job().run_policy, backoff_limit=limit)
    )
    words = policy_backoff.restart_words(unset, 2)
    assert "no limit" in words
    assert str(model.UNLIMITED_BACKOFF) not in words


def test_the_first_created_of_two_same_named_jobs_keeps_the_name() -> None:
    trainjob = children.Identity("2026-11-29T00:00:00Z", False, "TrainJob", "a")
    later = children.Identity("2026-11-29T00:00:05Z", True, "TFJob", "b")
    assert children.name_holder(later, [trainjob, later]) == trainjob
    assert children.name_holder(trainjob, [trainjob, later]) is None
    assert children.name_holder(later, [later]) is None


def test_within_one_second_the_job_already_started_keeps_the_name_then_the_kind_decides() -> None:
    started = children.Identity("2026-11-29T00:00:00Z", False, "TrainJob", "a")
    pending = children.Identity("2026-11-29T00:00:00Z", True, "TFJob", "b")
    assert children.name_holder(pending, [started, pending]) == started
    assert children.name_holder(started, [started, pending]) is None
    both = children.Identity("2026-11-29T00:00:00Z", True, "TrainJob", "c")
    assert children.name_holder(both, [both, pending]) == pending


def test_an_identity_is_read_from_the_watched_job() -> None:
    raw = {
        "metadata": {"uid": "u", "creationTimestamp": "2026-11-29T00:00:00Z"},
        "status": {"startTime": "2026-11-29T00:00:01Z"},
    }
    assert children.Identity.of("TFJob", raw) == children.Identity(
        "2026-11-29T00:00:00Z", False, "TFJob", "u"
    )
    assert children.Identity.of("TFJob", {"metadata": {"uid": "u"}}).pending


def test_a_child_is_read_by_our_labels_else_by_training_operators() -> None:
    ours = {"trainjob.dev/replica-type": "worker", "trainjob.dev/replica-index": "1"}
    theirs = {tfjob.LABEL_REPLICA_TYPE: "master", tfjob.LABEL_REPLICA_INDEX: "0"}
    assert tfjob.replica_key(ours) == ("worker", 1)
    assert tfjob.replica_key(theirs) == ("chief", 0)
    assert tfjob.replica_key({**theirs, **ours}) == ("worker", 1)
    # Ours, half there, is not a replica: training-operator's labels do not fill it in.
    assert tfjob.replica_key({**theirs, "trainjob.dev/replica-type": "worker"}) is None
    assert tfjob.replica_key({tfjob.LABEL_REPLICA_TYPE: "launcher"}) is None
