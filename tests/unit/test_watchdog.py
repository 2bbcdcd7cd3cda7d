"""The watchdog's verdict (pure): what makes the operator's liveness probe fail."""

from __future__ import annotations

from trainjob_operator import informer, watchdog


def test_healthy_when_watches_work_and_no_job_waits() -> None:
    watches = [informer.WatchHealth("pods in a"), informer.WatchHealth("TrainJobs", None)]
    assert watchdog.unhealthy(watches, [], now=1000.0, deadline=60.0) == []


def test_a_watch_failing_past_the_deadline_is_a_problem_and_a_short_outage_is_not() -> None:
    short = informer.WatchHealth("pods in a", failing_since=990.0)
    long = informer.WatchHealth("services in b", failing_since=900.0)
    problems = watchdog.unhealthy([short, long], [], now=1000.0, deadline=60.0)
    assert problems == ["watching services in b has failed for 100s"]


def test_jobs_waiting_for_a_first_reconcile_are_named() -> None:
    waiting = [("TrainJob", ("ns", f"job-{i}")) for i in range(7)]
    (problem,) = watchdog.unhealthy([], waiting, now=0.0, deadline=30.0)
    assert problem.startswith("7 TrainJob(s) waited more than 30s for a first reconcile: ns/job-0")
    assert problem.endswith("and 2 more")


def test_waiting_jobs_are_named_in_their_own_kinds_words() -> None:
    waiting = [("TFJob", ("ns", "words")), ("TrainJob", ("ns", "mnist"))]
    problems = watchdog.unhealthy([], waiting, now=0.0, deadline=30.0)
    assert problems == [
        "1 TFJob(s) waited more than 30s for a first reconcile: ns/words",
        "1 TrainJob(s) waited more than 30s for a first reconcile: ns/mnist",
    ]
