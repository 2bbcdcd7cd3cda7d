"""Checking a manifest field by field: the :class:`Collector` that gathers every problem with
its field path (so one pass reports all of them), and the checks of a replica's Pod template
that the CRD's schema makes too (the CRD keeps templates open, so the API server checks the
rest when the operator creates the Pod). Pure; :mod:`trainjob.core.spec` drives it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants
from trainjob.core.model import Problem

# The CRD's maxItems for a template's containers and a container's ports.
MAX_CONTAINERS: Final = 32
MAX_PORTS: Final = 64
_DNS_1123: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Collector:
    """Gathers problems while parsing so one pass reports all of them."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"must be an object, got {type_name(value)}")
            return {}
        return value

    def integer(
        self, value: object, path: str, default: int | None, minimum: int, maximum: int | None
    ) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be an integer, got {type_name(value)}")
            return default
        if value < minimum:
            self.add(path, f"must be >= {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.add(path, f"must be <= {maximum}, got {value}")
            return default
        return value

    def string(self, value: object, path: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.add(path, f"must be a non-empty string, got {type_name(value)}")
            return None
        return value

    def enum(self, value: object, path: str, allowed: Sequence[str], default: str) -> str:
        if value is None:
            return default
        if value not in allowed:
            self.add(path, f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        assert isinstance(value, str)
        return value

    def unknown_keys(self, obj: Mapping[str, Any], path: str, known: Sequence[str]) -> None:
        for key in obj:
            if key not in known:
                self.add(field_path(path, key), f"unknown field (known: {', '.join(known)})")


_PLAIN_KEY: Final = re.compile(r"^[A-Za-z0-9_-]+$")


def field_path(path: str, key: object) -> str:
    """`path.key`, or `path['odd key']` for a key that is empty, not a string or has dots, so
    the path still reads as one field."""
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


def check_template(c: Collector, template: Mapping[str, Any], path: str) -> None:
    """What the CRD's schema checks of a PodTemplateSpec, plus container names (the CRD keeps
    templates open, so the API server checks the rest when the operator creates the Pod)."""
    metadata = c.mapping(template.get("metadata"), f"{path}.metadata")
    for key in ("labels", "annotations"):
        _check_string_map(c, metadata.get(key), f"{path}.metadata.{key}")
    for kind, key, why in reserved_keys(metadata):
        c.add(field_path(f"{path}.metadata.{kind}", key), why)
    pod_spec = c.mapping(template.get("spec"), f"{path}.spec")
    # The renderer merges its own entries into these: they must have the shape it expects.
    c.mapping(pod_spec.get("securityContext"), f"{path}.spec.securityContext")
    _check_objects(c, pod_spec.get("volumes"), f"{path}.spec.volumes")
    containers = pod_spec.get("containers")
    if containers is None:
        return
    cpath = f"{path}.spec.containers"
    if not isinstance(containers, list) or not containers:
        c.add(cpath, "must be a non-empty array")
        return
    if len(containers) > MAX_CONTAINERS:
        c.add(cpath, f"must have at most {MAX_CONTAINERS} items, got {len(containers)}")
    names = [
        _check_container(c, container, f"{cpath}[{i}]") for i, container in enumerate(containers)
    ]
    if len(containers) > 1 and constants.DEFAULT_CONTAINER_NAME not in names:
        c.add(
            cpath,
            f"with several containers, one must be named {constants.DEFAULT_CONTAINER_NAME} "
            "(it gets TF_CONFIG and the TensorFlow port)",
        )


# Why a template cannot set each reserved key (its words, after the key's field path).
RESERVED_LABEL: Final = (
    "is set by TrainJob on every Pod (the job's Services, NetworkPolicy and operator select "
    "its Pods by it); remove it from the template"
)
RESERVED_ANNOTATION: Final = (
    "is set by TrainJob on every Pod (the operator's own bookkeeping); remove it from the template"
)


def reserved_keys(metadata: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The keys of a template's metadata that only TrainJob sets: ("labels" or "annotations",
    key, why) for each. Replacing the user's value would be silent; keeping it would break
    the selectors (or the bookkeeping) that rely on ours."""
    found: list[tuple[str, str, str]] = []
    for kind, reserved, why in (
        ("labels", constants.RESERVED_TEMPLATE_LABELS, RESERVED_LABEL),
        ("annotations", constants.RESERVED_TEMPLATE_ANNOTATIONS, RESERVED_ANNOTATION),
    ):
        given = metadata.get(kind)
        if isinstance(given, Mapping):
            found.extend((kind, key, why) for key in reserved if key in given)
    return found


def _check_container(c: Collector, container: object, path: str) -> str | None:
    """One container's name, image and ports; returns its name when it is valid."""
    if not isinstance(container, Mapping):
        # The CRD says "must be of type object" for null items too (a YAML `- ` with nothing).
        c.add(path, f"must be an object, got {type_name(container)}")
        return None
    image = container.get("image")
    if image is not None and not isinstance(image, str):
        c.add(f"{path}.image", f"must be a string, got {type_name(image)}")
    _check_ports(c, container.get("ports"), f"{path}.ports")
    for j, variable in _check_objects(c, container.get("env"), f"{path}.env"):
        if not isinstance(variable.get("name"), str):
            c.add(f"{path}.env[{j}].name", "is required (a string)")
    _check_objects(c, container.get("volumeMounts"), f"{path}.volumeMounts")
    c.mapping(container.get("securityContext"), f"{path}.securityContext")
    name = container.get("name")
    if not isinstance(name, str) or not _DNS_1123.match(name) or len(name) > 63:
        c.add(f"{path}.name", "is required and must be a DNS-1123 label")
        return None
    return name


def _check_string_map(c: Collector, value: object, path: str) -> None:
    for key, item in c.mapping(value, path).items():
        if item is not None and not isinstance(item, str):  # null: pruned, as above
            c.add(field_path(path, key), f"must be a string, got {type_name(item)}")


def _check_objects(c: Collector, value: object, path: str) -> list[tuple[int, Mapping[str, Any]]]:
    """An optional array of objects; the items that are objects, with their index."""
    if value is None:
        return []
    if not isinstance(value, list):
        c.add(path, f"must be an array, got {type_name(value)}")
        return []
    objects: list[tuple[int, Mapping[str, Any]]] = []
    for i, item in enumerate(value):
        if isinstance(item, Mapping):
            objects.append((i, item))
        else:
            c.add(f"{path}[{i}]", f"must be an object, got {type_name(item)}")
    return objects


def _check_ports(c: Collector, ports: object, path: str) -> None:
    if ports is None:
        return
    if not isinstance(ports, list):
        c.add(path, f"must be an array, got {type_name(ports)}")
        return
    if len(ports) > MAX_PORTS:
        c.add(path, f"must have at most {MAX_PORTS} items, got {len(ports)}")
    for j, port in enumerate(ports):
        ppath = f"{path}[{j}]"
        if not isinstance(port, Mapping):
            c.add(ppath, f"must be an object, got {type_name(port)}")
            continue
        name = port.get("name")
        if name is not None and not isinstance(name, str):
            c.add(f"{ppath}.name", f"must be a string, got {type_name(name)}")
        if port.get("containerPort") is None:
            c.add(f"{ppath}.containerPort", "is required")
        else:
            c.integer(port.get("containerPort"), f"{ppath}.containerPort", None, 1, 65535)
