"""An operator killed between two API calls of a reconcile leaves nothing the next operator
misreads: each test SIGKILLs the operator right after a chosen API call (its test hook
TRAINJOB_TEST_CRASH_AFTER, a real SIGKILL of the process), then starts a fresh one and checks
the job's outcome. Each failed before the decision was recorded ahead of the actions:

- clean-up before the verdict: Pods deleted under cleanPodPolicy All before Succeeded was
  written, so the next operator read the missing Pods as deleted and re-ran the job;
- a restart not counted: the replacement Pod created before the status write that counts the
  restart, so the next operator adopted it with restartCount 0 and no Restarting Event;
- a lost Event: Events posted after the status write, so the Created Event never came.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.integration.operator_harness import Cluster, attempt, meta, trainjob
from tests.support import operator_process, waits
from tests.support.processes import all_threads_stopped

pytestmark = pytest.mark.integration

T = 30.0


@pytest.fixture
def cluster(api_client: k8s.ApiClient, namespace: str) -> Cluster:
    return Cluster(api_client, namespace)


class Operators:
    """Operators started one after another on the test's namespace, each logging to a file."""

    def __init__(self, kubeconfig: Path, logs: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.logs = logs
        self.namespace = namespace
        self.started: list[operator_process.Operator] = []

    def start(self, crash_after: str | None = None) -> operator_process.Operator:
        env = {"TRAINJOB_TEST_CRASH_AFTER": crash_after} if crash_after else {}
        log = self.logs / f"operator-{len(self.started)}.log"
        operator = operator_process.Operator(
            self.kubeconfig, log, f"--namespace={self.namespace}", env=env
        ).start()
        self.started.append(operator)
        return operator

    def tails(self) -> str:
        return "\n".join(f"--- {op.log}\n{op.log_tail(25)}" for op in self.started)

    def stop_all(self) -> None:
        for operator in self.started:
            operator.stop()


@pytest.fixture
def operators(kubeconfig: Path, tmp_path: Path, namespace: str) -> Iterator[Operators]:
    ops = Operators(kubeconfig, tmp_path, namespace)
    try:
        yield ops
    finally:
        ops.stop_all()
        print(ops.tails())


def crashed(operator: operator_process.Operator) -> None:
    """Wait until the operator has killed itself at its crash point."""
    waits.wait_until(lambda: not operator.running(), timeout=T, what="the operator's crash")
    assert operator.process is not None and operator.process.returncode == -9, operator.log_tail()


def running_job(cluster: Cluster, operators: Operators, body: dict[str, Any]) -> str:
    """A job whose Pods all run, then no operator."""
    name = str(body["metadata"]["name"])
    operator = operators.start()
    cluster.create_job(body)
    replicas = body["spec"]["replicaSpecs"]
    names = {
        f"{name}-{rtype}-{i}" for rtype, group in replicas.items() for i in range(group["replicas"])
    }
    cluster.run_all(name, names)
    cluster.wait_condition(name, "Running")
    operator.stop()
    return name


def test_a_crash_during_clean_up_never_re_runs_a_succeeded_job(
    cluster: Cluster, operators: Operators
) -> None:
    name = running_job(
        cluster,
        operators,
        trainjob(
            "done",
            chief=1,
            workers=1,
            restart_policy="ExitCode",
            run_policy={"cleanPodPolicy": "All"},
        ),
    )
    crashing = operators.start(crash_after="DELETE /pods/ 1")
    cluster.set_exited("done-chief-0", 0)
    crashed(crashing)
    operators.start()
    cluster.wait_condition(name, "Succeeded")
    waits.wait_until(lambda: not cluster.pods(name), timeout=T, what="the job's Pods deleted")
    job = cluster.job(name) or {}
    assert job["status"]["restartCount"] == 0, job["status"]
    assert not cluster.condition(name, "Restarting"), job["status"]
    # No Pod of a new attempt ever appears (a re-run would create attempt 1 at once).
    with pytest.raises(waits.WaitTimeoutError):
        waits.wait_until(lambda: cluster.pods(name), timeout=3, what="a re-run's Pods")


def test_a_crash_right_after_creating_a_replacement_still_counts_the_restart(
    cluster: Cluster, operators: Operators
) -> None:
    name = running_job(cluster, operators, trainjob("lost", chief=0, workers=2))
    crashing = operators.start(crash_after="POST /pods 1")
    cluster.core.delete_namespaced_pod("lost-worker-1", cluster.namespace)
    crashed(crashing)
    operators.start()

    def both_on_attempt_one() -> bool:
        pods = cluster.pods(name)
        return set(pods) == {"lost-worker-0", "lost-worker-1"} and all(
            attempt(pod) == 1 and not meta(pod).deletion_timestamp for pod in pods.values()
        )

    waits.wait_until(both_on_attempt_one, timeout=T, what="both workers on attempt 1")
    job = cluster.job(name) or {}
    assert job["status"]["restartCount"] == 1, job["status"]
    reasons = [event.reason for event in cluster.events(name)]
    assert reasons.count("Restarting") == 1, reasons


def test_a_crash_right_after_the_first_status_write_loses_no_event(
    cluster: Cluster, operators: Operators
) -> None:
    crashing = operators.start(crash_after="PATCH /status 1")
    cluster.create_job(trainjob("fresh", chief=1, workers=1))
    crashed(crashing)
    operators.start()
    cluster.wait_pods("fresh", {"fresh-chief-0", "fresh-worker-0"})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # give a duplicate the chance to show up
        reasons = [event.reason for event in cluster.events("fresh")]
        if reasons.count("Created") > 1:
            break
        time.sleep(0.5)
    assert reasons.count("Created") == 1, reasons


def test_an_event_posted_for_a_decision_never_recorded_is_not_posted_again(
    cluster: Cluster, operators: Operators
) -> None:
    """The operator dies after posting the Created Event, before writing the status that
    records it; then the job changes (any write moves its resourceVersion: here a label, in
    the wild kopf's own finalizer racing the first status write). The next decision is the
    same transition from the same status: it posts the same Event name (409), not a second
    Created."""
    crashing = operators.start(crash_after="POST /events 1")
    cluster.create_job(trainjob("noted", chief=1, workers=1))
    crashed(crashing)
    cluster.patch_job("noted", {"metadata": {"labels": {"touched": "yes"}}})
    operators.start()
    cluster.wait_pods("noted", {"noted-chief-0", "noted-worker-0"})
    cluster.wait_condition("noted", "Created")
    reasons = [event.reason for event in cluster.events("noted")]
    assert reasons.count("Created") == 1, reasons


def test_a_restart_decided_again_from_what_changed_since_posts_one_restarting_event(
    cluster: Cluster, operators: Operators
) -> None:
    """The operator dies after posting the Restarting Event of worker 0's failure ("Restarting
    worker 0, worker 1"), before writing the status that counts the restart; then worker 1
    succeeds. The next operator decides the same restart from the same status, but now leaves
    the succeeded worker 1 alone ("Restarting worker 0"): other words, the same transition.
    Named after its words, it was a second Restarting Event for one restart (seen in the
    chaos storm: c007, 2 Restarting Events, restartCount 1). It is the same Event, told in
    the words of the decision that was recorded."""
    name = running_job(
        cluster, operators, trainjob("twice", chief=0, workers=2, restart_policy="ExitCode")
    )
    crashing = operators.start(crash_after="POST /events 1")
    cluster.set_exited("twice-worker-0", 137)
    crashed(crashing)
    told = [str(e.message) for e in cluster.events(name) if e.reason == "Restarting"]
    assert len(told) == 1 and "worker 1" in told[0], told
    cluster.set_exited("twice-worker-1", 0)
    operators.start()
    waits.wait_until(
        lambda: (cluster.job(name) or {}).get("status", {}).get("restartCount") == 1,
        timeout=T,
        what="the restart counted",
    )
    restarting = [e for e in cluster.events(name) if e.reason == "Restarting"]
    recorded = told[0].replace("worker 0, worker 1", "worker 0")
    story = [(e.metadata.name, e.message) for e in restarting]
    assert [e.message for e in restarting] == [recorded], story


def stopped(operator: operator_process.Operator) -> None:
    """Wait until the operator has paused itself (SIGSTOP) at its chosen point."""

    assert operator.process is not None
    pid = operator.process.pid
    waits.wait_until(lambda: all_threads_stopped(pid), timeout=T, what="the operator's pause")


def test_the_events_of_a_superseded_decision_are_withdrawn(
    cluster: Cluster, operators: Operators
) -> None:
    """A worker fails; the operator posts the Restarting Event, then pauses before writing
    the status that counts the restart; meanwhile the job is suspended. Its status write
    conflicts, so the restart it decided never happened: decided again, the job is suspended
    (restartCount 0), and the Restarting Event is withdrawn instead of telling of a restart
    that no status ever counted."""
    name = running_job(
        cluster, operators, trainjob("late", chief=0, workers=2, restart_policy="OnFailure")
    )
    paused = operators.start(crash_after="POST /events 1 SIGSTOP")
    cluster.set_exited("late-worker-1", 137)
    stopped(paused)
    cluster.patch_job(name, {"spec": {"runPolicy": {"suspend": True}}})
    assert paused.process is not None
    paused.process.send_signal(signal.SIGCONT)
    cluster.wait_condition(name, "Suspended")
    waits.wait_until(
        lambda: not [e for e in cluster.events(name) if e.reason == "Restarting"],
        timeout=T,
        what="the superseded Restarting Event withdrawn",
    )
    job = cluster.job(name) or {}
    assert job["status"]["restartCount"] == 0, job["status"]
