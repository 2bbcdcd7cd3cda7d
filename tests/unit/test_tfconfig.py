"""TF_CONFIG golden tests: the expected strings are Kubeflow training-operator v1's own
(pkg/controller.v1/tensorflow tests: job name test-tfjob), so TF code ports unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainjob.core import spec, tfconfig


def make_job(replicas: dict[str, int], port: int | None = None) -> spec.TrainJob:
    template: dict[str, Any] = {}
    if port is not None:
        template = {
            "spec": {
                "containers": [
                    {"name": "tensorflow", "ports": [{"name": "tfjob-port", "containerPort": port}]}
                ]
            }
        }
    return spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "test-tfjob"},
            "spec": {
                "image": "img",
                "replicaSpecs": {
                    rtype: {"replicas": count, "template": template}
                    for rtype, count in replicas.items()
                },
            },
        }
    )


def kubeflow_tf_config(job: spec.TrainJob, ns: str, domain: str, rtype: str, index: int) -> str:
    env = tfconfig.replica_env(
        job,
        tfconfig.cluster_spec(job, tfconfig.kubernetes_host(job, ns, domain)),
        rtype,
        index,
        ns,
        None,
    )
    return env.get("TF_CONFIG", "")


KUBEFLOW_CASES = [
    # (workers, ps, evaluators, namespace, domain, expected) - Kubeflow's TestClusterSpec table.
    (1, 0, 0, "ns0", "", ""),
    (1, 0, 0, "ns1", "tf.training.com", ""),
    (
        1,
        1,
        0,
        "ns2",
        "tf.training.org",
        '{"cluster":{"ps":["test-tfjob-ps-0.ns2.svc.tf.training.org:2222"],"worker":'
        '["test-tfjob-worker-0.ns2.svc.tf.training.org:2222"]},"task":{"type":"worker",'
        '"index":0},"environment":"cloud"}',
    ),
    (
        1,
        1,
        1,
        "ns3",
        "tf.training.io",
        '{"cluster":{"evaluator":["test-tfjob-evaluator-0.ns3.svc.tf.training.io:2222"],'
        '"ps":["test-tfjob-ps-0.ns3.svc.tf.training.io:2222"],"worker":'
        '["test-tfjob-worker-0.ns3.svc.tf.training.io:2222"]},"task":{"type":"worker",'
        '"index":0},"environment":"cloud"}',
    ),
    (
        1,
        1,
        1,
        "ns3",
        "",
        '{"cluster":{"evaluator":["test-tfjob-evaluator-0.ns3.svc:2222"],"ps":'
        '["test-tfjob-ps-0.ns3.svc:2222"],"worker":["test-tfjob-worker-0.ns3.svc:2222"]},'
        '"task":{"type":"worker","index":0},"environment":"cloud"}',
    ),
]


@pytest.mark.parametrize(
    ("workers", "ps", "evaluators", "ns", "domain", "expected"), KUBEFLOW_CASES
)
def test_tf_config_is_byte_identical_to_kubeflow(
    workers: int, ps: int, evaluators: int, ns: str, domain: str, expected: str
) -> None:
    replicas = {"worker": workers, "ps": ps, "evaluator": evaluators}
    job = make_job({k: v for k, v in replicas.items() if v})
    assert kubeflow_tf_config(job, ns, domain, "worker", 0) == expected


@pytest.mark.parametrize(
    ("replicas", "distributed"),
    [
        ({"worker": 1}, False),
        ({"worker": 1, "ps": 1}, True),
        ({"ps": 1, "worker": 0, "chief": 1}, True),
        ({"chief": 1}, False),
        ({"chief": 1, "worker": 1}, True),
    ],
)
def test_single_replica_jobs_get_no_tf_config(replicas: dict[str, int], distributed: bool) -> None:
    job = make_job(replicas)
    assert tfconfig.is_distributed(job) is distributed


def test_chief_worker_ps_evaluator_topology_lists_every_task_sorted() -> None:
    job = make_job({"chief": 1, "worker": 3, "ps": 2, "evaluator": 1})
    config = json.loads(kubeflow_tf_config(job, "team-a", "cluster.local", "ps", 1))
    assert list(config["cluster"]) == ["chief", "evaluator", "ps", "worker"]
    assert config["cluster"]["worker"] == [
        f"test-tfjob-worker-{i}.team-a.svc.cluster.local:2222" for i in range(3)
    ]
    assert config["task"] == {"type": "ps", "index": 1}
    assert config["environment"] == "cloud"


def test_custom_port_comes_from_tfjob_port_on_tensorflow_container() -> None:
    job = make_job({"worker": 2}, port=2345)
    config = json.loads(kubeflow_tf_config(job, "ns", "", "worker", 1))
    assert config["cluster"]["worker"] == [
        "test-tfjob-worker-0.ns.svc:2345",
        "test-tfjob-worker-1.ns.svc:2345",
    ]


def test_port_of_a_differently_named_port_is_ignored() -> None:
    template = {
        "spec": {
            "containers": [{"name": "tensorflow", "ports": [{"name": "http", "containerPort": 80}]}]
        }
    }
    assert spec.tf_port(template) == 2222


def test_local_hosts_use_loopback_and_given_ports() -> None:
    job = make_job({"chief": 1, "worker": 1})
    cluster = tfconfig.cluster_spec(
        job, tfconfig.local_host({("chief", 0): 41000, ("worker", 0): 41001})
    )
    assert cluster == {"chief": ["127.0.0.1:41000"], "worker": ["127.0.0.1:41001"]}


def test_dtensor_env_numbers_chief_first_then_workers() -> None:
    cluster = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]}
    assert tfconfig.dtensor_env(cluster, "worker", 1) == {
        "DTENSOR_CLIENT_ID": "2",
        "DTENSOR_NUM_CLIENTS": "3",
        "DTENSOR_JOB_NAME": "worker",
        "DTENSOR_JOBS": "c:1,w0:1,w1:1",
    }
    assert tfconfig.dtensor_env(cluster, "ps", 0) == {}
