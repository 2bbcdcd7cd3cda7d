"""HA: two operator replicas joined by kopf peering; only the higher priority one acts, and
the other takes over when it stops."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import Cluster, trainjob
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

PEERING_CRDS = REPO_ROOT / "operator" / "trainjob_operator" / "deploy" / "peering.yaml"
PEERING = "trainjob-operator"


def _install_peering(api_client: k8s.ApiClient, namespace: str) -> None:
    ext = k8s.ApiextensionsV1Api(api_client)
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text(encoding="utf-8")):
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition("kopfpeerings.kopf.dev")
        assert crd.status is not None
        return any(
            c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
        )

    waits.wait_until(established, timeout=30, what="the KopfPeering CRD")
    body: dict[str, Any] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": PEERING, "namespace": namespace},
    }
    k8s.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "kopf.dev", "v1", namespace, "kopfpeerings", body
    )


def _peers(api_client: k8s.ApiClient, namespace: str) -> dict[str, Any]:
    peering = cast(
        dict[str, Any],
        k8s.CustomObjectsApi(api_client).get_namespaced_custom_object(
            "kopf.dev", "v1", namespace, "kopfpeerings", PEERING
        ),
    )
    return {k: v for k, v in (peering.get("status") or {}).items() if v}


def _healthy(op: operator_process.Operator) -> bool:
    try:
        url = f"http://127.0.0.1:{op.liveness_port}/healthz"
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_ha_only_the_leader_acts_and_the_other_takes_over(
    kubeconfig: Path, api_client: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _install_peering(api_client, namespace)
    cluster = Cluster(api_client, namespace)
    args = (f"--namespace={namespace}", f"--peering={PEERING}")
    leader = operator_process.Operator(
        kubeconfig, tmp_path / "leader.log", *args, "--priority=200", standalone=False
    )
    standby = operator_process.Operator(
        kubeconfig, tmp_path / "standby.log", *args, "--priority=100", standalone=False
    )
    leader.start()
    try:
        waits.wait_until(lambda: _healthy(leader), timeout=30, what="the leader to start")
        standby.start()
        # Both replicas registered in the peering object: the standby saw the leader's
        # higher priority and stays paused (kopf starts paused until its first peering check).
        waits.wait_until(
            lambda: len(_peers(api_client, namespace)) == 2,
            timeout=30,
            what="both replicas in the peering object",
        )
        waits.wait_until(lambda: _healthy(standby), timeout=30, what="the standby to start")
        cluster.create_job(trainjob("one", chief=1, workers=1))
        cluster.wait_pods("one", {"one-chief-0", "one-worker-0"})
        cluster.wait_condition("one", "Created")
        assert "Created Pod" in leader.log_tail(200)
        assert "Created Pod" not in standby.log_tail(200)
        assert "Resuming operations" not in standby.log_tail(200)

        leader.stop()  # graceful: it leaves the peering object, the standby resumes
        waits.wait_until(
            lambda: "Resuming operations" in standby.log_tail(200),
            timeout=60,
            what="the standby to resume",
        )
        cluster.create_job(trainjob("two", chief=1, workers=1))
        cluster.wait_pods("two", {"two-chief-0", "two-worker-0"})
        cluster.wait_condition("two", "Created")
        assert f"Created Pod {namespace}/two-chief-0" in standby.log_tail(200)
    finally:
        leader.stop()
        standby.stop()
