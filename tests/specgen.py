"""Hypothesis strategies for TrainJob manifests, shared by the unit fuzz tests (the parser and
the renderer alone) and the integration ones (the real API server, the running operator).

A generated manifest is a plausible TrainJob (every field drawn from its documented range)
with a few mutations applied at random paths: a wrong type, a boundary or far out-of-range
number, an empty or overlong string, a wrong enum value, a removed key, an unknown key. Most
draws are then invalid in one or two ways, which is what finds disagreements; about a third
stay valid, which is what exercises the renderer and the operator's happy path.

Mutations stay inside `spec` and `metadata.name`: the rest of ObjectMeta (labels,
annotations, namespace) is the API server's to check, not the TrainJob parser's (docs:
concepts/semantics.md, "Validation").
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any, Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

Obj = dict[str, Any]
Path = tuple[str | int, ...]

# More examples for a long run: `TRAINJOB_FUZZ_EXAMPLES=5000 pytest tests/...` (docs:
# development/tests.md).
EXAMPLES_ENV: Final = "TRAINJOB_FUZZ_EXAMPLES"


def fuzz_settings(ci_examples: int, scalable: bool = True) -> settings:
    """CI's profile: a fixed number of examples (`scalable`: unless $TRAINJOB_FUZZ_EXAMPLES
    says more), derandomized (the same examples on every run, so a failure in CI replays
    here), no deadline (a loaded CI machine is slow, not wrong) and no example database
    (nothing written into the tree)."""
    examples = int(os.environ.get(EXAMPLES_ENV, ci_examples)) if scalable else ci_examples
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


API_VERSION: Final = "trainjob.dev/v1alpha1"

# Values a mutation puts at a path: every JSON type, the boundaries of each range the schema
# has (0, 1, 9999, 65535, int32, int64), and strings that are empty, overlong, upper-case,
# relative or absolute. 9999 and 10000 are the replica bound; 2**63 does not fit int64.
NASTY_SCALARS: Final[tuple[Any, ...]] = (
    None,
    True,
    False,
    -(2**63),
    -1,
    0,
    1,
    2,
    48,
    10_000,
    65_535,
    65_536,
    2**31,
    2**40,
    2**63 - 1,
    1.5,
    "",
    "x",
    "X",
    "Never",
    "auto",
    "tensorflow",
    "tfjob-port",
    "relative/dir",
    "/abs/dir",
    "m:f",
    "a" * 64,
    "Tensor_Flow",
    "-x-",
)
# 9999 replicas is valid and would create 20,000 children: only where nothing is created.
LARGE_VALID: Final = 9_999

REPLICA_BOUNDS: Final = {"chief": 1, "evaluator": 1, "ps": 2, "worker": 3}
RESTART_POLICIES: Final = ("Never", "OnFailure", "Always", "ExitCode")
STRATEGIES: Final = (
    "Auto",
    "MultiWorkerMirrored",
    "ParameterServer",
    "Mirrored",
    "OneDevice",
    "DTensor",
)
FRAMEWORKS: Final = ("Keras", "Estimator")


def _maybe(draw: st.DrawFn, value: Any) -> Any:
    """`value`, or a marker that the key is left out (None: the callers drop None keys)."""
    return value if draw(st.booleans()) else None


def _compact(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if v is not None}


@st.composite
def containers(draw: st.DrawFn, with_image: bool) -> list[Obj]:
    """One `tensorflow` container, sometimes a sidecar, sometimes a port named tfjob-port."""
    tf: Obj = {"name": "tensorflow"}
    if with_image or draw(st.booleans()):
        tf["image"] = "example.com/trainjob:fuzz"
    if draw(st.booleans()):
        tf["ports"] = [{"name": "tfjob-port", "containerPort": draw(st.integers(1024, 65535))}]
    if draw(st.integers(0, 3)) == 0:
        # Fields the renderer merges its own entries into: mutations inside them must be
        # refused by both the parser and the CRD, never reach the renderer.
        tf["env"] = [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}]
        tf["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        tf["securityContext"] = {"runAsUser": 1000}
    result = [tf]
    if draw(st.integers(0, 3)) == 0:
        result.append({"name": "sidecar", "image": "example.com/sidecar:fuzz"})
    return result


@st.composite
def replica_spec(draw: st.DrawFn, rtype: str, with_image: bool) -> Obj:
    spec: Obj = _compact(
        {
            "replicas": _maybe(draw, draw(st.integers(0, REPLICA_BOUNDS[rtype]))),
            "restartPolicy": _maybe(draw, draw(st.sampled_from(RESTART_POLICIES))),
        }
    )
    if with_image or draw(st.booleans()):
        pod: Obj = {"containers": draw(containers(with_image))}
        template: Obj = {"spec": pod}
        if draw(st.integers(0, 3)) == 0:
            pod["securityContext"] = {"fsGroup": 1000}
            pod["volumes"] = [{"name": "data", "emptyDir": {}}]
            template["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "b"}}
        spec["template"] = template
    # A replica without a template and without spec.image is invalid on purpose sometimes.
    return spec


@st.composite
def valid_looking(draw: st.DrawFn) -> Obj:
    """A TrainJob drawn from the documented ranges (cross-field rules may still fail)."""
    has_image = draw(st.integers(0, 4)) > 0
    types = draw(
        st.lists(st.sampled_from(sorted(REPLICA_BOUNDS)), min_size=1, max_size=4, unique=True)
    )
    spec: Obj = {
        "replicaSpecs": {
            rtype: draw(replica_spec(rtype, with_image=not has_image)) for rtype in sorted(types)
        }
    }
    if has_image:
        spec["image"] = "example.com/trainjob:fuzz"
    if draw(st.booleans()):
        spec["runtime"] = _compact(
            {
                "entrypoint": "trainjob.samples.mnist:build",
                "strategy": _maybe(draw, draw(st.sampled_from(STRATEGIES))),
                "framework": _maybe(draw, draw(st.sampled_from(FRAMEWORKS))),
                "config": _maybe(draw, {"epochs": 1, "batch_size": 32}),
            }
        )
    if draw(st.integers(0, 2)) == 0:
        claim = draw(st.booleans())
        spec["checkpoint"] = _compact(
            {
                "path": _maybe(draw, "/ckpt"),
                "claimName": "shared" if claim else None,
                "subPath": "job" if claim and draw(st.booleans()) else None,
            }
        )
    if draw(st.booleans()):
        spec["runPolicy"] = _compact(
            {
                "cleanPodPolicy": _maybe(draw, draw(st.sampled_from(("All", "Running", "None")))),
                "backoffLimit": _maybe(draw, draw(st.integers(0, 10))),
                "activeDeadlineSeconds": _maybe(draw, draw(st.integers(1, 86_400))),
                "ttlSecondsAfterFinished": _maybe(draw, draw(st.integers(0, 86_400))),
                "startupDeadlineSeconds": _maybe(draw, draw(st.integers(1, 3_600))),
                "suspend": _maybe(draw, False),
                "schedulingPolicy": _maybe(
                    draw, {"minAvailable": 1, "queue": "default", "priorityClass": "high"}
                ),
            }
        )
    if draw(st.booleans()):
        spec["successPolicy"] = draw(st.sampled_from(("ChiefOrWorker0", "AllWorkers")))
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": "fuzz"},
        "spec": spec,
    }


def paths_of(obj: Any, prefix: Path = ()) -> list[Path]:
    """Every path into `obj` below `spec` (and metadata.name), containers and mappings alike."""
    found: list[Path] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = (*prefix, key)
            if prefix or key == "spec":
                found.append(path)
            if prefix or key == "spec":
                found += paths_of(value, path)
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            path = (*prefix, index)
            found.append(path)
            found += paths_of(value, path)
    if not prefix:
        found.append(("metadata", "name"))
    return found


def _not_a_large_count(number: int) -> bool:
    return not 4 <= number <= LARGE_VALID


def _parent(obj: Any, path: Path) -> Any:
    for step in path[:-1]:
        obj = obj[step]
    return obj


@st.composite
def mutated(draw: st.DrawFn, large_valid: bool = True, max_mutations: int = 3) -> Obj:
    """A `valid_looking` manifest with 0..max_mutations mutations at random paths.

    `large_valid`: whether numbers from 4 to 9,999 may be drawn as a value: valid replica
    counts whose jobs render thousands of children (fine for a dry run, not for a test that
    creates them)."""
    manifest = copy.deepcopy(draw(valid_looking()))
    scalars: Sequence[Any] = (*NASTY_SCALARS, LARGE_VALID) if large_valid else NASTY_SCALARS
    values = st.one_of(
        st.sampled_from(scalars),
        st.sampled_from(([], {}, ["x"], {"x": 1}, [{}], [None])),
        st.integers() if large_valid else st.integers().filter(_not_a_large_count),
        st.text(max_size=70),
    )
    for _ in range(draw(st.integers(0, max_mutations))):
        path = draw(st.sampled_from(paths_of(manifest)))
        parent = _parent(manifest, path)
        key = path[-1]
        action = draw(st.sampled_from(("set", "set", "set", "delete", "unknown")))
        if action == "delete" and isinstance(parent, dict):
            parent.pop(key, None)
        elif action == "unknown" and isinstance(parent, dict):
            parent[draw(st.sampled_from(("extra", "Replicas", "templat", "ports")))] = 1
        else:
            # A copy: the sampled lists and dicts are shared, and a mutation inside one would
            # otherwise reach every later draw of it (or make a cycle).
            parent[key] = copy.deepcopy(draw(values))
    return manifest


# Arbitrary YAML-shaped data for the parser alone: any nesting of the types a YAML loader
# produces, non-string keys included (`1: x` is a mapping with an int key).
yaml_values: Final = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=8), st.integers(), st.booleans()), children, max_size=4
        ),
    ),
    max_leaves=20,
)
