"""Kubeflow's TFJob served by our operator (`--tfjob`) on a real API server with the v1.9.4
TFJob CRD, Pods driven by patching their status like a kubelet: the Pods, Services and status
a client of training-operator reads, a spec never written, and the TFJobs that are not ours
left alone."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import HERE as CONTROLPLANE
from tests.controlplane.tools import INSTALL_COMMAND, REPO_ROOT, go_mod_version, tools_dir
from tests.integration.operator_harness import (
    NO_SCHEDULER,
    TEST_IMAGE,
    Cluster,
    env_of,
    meta,
    module_cluster,
    module_operator,
    pod_spec,
)
from tests.support import manifests, operator_process, waits
from trainjob.core import tfjob

pytestmark = pytest.mark.integration

T = 30.0
TFJOB_CRD = REPO_ROOT / "crds/kubeflow/kubeflow.org_tfjobs.yaml"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    control_plane.apply_crds([TFJOB_CRD])
    yield from module_operator(kubeconfig, tmp_path_factory, "test-a-tfjob", "--tfjob", timeout=T)


class TFJobs(Cluster):
    """The harness's Cluster, for TFJobs."""

    def create_job(self, body: Obj) -> Obj:
        return cast(
            Obj,
            self.custom.create_namespaced_custom_object(
                tfjob.GROUP, tfjob.VERSION, self.namespace, tfjob.PLURAL, body
            ),
        )

    def job(self, name: str) -> Obj | None:
        try:
            return cast(
                Obj,
                self.custom.get_namespaced_custom_object(
                    tfjob.GROUP, tfjob.VERSION, self.namespace, tfjob.PLURAL, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_job(self, name: str, patch: Obj) -> None:
        self.custom.patch_namespaced_custom_object(
            tfjob.GROUP, tfjob.VERSION, self.namespace, tfjob.PLURAL, name, patch
        )

    def conditions(self, name: str) -> list[tuple[str, str, str]]:
        status = (self.job(name) or {}).get("status") or {}
        return [(c["type"], c["status"], c["reason"]) for c in status.get("conditions") or []]

    def wait_conditions(self, name: str, wanted: list[tuple[str, str, str]]) -> None:
        try:
            waits.wait_until(
                lambda: self.conditions(name) == wanted, timeout=T, what=f"{name}: {wanted}"
            )
        except waits.WaitTimeoutError as exc:
            raise waits.WaitTimeoutError(f"{exc}; have {self.conditions(name)}") from None


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[TFJobs]:
    for plain in module_cluster(operator, api_client, namespace, "test-a-tfjob"):
        yield TFJobs(api_client, plain.namespace)


def a_tfjob(name: str, replicas: dict[str, int], run_policy: Obj | None = None, **spec: Any) -> Obj:
    template = {
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [manifests.container(TEST_IMAGE, command=["python", "train.py"])],
        }
    }
    body: Obj = {
        "apiVersion": tfjob.API_VERSION,
        "kind": tfjob.KIND,
        "metadata": {"name": name},
        "spec": {
            "tfReplicaSpecs": {
                rtype: {
                    "replicas": count,
                    "restartPolicy": "Never",
                    "template": copy.deepcopy(template),
                }
                for rtype, count in replicas.items()
            },
            **spec,
        },
    }
    if run_policy is not None:
        body["spec"]["runPolicy"] = run_policy
    return body


def kubeflow_pods(cluster: TFJobs, job: str) -> dict[str, k8s.V1Pod]:
    items = cluster.core.list_namespaced_pod(
        cluster.namespace, label_selector=f"{tfjob.LABEL_JOB_NAME}={job}"
    ).items
    return {meta(p).name or "": p for p in items}


def test_a_tfjob_runs_with_kubeflows_pods_and_status_and_its_spec_is_never_written(
    cluster: TFJobs,
) -> None:
    created = cluster.create_job(a_tfjob("mnist", {"Worker": 2, "PS": 1}))
    names = {"mnist-worker-0", "mnist-worker-1", "mnist-ps-0"}
    waits.wait_until(lambda: set(kubeflow_pods(cluster, "mnist")) == names, timeout=T, what="pods")
    cluster.wait_conditions("mnist", [("Created", "True", "TFJobCreated")])
    pods = kubeflow_pods(cluster, "mnist")
    worker0 = pods["mnist-worker-0"]
    labels = meta(worker0).labels or {}
    assert labels[tfjob.LABEL_JOB_ROLE] == "master"
    assert labels[tfjob.LABEL_OPERATOR_NAME] == "tfjob-controller"
    assert tfjob.LABEL_JOB_ROLE not in (meta(pods["mnist-ps-0"]).labels or {})
    (owner,) = meta(worker0).owner_references or []
    assert (owner.kind, owner.api_version, owner.uid, owner.controller) == (
        "TFJob",
        "kubeflow.org/v1",
        created["metadata"]["uid"],
        True,
    )
    tf_config = json.loads(env_of(worker0)["TF_CONFIG"] or "")
    assert tf_config["task"] == {"type": "worker", "index": 0}
    security = pod_spec(worker0).security_context
    assert security is None or security.seccomp_profile is None  # none of our defaults
    services = cluster.core.list_namespaced_service(
        cluster.namespace, label_selector=f"{tfjob.LABEL_JOB_NAME}=mnist"
    ).items
    assert {meta(s).name for s in services} == names

    for name in sorted(names):
        cluster.set_running(name)
    cluster.wait_conditions(
        "mnist", [("Created", "True", "TFJobCreated"), ("Running", "True", "TFJobRunning")]
    )
    waits.wait_until(
        lambda: (
            (cluster.job("mnist") or {}).get("status", {}).get("replicaStatuses")
            == {"Worker": {"active": 2}, "PS": {"active": 1}}
        ),
        timeout=T,
        what="replicaStatuses counted from Running Pods",
    )
    cluster.set_exited("mnist-worker-0", 0)
    cluster.wait_conditions(
        "mnist",
        [
            ("Created", "True", "TFJobCreated"),
            ("Running", "False", "TFJobRunning"),
            ("Succeeded", "True", "TFJobSucceeded"),
        ],
    )
    job = cluster.job("mnist") or {}
    assert job["spec"] == created["spec"], "the TFJob's spec was written"
    assert set(job["status"]) == {"conditions", "replicaStatuses", "startTime", "completionTime"}
    # cleanPodPolicy None (TFJob's default): the PS and worker 1 are left running.
    assert set(kubeflow_pods(cluster, "mnist")) == names
    events = [(e.involved_object.kind, e.reason) for e in cluster.events("mnist")]
    assert ("TFJob", "TFJobSucceeded") in events, events


def test_a_tfjob_created_suspended_waits_then_resumes(cluster: TFJobs) -> None:
    cluster.create_job(a_tfjob("later", {"Worker": 1}, run_policy={"suspend": True}))
    cluster.wait_conditions(
        "later",
        [("Created", "True", "TFJobCreated"), ("Suspended", "True", "TFJobSuspended")],
    )
    job = cluster.job("later") or {}
    assert "startTime" not in job["status"]
    assert kubeflow_pods(cluster, "later") == {}
    cluster.patch_job("later", {"spec": {"runPolicy": {"suspend": False}}})
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "later")) == {"later-worker-0"}, timeout=T, what="pod"
    )
    cluster.wait_conditions(
        "later",
        [("Created", "True", "TFJobCreated"), ("Suspended", "False", "TFJobResumed")],
    )
    # A single replica: no TF_CONFIG, as training-operator.
    assert "TF_CONFIG" not in env_of(kubeflow_pods(cluster, "later")["later-worker-0"])


@pytest.mark.parametrize("managed_by", [tfjob.MULTIKUEUE, "example.com/another-controller"])
def test_a_tfjob_of_another_controller_is_left_alone(cluster: TFJobs, managed_by: str) -> None:
    cluster.create_job(a_tfjob("theirs", {"Worker": 1}, run_policy={"managedBy": managed_by}))
    cluster.create_job(a_tfjob("ours", {"Worker": 1}))
    cluster.wait_conditions("ours", [("Created", "True", "TFJobCreated")])
    job = cluster.job("theirs") or {}
    assert "status" not in job and tfjob.ANNOTATION_ENGINE_STATUS not in (
        job["metadata"].get("annotations") or {}
    )
    assert kubeflow_pods(cluster, "theirs") == {}


def test_a_tfjob_its_webhook_would_refuse_fails_naming_the_field(cluster: TFJobs) -> None:
    body = a_tfjob("bad", {"Worker": 1})
    body["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    cluster.create_job(body)
    cluster.wait_conditions(
        "bad", [("Created", "True", "TFJobCreated"), ("Failed", "True", "TFJobFailed")]
    )
    message = ((cluster.job("bad") or {})["status"]["conditions"][-1])["message"]
    assert "spec.tfReplicaSpecs[Worker].template.spec.containers" in message, message
    assert "no container named tensorflow" in message, message
    assert kubeflow_pods(cluster, "bad") == {}


def test_a_tfjob_finished_is_deleted_after_its_ttl(cluster: TFJobs) -> None:
    cluster.create_job(a_tfjob("brief", {"Worker": 1}, run_policy={"ttlSecondsAfterFinished": 1}))
    waits.wait_until(
        lambda: set(kubeflow_pods(cluster, "brief")) == {"brief-worker-0"}, timeout=T, what="pod"
    )
    cluster.set_exited("brief-worker-0", 0)
    waits.wait_until(lambda: cluster.job("brief") is None, timeout=T, what="TTL deletion")


VALIDATION = REPO_ROOT / "operator/trainjob_operator/deploy/tfjob-validation.yaml"


@pytest.fixture
def validation(control_plane: ControlPlane) -> Iterator[None]:
    """The chart's ValidatingAdmissionPolicy for TFJobs (tfjob.validate), for one test: it
    applies to every namespace."""
    control_plane.kubectl("apply", "-f", str(VALIDATION))
    try:
        yield
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(VALIDATION))


def refusal(cluster: TFJobs, body: Obj) -> str | None:
    """The API server's words refusing `body` (None: created, and deleted again)."""
    try:
        cluster.create_job(body)
    except ApiException as exc:
        assert exc.status == 422, exc
        return str(json.loads(str(exc.body))["message"])
    cluster.custom.delete_namespaced_custom_object(
        tfjob.GROUP, tfjob.VERSION, cluster.namespace, tfjob.PLURAL, body["metadata"]["name"]
    )
    return None


def test_a_tfjob_its_webhook_would_refuse_is_refused_at_the_api_server(
    cluster: TFJobs, validation: None
) -> None:
    no_tensorflow = a_tfjob("bad", {"Worker": 1, "PS": 1})
    no_tensorflow["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["name"] = (
        "main"
    )
    # The policy takes effect once the API server has loaded it (its own informer).
    words = waits.wait_until(
        lambda: refusal(cluster, no_tensorflow), timeout=T, what="the policy in effect"
    )
    assert "There is no container named tensorflow in PS" in words, words
    two_chiefs = a_tfjob("bad", {"Chief": 1, "Master": 1})
    assert "must not have more than 1 Chief or Master" in (refusal(cluster, two_chiefs) or "")
    theirs = a_tfjob("bad", {"Worker": 1}, run_policy={"managedBy": "example.com/x"})
    assert 'spec.runPolicy.managedBy: Unsupported value: "example.com/x"' in (
        refusal(cluster, theirs) or ""
    )
    ours = a_tfjob("good", {"Worker": 1}, run_policy={"managedBy": tfjob.OURS})
    cluster.create_job(ours)
    with pytest.raises(ApiException) as changed:
        cluster.patch_job("good", {"spec": {"runPolicy": {"managedBy": tfjob.TRAINING_OPERATOR}}})
    assert "field is immutable" in json.loads(str(changed.value.body))["message"]
    # Kueue unsuspends by an update: a valid TFJob's updates pass.
    cluster.patch_job("good", {"spec": {"runPolicy": {"suspend": True}}})


def test_takeover_of_a_running_tfjob_adopts_the_pods_training_operator_made(
    control_plane: ControlPlane,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A TFJob running under training-operator when it is replaced: its Pods and Services
    (training-operator's labels only) are the job's, none is made twice, and the job goes on
    to its end from the status training-operator left."""
    control_plane.apply_crds([TFJOB_CRD])
    cluster = TFJobs(api_client, namespace)
    created = cluster.create_job(a_tfjob("legacy", {"Worker": 2}))
    owner = {
        "apiVersion": tfjob.API_VERSION,
        "kind": tfjob.KIND,
        "name": "legacy",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    template = created["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    for index in range(2):
        labels = {
            tfjob.LABEL_OPERATOR_NAME: tfjob.OPERATOR_NAME,
            tfjob.LABEL_JOB_NAME: "legacy",
            tfjob.LABEL_REPLICA_TYPE: "worker",
            tfjob.LABEL_REPLICA_INDEX: str(index),
            **({tfjob.LABEL_JOB_ROLE: "master"} if index == 0 else {}),
        }
        name = f"legacy-worker-{index}"
        metadata = {"name": name, "labels": labels, "ownerReferences": [owner]}
        # Manifests, as training-operator sends them: the client takes them as they are.
        service: Any = {
            "metadata": metadata,
            "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 2222}]},
        }
        cluster.core.create_namespaced_service(namespace, service)
        pod: Any = {"metadata": metadata, "spec": {**template["spec"], "restartPolicy": "Never"}}
        cluster.core.create_namespaced_pod(namespace, pod)
        cluster.set_running(name)
    before = {name: meta(pod).uid for name, pod in kubeflow_pods(cluster, "legacy").items()}
    cluster.custom.patch_namespaced_custom_object_status(
        tfjob.GROUP,
        tfjob.VERSION,
        namespace,
        tfjob.PLURAL,
        "legacy",
        {
            "status": {
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "TFJobCreated"},
                    {"type": "Running", "status": "True", "reason": "TFJobRunning"},
                ],
                "replicaStatuses": {"Worker": {"active": 2}},
                "startTime": "2026-01-01T00:00:00Z",
            }
        },
    )
    log = tmp_path / "operator.log"
    op = operator_process.Operator(kubeconfig, log, f"--namespace={namespace}", "--tfjob")
    op.start().wait_serving(T)
    try:
        waits.wait_until(
            lambda: (
                tfjob.ANNOTATION_ENGINE_STATUS
                in ((cluster.job("legacy") or {})["metadata"].get("annotations") or {})
            ),
            timeout=T,
            what="the operator's first reconcile of the TFJob",
        )
        cluster.set_exited("legacy-worker-0", 0)
        cluster.wait_conditions(
            "legacy",
            [
                ("Created", "True", "TFJobCreated"),
                ("Running", "False", "TFJobRunning"),
                ("Succeeded", "True", "TFJobSucceeded"),
            ],
        )
        after = {name: meta(pod).uid for name, pod in kubeflow_pods(cluster, "legacy").items()}
        assert after == before, "a Pod training-operator made was replaced"
        assert "Created Pod" not in log.read_text(), op.log_tail()
    finally:
        op.stop()


def katib_trial_status(job: Obj) -> Obj:
    """Katib v0.19's own verdict on a trial deployed as `job` (its GetDeployedJobStatus with
    its default conditions for Kubeflow jobs: tests/controlplane/katib)."""
    version = go_mod_version(CONTROLPLANE / "katib" / "go.mod", "github.com/kubeflow/katib")
    binary = tools_dir() / f"katib-{version}" / "katib-trial-status"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it with {INSTALL_COMMAND}", pytrace=False)
    out = subprocess.run(
        [str(binary)], input=json.dumps(job), capture_output=True, text=True, check=True
    )
    return cast(Obj, json.loads(out.stdout))


def kfp_launcher_done(job: Obj) -> str | None:
    """KFP's "Launch TFJob" wait rule (components/kubeflow/common/launch_crd.py,
    is_expected_conditions with Succeeded and Failed): the last condition, if terminal."""
    conditions = (job.get("status") or {}).get("conditions")
    if not conditions:
        return None
    last = conditions[-1]
    return (
        str(last["type"])
        if last["type"] in ("Succeeded", "Failed") and last["status"] == "True"
        else None
    )


def test_a_tfjob_ends_as_kfp_and_katib_read_it(cluster: TFJobs) -> None:
    for name in ("good", "bad"):
        cluster.create_job(a_tfjob(name, {"Worker": 2}))
        waits.wait_until(
            functools.partial(lambda n: len(kubeflow_pods(cluster, n)) == 2, name),
            timeout=T,
            what=f"{name} Pods",
        )
        cluster.set_running(f"{name}-worker-0")
        cluster.set_running(f"{name}-worker-1")
    waits.wait_until(
        lambda: cluster.conditions("good")[-1][0] == "Running", timeout=T, what="good Running"
    )
    running = cluster.job("good") or {}
    assert katib_trial_status(running)["condition"] == "Running"
    assert kfp_launcher_done(running) is None
    cluster.set_exited("good-worker-0", 0)
    cluster.set_exited("bad-worker-1", 1)
    for name, verdict in (("good", "Succeeded"), ("bad", "Failed")):
        waits.wait_until(
            functools.partial(lambda n: kfp_launcher_done(cluster.job(n) or {}), name),
            timeout=T,
            what=f"{name}: a terminal last condition",
        )
        job = cluster.job(name) or {}
        assert kfp_launcher_done(job) == verdict, job["status"]
        katib = katib_trial_status(job)
        assert katib["condition"] == verdict, katib
        assert katib["reason"] == f"TFJob{verdict}", katib


def test_a_tfjob_deleted_in_the_foreground_gets_no_new_pods(cluster: TFJobs) -> None:
    """KFP's launcher deletes a finished TFJob with propagationPolicy Foreground: the TFJob
    stays, with a deletionTimestamp, until the garbage collector has deleted its Pods; none is
    made again meanwhile."""
    cluster.create_job(a_tfjob("kfp", {"Worker": 2}))
    waits.wait_until(lambda: len(kubeflow_pods(cluster, "kfp")) == 2, timeout=T, what="Pods")
    first = {meta(p).uid for p in kubeflow_pods(cluster, "kfp").values()}
    cluster.custom.delete_namespaced_custom_object(
        tfjob.GROUP,
        tfjob.VERSION,
        cluster.namespace,
        tfjob.PLURAL,
        "kfp",
        body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
    )
    seen: set[str | None] = set()

    def gone() -> bool:
        seen.update(meta(p).uid for p in kubeflow_pods(cluster, "kfp").values())
        return cluster.job("kfp") is None

    # The garbage collector picks up a CRD installed a moment ago at its next discovery
    # (every 30 s), so the deletion may take that long here.
    waits.wait_until(gone, timeout=120, what="the TFJob and its Pods deleted")
    assert seen <= first, "a Pod was made while the TFJob was being deleted"
