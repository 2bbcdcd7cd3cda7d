"""The order of one reconcile's API calls (reconciler.py's module docstring): Events, then the
status conditional on the version decided from, and only then children; a status write that
conflicts stops the reconcile before anything is created. The API is a recorder implementing
writes.JobWrites: no API server, milliseconds per test."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Iterable
from typing import Any, cast

import pytest

from trainjob.core import policy
from trainjob_operator import config, kube, manager, metrics, reconciler, writes

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def trainjob() -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "tensorflow", "image": "trainjob:1"}]}}
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist",
            "namespace": "team-a",
            "uid": "uid-1",
            "resourceVersion": "7",
            "generation": 1,
        },
        "spec": {
            "replicaSpecs": {
                "chief": {"replicas": 1, "template": template},
                "worker": {"replicas": 2, "template": template},
            }
        },
    }


class Recorder:
    """Every call, in order, as (method, what); a status write may be made to conflict."""

    def __init__(self, conflict: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.conflict = conflict
        self.written_at: str | None = None

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", name))
        return trainjob()

    async def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        self.calls.append(("status", str(status.get("state"))))
        self.written_at = resource_version
        if self.conflict:
            raise kube.ConflictError("the object has been modified")
        return {
            **trainjob(),
            "status": status,
            "metadata": {**trainjob()["metadata"], "resourceVersion": "8"},
        }

    async def post_event(
        self,
        job: dict[str, Any],
        event: policy.Event,
        now: datetime.datetime,
        event_id: str | None = None,
    ) -> str | None:
        self.calls.append(("event", event.reason))
        return event_id or event.reason

    async def withdraw_events(self, namespace: str, names: Iterable[str]) -> None:
        self.calls.extend(("withdraw", name) for name in names)

    async def create(
        self, kind: str, namespace: str, name: str, render: Callable[[], dict[str, Any]]
    ) -> bool:
        render()
        self.calls.append((kind, name))
        return True

    async def create_object(self, manifest: dict[str, Any], plural: str) -> dict[str, Any]:
        self.calls.append((str(manifest["kind"]), str(manifest["metadata"]["name"])))
        return manifest

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.calls.append(("delete Pod", name))

    async def delete_service(self, namespace: str, name: str, uid: str | None = None) -> None:
        self.calls.append(("delete Service", name))

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete TrainJob", name))


def writes_as_kube_does(api: kube.Kube) -> writes.JobWrites:
    return api  # mypy: the real API layer is a JobWrites


def reconcile(api: Recorder, seen: writes.Seen) -> reconciler.Outcome:
    async def once() -> reconciler.Outcome:
        shared = manager.build(config.Settings(), cast(kube.Kube, api), metrics.Metrics()).ctx
        request = reconciler.Request(("team-a", "mnist"), trainjob(), seen, NOW)
        return await reconciler.reconcile(shared, request)

    return asyncio.run(once())


def test_a_new_job_is_recorded_before_any_child_is_made_its_policy_first_pods_last() -> None:
    api = Recorder()
    seen = writes.Seen()
    outcome = reconcile(api, seen)
    kinds = [what for what, _ in api.calls]
    status_at = kinds.index("status")
    assert "event" in kinds[:status_at] and not {"Service", "Pod"} & set(kinds[:status_at])
    assert api.written_at == "7"  # conditional on the version decided from
    made = api.calls[status_at + 1 :]
    # The NetworkPolicy before any Pod: no replica's TensorFlow port is ever open to all.
    assert [kind for kind, _ in made] == ["NetworkPolicy"] + ["Service"] * 3 + ["Pod"] * 3
    assert made[0] == ("NetworkPolicy", "mnist")
    assert {name for _, name in made[1:]} == {"mnist-chief-0", "mnist-worker-0", "mnist-worker-1"}
    # Our write is not yet in a watched copy: the job is not at rest, the loop remembers it.
    assert seen.known is not None and not outcome.at_rest and not outcome.done


def test_a_conflicting_status_write_stops_the_reconcile_before_anything_is_made() -> None:
    api = Recorder(conflict=True)
    seen = writes.Seen()
    with pytest.raises(kube.ConflictError):
        reconcile(api, seen)
    assert [what for what, _ in api.calls if what not in ("event",)] == ["status"]
    # The next reconcile reads afresh, and knows which Events it posted for nothing.
    assert seen.stale and seen.superseded is not None and seen.superseded.names


def test_a_transition_decided_again_with_more_events_posts_its_terminal_event_once() -> None:
    """After a crash between posting a decision's Events and recording it, the next decision
    from the same recorded status may see more (a second replica ended meanwhile) and add an
    Event before the terminal one. Named by position, the terminal Event got a second name:
    two Succeeded Events for one success (seen once in the chaos storm). Named by what it is
    and how often it came before in its decision, it gets the same name: posted once (409)."""
    succeeded = policy.Event("Normal", "TrainJobSucceeded", "TrainJob mnist succeeded (chief 0)")
    stopped = policy.Event("Normal", "Stopped", "stopped worker 1")

    def names(*events: policy.Event) -> list[str]:
        posted, _ = asyncio.run(
            writes.post_events(Recorder(), trainjob(), "fingerprint", events, NOW)
        )
        return posted

    first = names(succeeded)
    again = names(stopped, succeeded)
    assert first[0] == again[1]
    # Two identical Events of one decision still get two names.
    twice = names(stopped, stopped)
    assert twice[0] != twice[1]
    # The same restart in other words (worker 1 succeeded meanwhile and is not restarted):
    # the same Event, so one restart is one Restarting Event (seen in the chaos storm: c007).
    both = policy.Event("Warning", "Restarting", "Restarting worker 0, worker 1 after ...")
    alone = policy.Event("Warning", "Restarting", "Restarting worker 0 after ...")
    assert names(both) == names(alone)
    # Two restarts in one decision (two parameter-server groups) are still two Events.
    assert len(set(names(both, alone))) == 2
    # Another recorded status: another transition, other names.
    other, _ = asyncio.run(writes.post_events(Recorder(), trainjob(), "other", [succeeded], NOW))
    assert other != first
