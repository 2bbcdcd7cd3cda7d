"""The `trainjob_jobs` gauge (jobs by namespace and state) as jobs move between states."""

from __future__ import annotations

from trainjob_operator import metrics


def gauge(meters: metrics.Metrics) -> dict[tuple[str, str], float]:
    return {
        (sample.labels["namespace"], sample.labels["state"]): sample.value
        for family in meters.registry.collect()
        if family.name == "trainjob_jobs"
        for sample in family.samples
    }


def test_the_jobs_gauge_counts_each_job_once_in_its_latest_state() -> None:
    meters = metrics.Metrics()
    meters.set_state("a", "team", "Pending")
    meters.set_state("b", "team", "Pending")
    meters.set_state("c", "other", "Succeeded")
    assert gauge(meters) == {("team", "Pending"): 2, ("other", "Succeeded"): 1}
    meters.set_state("a", "team", "Running")
    meters.set_state("a", "team", "Running")  # the same state again changes nothing
    assert gauge(meters) == {
        ("team", "Pending"): 1,
        ("team", "Running"): 1,
        ("other", "Succeeded"): 1,
    }
    meters.set_state("b", "team", "Running")
    meters.forget("c")
    meters.forget("c")  # forgetting twice is harmless
    # A (namespace, state) with no job left is no sample at all, not a 0 that lingers.
    assert gauge(meters) == {("team", "Running"): 2}
