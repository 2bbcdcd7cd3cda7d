"""`trainjob convert`: Kubeflow TFJob v1 manifests written from its documented API become
equivalent TrainJobs: same replicas, same TF_CONFIG, same policies, notes for what differs."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import yaml

from trainjob.core import convert, spec, tfconfig

CORPUS = pathlib.Path(__file__).parents[1] / "corpus" / "tfjob"


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((CORPUS / name).read_text())
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.yaml")))
def test_every_converted_tfjob_is_a_valid_trainjob(name: str) -> None:
    conversion = convert.convert_tfjob(load(name))
    assert spec.problems_of(conversion.trainjob) == []


def test_ps_job_keeps_replicas_templates_and_namespace() -> None:
    job = spec.parse(convert.convert_tfjob(load("dist-mnist.yaml")).trainjob)
    assert job.namespace == "kubeflow"
    assert (job.replicas("ps"), job.replicas("worker")) == (2, 4)
    assert job.replica_specs["worker"].restart_policy == "Never"
    container = spec.tf_container(job.replica_specs["ps"].template)
    assert container is not None
    assert container["image"] == "kubeflow/tf-dist-mnist-test:latest"


def test_run_policy_success_policy_and_port_carry_over() -> None:
    conversion = convert.convert_tfjob(load("multi-worker-run-policy.yaml"))
    job = spec.parse(conversion.trainjob)
    assert job.success_policy == "AllWorkers"
    assert job.run_policy.clean_pod_policy == "None"
    assert job.run_policy.backoff_limit == 5
    assert job.run_policy.active_deadline_seconds == 7200
    assert job.run_policy.ttl_seconds_after_finished == 600
    assert job.run_policy.scheduling_policy is not None
    assert job.run_policy.scheduling_policy.queue == "research"
    assert job.replica_specs["chief"].restart_policy == "ExitCode"
    assert job.replica_specs["worker"].restart_policy == "OnFailure"
    assert job.labels == {"team": "vision"}
    assert any("minResources" in note for note in conversion.notes)
    cluster = tfconfig.cluster_spec(job, tfconfig.kubernetes_host(job, "default", ""))
    config = json.loads(tfconfig.tf_config(cluster, "worker", 1))
    assert config["cluster"] == {
        "chief": ["multi-worker-chief-0.default.svc:2345"],
        "worker": [
            "multi-worker-worker-0.default.svc:2345",
            "multi-worker-worker-1.default.svc:2345",
        ],
    }


def test_master_becomes_chief_and_spec_level_run_policy_is_read() -> None:
    conversion = convert.convert_tfjob(load("estimator-master-evaluator.yaml"))
    job = spec.parse(conversion.trainjob)
    assert list(job.replica_specs) == ["chief", "evaluator", "worker"]
    assert job.replicas("chief") == 1
    assert job.run_policy.backoff_limit == 2
    assert job.run_policy.clean_pod_policy == "Running"
    assert any("enableDynamicWorker" in note for note in conversion.notes)
    assert any("Master" in note for note in conversion.notes)


def test_unset_backoff_limit_is_called_out() -> None:
    conversion = convert.convert_tfjob(load("dist-mnist.yaml"))
    assert any("backoffLimit" in note for note in conversion.notes)


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        ({"kind": "PyTorchJob"}, "kind"),
        ({"apiVersion": "kubeflow.org/v2"}, "apiVersion"),
        ({"spec": {}}, "spec.tfReplicaSpecs"),
        ({"spec": {"tfReplicaSpecs": {"Launcher": {}}}}, "spec.tfReplicaSpecs.Launcher"),
        ({"spec": {"tfReplicaSpecs": {"Master": {}, "Chief": {}}}}, "given twice"),
    ],
)
def test_what_cannot_convert_is_an_error_naming_the_field(
    mutation: dict[str, Any], message: str
) -> None:
    document = {**load("dist-mnist.yaml"), **mutation}
    with pytest.raises(convert.ConvertError, match=message):
        convert.convert_tfjob(document)


@pytest.mark.parametrize(
    ("managed_by", "expected"),
    [
        (None, None),
        ("kubeflow.org/training-operator", None),  # TFJob's own controller: ours now
        ("kueue.x-k8s.io/multikueue", "kueue.x-k8s.io/multikueue"),
    ],
)
def test_tfjob_managed_by_becomes_the_top_level_managed_by(
    managed_by: str | None, expected: str | None
) -> None:
    document = load("dist-mnist.yaml")
    if managed_by is not None:
        document["spec"].setdefault("runPolicy", {})["managedBy"] = managed_by
    conversion = convert.convert_tfjob(document)
    assert conversion.trainjob["spec"].get("managedBy") == expected
    assert "managedBy" not in conversion.trainjob["spec"].get("runPolicy", {})
    assert spec.parse(conversion.trainjob).managed_by == expected
    assert not any("managedBy" in note for note in conversion.notes)
