"""Bad input at scale (issue 17 part 3): every manifest of the invalid corpora goes through the
real API server to the running operator, beside a valid job.

- tests/corpus/invalid/*.yaml: refused at admission (schema, CEL, strict decoding), the
  message naming the field of the file's `# expect:` line;
- tests/corpus/invalid-at-run/*.yaml: what admission cannot catch (the parser's own checks,
  template fields only the Pod's validation knows, conflicting ports): the operator marks the
  job Failed / InvalidSpec with a message naming the field.

The operator never crashes (no process exit, no "crashed" reconcile) and serves the valid job.
With $TRAINJOB_RELIABILITY_DIR set, the figures go to bad-input.json there (tests/RELIABILITY.md,
`python -m tests.reliability`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import GROUP, PLURAL, VERSION, Cluster, trainjob
from tests.reliability import save_figures
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

CORPUS: Final = REPO_ROOT / "tests" / "corpus"
AT_ADMISSION: Final = sorted((CORPUS / "invalid").glob("*.yaml"))
AT_RUN: Final = sorted((CORPUS / "invalid-at-run").glob("*.yaml"))
REASON: Final = "InvalidSpec"
# What the operator logs when a reconcile raised something unexpected (handlers.py).
CRASH_MARK: Final = "crashed; retrying"
T: Final = 60.0


def expectation(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <field>'"
    return first.removeprefix("# expect: ").strip()


def load(path: Path) -> dict[str, Any]:
    body = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(body, dict), path.name
    return body


def server_message(exc: ApiException) -> str:
    try:
        status = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.body)
    causes = (status.get("details") or {}).get("causes") or []
    return "\n".join(
        [str(status.get("message", ""))]
        + [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes]
    )


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = operator_process.Operator(kubeconfig, log, "--namespace=test-bad-*").start()
    try:
        yield op.wait_serving(T)
    finally:
        op.stop()


def crashes(operator: operator_process.Operator) -> int:
    """Reconciles that raised something unexpected, plus 1 if the process is gone."""
    text = operator.log.read_text(encoding="utf-8", errors="replace")
    return text.count(CRASH_MARK) + (0 if operator.running() else 1)


def failed_invalid(cluster: Cluster, name: str) -> dict[str, Any] | None:
    condition = cluster.condition(name, "Failed")
    return condition if condition and condition.get("reason") == REASON else None


def test_bad_input_is_refused_naming_the_field_and_the_operator_serves_on(
    api_client: k8s.ApiClient, namespace: str, operator: operator_process.Operator
) -> None:
    assert namespace.startswith("test-bad-"), namespace
    cluster = Cluster(api_client, namespace)
    cluster.create_job(trainjob("good", chief=1, workers=1))
    admitted: list[str] = []
    rejected: dict[str, str] = {}
    for path in AT_ADMISSION + AT_RUN:
        body = load(path)
        if path in AT_RUN:
            body["metadata"]["name"] = path.stem  # one namespace: unique names
        try:
            cluster.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
            )
            admitted.append(path.name)
        except ApiException as exc:
            assert exc.status in (400, 422), f"{path.name}: {exc.status} {exc.body}"
            rejected[path.name] = server_message(exc)

    misses = [
        f"{p.name}: expected {expectation(p)!r} in {rejected.get(p.name)!r}"
        for p in AT_ADMISSION
        if expectation(p) not in rejected.get(p.name, "")
    ]
    assert not misses, "\n".join(misses)
    assert admitted == [p.name for p in AT_RUN], "refused at admission: " + ", ".join(
        sorted(set(rejected) - {p.name for p in AT_ADMISSION})
    )

    marked: dict[str, str] = {}
    for path in AT_RUN:
        condition = waits.wait_until(
            functools.partial(failed_invalid, cluster, path.stem),
            timeout=T,
            what=f"{path.stem} Failed/{REASON}; operator log:\n{operator.log_tail(30)}",
        )
        marked[path.name] = str(condition.get("message", ""))
    misses = [
        f"{p.name}: expected {expectation(p)!r} in {marked[p.name]!r}"
        for p in AT_RUN
        if expectation(p) not in marked[p.name] or not marked[p.name].startswith("spec.")
    ]
    assert not misses, "\n".join(misses)

    # The valid job, created first, is served while and after all this.
    cluster.run_all("good", {"good-chief-0", "good-worker-0"})
    cluster.wait_condition("good", "Running", timeout=T)
    assert crashes(operator) == 0, operator.log_tail(60)
    write_figures(
        tried=len(AT_ADMISSION) + len(AT_RUN),
        at_admission=len(AT_ADMISSION),
        invalid_spec=len(marked),
        crashes=crashes(operator),
        examples={**rejected, **marked},
    )


def write_figures(
    tried: int, at_admission: int, invalid_spec: int, crashes: int, examples: dict[str, str]
) -> None:
    figures: dict[str, object] = {
        "bad inputs tried": tried,
        "rejected at admission, naming the field": at_admission,
        "marked Failed/InvalidSpec, naming the field": invalid_spec,
        "operator crashes": crashes,
        "valid job served alongside": "yes",
    }
    save_figures("bad-input.json", figures, messages=examples)
