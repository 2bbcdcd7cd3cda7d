"""`trainjob validate` and the CRD agree on generated manifests (issue 17 part 3).

Each manifest from tests/specgen.py goes to the real API server as a server-side dry run
(strict field validation, as kubectl sends it) and through the parser. A manifest the API
server refuses must be refused by the parser too (else `trainjob validate` says valid and
`kubectl apply` fails). One the parser refuses and the API server admits is allowed only for
the parser's documented extra checks (docs: concepts/semantics.md, "Validation"): the
operator then marks it Failed / InvalidSpec. Then `trainjob validate -o json` runs once over
every manifest and must give the parser's verdict for each.

CI runs a fixed, derandomized sample; `TRAINJOB_FUZZ_EXAMPLES=5000` runs more.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from hypothesis import given
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests import specgen
from tests.reliability import save_figures
from trainjob import cli
from trainjob.core import spec

pytestmark = pytest.mark.integration

GROUP: Final = "trainjob.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "trainjobs"
# The parser's checks the CRD does not make (docs: concepts/semantics.md, "Validation"):
# container names must be DNS-1123 labels (the CRD leaves template contents to the Pod's own
# validation; the parser needs the names to find the `tensorflow` container).
PARSER_ONLY: Final = (re.compile(r"\.template\.spec\.containers\[\d+\]\.name$"),)


@pytest.fixture(scope="module")
def dry_run_namespace(core_v1: k8s.CoreV1Api) -> Iterator[str]:
    """A namespace of its own (hypothesis runs one test body many times: no per-test fixture)."""
    name = f"spec-fuzz-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core_v1.delete_namespace(name)


def server_verdict(api: k8s.CustomObjectsApi, namespace: str, manifest: Any) -> str | None:
    """None when the API server would store the manifest, else its message."""
    try:
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All", field_validation="Strict"
        )
    except ApiException as exc:
        assert exc.status in (400, 422), f"{exc.status}: {exc.body}\n{manifest}"
        return str(json.loads(exc.body or "{}").get("message", exc.body))
    return None


def documented(problem: spec.Problem) -> bool:
    return any(pattern.search(problem.path) for pattern in PARSER_ONLY)


def validate_cli(manifests: list[Any], tmp: Path) -> list[bool]:
    """`trainjob validate -o json` over all manifests at once: each document's `valid`."""
    path = tmp / "generated.yaml"
    path.write_text(yaml.safe_dump_all(manifests, sort_keys=False), encoding="utf-8")
    out = io.StringIO()
    cli.main(["validate", "-f", str(path), "-o", "json"], out=out, err=io.StringIO())
    return [bool(result["valid"]) for result in json.loads(out.getvalue())]


def test_validate_and_the_crd_agree_on_generated_manifests(
    custom_objects: k8s.CustomObjectsApi, dry_run_namespace: str, tmp_path: Path
) -> None:
    seen: list[Any] = []
    counts = {"admitted": 0, "refused by both": 0, "parser-only (documented)": 0}

    @specgen.fuzz_settings(ci_examples=300)
    @given(specgen.mutated())
    def agree(manifest: Any) -> None:
        seen.append(manifest)
        refused = server_verdict(custom_objects, dry_run_namespace, manifest)
        problems = spec.problems_of(manifest)
        if refused is not None:
            assert problems, f"the API server refused it, the parser did not: {refused}"
            counts["refused by both"] += 1
        elif problems:
            assert all(documented(p) for p in problems), f"only the parser refused: {problems}"
            counts["parser-only (documented)"] += 1
        else:
            counts["admitted"] += 1

    agree()
    verdicts = validate_cli(seen, tmp_path)
    assert verdicts == [not spec.problems_of(m) for m in seen]
    assert counts["admitted"] >= len(seen) // 10, counts  # the sample is not all invalid
    write_figures(len(seen), counts)


def write_figures(generated: int, counts: dict[str, int]) -> None:
    figures: dict[str, object] = {"fuzzed specs (server dry run + trainjob validate)": generated}
    figures.update({f"  {key}": value for key, value in counts.items()})
    figures["disagreements (after the fixes)"] = 0
    save_figures("spec-fuzz.json", figures)
