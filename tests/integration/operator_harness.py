"""Helpers for the operator tests: run the operator (tests/support/operator_process.py)
against the test control plane, create TrainJobs, and play the kubelet by patching Pod status.

There is no kubelet: test Pods name a scheduler that does not exist, so neither
kube-scheduler nor kwok touches them, and deleting one removes it at once (an unbound Pod
has no graceful termination). Every wait polls real state with a deadline.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Protocol, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.tools import REPO_ROOT, Tools, ToolsMissingError
from tests.support import kubelet, manifests, operator_process, waits

GROUP: Final = manifests.GROUP
VERSION: Final = manifests.VERSION
PLURAL: Final = "trainjobs"
JOB_LABEL: Final = "trainjob.dev/job-name"
NO_SCHEDULER: Final = "trainjob-test-no-scheduler"
TEST_IMAGE: Final = "example.com/trainjob:test"  # never pulled: no Pod here runs

Obj = dict[str, Any]


class HasMetadata(Protocol):
    """A kubernetes client model of an object: a Pod, a Service, a ConfigMap..."""

    @property
    def metadata(self) -> k8s.V1ObjectMeta | None: ...


def meta(obj: HasMetadata) -> k8s.V1ObjectMeta:
    """The metadata of an object the API server sent (it always has some)."""
    assert obj.metadata is not None
    return obj.metadata


def name_of(obj: HasMetadata) -> str:
    """The name of an object the API server sent (it always has one)."""
    name = meta(obj).name
    assert name is not None
    return str(name)  # typed Any by some kubernetes client releases


def uid_of(obj: HasMetadata) -> str:
    """The uid of an object the API server sent (it always has one)."""
    uid = meta(obj).uid
    assert uid is not None
    return str(uid)


def pod_spec(pod: k8s.V1Pod) -> k8s.V1PodSpec:
    """The spec of a Pod the API server sent (it always has one)."""
    assert pod.spec is not None
    return pod.spec


def pod_status(pod: k8s.V1Pod) -> k8s.V1PodStatus:
    """The status of a Pod the API server sent (it always has one, if only a phase)."""
    assert pod.status is not None
    return pod.status


def run_benchmark(
    script: str, *args: str, json_out: Path, timeout: float
) -> tuple[str, dict[str, Any]]:
    """Run bench/<script> with `args` (it writes its figures to `json_out`); fail the test
    with its output's tail unless it exits 0. Returns its stdout and its figures."""
    try:
        Tools.locate().require()
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / script), *args, f"--json={json_out}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    figures: dict[str, Any] = json.loads(json_out.read_text(encoding="utf-8"))
    return result.stdout, figures


@contextlib.contextmanager
def running_operator(
    kubeconfig: Path, log: Path, *args: str
) -> Iterator[operator_process.Operator]:
    operator = operator_process.Operator(kubeconfig, log, *args).start()
    try:
        yield operator
    finally:
        operator.stop()


def module_operator(
    kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    *args: str,
    timeout: float = 30.0,
) -> Iterator[operator_process.Operator]:
    """The operator of one test module, watching the namespaces its tests get (`<prefix>-*`:
    the namespace fixture names each after its test); for a module-scoped fixture."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(kubeconfig, log, f"--namespace={prefix}-*", *args).start()
    try:
        yield op.wait_serving(timeout)
    finally:
        op.stop()
        print(f"operator log: {log}\n{op.log_tail(30)}")


def module_cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str, prefix: str
) -> Iterator[Cluster]:
    """One test's namespace, served by the module's operator (see `module_operator`)."""
    assert namespace.startswith(f"{prefix}-"), namespace
    yield Cluster(api_client, namespace)
    # pytest shows this only when the test failed: what the operator was doing meanwhile.
    print(f"operator log, last lines:\n{operator.log_tail(25)}")


# -- TrainJobs --------------------------------------------------------------------------------


def container(**extra: Any) -> Obj:
    return manifests.container(TEST_IMAGE, **extra)


def template(**extra: Any) -> Obj:
    return {"spec": {"schedulerName": NO_SCHEDULER, "containers": [container()], **extra}}


def trainjob(
    name: str,
    *,
    chief: int = 1,
    workers: int = 2,
    ps: int = 0,
    restart_policy: str = "Never",
    run_policy: Obj | None = None,
    template_spec: Obj | None = None,
) -> Obj:
    tpl = template()
    if template_spec is not None:
        tpl = {"spec": {**tpl["spec"], **template_spec}}
    replica_specs = {
        rtype: manifests.replica(count, copy.deepcopy(tpl), restart_policy)
        for rtype, count in (("chief", chief), ("worker", workers), ("ps", ps))
        if count
    }
    return manifests.trainjob(name, replica_specs, run_policy)


class Cluster:
    """Thin test-side client for one namespace."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.namespace = namespace

    def create_job(self, body: Obj) -> Obj:
        # CustomObjectsApi's results are typed `object`: they are the JSON objects themselves
        return cast(
            Obj,
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body
            ),
        )

    def job(self, name: str) -> Obj | None:
        try:
            result = cast(
                Obj,
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def patch_job(self, name: str, patch: Obj) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, patch
        )

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def condition(self, name: str, ctype: str) -> Obj | None:
        job = self.job(name) or {}
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") == ctype and cond.get("status") == "True":
                result: Obj = cond
                return result
        return None

    def wait_condition(self, name: str, ctype: str, timeout: float = 30) -> Obj:
        try:
            return waits.wait_until(
                lambda: self.condition(name, ctype),
                timeout=timeout,
                what=f"TrainJob {name} condition {ctype}",
            )
        except waits.WaitTimeoutError as exc:
            job = self.job(name) or {}
            raise waits.WaitTimeoutError(f"{exc}; status: {job.get('status')}") from None

    def pods(self, job: str | None = None) -> dict[str, k8s.V1Pod]:
        selector = f"{JOB_LABEL}={job}" if job else JOB_LABEL
        items = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return {name_of(p): p for p in items}

    def services(self, job: str | None = None) -> dict[str, k8s.V1Service]:
        selector = f"{JOB_LABEL}={job}" if job else JOB_LABEL
        items = self.core.list_namespaced_service(self.namespace, label_selector=selector).items
        return {name_of(s): s for s in items}

    def pod(self, name: str) -> k8s.V1Pod | None:
        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def wait_pods(self, job: str, names: set[str], timeout: float = 30) -> dict[str, k8s.V1Pod]:
        def probe() -> dict[str, k8s.V1Pod] | None:
            pods = self.pods(job)
            return pods if set(pods) == names else None

        return waits.wait_until(probe, timeout=timeout, what=f"pods {sorted(names)} of {job}")

    def events(self, name: str) -> list[k8s.CoreV1Event]:
        items: list[k8s.CoreV1Event] = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return items

    # -- playing the kubelet ----------------------------------------------------------------

    def set_running(self, pod: str) -> None:
        now = kubelet.now()
        status = kubelet.pod_status("Running", kubelet.running(TEST_IMAGE, now), startTime=now)
        self.core.patch_namespaced_pod_status(pod, self.namespace, status)

    def set_exited(self, pod: str, exit_code: int, reason: str | None = None) -> None:
        container = kubelet.exited(TEST_IMAGE, exit_code, kubelet.now(), reason)
        status = kubelet.pod_status(kubelet.exit_phase(exit_code), container)
        self.core.patch_namespaced_pod_status(pod, self.namespace, status)

    def run_all(self, job: str, names: set[str]) -> None:
        for name in sorted(self.wait_pods(job, names)):
            self.set_running(name)


def attempt(pod: k8s.V1Pod) -> int:
    return int((meta(pod).annotations or {}).get("trainjob.dev/attempt", "0"))


def env_of(pod: k8s.V1Pod) -> dict[str, str | None]:
    tf = next(c for c in pod_spec(pod).containers if c.name == "tensorflow")
    return {e.name: e.value for e in tf.env or []}
