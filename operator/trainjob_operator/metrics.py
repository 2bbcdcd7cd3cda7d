"""Prometheus metrics of the operator, served on /metrics (prometheus-client).

Counters move on status *transitions* (old status -> written status), after the status write
succeeded, so a retried reconcile never counts twice and a restarted operator does not count
jobs that were already Created/Succeeded/Failed before it started.
"""

from __future__ import annotations

import collections
from typing import Final

import prometheus_client

from trainjob.core import status as st

NAMESPACE: Final = "trainjob"


class Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        self.registry = registry or prometheus_client.CollectorRegistry()
        labels = ["namespace"]

        def counter(name: str, documentation: str, *extra: str) -> prometheus_client.Counter:
            return prometheus_client.Counter(
                name, documentation, [*labels, *extra], namespace=NAMESPACE, registry=self.registry
            )

        self.created = counter("jobs_created", "TrainJobs created (first reconcile)")
        self.succeeded = counter("jobs_succeeded", "TrainJobs that succeeded")
        self.failed = counter("jobs_failed", "TrainJobs that failed", "reason")
        self.restarted = counter(
            "jobs_restarted", "Restarts decided (each counts toward backoffLimit)"
        )
        self.jobs = prometheus_client.Gauge(
            "jobs",
            "TrainJobs served by this operator, by state",
            [*labels, "state"],
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.reconcile_seconds = prometheus_client.Histogram(
            "reconcile_duration_seconds",
            "Time of one reconcile (read, decide, apply, status)",
            namespace=NAMESPACE,
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.reconcile_errors = counter(
            "reconcile_errors", "Reconciles that failed (retried with backoff)"
        )
        self.unserved = counter(
            "jobs_unserved",
            "TrainJobs found waiting longer than the serve deadline for a first reconcile",
        )
        self.waiting = prometheus_client.Gauge(
            "jobs_waiting_first_reconcile",
            "TrainJobs waiting longer than the serve deadline for a first reconcile now",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.leader = prometheus_client.Gauge(
            "operator_leader",
            "1 while this replica may write (it holds the leader Lease, or runs without leader "
            "election), 0 while it stands by",
            namespace=NAMESPACE,
            registry=self.registry,
        )
        self.leader.set(1)
        self._states: dict[str, tuple[str, str]] = {}  # uid -> (namespace, state)
        # How many jobs each (namespace, state) has: kept as states move, so that a change
        # touches two gauge samples, not all of them (10,000 jobs looked at on start-up
        # counted every job each time: quadratic).
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def serve(self, port: int) -> None:
        prometheus_client.start_http_server(port, registry=self.registry)

    def transition(self, namespace: str, old: st.JobStatus, new: st.JobStatus) -> None:
        if new.is_true(st.CREATED) and not old.is_true(st.CREATED):
            self.created.labels(namespace).inc()
        if new.is_true(st.SUCCEEDED) and not old.is_true(st.SUCCEEDED):
            self.succeeded.labels(namespace).inc()
        if new.is_true(st.FAILED) and not old.is_true(st.FAILED):
            condition = new.condition(st.FAILED)
            self.failed.labels(namespace, condition.reason if condition else "").inc()
        if new.restart_count > old.restart_count:
            self.restarted.labels(namespace).inc(new.restart_count - old.restart_count)

    def set_state(self, uid: str, namespace: str, state: str) -> None:
        new = (namespace, state)
        old = self._states.get(uid)
        if old == new:
            return
        self._states[uid] = new
        self._count(new, +1)
        if old is not None:
            self._count(old, -1)

    def forget(self, uid: str) -> None:
        old = self._states.pop(uid, None)
        if old is not None:
            self._count(old, -1)

    def _count(self, labels: tuple[str, str], change: int) -> None:
        self._counts[labels] += change
        if self._counts[labels] > 0:
            self.jobs.labels(*labels).set(self._counts[labels])
        else:
            del self._counts[labels]
            self.jobs.remove(*labels)
