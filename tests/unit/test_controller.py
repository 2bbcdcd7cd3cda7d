"""The job loop (controller.py, workqueue.py) on a real event loop, with the reconcile
replaced by a script: which jobs are reconciled when, what an active job keeps, that a
finished job is parked with nothing kept, and that retries, deletions and pauses do what
they say."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from trainjob.core import policy
from trainjob.core import status as st
from trainjob_operator import (
    children,
    config,
    context,
    controller,
    kube,
    reconciler,
    workqueue,
    writes,
)

JobKey = children.JobKey
KEY: JobKey = ("team-a", "mnist")


def trainjob(name: str = "mnist", uid: str = "uid-1", version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "team-a",
            "name": name,
            "uid": uid,
            "resourceVersion": version,
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {},
    }


class FakeCounter:
    def labels(self, *_: str) -> FakeCounter:
        return self

    def inc(self) -> None:
        pass

    def observe(self, _: float) -> None:
        pass


class FakeMetrics:
    def __init__(self) -> None:
        self.reconcile_seconds = FakeCounter()
        self.reconcile_errors = FakeCounter()
        self.forgotten: list[str] = []
        self.states: dict[str, tuple[str, str]] = {}

    def set_state(self, uid: str, namespace: str, state: str) -> None:
        self.states[uid] = (namespace, state)

    def forget(self, uid: str) -> None:
        self.forgotten.append(uid)


class FakeInformer:
    def __init__(self) -> None:
        self.listed = asyncio.Event()
        self.listed.set()
        self.users = 0

    def acquire(self, _: str) -> asyncio.Event:
        self.users += 1
        return self.listed

    def release(self, _: str) -> None:
        self.users -= 1


class FakeWatchdog:
    def __init__(self) -> None:
        self.seen: set[JobKey] = set()
        self.kinds: dict[JobKey, set[str]] = {}

    def saw(self, key: JobKey, kind: str = "TrainJob") -> None:
        self.seen.add(key)
        self.kinds.setdefault(key, set()).add(kind)

    def forget(self, key: JobKey) -> None:
        self.seen.discard(key)


class FakeIndex:
    def __init__(self) -> None:
        self.with_children: set[JobKey] = set()

    def has_children(self, key: JobKey) -> bool:
        return key in self.with_children

    def pods(self, _: JobKey) -> list[children.ChildPod]:
        return []

    def services(self, _: JobKey) -> list[children.ChildService]:
        return []


@dataclasses.dataclass
class FakeRuntime:
    settings: config.Settings = dataclasses.field(
        default_factory=lambda: config.Settings(resync_seconds=600.0)
    )
    informer: FakeInformer = dataclasses.field(default_factory=FakeInformer)
    child_index: FakeIndex = dataclasses.field(default_factory=FakeIndex)
    metrics: FakeMetrics = dataclasses.field(default_factory=FakeMetrics)
    begun: list[JobKey] = dataclasses.field(default_factory=list)
    forgotten: list[JobKey] = dataclasses.field(default_factory=list)
    wakes: context.Wakes = dataclasses.field(default_factory=context.Wakes)
    watchdog: FakeWatchdog = dataclasses.field(default_factory=FakeWatchdog)

    def begin(self, key: JobKey) -> None:
        self.begun.append(key)

    def forget(self, key: JobKey) -> None:
        self.forgotten.append(key)


@dataclasses.dataclass
class Call:
    key: JobKey
    live: Mapping[str, Any] | None
    seen: writes.Seen | None


Script = Callable[[Call], Awaitable[reconciler.Outcome]]


class Loop:
    """A Controller whose reconcile is `script`, recording every call."""

    def __init__(self, script: Script, workers: int = 4) -> None:
        self.rt = FakeRuntime()
        self.calls: list[Call] = []
        self.script = script

        async def reconcile(
            ctx: context.OperatorContext, request: reconciler.Request
        ) -> reconciler.Outcome:
            call = Call(request.key, request.live, request.seen)
            self.calls.append(call)
            return await self.script(call)

        self.controller = controller.Controller(
            cast(context.OperatorContext, self.rt), workers=workers, reconcile=reconcile
        )
        self.rt.wakes.serve(self.controller)  # as manager.build does

    def called(self) -> list[JobKey]:
        return [c.key for c in self.calls]


async def settle(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until `condition` holds (fails the test after `timeout`)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the loop did not get there"
        await asyncio.sleep(0.001)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 20))


def finished() -> Script:
    async def script(_: Call) -> reconciler.Outcome:
        return reconciler.Outcome(None, at_rest=True)

    return script


def active(requeue_after: float | None) -> Script:
    async def script(_: Call) -> reconciler.Outcome:
        return reconciler.Outcome(requeue_after)

    return script


def test_a_finished_job_is_parked_with_no_copy_no_state_and_no_timer() -> None:
    async def scenario() -> None:
        loop = Loop(finished())
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await settle(lambda: len(loop.calls) == 1 and KEY not in loop.controller.states)
        assert KEY in loop.controller.known
        assert loop.controller.bodies == {}
        assert loop.controller.queue.timers == 0
        # Handed the watched copy without managedFields, and a fresh loop memory.
        first = loop.calls[0]
        assert first.live is not None and "managedFields" not in first.live["metadata"]
        assert first.seen is not None and first.seen.known is None
        await loop.controller.close()

    run(scenario)


def test_a_child_event_of_a_parked_job_reconciles_it_again_from_a_fresh_read() -> None:
    async def scenario() -> None:
        loop = Loop(finished())
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await settle(lambda: len(loop.calls) == 1 and KEY not in loop.controller.states)
        loop.rt.wakes.wake(KEY)  # what the Pod informer calls
        await settle(lambda: len(loop.calls) == 2)
        assert loop.calls[1].live is None  # no copy kept: the reconciler reads it
        await loop.controller.close()

    run(scenario)


def test_a_relist_forgets_the_jobs_deleted_while_the_watch_was_down_and_only_in_its_scope() -> None:
    async def scenario() -> None:
        loop = Loop(active(None))
        loop.controller.start()
        loop.controller.observe(None, trainjob("kept", uid="u1"))
        loop.controller.observe(None, trainjob("gone", uid="u2"))
        other = trainjob("elsewhere", uid="u3")
        other["metadata"]["namespace"] = "team-b"
        loop.controller.observe(None, other)
        await settle(lambda: len(loop.calls) == 3)
        assert loop.rt.watchdog.seen == {
            ("team-a", "kept"),
            ("team-a", "gone"),
            ("team-b", "elsewhere"),
        }

        loop.controller.listed("team-a", {("team-a", "kept")})

        assert set(loop.controller.known) == {("team-a", "kept"), ("team-b", "elsewhere")}
        assert loop.rt.metrics.forgotten == ["u2"]
        assert loop.rt.watchdog.seen == {("team-a", "kept"), ("team-b", "elsewhere")}
        assert loop.rt.informer.users == 2  # the deleted job's scope released
        loop.controller.listed(None, set())
        assert not loop.controller.known
        await loop.controller.close()

    run(scenario)


def test_an_active_job_keeps_its_copy_and_is_looked_at_again_when_its_deadline_comes() -> None:
    async def scenario() -> None:
        loop = Loop(active(0.2))
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await settle(lambda: len(loop.calls) == 1)
        await settle(lambda: loop.controller.queue.timers == 1)
        assert KEY in loop.controller.bodies and KEY in loop.controller.states
        await settle(lambda: len(loop.calls) >= 2, timeout=3.0)
        # The same loop memory carries over between reconciles of an active job.
        assert loop.calls[0].seen is loop.calls[1].seen
        await loop.controller.close()

    run(scenario)


def test_an_active_job_with_nothing_due_waits_for_the_resync_period_only() -> None:
    outcome = reconciler.Outcome(None)
    assert controller.requeue_delay(outcome, 600.0) == 600.0
    assert (
        controller.requeue_delay(reconciler.Outcome(30.0), 600.0) == 30.0 + controller.REQUEUE_SLACK
    )
    assert controller.requeue_delay(reconciler.Outcome(9999.0), 600.0) == 600.0
    assert controller.requeue_delay(reconciler.Outcome(-5.0), 600.0) == controller.REQUEUE_SLACK
    assert controller.requeue_delay(reconciler.Outcome(None, at_rest=True), 600.0) is None


def test_events_during_a_reconcile_coalesce_into_one_more_and_one_job_is_never_run_twice() -> None:
    async def scenario() -> None:
        running: dict[JobKey, int] = {}
        most: dict[JobKey, int] = {}
        release = asyncio.Event()

        async def script(call: Call) -> reconciler.Outcome:
            running[call.key] = running.get(call.key, 0) + 1
            most[call.key] = max(most.get(call.key, 0), running[call.key])
            await release.wait()
            running[call.key] -= 1
            return reconciler.Outcome(None, at_rest=True)

        loop = Loop(script, workers=4)
        loop.controller.start()
        loop.controller.observe(None, trainjob("a", "uid-a"))
        loop.controller.observe(None, trainjob("b", "uid-b"))
        await settle(lambda: len(loop.calls) == 2)  # two jobs at once
        for _ in range(10):
            loop.controller.observe("MODIFIED", trainjob("a", "uid-a"))
            loop.rt.wakes.wake(("team-a", "a"))
        await asyncio.sleep(0.05)
        assert len(loop.calls) == 2  # a's events wait for its reconcile to end
        release.set()
        await settle(lambda: len(loop.calls) == 3)
        await asyncio.sleep(0.05)
        assert loop.called().count(("team-a", "a")) == 2
        assert most == {("team-a", "a"): 1, ("team-a", "b"): 1}
        await loop.controller.close()

    run(scenario)


def test_a_deleted_job_is_forgotten_and_wakes_no_more() -> None:
    async def scenario() -> None:
        loop = Loop(active(None))
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await settle(lambda: len(loop.calls) == 1 and loop.controller.queue.timers == 1)
        assert loop.rt.informer.users == 1
        loop.controller.observe("DELETED", trainjob())
        assert KEY not in loop.controller.known and KEY not in loop.controller.states
        assert loop.controller.queue.timers == 0
        assert loop.rt.informer.users == 0
        assert loop.rt.forgotten == [KEY] and loop.rt.metrics.forgotten == ["uid-1"]
        loop.rt.wakes.wake(KEY)
        await asyncio.sleep(0.05)
        assert len(loop.calls) == 1
        await loop.controller.close()

    run(scenario)


def test_a_job_made_again_under_the_same_name_starts_with_a_fresh_memory() -> None:
    async def scenario() -> None:
        loop = Loop(active(None))
        loop.controller.start()
        loop.controller.observe(None, trainjob(uid="uid-1"))
        await settle(lambda: len(loop.calls) == 1)
        loop.controller.observe("ADDED", trainjob(uid="uid-2"))
        await settle(lambda: len(loop.calls) == 2)
        assert loop.calls[0].seen is not loop.calls[1].seen
        assert loop.controller.known[KEY] == "uid-2"
        await loop.controller.close()

    run(scenario)


def test_a_conflict_is_decided_again_soon_and_a_crash_is_retried_without_losing_the_worker() -> (
    None
):
    async def scenario() -> None:
        errors: list[BaseException] = [kube.ConflictError("409"), RuntimeError("a bug")]

        async def script(_: Call) -> reconciler.Outcome:
            if errors:
                raise errors.pop(0)
            return reconciler.Outcome(None, at_rest=True)

        loop = Loop(script, workers=1)
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await settle(lambda: len(loop.calls) == 2)  # the conflict: again within ~50 ms
        # The crash backs off (0.5 s), then the job is reconciled and parked.
        await settle(lambda: len(loop.calls) == 3 and KEY not in loop.controller.states)
        await loop.controller.close()

    run(scenario)


def test_a_standby_reconciles_nothing_and_serves_what_it_queued_once_it_leads() -> None:
    class Election:
        """leader.Leadership, switched by the test."""

        def __init__(self) -> None:
            self.elected = asyncio.Event()

        def leading(self) -> bool:
            return self.elected.is_set()

        async def wait_leading(self) -> None:
            await self.elected.wait()

    async def scenario() -> None:
        election = Election()
        loop = Loop(finished())
        loop.controller.leadership = election
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        loop.controller.observe(None, trainjob("other", uid="uid-2"))
        await asyncio.sleep(0.1)
        assert loop.calls == []
        # The standby's copies are current: the jobs it saw are known and queued.
        assert set(loop.controller.known) == {KEY, ("team-a", "other")}
        election.elected.set()
        await settle(lambda: len(loop.calls) == 2)
        await loop.controller.close()

    run(scenario)


def test_a_reconcile_refused_for_want_of_the_lease_is_queued_again_quietly() -> None:
    async def scenario() -> None:
        refusals: list[Exception] = [kube.NotLeaderError("not the leader")]

        async def script(_: Call) -> reconciler.Outcome:
            if refusals:
                raise refusals.pop()
            return reconciler.Outcome(None, at_rest=True)

        loop = Loop(script, workers=1)
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        # Again at once (no backoff, no error counted): whoever leads decides it.
        await settle(lambda: len(loop.calls) == 2 and KEY not in loop.controller.states)
        assert loop.controller.states == {}
        await loop.controller.close()

    run(scenario)


def test_a_job_waits_for_its_scope_to_be_listed_before_its_first_reconcile() -> None:
    async def scenario() -> None:
        loop = Loop(finished())
        loop.rt.informer.listed.clear()
        loop.controller.start()
        loop.controller.observe(None, trainjob())
        await asyncio.sleep(0.05)
        assert loop.calls == []
        loop.rt.informer.listed.set()
        await settle(lambda: len(loop.calls) == 1)
        await loop.controller.close()

    run(scenario)


def test_the_queue_keeps_one_timer_per_key_and_the_later_call_wins() -> None:
    async def scenario() -> None:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        timers = asyncio.get_running_loop().create_task(queue.run_timers())
        queue.add_after("a", 5.0)
        queue.add_after("a", 0.05)  # replaces the 5 s wake-up
        queue.add_after("b", 0.02)
        queue.add_after("c", 0.03)
        queue.cancel_timer("c")
        assert queue.timers == 2
        first = await asyncio.wait_for(queue.get(), 1.0)
        second = await asyncio.wait_for(queue.get(), 1.0)
        assert (first, second) == ("b", "a")
        assert queue.timers == 0 and len(queue) == 0
        queue.done("a")
        queue.done("b")
        queue.add("x")
        queue.forget("x")
        assert len(queue) == 0
        timers.cancel()

    run(scenario)


def test_the_timer_task_stops_when_cancelled_in_the_turn_a_timer_was_set() -> None:
    # A worker's requeue sets the timer event; the controller closing in that same turn
    # cancelled a task whose asyncio.wait_for then returned the event instead (CPython
    # gh-86296), so closing waited for the resync period. It failed a CI run.
    async def scenario() -> None:
        queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
        timers = asyncio.get_running_loop().create_task(queue.run_timers())
        queue.add_after("a", 600.0)  # the timer task now waits with a timeout
        for _ in range(5):
            await asyncio.sleep(0)
        queue.add_after("b", 600.0)
        timers.cancel()
        done, _ = await asyncio.wait({timers}, timeout=2.0)
        assert done and timers.cancelled(), "the timer task ran on after its cancellation"

    run(scenario)


def test_the_slim_copy_leaves_only_managed_fields_out() -> None:
    raw = trainjob()
    slim = controller.slim(raw)
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["resourceVersion"] == "1" and slim["spec"] is raw["spec"]
    assert "managedFields" in raw["metadata"]  # the watched object is not changed
    bare: dict[str, Any] = {"metadata": {"name": "x"}}
    assert controller.slim(bare) == bare


def test_only_a_finished_job_with_nothing_left_to_do_and_our_writes_seen_is_at_rest() -> None:
    done = st.from_dict({"conditions": [{"type": "Succeeded", "status": "True"}]})
    running = st.from_dict({"conditions": [{"type": "Running", "status": "True"}]})
    quiet = writes.Seen()
    assert reconciler.at_rest(policy.Decision(status=done), quiet)
    assert not reconciler.at_rest(policy.Decision(status=running), quiet)
    # Clean-up still to carry out, a TTL still to wait for, the job to delete.
    assert not reconciler.at_rest(policy.Decision(status=done, delete_pods=(("worker", 0),)), quiet)
    assert not reconciler.at_rest(policy.Decision(status=done, requeue_after=60.0), quiet)
    assert not reconciler.at_rest(policy.Decision(status=done, delete_job=True), quiet)
    # Our last write not yet in the watched copy, or a refused create being retried.
    assert not reconciler.at_rest(policy.Decision(status=done), writes.Seen(known={}))
    assert not reconciler.at_rest(policy.Decision(status=done), writes.Seen(stale=True))
    assert not reconciler.at_rest(policy.Decision(status=done), writes.Seen(refusals=1))


def succeeded(name: str = "mnist", ttl: int | None = None) -> dict[str, Any]:
    raw = trainjob(name)
    raw["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    if ttl is not None:
        raw["spec"] = {"runPolicy": {"ttlSecondsAfterFinished": ttl}}
    return raw


def test_a_finished_job_with_no_child_left_is_parked_at_sight_without_a_reconcile() -> None:
    async def scenario() -> None:
        loop = Loop(finished())
        loop.controller.start()
        loop.controller.observe(None, succeeded())
        await asyncio.sleep(0.05)
        assert loop.calls == []  # nothing a reconcile could do
        assert KEY in loop.controller.known and loop.controller.bodies == {}
        assert loop.rt.begun == [KEY]  # counted as looked at (the watchdog, `trainjob_jobs`)
        assert loop.rt.metrics.states == {"uid-1": ("team-a", "Succeeded")}
        await loop.controller.close()

    run(scenario)


def test_a_finished_job_with_children_left_a_ttl_or_unlisted_children_is_reconciled() -> None:
    async def scenario() -> None:
        loop = Loop(finished())
        loop.rt.child_index.with_children.add(("team-a", "kept"))
        loop.controller.start()
        loop.controller.observe(None, succeeded("kept"))  # clean-up may be due
        loop.controller.observe(None, succeeded("ttl", ttl=60))  # its TTL is due later
        await settle(lambda: len(loop.calls) == 2)
        loop.rt.informer.listed.clear()  # children not listed yet: cannot tell
        loop.controller.observe(None, succeeded("early"))
        loop.rt.informer.listed.set()
        await settle(lambda: len(loop.calls) == 3)
        assert sorted(name for _, name in loop.called()) == ["early", "kept", "ttl"]
        await loop.controller.close()

    run(scenario)


def test_what_one_look_at_a_trainjob_tells() -> None:
    assert controller.finished_at_sight(succeeded()) == "Succeeded"
    failed = trainjob()
    failed["status"] = {"conditions": [{"type": "Failed", "status": "True", "reason": "X"}]}
    assert controller.finished_at_sight(failed) == "Failed"
    assert controller.finished_at_sight(trainjob()) is None  # no status yet
    assert controller.finished_at_sight(succeeded(ttl=0)) is None
    going = succeeded()
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert controller.finished_at_sight(going) is None


def test_each_kinds_loop_tells_the_watchdog_and_its_namesakes_of_its_jobs() -> None:
    async def scenario() -> None:
        loop = Loop(active(None))
        tfjobs = controller.Controller(
            cast(context.OperatorContext, loop.rt),
            reconcile=loop.controller._reconcile_job,
            kind="TFJob",
        )
        loop.rt.wakes.serve(tfjobs)
        first = {**trainjob(uid="uid-1"), "status": {"startTime": "2026-11-29T00:00:01Z"}}
        first["metadata"]["creationTimestamp"] = "2026-11-29T00:00:00Z"
        second = trainjob(uid="uid-2")
        second["metadata"]["creationTimestamp"] = "2026-11-29T00:00:09Z"
        loop.controller.observe(None, first)
        tfjobs.observe(None, second)
        assert loop.rt.watchdog.kinds[KEY] == {"TrainJob", "TFJob"}
        namesakes = loop.rt.wakes.namesakes(KEY)
        assert sorted((n.kind, n.uid, n.pending) for n in namesakes) == [
            ("TFJob", "uid-2", True),
            ("TrainJob", "uid-1", False),
        ]
        holder = children.name_holder(namesakes[1], namesakes)
        assert holder is not None and holder.uid == "uid-1"
        tfjobs.observe("DELETED", second)
        assert [n.kind for n in loop.rt.wakes.namesakes(KEY)] == ["TrainJob"]
        await tfjobs.close()
        await loop.controller.close()

    run(scenario)
