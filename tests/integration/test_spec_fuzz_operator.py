"""The operator survives generated jobs (issue 17 part 3): manifests from tests/specgen.py,
created in bulk through the real API server, with kwok running the Pods of the valid ones.

Every admitted job ends up served: Failed / InvalidSpec when the parser refuses it, else a
state the operator wrote (Running, Suspended, Failed for a deadline, ...). The operator
process stays up, no reconcile crashes, and a valid job created after the storm runs.

CI creates 100 jobs; `TRAINJOB_FUZZ_JOBS=1000` is the full run (tests/RELIABILITY.md).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, cast

import pytest
from hypothesis import given
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests import specgen
from tests.controlplane.cluster import Component
from tests.integration.operator_harness import GROUP, PLURAL, VERSION, Cluster
from tests.integration.test_bad_input import crashes
from tests.reliability import save_figures
from tests.support import operator_process, waits
from trainjob.core import spec

pytestmark = pytest.mark.integration

JOBS: Final = int(os.environ.get("TRAINJOB_FUZZ_JOBS", "100"))
GOOD: Final = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "TrainJob",
    "metadata": {"name": "good"},
    "spec": {"image": "example.com/trainjob:test", "replicaSpecs": {"worker": {"replicas": 2}}},
}


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, kwok: Component, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(kubeconfig, log, "--namespace=test-fuzz-*").start()
    try:
        yield op
    finally:
        op.stop()


def generated(count: int) -> list[dict[str, Any]]:
    """`count` manifests, the same ones on every run (derandomized), with unique names (bad
    names are the corpus's business, tests/corpus/invalid)."""
    drawn: list[dict[str, Any]] = []

    @specgen.fuzz_settings(ci_examples=count, scalable=False)
    @given(specgen.mutated(large_valid=False))
    def draw(manifest: dict[str, Any]) -> None:
        drawn.append(manifest)

    draw()
    for index, manifest in enumerate(drawn):
        manifest["metadata"] = {"name": f"fz-{index:04d}"}
    return drawn


def served(job: dict[str, Any], refused: bool) -> bool:
    """The operator has written its verdict: InvalidSpec for what the parser refuses."""
    status = job.get("status") or {}
    if not refused:
        return bool(status.get("state"))
    return any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == "InvalidSpec"
        for c in status.get("conditions") or []
    )


def test_fuzz_operator_survives_generated_jobs(
    api_client: k8s.ApiClient, namespace: str, operator: operator_process.Operator
) -> None:
    assert namespace.startswith("test-fuzz-"), namespace
    cluster = Cluster(api_client, namespace)
    refused_by_parser: dict[str, bool] = {}
    at_admission = 0
    started = time.monotonic()
    for manifest in generated(JOBS):
        try:
            cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, manifest, field_validation="Strict"
            )
        except ApiException as exc:
            assert exc.status in (400, 422), exc.body
            at_admission += 1
            continue
        refused_by_parser[manifest["metadata"]["name"]] = bool(spec.problems_of(manifest))

    def unserved() -> list[str]:
        items = cast(
            dict[str, Any],
            cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
        )
        jobs = {item["metadata"]["name"]: item for item in items["items"]}
        return [
            name
            for name, refused in refused_by_parser.items()
            if name in jobs and not served(jobs[name], refused)
        ]

    waits.wait_until(
        lambda: not unserved() or not operator.running(),
        timeout=60 + JOBS * 0.5,
        what="every generated job served",
        interval=1.0,
    )
    assert operator.running(), operator.log_tail(60)
    assert not unserved(), unserved()[:20]
    states = final_states(cluster, namespace)
    cluster.create_job(GOOD)
    cluster.wait_condition("good", "Running", timeout=60)  # kwok runs its Pods
    assert crashes(operator) == 0, operator.log_tail(60)
    write_figures(JOBS, at_admission, states, crashes(operator), time.monotonic() - started)


def final_states(cluster: Cluster, namespace: str) -> collections.Counter[str]:
    """How the admitted jobs ended up: state, and the reason of a failure."""
    items = cast(
        dict[str, Any],
        cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
    )
    counted: collections.Counter[str] = collections.Counter()
    for item in items["items"]:
        status = item.get("status") or {}
        reasons = [
            str(c.get("reason"))
            for c in status.get("conditions") or []
            if c.get("type") == "Failed" and c.get("status") == "True"
        ]
        counted[" / ".join([str(status.get("state")), *reasons])] += 1
    return counted


def write_figures(
    jobs: int, at_admission: int, states: collections.Counter[str], crashed: int, seconds: float
) -> None:
    figures: dict[str, object] = {
        "generated jobs created": jobs,
        "  refused at admission": at_admission,
    }
    figures.update({f"  admitted, now {state}": n for state, n in sorted(states.items())})
    figures.update({"operator crashes": crashed, "seconds": round(seconds)})
    save_figures("fuzz-operator.json", figures)
