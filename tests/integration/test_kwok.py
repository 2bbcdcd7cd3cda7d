"""kwok drives TrainJob-labelled pods on fake nodes: kube-scheduler binds them, kwok's stages
(tests/controlplane/kwok/kwok.yaml) move them Pending -> Running -> Succeeded/Failed with the
exit code from the annotation trainjob.dev/kwok-exit-code."""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Any, Final

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from tests.controlplane.cluster import Component
from tests.support import waits

pytestmark = pytest.mark.integration

EXIT_CODE: Final = "trainjob.dev/kwok-exit-code"
TERMINAL: Final = ("Succeeded", "Failed")


def trainjob_pod(name: str, exit_code: str | None) -> k8s.V1Pod:
    annotations = {EXIT_CODE: exit_code} if exit_code is not None else {}
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "labels": {
                "trainjob.dev/job-name": "kwok-job",
                "trainjob.dev/replica-type": "worker",
                "trainjob.dev/replica-index": name.rsplit("-", 1)[-1],
            },
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "tensorflow", "image": "registry.example/never-pulled:1"}],
        },
    }
    pod = k8s.V1Pod.from_dict(body)
    assert pod is not None
    return pod


def phase(pod: k8s.V1Pod) -> str:
    return str(pod.status.phase) if pod.status is not None and pod.status.phase else "Pending"


def container_state(pod: k8s.V1Pod) -> k8s.V1ContainerState:
    assert pod.status is not None
    statuses = pod.status.container_statuses or []
    assert len(statuses) == 1, statuses
    state = statuses[0].state
    assert state is not None
    return state


def node_name(pod: k8s.V1Pod) -> str:
    return str(pod.spec.node_name) if pod.spec is not None else ""


def pod_names(core_v1: k8s.CoreV1Api, namespace: str) -> set[str]:
    items = core_v1.list_namespaced_pod(namespace).items
    return {str(p.metadata.name) for p in items if p.metadata is not None}


def follow_phases(
    core_v1: k8s.CoreV1Api, namespace: str, names: set[str], since: str
) -> dict[str, list[str]]:
    """Watch the pods from resourceVersion ``since`` (every update, not samples) until each is
    terminal; return their phase histories."""
    history: dict[str, list[str]] = {n: [] for n in names}
    stream = watch.Watch()
    events = stream.stream(
        core_v1.list_namespaced_pod, namespace, resource_version=since, timeout_seconds=60
    )
    for event in events:
        pod = event["object"]
        name = pod.metadata.name if pod.metadata is not None else None
        if name not in history:
            continue
        now = phase(pod)
        if not history[name] or history[name][-1] != now:
            history[name].append(now)
        if all(h and h[-1] in TERMINAL for h in history.values()):
            stream.stop()
            break
    unfinished = {n: h for n, h in history.items() if not h or h[-1] not in TERMINAL}
    assert not unfinished, f"pods not terminal within 60s: {unfinished}"
    return history


def terminated_exit_code(pod: k8s.V1Pod) -> int:
    terminated = container_state(pod).terminated
    assert terminated is not None, container_state(pod)
    return int(terminated.exit_code)


def test_kwok_runs_trainjob_pods_to_the_annotated_exit_code(
    kwok: Component, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    names = {"kwok-worker-0": "0", "kwok-worker-1": "3", "kwok-worker-2": "137"}
    listed = core_v1.list_namespaced_pod(namespace)
    assert listed.metadata is not None and listed.metadata.resource_version
    since = listed.metadata.resource_version
    for name, code in names.items():
        core_v1.create_namespaced_pod(namespace, trainjob_pod(name, code))
    core_v1.create_namespaced_pod(namespace, trainjob_pod("kwok-worker-9", None))

    history = follow_phases(core_v1, namespace, set(names), since)

    for name, code in names.items():
        phases = history[name]
        assert "Running" in phases, f"{name}: {phases}"
        assert phases.index("Running") < len(phases) - 1, f"{name}: {phases}"
        pod = core_v1.read_namespaced_pod(name, namespace)
        assert node_name(pod) in ("kwok-node-0", "kwok-node-1")  # bound by kube-scheduler
        assert pod.status is not None
        assert pod.status.pod_ip, "kwok assigns a pod IP"
        assert phase(pod) == ("Succeeded" if code == "0" else "Failed")
        assert terminated_exit_code(pod) == int(code)

    # Without an exit-code annotation the pod keeps running (a ps replica, say): it started
    # no later than the others, which completed after kwok's default 500ms run time.
    def running() -> bool:
        return phase(core_v1.read_namespaced_pod("kwok-worker-9", namespace)) == "Running"

    waits.wait_until(running, timeout=30, what="kwok-worker-9 to run")
    lingering = core_v1.read_namespaced_pod("kwok-worker-9", namespace)
    assert container_state(lingering).terminated is None
    assert kwok.running()

    # Deleting a pod on a fake node completes (kwok plays the kubelet's part).
    core_v1.delete_namespaced_pod("kwok-worker-9", namespace)

    def deleted() -> bool:
        return "kwok-worker-9" not in pod_names(core_v1, namespace)

    waits.wait_until(deleted, timeout=30, what="kwok to finish deleting kwok-worker-9")


def test_kwok_acts_on_the_pod_it_saw_not_a_newer_one_of_the_same_name(
    kwok: Component, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """A replica restarted under the same name (the operator's restarts, a StatefulSet's) is a
    new pod: the deletion kwok plays for the old one must not take it, as the kubelet deletes
    only the pod of its uid. Here a pod runs to Succeeded, is deleted (at once: it is terminal)
    and is replaced under its name straight away, many times over, on several names at once
    so that kwok has events queued; every replacement must run to Succeeded in its turn.
    Before kwok was patched (install.sh, KWOK_PATCH), 4 of the 8 names lost a replacement."""
    names = [f"kwok-again-{i}" for i in range(8)]
    rounds = 12
    taken: list[str] = []

    def create(name: str) -> str | None:
        """The new pod's uid; None while the old one is still there."""
        try:
            created = core_v1.create_namespaced_pod(namespace, trainjob_pod(name, "0"))
        except k8s.ApiException as exc:
            if exc.status == 409:
                return None
            raise
        assert created.metadata is not None
        return str(created.metadata.uid)

    def fate(name: str, uid: str) -> str | None:
        """`ok` once the pod of `uid` has Succeeded; what became of it if anything else did."""
        try:
            pod = core_v1.read_namespaced_pod(name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return "gone"
            raise
        assert pod.metadata is not None
        if str(pod.metadata.uid) != uid:
            return "replaced"
        if pod.metadata.deletion_timestamp is not None:
            return "deleting"
        return "ok" if phase(pod) == "Succeeded" else None

    def replace_repeatedly(name: str) -> None:
        for round_ in range(rounds):
            what = f"{name} #{round_}"
            uid = waits.wait_until(
                functools.partial(create, name), timeout=30, what=f"{what} created"
            )
            outcome = waits.wait_until(
                functools.partial(fate, name, uid), timeout=30, what=f"{what} to succeed"
            )
            if outcome != "ok":
                taken.append(f"{what}: {outcome} before it ran to its end")
                return
            # Terminal: the API server removes it at once, and its name is free again.
            preconditions = k8s.V1Preconditions(uid=uid)
            core_v1.delete_namespaced_pod(
                name, namespace, body=k8s.V1DeleteOptions(preconditions=preconditions)
            )

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        for future in [pool.submit(replace_repeatedly, name) for name in names]:
            future.result()
    assert not taken, taken
    assert kwok.running()
