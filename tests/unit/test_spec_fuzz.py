"""Property-based tests of the spec parser (hypothesis; strategies in tests/specgen.py).

Bad input must end as a SpecError listing field paths, never as another exception: the
operator turns SpecError into Failed / InvalidSpec, and anything else into a reconcile crash
retried forever. What the parser accepts must render and be decided on without raising.
The real API server's view of the same manifests is compared in
tests/integration/test_spec_fuzz_crd.py.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, Final

import pytest
from hypothesis import given

from tests import specgen
from trainjob.core import policy, render, spec
from trainjob.core import status as st

pytestmark = pytest.mark.unit

NOW: Final = datetime.datetime(2026, 11, 23, tzinfo=datetime.timezone.utc)
# A problem's path is a field path such as `spec.replicaSpecs.worker.template.spec.containers[0]`
# (`<document>` when the document is not a mapping at all; `spec['odd key']` for odd keys).
PATH: Final = re.compile(r"^(?!\.).+(?<!\.)$", re.DOTALL)
DNS_1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# Template fields the renderer reads or merges its own entries into.
RENDERED_INTO: Final = (
    "pod.securityContext",
    "pod.volumes",
    "pod.schedulerName",
    "container.env",
    "container.ports",
    "container.volumeMounts",
    "container.securityContext",
    "container.command",
    "container.image",
    "meta.labels",
    "meta.annotations",
)


def wrap(where: str, value: Any) -> Any:
    """`value` placed where the parser looks deepest into user data."""
    base: dict[str, Any] = {
        "apiVersion": specgen.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": "fuzz"},
    }
    if where == "document":
        return value
    if where == "spec":
        return {**base, "spec": value}
    replica: dict[str, Any] = {"template": value}
    container: dict[str, Any] = {"name": "tensorflow"}
    if where == "container":
        replica = {"template": {"spec": {"containers": [value]}}}
    elif where == "replica":
        replica = value
    elif where.startswith("pod."):
        pod = {where.removeprefix("pod."): value, "containers": [container]}
        replica = {"template": {"spec": pod}}
    elif where.startswith("container."):
        container[where.removeprefix("container.")] = value
        replica = {"template": {"spec": {"containers": [container]}}}
    elif where.startswith("meta."):
        replica = {"template": {"metadata": {where.removeprefix("meta."): value}}}
    return {**base, "spec": {"image": "i", "replicaSpecs": {"worker": replica}}}


def parse_or_problems(manifest: Any) -> spec.TrainJob | list[spec.Problem]:
    """The parsed job, or its problems; any other exception fails the test with the input."""
    try:
        return spec.parse(manifest)
    except spec.SpecError as error:
        assert error.problems, "a SpecError without problems"
        for problem in error.problems:
            assert PATH.match(problem.path), problem
            assert problem.message, problem
        return list(error.problems)


@specgen.fuzz_settings(ci_examples=150)
@given(specgen.yaml_values)
def test_parser_raises_only_spec_error_on_any_yaml_value(value: Any) -> None:
    """...and what it accepts renders: the renderer merges into these template fields."""
    for where in ("document", "spec", "replica", "template", "container", *RENDERED_INTO):
        result = parse_or_problems(wrap(where, value))
        if isinstance(result, spec.TrainJob):
            check_renders(result)


def check_renders(job: spec.TrainJob) -> None:
    """Every child renders with a DNS-1035 name of at most 63 characters (Services need it),
    and the policy engine decides the first reconcile."""
    options = render.RenderOptions(namespace="ns", default_image="example.com/default:1")
    manifests = render.render_all(job, options, render.Owner(name=job.name, uid="u"))
    assert len(manifests) == 2 * job.total_replicas
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        assert len(name) <= 63 and DNS_1035.match(name), name
    decision = policy.reconcile(job, st.from_dict({}), {}, set(), NOW)
    assert len(decision.create_pods) == job.total_replicas


@specgen.fuzz_settings(ci_examples=300)
@given(specgen.mutated(large_valid=False))
def test_mutated_manifests_parse_to_problems_or_a_job_that_renders(manifest: Any) -> None:
    result = parse_or_problems(manifest)
    if isinstance(result, spec.TrainJob):
        check_renders(result)


def test_the_generator_draws_valid_and_invalid_manifests() -> None:
    """The fuzzing above means little if every draw were invalid (or valid)."""
    valid = invalid = 0

    @specgen.fuzz_settings(ci_examples=200, scalable=False)
    @given(specgen.mutated(large_valid=False))
    def count(manifest: Any) -> None:
        nonlocal valid, invalid
        if spec.problems_of(manifest):
            invalid += 1
        else:
            valid += 1

    count()
    assert valid >= 20 and invalid >= 20, (valid, invalid)
