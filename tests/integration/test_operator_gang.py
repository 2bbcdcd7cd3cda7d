"""Gang scheduling, the operator's side: with --gang-scheduler set, the operator creates the
job's PodGroup (Volcano or scheduler-plugins) before the Pods, and the Pods name the
scheduler and the group. scheduler-plugins' CRDs are the real ones (its scheduler runs:
test_gang_scheduling.py watches it place gangs); Volcano cannot be built from the Go module
proxy here, so its PodGroup CRD is a minimal stand-in and the test plays Volcano's part: it
moves the group from Pending to Inqueue, which is when the operator creates the Pods."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.gang import GangScheduler
from tests.controlplane.kueue import Kueue
from tests.integration.conftest import started_control_plane
from tests.integration.kueue_harness import Queues, queued_job
from tests.integration.operator_harness import Cluster, container, meta, pod_spec, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

GANGS = {
    "volcano": ("scheduling.volcano.sh", "v1beta1", "volcano"),
    "scheduler-plugins": ("scheduling.x-k8s.io", "v1alpha1", "scheduler-plugins-scheduler"),
}
VOLCANO = "volcano"


def _podgroup_crd(group: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"podgroups.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def podgroup_crds(api_client: k8s.ApiClient, gang_scheduler: GangScheduler) -> None:
    """scheduler-plugins' CRDs come with its scheduler; Volcano's is a stand-in."""
    ext = k8s.ApiextensionsV1Api(api_client)
    for group, version, _ in [GANGS[VOLCANO]]:
        try:
            # a manifest, as kubectl would send it: the client validates it into the model
            ext.create_custom_resource_definition(_podgroup_crd(group, version))  # type: ignore[arg-type, unused-ignore]
        except ApiException as exc:
            if exc.status != 409:
                raise

        def established(name: str = f"podgroups.{group}") -> bool:
            crd = ext.read_custom_resource_definition(name)
            assert crd.status is not None
            return any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or [])
            )

        waits.wait_until(established, timeout=30, what=f"PodGroup CRD of {group}")


@pytest.mark.parametrize("gang", sorted(GANGS))
def test_gang_podgroup_and_pod_references(
    gang: str,
    podgroup_crds: None,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    group, version, scheduler = GANGS[gang]
    cluster = Cluster(api_client, namespace)
    body = trainjob("gang", chief=1, workers=2)
    for replica in body["spec"]["replicaSpecs"].values():
        replica["template"] = {"spec": {"containers": [container()]}}  # no schedulerName
    body["spec"]["runPolicy"] = {
        "schedulingPolicy": {"minAvailable": 3, "queue": "research", "scheduleTimeoutSeconds": 60}
    }
    operator = operator_process.Operator(
        kubeconfig,
        tmp_path / "operator.log",
        f"--namespace={namespace}",
        f"--gang-scheduler={gang}",
    ).start()
    names = {"gang-chief-0", "gang-worker-0", "gang-worker-1"}
    try:
        created = cluster.create_job(body)
        podgroup = waits.wait_until(
            lambda: _podgroup(cluster, group, version, "gang"), timeout=30, what="the PodGroup"
        )
        if gang == VOLCANO:
            # Until Volcano enqueues the group, no Pod may take a node; the job says why.
            held = waits.wait_until(
                lambda: (c := _running(cluster, "gang")).get("reason") == "GangPending" and c,
                timeout=30,
                what="the job to say its gang waits for Volcano",
            )
            assert "queue research" in held["message"], held
            assert not cluster.pods("gang")
            assert any(e.reason == "GangPending" for e in cluster.events("gang"))
            cluster.custom.patch_namespaced_custom_object(
                group, version, namespace, "podgroups", "gang", {"status": {"phase": "Inqueue"}}
            )
        pods = cluster.wait_pods("gang", names)
    finally:
        operator.stop()
    assert podgroup["spec"]["minMember"] == 3
    (ref,) = podgroup["metadata"]["ownerReferences"]
    assert ref["uid"] == created["metadata"]["uid"]
    if gang == "volcano":
        assert podgroup["spec"]["queue"] == "research"
    else:
        assert podgroup["spec"]["scheduleTimeoutSeconds"] == 60
    for pod in pods.values():
        assert pod_spec(pod).scheduler_name == scheduler
        if gang == "volcano":
            assert (meta(pod).annotations or {})["scheduling.k8s.io/group-name"] == "gang"
        else:
            assert (meta(pod).labels or {})["scheduling.x-k8s.io/pod-group"] == "gang"


def test_gang_podgroup_of_a_kueue_job_is_made_only_after_admission(
    podgroup_crds: None,
    kueue: Kueue,
    kubeconfig: Path,
    api_client: k8s.ApiClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Kueue admits a job whole (all its podSets or none), so a PodGroup while it waits in
    the queue would only reserve nothing for a job that cannot start: it comes with the Pods."""
    group, version, _ = GANGS["scheduler-plugins"]
    cluster, queues = Cluster(api_client, namespace), Queues(api_client, namespace)
    cq = queues.cluster_queue(queues.flavor(), "0")  # nothing fits yet
    lq = queues.local_queue(cq)
    body = queued_job("gq", lq)
    body["spec"]["runPolicy"] = {"schedulingPolicy": {"minAvailable": 3}}
    operator = operator_process.Operator(
        kubeconfig,
        tmp_path / "operator.log",
        f"--namespace={namespace}",
        "--gang-scheduler=scheduler-plugins",
        "--kueue",
    ).start()

    def podgroups() -> list[Any]:
        found = cast(
            dict[str, Any],
            cluster.custom.list_namespaced_custom_object(group, version, namespace, "podgroups"),
        )
        return list(found.get("items") or [])

    try:
        cluster.create_job(body)
        waits.wait_until(
            lambda: (c := cluster.condition("gq", "Suspended")) and c["reason"] == "Queued",
            timeout=60,
            what="the job queued",
        )
        assert podgroups() == [] and not cluster.pods("gq")
        queues.custom.patch_cluster_custom_object(
            "kueue.x-k8s.io",
            "v1beta2",
            "clusterqueues",
            cq,
            {
                "spec": {
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu"],
                            "flavors": [
                                {
                                    "name": queues.cluster_scoped[0][1],
                                    "resources": [{"name": "cpu", "nominalQuota": "10"}],
                                }
                            ],
                        }
                    ]
                }
            },
        )
        cluster.wait_pods("gq", {"gq-chief-0", "gq-worker-0", "gq-worker-1"}, timeout=60)
        (podgroup,) = podgroups()
        assert podgroup["spec"]["minMember"] == 3
    finally:
        operator.stop()
        queues.cleanup()


def _podgroup(cluster: Cluster, group: str, version: str, name: str) -> Any:
    try:
        return cluster.custom.get_namespaced_custom_object(
            group, version, cluster.namespace, "podgroups", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _running(cluster: Cluster, name: str) -> dict[str, Any]:
    for condition in ((cluster.job(name) or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Running":
            return dict(condition)
    return {}


def test_gang_operator_refuses_to_start_without_the_podgroup_crd(tmp_path: Path) -> None:
    """Every job's Pods would wait for a PodGroup that cannot be created: the operator says
    so and exits (its Pod restarts, the reason is the last line of its log)."""
    # A control plane of its own: no test has added a PodGroup CRD there.
    with contextlib.closing(started_control_plane()) as planes:
        plane = next(planes)
        operator = operator_process.Operator(
            plane.kubeconfig, tmp_path / "operator.log", "--gang-scheduler=volcano"
        ).start()
        try:
            waits.wait_until(
                lambda: not operator.running(), timeout=60, what="the operator to exit"
            )
            assert operator.process is not None and operator.process.returncode == 2
            log = operator.log_tail()
            assert "podgroups.scheduling.volcano.sh/v1beta1" in log, log
            assert "install the gang scheduler" in log, log
            assert log.strip().splitlines()[-1].startswith("trainjob-operator: --gang-scheduler")
        finally:
            operator.stop()
