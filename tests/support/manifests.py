"""TrainJob manifests as the tests and benchmarks write them: the envelope, a replica spec, the
training container. Each caller picks its own replicas, templates and annotations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

Obj = dict[str, Any]

GROUP: Final = "trainjob.dev"
VERSION: Final = "v1alpha1"
# The container the operator renders TF_CONFIG into and reads exit codes from.
CONTAINER: Final = "tensorflow"


def container(image: str, **extra: Any) -> Obj:
    """The training container of a replica template."""
    return {"name": CONTAINER, "image": image, **extra}


def replica(count: int, template: Obj, restart_policy: str | None = "Never") -> Obj:
    """One entry of `replicaSpecs`; restart policy None leaves the CRD's default."""
    if restart_policy is None:
        return {"replicas": count, "template": template}
    return {"replicas": count, "restartPolicy": restart_policy, "template": template}


def trainjob(name: str, replica_specs: Mapping[str, Obj], run_policy: Obj | None = None) -> Obj:
    """A TrainJob named `name` (namespace from where it is created)."""
    body: Obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"replicaSpecs": dict(replica_specs)},
    }
    if run_policy:
        body["spec"]["runPolicy"] = run_policy
    return body
