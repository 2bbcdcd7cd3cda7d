"""A job that waits suspended (created suspended, or queued by Kueue), as the cluster commands
show it: `describe`, the live table of `attach`, what `attach` says while it waits and when it
detaches. Its status is the policy engine's first decision (and, for a Kueue-managed job, the
operator's Kueue wording of it), stored as the operator stores it (issue 32, item 5)."""

from __future__ import annotations

import datetime
import io
from typing import Any

import pytest

from trainjob import cliutil
from trainjob.cluster import describe, objects, show
from trainjob.cluster.cli import submit
from trainjob.console import view
from trainjob.core import policy, spec
from trainjob.core import status as st
from trainjob_operator import kueue_patches as kp

pytestmark = pytest.mark.unit

T0 = datetime.datetime(2026, 11, 24, 12, 0, 0, tzinfo=datetime.timezone.utc)
NOW = T0 + datetime.timedelta(seconds=30)
KUEUE_WORDS = (
    "couldn't assign flavors to pod set worker: insufficient quota for cpu in flavor "
    "default-flavor, request > maximum capacity (24 > 8)"
)
WORKLOAD = {
    "metadata": {"name": "trainjob-mnist-3f2a1"},
    "spec": {"queueName": "user-queue"},
    "status": {
        "conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending",
             "message": KUEUE_WORDS},
        ]
    },
}  # fmt: skip


def manifest(*, queue: str | None = None) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist", "namespace": "team-a", "uid": "0b7c", "generation": 1,
            "creationTimestamp": "2026-11-24T12:00:00Z", "labels": labels,
        },
        "spec": {
            "image": "img",
            "replicaSpecs": {"chief": {"replicas": 1}, "worker": {"replicas": 2}},
            "runPolicy": {"suspend": True},
        },
    }  # fmt: skip


def stored(obj: dict[str, Any], decision: policy.Decision) -> tuple[dict[str, Any], list[Any]]:
    """The job as the API server returns it after the operator applied `decision`, and the
    Events it posted (as `kubectl get events -o json` lists them)."""
    job = spec.parse(obj)
    events = [
        {"type": e.type, "reason": e.reason, "message": e.message,
         "metadata": {"uid": f"e{i}"}, "lastTimestamp": "2026-11-24T12:00:01Z",
         "involvedObject": {"kind": "TrainJob", "name": "mnist"},
         "source": {"component": "trainjob-operator"}}
        for i, e in enumerate(decision.events)
    ]  # fmt: skip
    return {**obj, "status": st.to_dict(job, decision.status)}, events


def created_suspended() -> tuple[dict[str, Any], list[Any]]:
    obj = manifest()
    return stored(obj, policy.reconcile(spec.parse(obj), st.JobStatus(), {}, set(), T0))


def queued_by_kueue() -> tuple[dict[str, Any], list[Any]]:
    """The operator's first pass for a Kueue-managed job: suspended, its Workload made, the
    engine's decision told in Kueue's words (kueue_patches.held_decision)."""
    obj = manifest(queue="user-queue")
    decision = policy.reconcile(spec.parse(obj), st.JobStatus(), {}, set(), T0)
    hold = kp.hold_reason(WORKLOAD, "user-queue")
    return stored(obj, kp.held_decision(decision, st.JobStatus(), hold, WORKLOAD, T0))


def evicted_after_it_ran() -> dict[str, Any]:
    """A job that ran, then was suspended (its Pods deleted): attempt 1 waits."""
    obj = manifest()
    job = spec.parse({**obj, "spec": {**obj["spec"], "runPolicy": {}}})
    keys = job.replica_keys()
    first = policy.reconcile(job, st.JobStatus(), {}, set(), T0)
    running = {k: policy.ObservedReplica(phase="Running", attempt=0) for k in keys}
    ran = policy.reconcile(job, first.status, running, set(keys), T0)
    suspended = policy.reconcile(spec.parse(obj), ran.status, running, set(keys), NOW)
    return stored(obj, suspended)[0]


def replica_rows(text: str) -> list[list[str]]:
    table = text.split("Replicas:\n", maxsplit=1)[1].split("Events:", maxsplit=1)[0]
    return [line.split() for line in table.splitlines()]


def test_describe_of_a_job_queued_by_kueue_says_why_nothing_exists_and_what_starts_it() -> None:
    obj, events = queued_by_kueue()
    text = describe.describe_text(obj, [], events, NOW)
    assert "State:        Queued\n" in text
    assert (
        "Suspended:    Queued: Waiting for Kueue to admit Workload trainjob-mnist-3f2a1 in "
        f"LocalQueue user-queue: {KUEUE_WORDS}\n"
        "              Not started: no Pod or Service is created until it starts\n"
        "Next:         Kueue starts it once it admits its Workload; where it waits: kubectl "
        "describe workloads -n team-a -l kueue.x-k8s.io/job-uid=0b7c\n"
    ) in text
    assert replica_rows(text)[1:] == [
        ["chief-0", "Queued", "0", "<none>", "<none>"],
        ["worker-0", "Queued", "0", "<none>", "<none>"],
        ["worker-1", "Queued", "0", "<none>", "<none>"],
    ]
    assert "Starting" not in text and "deleted" not in text


def test_describe_of_a_job_created_suspended_says_how_to_resume_it() -> None:
    obj, events = created_suspended()
    text = describe.describe_text(obj, [], events, NOW)
    assert "State:        Suspended\n" in text
    assert "              Not started: no Pod or Service is created until it starts\n" in text
    assert (
        "Next:         It waits for spec.runPolicy.suspend to be false: kubectl patch tj mnist "
        """-n team-a --type merge -p '{"spec":{"runPolicy":{"suspend":false}}}'\n"""
    ) in text
    assert [row[1:3] for row in replica_rows(text)[1:]] == [["Suspended", "0"]] * 3
    # The engine's Event says what suspending did: nothing, it had nothing.
    assert [e["message"] for e in events] == [
        "Created TrainJob mnist",
        "Suspended TrainJob before it started: no Pod or Service was created",
    ]


def test_describe_of_a_job_suspended_after_it_ran_says_its_pods_were_deleted() -> None:
    text = describe.describe_text(evicted_after_it_ran(), [], [], NOW)
    assert (
        "              Stopped: its Pods and Services were deleted; it resumes from its "
        "checkpoint as a new attempt\n"
    ) in text
    assert [row[1:3] for row in replica_rows(text)[1:]] == [["Suspended", "1"]] * 3


def test_the_live_table_of_a_waiting_job_shows_its_replicas_queued_not_starting() -> None:
    obj, _ = queued_by_kueue()
    table = [view.plain(line) for line in view.table_segments(show.snapshot(obj, NOW), width=80)]
    assert table[0].startswith("TrainJob mnist  Queued  ")
    assert [line.split() for line in table[1:]] == [
        ["chief-0", "Queued", "attempt", "0"],
        ["worker-0", "Queued", "attempt", "0"],
        ["worker-1", "Queued", "attempt", "0"],
    ]


def test_detaching_from_a_waiting_job_says_it_waits_and_what_starts_it() -> None:
    obj, _ = queued_by_kueue()
    assert show.attach_hint(obj) == (
        "Detached: TrainJob mnist stays Queued on the cluster (not started: no Pod or Service "
        "is created until it starts).\n"
        "Kueue starts it once it admits its Workload; where it waits: kubectl describe "
        "workloads -n team-a -l kueue.x-k8s.io/job-uid=0b7c\n"
        "Attach again with:\n  trainjob attach mnist -n team-a\n"
    )
    running = {**obj, "status": {"conditions": [
        {"type": "Running", "status": "True", "reason": "Running", "message": "all running"}
    ]}}  # fmt: skip
    assert show.attach_hint(running).startswith("Detached: TrainJob mnist keeps running on the")
    assert objects.hold_of(running) is None


def test_a_hold_says_why_unless_an_event_said_it_then_what_starts_it() -> None:
    obj, _ = queued_by_kueue()
    hold = objects.hold_of(obj)
    assert hold is not None
    after = [
        "  Queued, not started: no Pod or Service is created until it starts.",
        f"  {hold.resume}",
    ]
    assert show.hold_lines(hold, [hold.message]) == after
    # The Queued Event expired (Events last an hour): the condition still says why.
    assert show.hold_lines(hold, []) == [f"* Queued: {hold.message}", *after]


class WaitingCluster:
    """What `attach` reads of a queued job: the job, its Events, no Pods. The third read of
    the job is Ctrl-C (the user detaches)."""

    def __init__(self, obj: dict[str, Any], events: list[Any]) -> None:
        self.obj, self.listed, self.reads = obj, events, 0

    def get_job(self, _name: str) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 3:
            raise KeyboardInterrupt
        return self.obj

    def events(self, _names: list[str]) -> list[Any]:
        return self.listed

    def pods(self, _name: str) -> list[Any]:
        return []


def test_attach_to_a_queued_job_says_why_once_and_detaching_says_it_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(submit, "POLL_SECONDS", 0.0)
    obj, events = queued_by_kueue()
    out = io.StringIO()
    streams = cliutil.Streams(out=out, err=io.StringIO(), stdin=io.StringIO())
    code = submit.follow(WaitingCluster(obj, events), "mnist", streams, no_tty=True)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert code == cliutil.EXIT_SIGINT
    assert lines[:4] == [
        "* Created: Created TrainJob mnist",
        f"* Queued: Waiting for Kueue to admit Workload trainjob-mnist-3f2a1 in LocalQueue "
        f"user-queue: {KUEUE_WORDS}",
        "  Queued, not started: no Pod or Service is created until it starts.",
        "  Kueue starts it once it admits its Workload; where it waits: kubectl describe "
        "workloads -n team-a -l kueue.x-k8s.io/job-uid=0b7c",
    ]
    assert sum("not started" in line for line in lines) == 2  # once, and in the detach hint
    assert "keeps running" not in out.getvalue() and "Starting" not in out.getvalue()
    assert "Detached: TrainJob mnist stays Queued on the cluster" in out.getvalue()
