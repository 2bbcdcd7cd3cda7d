"""The differential test of the TFJob front door: every manifest of tests/corpus/tfjob, played
by its script under OUR operator (`--tfjob`) on the real control plane, observed and compared
with what Kubeflow's training-operator v1.9.4 did with the same manifest and script (the golden
files tests/corpus/tfjob/expected/*.json; harness and recording command:
tests/integration/tfjob_differential.py). Any difference not in ALLOWED fails, listed path by
path. With TRAINJOB_TFJOB_OBSERVED=DIR each case's observation under ours is written to
DIR/<case>.json, and `python -m tests.integration.tfjob_differential --diff DIR` lists every
difference, the allowed ones too."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.controlplane import gang
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import ToolsMissingError
from tests.integration.conftest import TFJOB_CRD
from tests.integration.tfjob_differential import (
    ALLOWED,
    GANG_NAMESPACE_PREFIX,
    NAMESPACE_PREFIX,
    OBSERVED_DIR_ENV,
    case_names,
    compare,
    describe,
    load_case,
    load_expected,
    report,
    run_case,
)
from tests.support import operator_process

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tfjob_crd_applied(control_plane: ControlPlane) -> None:
    """The v1.9.4 TFJob CRD as this repository ships it (no training-operator needed)."""
    control_plane.apply_crds([TFJOB_CRD])


def start_ours(log: Path, kubeconfig: Path, *args: str) -> Iterator[operator_process.Operator]:
    operator = operator_process.Operator(kubeconfig, log, "--tfjob", *args).start()
    try:
        yield operator.wait_serving(60)
    finally:
        operator.stop()
        print(f"operator log: {log}\n{operator.log_tail(30)}")


@pytest.fixture(scope="module")
def our_operator(
    kubeconfig: Path, tfjob_crd_applied: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    """Ours, serving the namespaces of the cases without gang scheduling."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    yield from start_ours(log, kubeconfig, f"--namespace={NAMESPACE_PREFIX}-*")


@pytest.fixture(scope="module")
def our_gang_operator(
    control_plane: ControlPlane,
    kubeconfig: Path,
    tfjob_crd_applied: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[operator_process.Operator]:
    """Ours with gang scheduling on (scheduler-plugins), serving the gang cases' namespaces
    (training-operator recorded them with --gang-scheduler-name=scheduler-plugins-scheduler)."""
    try:
        crds = gang.crd_files()
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    control_plane.apply_crds(crds)
    log = tmp_path_factory.mktemp("operator-gang") / "operator.log"
    yield from start_ours(
        log,
        kubeconfig,
        "--gang-scheduler=scheduler-plugins",
        f"--namespace={GANG_NAMESPACE_PREFIX}-*",
    )


def test_corpus_complete_and_recorded() -> None:
    """Every manifest has a script and a golden file recorded from that script (the step
    words match): a changed script without a new recording fails here."""
    names = case_names()
    assert len(names) >= 20, names
    stale = []
    for name in names:
        case = load_case(name)
        assert case.expected_path.is_file(), (
            f"{name}: no golden file; record it with "
            f"`python -m tests.integration.tfjob_differential --record {name}`"
        )
        golden = load_expected(case)
        assert golden["controller"].startswith("training-operator v1.9."), golden["controller"]
        recorded = [step["step"] for step in golden["steps"]]
        if recorded != [describe(step) for step in case.steps] or golden.get("error"):
            stale.append(name)
        unsettled = [s["step"] for s in golden["steps"] if s.get("settled") is False]
        assert not unsettled, f"{name}: training-operator never settled at {unsettled}"
    assert not stale, f"golden files out of date with their scripts (record them again): {stale}"


@pytest.mark.parametrize("name", case_names())
def test_tfjob_as_training_operator_does(
    name: str, request: pytest.FixtureRequest, api_client: k8s.ApiClient
) -> None:
    case = load_case(name)
    our_operator: operator_process.Operator = request.getfixturevalue(
        "our_gang_operator" if case.gang else "our_operator"
    )
    golden = load_expected(case)
    observed = run_case(api_client, case, golden=golden, allowances=ALLOWED)
    dump = os.environ.get(OBSERVED_DIR_ENV)
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{name}.json").write_text(json.dumps(observed, indent=1), encoding="utf-8")
    assert our_operator.running(), our_operator.log_tail()
    unexplained, _ = compare(name, golden, observed, ALLOWED)
    assert not observed.get("error"), f"{name}: {observed['error']}\n" + report(name, unexplained)
    assert not unexplained, report(name, unexplained)
