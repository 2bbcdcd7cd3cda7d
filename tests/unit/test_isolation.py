"""The job's NetworkPolicy as data (trainjob.core.isolation): what it closes and what stays
open. The API server's acceptance and the Pods' order are the integration tier's
(tests/integration/test_network_policy.py), enforcement the e2e tier's."""

from __future__ import annotations

from typing import Any

import pytest

from trainjob.core import isolation, spec


def job(ports: dict[str, int | None], isolation_mode: str | None = None) -> spec.TrainJob:
    replica_specs: dict[str, Any] = {}
    for rtype, port in ports.items():
        container: dict[str, Any] = {"name": "tensorflow", "image": "trainjob:1"}
        if port is not None:
            container["ports"] = [{"name": "tfjob-port", "containerPort": port}]
        replica_specs[rtype] = {"replicas": 1, "template": {"spec": {"containers": [container]}}}
    body: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "mnist", "namespace": "team-a"},
        "spec": {"replicaSpecs": replica_specs},
    }
    if isolation_mode is not None:
        body["spec"]["networkIsolation"] = isolation_mode
    return spec.parse(body)


@pytest.mark.parametrize(
    ("closed", "expected"),
    [
        ([2222], [(1, 2221), (2223, 65535)]),
        ([], [(1, 65535)]),
        ([1, 65535], [(2, 65534)]),
        ([2222, 2223], [(1, 2221), (2224, 65535)]),
        ([22, 2222], [(1, 21), (23, 2221), (2223, 65535)]),
    ],
)
def test_open_ranges_are_every_port_but_the_closed_ones(
    closed: list[int], expected: list[tuple[int, int]]
) -> None:
    assert isolation.open_port_ranges(closed) == expected


def test_the_policy_selects_the_job_and_closes_each_replica_types_tf_port_only() -> None:
    parsed = job({"chief": None, "worker": 3333, "ps": 2222})
    assert isolation.tf_ports(parsed) == [2222, 3333]
    owner = {"kind": "TrainJob", "name": "mnist", "uid": "u1", "controller": True}
    policy = isolation.render_network_policy(parsed, "team-a", owner)
    assert policy["metadata"]["name"] == "mnist"
    assert policy["metadata"]["namespace"] == "team-a"
    assert policy["metadata"]["ownerReferences"] == [owner]
    body = policy["spec"]
    selector = {"matchLabels": {"trainjob.dev/job-name": "mnist"}}
    assert body["podSelector"] == selector
    assert body["policyTypes"] == ["Ingress"]  # egress (DNS, data, storage) untouched
    own, others = body["ingress"]
    assert own == {"from": [{"podSelector": selector}]}  # every port, the job's Pods only
    assert "from" not in others  # anyone ...
    tcp = [(p["port"], p.get("endPort", p["port"])) for p in others["ports"] if "port" in p]
    assert tcp == [(1, 2221), (2223, 3332), (3334, 65535)]  # ... on every other port
    assert [p for p in others["ports"] if "port" not in p] == [
        {"protocol": "UDP"},
        {"protocol": "SCTP"},
    ]


def test_isolation_defaults_to_job_and_is_an_enum() -> None:
    assert job({"worker": None}).network_isolation == isolation.ISOLATION_JOB
    assert job({"worker": None}, "None").network_isolation == isolation.ISOLATION_NONE
    with pytest.raises(spec.SpecError) as invalid:
        job({"worker": None}, "Off")
    assert "spec.networkIsolation" in str(invalid.value.problems[0])
