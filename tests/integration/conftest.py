"""Fixtures of the integration tier: a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; kwok on demand), started once per session.

The binaries come from ``bash tests/controlplane/install.sh``; when they are missing the
session fails (it never skips) with a message naming that command.

Environment:
  TRAINJOB_TOOLS_DIR   where install.sh cached the binaries (default ~/.cache/trainjob-tools)
  TRAINJOB_CP_WORKDIR  keep the control plane's state and logs there (e.g. a CI artifact dir)
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tests.controlplane import trainer
from tests.controlplane.cluster import Component, ControlPlane, ControlPlaneError
from tests.controlplane.gang import GangScheduler, start_gang_scheduler
from tests.controlplane.kueue import EXTERNAL_FRAMEWORK, KUEUE_GROUP, Kueue, start_kueue
from tests.controlplane.tools import REPO_ROOT, Tools, ToolsMissingError
from tests.integration.kueue_harness import KUEUE_PODS_READY_TIMEOUT
from tests.support import waits

CRD_DIR = REPO_ROOT / "crds"
# Kubeflow's TFJob CRD (v1.9.4, verbatim): applied by the tests that serve TFJobs.
TFJOB_CRD = CRD_DIR / "kubeflow" / "kubeflow.org_tfjobs.yaml"


def started_control_plane(
    apiserver_flags: Sequence[str] = (),
) -> Generator[ControlPlane, None, None]:
    """A control plane with crds/ applied and Established, stopped after use; a missing
    tool or a failed start fails the test with one line. Tests that break their control
    plane on purpose (chaos, watch loss) start their own with this."""
    try:
        tools = Tools.locate().require()
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    workdir_env = os.environ.get("TRAINJOB_CP_WORKDIR")
    workdir = Path(workdir_env) / f"cp-{uuid.uuid4().hex[:8]}" if workdir_env else None
    plane = ControlPlane(
        tools=tools,
        workdir=workdir,
        crds=sorted(CRD_DIR.glob("*.yaml")),
        apiserver_flags=apiserver_flags,
    )
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"the test control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's control plane, with crds/ applied and Established, and Kubeflow
    Trainer's CRDs and torch runtime beside them: every test here runs with both TrainJob
    kinds served, as on a cluster that also runs Trainer (test_trainer_coexistence.py)."""
    for plane in started_control_plane():
        try:
            plane.apply_crds(trainer.crd_files())
            plane.kubectl("apply", "--server-side", "-f", trainer.runtime_file())
        except (ControlPlaneError, ToolsMissingError) as exc:
            pytest.fail(f"Kubeflow Trainer's CRDs were not applied: {exc}", pytrace=False)
        yield plane


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    """Admin kubeconfig of the session's control plane (kubectl, kopf, kubernetes client)."""
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def kwok(control_plane: ControlPlane) -> Component:
    """kwok running against the control plane, with the fake nodes Ready."""
    try:
        return control_plane.start_kwok()
    except ControlPlaneError as exc:
        pytest.fail(f"kwok did not start: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kueue(control_plane: ControlPlane) -> Iterator[Kueue]:
    """The real Kueue controller against the session's control plane, its CRDs applied and
    its webhooks registered (started by the first test that needs it)."""
    # Kueue's own TFJob integration too (kubeflow.org/tfjob, its webhooks), against our
    # operator's --tfjob (test_kueue_tfjob.py): it needs only the TFJob CRD.
    control_plane.apply_crds([TFJOB_CRD])
    # And its Kubeflow Trainer integration (trainer.kubeflow.org/trainjob), beside ours.
    integrations = {
        "frameworks": ["batch/job", "kubeflow.org/tfjob", trainer.KUEUE_FRAMEWORK],
        "externalFrameworks": [EXTERNAL_FRAMEWORK],
    }
    try:
        controller = start_kueue(
            control_plane,
            pods_ready_timeout=f"{KUEUE_PODS_READY_TIMEOUT}s",
            extra_config={"integrations": integrations},
            webhook_groups=(KUEUE_GROUP, "kubeflow.org", trainer.GROUP),
        )
    except (ControlPlaneError, ToolsMissingError) as exc:
        pytest.fail(f"Kueue did not start: {exc}", pytrace=False)
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture(scope="session")
def gang_scheduler(control_plane: ControlPlane) -> Iterator[GangScheduler]:
    """scheduler-plugins' Coscheduling as a second scheduler against the session's control
    plane, its PodGroup CRDs applied (started by the first test that needs it)."""
    try:
        scheduler = start_gang_scheduler(control_plane, backoff_seconds=1)
    except (ControlPlaneError, ToolsMissingError) as exc:
        pytest.fail(f"the gang scheduler did not start: {exc}", pytrace=False)
    try:
        yield scheduler
    finally:
        scheduler.stop()


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[k8s.ApiClient]:
    """A kubernetes-client ApiClient authenticated as the admin."""
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def core_v1(api_client: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom_objects(api_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api_client)


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"{base or 't'}-{uuid.uuid4().hex[:6]}"


def create_namespace(core_v1: k8s.CoreV1Api, name: str) -> None:
    """Create the namespace `name` and wait until its default service account exists."""
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))

    def has_default_service_account() -> bool:
        try:
            core_v1.read_namespaced_service_account("default", name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    waits.wait_until(
        has_default_service_account,
        timeout=60,
        what=f"the serviceaccount controller to create {name}/default",
        interval=0.05,
    )


@pytest.fixture
def namespace(core_v1: k8s.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (its default service account exists); deleted afterwards."""
    name = _namespace_name(request.node.name)
    create_namespace(core_v1, name)
    try:
        yield name
    finally:
        # Not waited on: the namespace controller finishes it in the background.
        core_v1.delete_namespace(name)
