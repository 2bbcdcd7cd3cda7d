"""Parsing and validation: every example parses and matches the CRD's openAPIV3Schema; every
manifest of the invalid corpus is rejected with a message naming the field; the parser's
defaults are the CRD's defaults."""

from __future__ import annotations

import pathlib
from typing import Any

import jsonschema
import pytest
import yaml

from trainjob.core import spec

ROOT = pathlib.Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "tests" / "corpus" / "invalid").glob("*.yaml"))
CRD = yaml.safe_load((ROOT / "crds" / "trainjobs.trainjob.dev.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def load(path: pathlib.Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def expectation(path: pathlib.Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <field>'"
    return first.removeprefix("# expect: ")


def test_there_are_examples_for_every_strategy_and_enough_invalid_cases() -> None:
    strategies = {
        (load(p)["spec"].get("runtime") or {}).get("strategy", "command") for p in EXAMPLES
    }
    assert {"MultiWorkerMirrored", "ParameterServer", "DTensor", "command"} <= strategies
    assert len(INVALID) >= 25


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses_and_matches_the_crd_schema(path: pathlib.Path) -> None:
    document = load(path)
    jsonschema.validate(document, SCHEMA)
    job = spec.parse(document)
    assert job.name == document["metadata"]["name"]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_manifest_is_rejected_naming_the_field(path: pathlib.Path) -> None:
    problems = spec.problems_of(load(path))
    assert problems, f"{path.name} was accepted"
    assert any(expectation(path) in str(problem) for problem in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    document = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "x"},
        "spec": {
            "image": "i",
            "replicaSpecs": {"worker": {"replicas": -1, "restartPolicy": "Sometimes"}},
            "runPolicy": {"backoffLimit": "three", "cleanPodPolicy": "Later"},
        },
    }
    paths = {problem.path for problem in spec.problems_of(document)}
    assert {
        "spec.replicaSpecs.worker.replicas",
        "spec.replicaSpecs.worker.restartPolicy",
        "spec.runPolicy.backoffLimit",
        "spec.runPolicy.cleanPodPolicy",
    } <= paths


def test_not_a_trainjob_at_all() -> None:
    problems = spec.problems_of({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    assert {p.path for p in problems} >= {"apiVersion", "kind", "spec"}
    assert spec.problems_of(["a", "list"])[0].path == "<document>"


def schema_at(*path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for key in path:
        node = node["properties"][key]
    return node


def test_parser_defaults_are_the_crd_defaults() -> None:
    job = spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "d"},
            "spec": {
                "image": "i",
                "runtime": {"entrypoint": "m:f"},
                "replicaSpecs": {"worker": {}},
            },
        }
    )
    run_policy = ("spec", "runPolicy")
    assert job.run_policy.clean_pod_policy == schema_at(*run_policy, "cleanPodPolicy")["default"]
    assert job.run_policy.backoff_limit == schema_at(*run_policy, "backoffLimit")["default"]
    assert (
        job.run_policy.startup_deadline_seconds
        == schema_at(*run_policy, "startupDeadlineSeconds")["default"]
    )
    assert job.run_policy.disruption_limit == schema_at(*run_policy, "disruptionLimit")["default"]
    assert (
        job.run_policy.progress_deadline_action
        == schema_at(*run_policy, "progressDeadlineAction")["default"]
    )
    assert job.run_policy.suspend is schema_at(*run_policy, "suspend")["default"]
    assert job.success_policy == schema_at("spec", "successPolicy")["default"]
    worker = schema_at("spec", "replicaSpecs", "worker")
    assert job.replicas("worker") == worker["properties"]["replicas"]["default"]
    assert (
        job.replica_specs["worker"].restart_policy
        == (worker["properties"]["restartPolicy"]["default"])
    )
    assert job.runtime is not None
    assert job.runtime.strategy == schema_at("spec", "runtime", "strategy")["default"]
    assert job.runtime.framework == schema_at("spec", "runtime", "framework")["default"]


def test_parser_enums_are_the_crd_enums() -> None:
    worker = schema_at("spec", "replicaSpecs", "worker")["properties"]
    assert tuple(worker["restartPolicy"]["enum"]) == spec.RESTART_POLICIES
    assert tuple(schema_at("spec", "runPolicy", "cleanPodPolicy")["enum"]) == (
        spec.CLEAN_POD_POLICIES
    )
    assert tuple(schema_at("spec", "successPolicy")["enum"]) == spec.SUCCESS_POLICIES
    assert tuple(schema_at("spec", "runPolicy", "progressDeadlineAction")["enum"]) == (
        spec.PROGRESS_DEADLINE_ACTIONS
    )
    assert tuple(schema_at("spec", "runtime", "strategy")["enum"]) == spec.STRATEGIES
    assert tuple(schema_at("spec", "runtime", "framework")["enum"]) == spec.FRAMEWORKS


def describe_missing(node: dict[str, Any], path: str) -> list[str]:
    missing = (
        []
        if node.get("description") or path.endswith(("apiVersion", "kind", "metadata"))
        else [path]
    )
    for key, child in (node.get("properties") or {}).items():
        missing += describe_missing(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        missing += describe_missing(node["items"], f"{path}[]")
    return missing


def test_every_spec_field_has_a_description_for_kubectl_explain() -> None:
    missing = [p for p in describe_missing(schema_at("spec"), "spec") if not p.endswith("[]")]
    assert missing == []


def test_crd_names_and_subresources() -> None:
    names = CRD["spec"]["names"]
    assert (CRD["spec"]["group"], names["kind"], names["plural"], names["shortNames"]) == (
        "trainjob.dev",
        "TrainJob",
        "trainjobs",
        ["tj"],
    )
    version = CRD["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "State",
        "Ready",
        "Restarts",
        "Reason",
        "Progress",
        "ETA",
        "Loss",
        "Devices",
        "Age",
    ]
    # Why a job is not running (ImagePullBackOff, Unschedulable, Preempted) at a glance.
    reason = version["additionalPrinterColumns"][3]
    assert reason["jsonPath"] == '.status.conditions[?(@.type=="Running")].reason'
