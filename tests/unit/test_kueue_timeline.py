"""The cohort storm's checker (tests/integration/kueue_timeline.py) on hand-made event
sequences: it must flag a live Pod whose Workload holds no admission and an over-committed
Cohort, report Pods of a Finished Workload as the separate finding, and accept a clean
sequence. The storm passing proves nothing unless the checker is known to see what it looks
for; these take milliseconds, the storm minutes."""

from __future__ import annotations

from typing import Any

from tests.integration import kueue_timeline as tl

NS = "ns"
COHORT = tl.CohortQuota("c", {"cq-a": tl.QueueQuota(2000, 2000), "cq-b": tl.QueueQuota(2000, 0)})
QUEUE_OF = {f"{NS}/a1": "cq-a", f"{NS}/a2": "cq-a", f"{NS}/b1": "cq-b"}


class Writes:
    """A hand-made sequence of writes, each at the next resourceVersion, 0.1 s apart."""

    def __init__(self) -> None:
        self.rv = 100
        self.events: list[tl.Event] = []

    def _add(self, kind: str, etype: str, raw: dict[str, Any]) -> None:
        self.rv += 1
        raw["metadata"]["resourceVersion"] = str(self.rv)
        ev = tl.event(kind, etype, raw, 1000.0 + (self.rv - 100) * 0.1)
        assert ev is not None
        self.events.append(ev)

    def pod(
        self,
        name: str,
        job: str,
        *,
        cpu: str = "500m",
        phase: str | None = None,
        deleting: bool = False,
        etype: str = tl.MODIFIED,
    ) -> None:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {tl.JOB_LABEL: job},
        }
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        raw = {
            "metadata": meta,
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase} if phase else {},
        }
        self._add(tl.POD, etype, raw)

    def workload(
        self,
        job: str,
        *,
        queue: str | None = None,
        finished: bool = False,
        evicted: str | None = None,
        etype: str = tl.MODIFIED,
    ) -> None:
        conditions = []
        if finished:
            conditions.append({"type": "Finished", "status": "True"})
        if evicted:
            conditions.append(
                {
                    "type": "Evicted",
                    "status": "True",
                    "reason": evicted,
                    "lastTransitionTime": "2026-01-01T00:00:01Z",
                }
            )
        status: dict[str, Any] = {"conditions": conditions}
        if queue:
            status["admission"] = {"clusterQueue": queue}
        raw = {
            "metadata": {
                "name": f"wl-{job}",
                "namespace": NS,
                "uid": f"uid-wl-{job}",
                "labels": {tl.JOB_LABEL: job},
            },
            "status": status,
        }
        self._add(tl.WORKLOAD, etype, raw)

    def replay(self, *, shuffle: bool = True) -> tl.Report:
        # The streams deliver Pods and Workloads separately: the order must come from the
        # resourceVersions, not from the order of the list.
        events = sorted(self.events, key=lambda e: (e.kind, -e.rv)) if shuffle else self.events
        return tl.replay(events, COHORT, QUEUE_OF)


def clean_job(w: Writes, job: str, queue: str, pods: int) -> None:
    """Admitted, Pods created and run, chief done, the rest deleted, then Finished."""
    w.workload(job, etype=tl.ADDED)
    w.workload(job, queue=queue)
    for i in range(pods):
        w.pod(f"{job}-{i}", job, etype=tl.ADDED)
    for i in range(pods):
        w.pod(f"{job}-{i}", job, phase="Running")
    w.pod(f"{job}-0", job, phase="Succeeded")
    for i in range(1, pods):
        w.pod(f"{job}-{i}", job, phase="Running", deleting=True)
        w.pod(f"{job}-{i}", job, phase="Running", deleting=True, etype=tl.DELETED)
    w.workload(job, queue=queue, finished=True)


def test_a_clean_sequence_has_no_window() -> None:
    w = Writes()
    clean_job(w, "a1", "cq-a", 4)  # 2 CPU: all of cq-a's nominal
    clean_job(w, "b1", "cq-b", 4)
    report = w.replay()
    assert report.violations == []
    assert report.findings == []
    assert report.events == len(w.events)
    assert report.admissions == 2
    assert report.jobs == {f"{NS}/a1", f"{NS}/b1"}


def test_a_live_pod_after_the_admission_is_cleared_is_a_window_until_it_ends() -> None:
    w = Writes()
    w.workload("a1", queue="cq-a", etype=tl.ADDED)
    w.pod("a1-0", "a1", etype=tl.ADDED)
    w.pod("a1-1", "a1", etype=tl.ADDED)
    w.workload("a1", queue="cq-a", evicted="Preempted")
    w.workload("a1", evicted="Preempted")  # admission cleared: both Pods still exist
    opened = w.rv
    w.pod("a1-0", "a1", deleting=True)  # terminating is still live
    w.pod("a1-0", "a1", etype=tl.DELETED)
    w.pod("a1-1", "a1", phase="Failed")  # ended: no longer live
    closed = w.rv
    w.pod("a1-1", "a1", phase="Failed", etype=tl.DELETED)
    report = w.replay()
    (window,) = report.violations
    assert window.kind == tl.UNADMITTED
    assert window.subject == f"{NS}/a1"
    assert (window.start_rv, window.end_rv) == (opened, closed)
    assert window.revisions == 3
    assert window.seconds is not None and abs(window.seconds - 0.3) < 1e-9
    assert window.pods == {"a1-0", "a1-1"}
    assert window.events == 3
    assert report.evictions == {"Preempted": 1}
    assert report.evicted_soon_after_admission == 1
    assert "a1-0" in window.describe() and str(opened) in window.describe()


def test_a_pod_of_a_job_whose_workload_never_existed_is_flagged() -> None:
    w = Writes()
    w.pod("a2-0", "a2", etype=tl.ADDED)
    report = w.replay()
    (window,) = report.violations
    assert window.kind == tl.UNADMITTED
    assert window.end_rv is None  # still open at the end
    assert "to the end" in window.describe()


def test_an_over_committed_cohort_is_flagged_with_its_peak() -> None:
    w = Writes()
    # cq-a borrows all of cq-b (4 CPU), then b1 is admitted on its reclaimed nominal quota
    # while a1's evicted Pods still run with the admission still held: 4 + 1 > 4.
    w.workload("a1", queue="cq-a", etype=tl.ADDED)
    for i in range(8):
        w.pod(f"a1-{i}", "a1", etype=tl.ADDED)
    w.workload("b1", queue="cq-b", etype=tl.ADDED)
    w.pod("b1-0", "b1", cpu="1", etype=tl.ADDED)
    opened = w.rv
    for i in range(8):
        w.pod(f"a1-{i}", "a1", etype=tl.DELETED)
    report = w.replay()
    kinds = {(v.kind, v.subject) for v in report.violations}
    assert kinds == {(tl.COHORT_OVER, "c")}
    (window,) = report.violations
    assert window.start_rv == opened
    assert window.end_rv == opened + 2  # 3.5 + 1 CPU fits once two Pods are gone
    assert (window.peak_m, window.limit_m) == (5000, 4000)
    assert report.peak_cohort_m == 5000


def test_a_cluster_queue_over_its_borrowing_limit_is_flagged() -> None:
    w = Writes()
    w.workload("b1", queue="cq-b", etype=tl.ADDED)  # cq-b may not borrow: limit 2 CPU
    for i in range(5):
        w.pod(f"b1-{i}", "b1", etype=tl.ADDED)
    (window,) = w.replay().violations
    assert (window.kind, window.subject) == (tl.QUEUE_OVER, "cq-b")
    assert (window.peak_m, window.limit_m) == (2500, 2000)


def test_pods_of_a_finished_workload_are_the_second_finding_not_a_violation() -> None:
    w = Writes()
    w.workload("a1", queue="cq-a", etype=tl.ADDED)
    w.pod("a1-0", "a1", etype=tl.ADDED)
    w.pod("a1-1", "a1", etype=tl.ADDED)
    w.workload("a1", queue="cq-a", finished=True)
    w.workload("a2", queue="cq-a", etype=tl.ADDED)
    for i in range(8):  # the released quota reused while a1's Pods still run
        w.pod(f"a2-{i}", "a2", etype=tl.ADDED)
    w.pod("a1-0", "a1", etype=tl.DELETED)
    w.pod("a1-1", "a1", etype=tl.DELETED)
    report = w.replay()
    assert report.violations == []
    kinds = sorted(f.kind for f in report.findings)
    assert kinds == sorted([tl.AFTER_FINISH, tl.QUEUE_OVER_FINISHED, tl.COHORT_OVER_FINISHED])
    after = next(f for f in report.findings if f.kind == tl.AFTER_FINISH)
    assert after.pods == {"a1-0", "a1-1"}
    assert "second finding" in report.summary()


def test_the_order_comes_from_resource_versions_and_a_relisted_write_counts_once() -> None:
    w = Writes()
    clean_job(w, "a1", "cq-a", 3)
    twice = [*w.events, *w.events[:4]]
    report = tl.replay(reversed(twice), COHORT, QUEUE_OF)
    assert report.violations == []
    assert report.events == len(w.events)


def test_cpu_quantities() -> None:
    assert tl.cpu_millis("500m") == 500
    assert tl.cpu_millis("1") == 1000
    assert tl.cpu_millis("1.5") == 1500
    assert tl.cpu_millis(2) == 2000
    assert tl.cpu_millis("0.0001") == 1  # rounded up, as the API server does
    assert tl.cpu_millis(None) == 0
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "250m"}}},
            {"resources": {"limits": {"cpu": "250m"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
    }
    assert tl.pod_cpu(spec) == 2000
    assert COHORT.limit_m("cq-a") == 4000
    assert COHORT.limit_m("cq-b") == 2000
