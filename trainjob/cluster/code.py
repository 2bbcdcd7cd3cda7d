"""`trainjob submit --code DIR`: your code on the cluster without an image build (pure).

Locally, `trainjob run` starts each replica in the current directory, so an entrypoint such
as `my_pkg.train:main` imports `my_pkg` from there. On a cluster the same files travel in a
ConfigMap (`<job>-code`, owned by the TrainJob once it exists) mounted read-only in every
replica's TensorFlow container at CODE_DIR, which leads its PYTHONPATH:

- `--code ./my_pkg` ships the directory under its own name: `import my_pkg` works;
- `--code .` ships the current directory's contents, as `trainjob run` sees them from there.

A ConfigMap holds at most 1 MiB (etcd's object limit): a larger tree is refused before
anything is sent, with the way out (an image FROM the trainjob image with the code baked in).
Caches, VCS folders and hidden files are left out. Reading the directory is the caller's
(`cluster/cli/submit.py`); this module only decides what is sent.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants

Obj = dict[str, Any]

CODE_DIR: Final = "/opt/trainjob/code"
VOLUME_NAME: Final = "trainjob-code"
# The API server refuses objects over ~1.5 MB and a ConfigMap's data over 1 MiB.
MAX_BYTES: Final = 1024 * 1024
SKIPPED_DIRS: Final = frozenset({"__pycache__", "node_modules", "venv", ".venv"})
SKIPPED_SUFFIXES: Final = (".pyc", ".pyo")
LABEL_CODE_OF: Final = f"{constants.GROUP}/code-of"


class CodeError(Exception):
    """Why a directory cannot be shipped, in words that name the fix."""


def config_map_name(job_name: str) -> str:
    return f"{job_name}-code"


def wanted(relative_path: str) -> bool:
    """Whether a file of the tree is shipped (no caches, VCS folders or hidden files)."""
    parts = relative_path.split("/")
    if any(part.startswith(".") or part in SKIPPED_DIRS for part in parts):
        return False
    return not parts[-1].endswith(SKIPPED_SUFFIXES)


def too_large(source: str, total: int, count: int) -> str:
    return (
        f"--code {source}: {total / 1024 / 1024:.1f} MiB in {count} files, more than a "
        "ConfigMap holds (1 MiB). Ship less (data belongs on a volume, not in --code), or bake "
        "the code into an image: FROM the trainjob image, COPY your package, and set spec.image"
    )


def _key(path: str, taken: set[str]) -> str:
    """A ConfigMap key for `path` (keys allow only [-._a-zA-Z0-9]); unique within the map."""
    base = re.sub(r"[^-._a-zA-Z0-9]", "_", path).strip(".") or "file"
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}.{n}"
    taken.add(key)
    return key


def bundle(
    job_name: str, namespace: str, source: str, files: Mapping[str, bytes]
) -> tuple[Obj, list[Obj]]:
    """The ConfigMap holding `files` (path under CODE_DIR -> content) and the volume items
    that put each key back at its path. CodeError when the tree is empty or too large."""
    if not files:
        raise CodeError(f"--code {source}: no files to ship (caches and hidden files are skipped)")
    total = sum(len(content) for content in files.values())
    if total > MAX_BYTES:
        raise CodeError(too_large(source, total, len(files)))
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    items: list[Obj] = []
    taken: set[str] = set()
    for path in sorted(files):
        key = _key(path, taken)
        content = files[path]
        try:
            data[key] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[key] = base64.b64encode(content).decode("ascii")
        items.append({"key": key, "path": path})
    config_map: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(job_name),
            "namespace": namespace,
            "labels": {LABEL_CODE_OF: job_name},
        },
        "data": data,
    }
    if binary:
        config_map["binaryData"] = binary
    return config_map, items


def with_code(body: Obj, config_map: str, items: list[Obj]) -> Obj:
    """The TrainJob `body` with the code volume in every replica template, mounted read-only
    in its TensorFlow container (the one named `tensorflow`, else the first), and CODE_DIR
    leading that container's PYTHONPATH. `body` itself is not changed."""
    result = copy.deepcopy(body)
    for replica in ((result.get("spec") or {}).get("replicaSpecs") or {}).values():
        template = replica.setdefault("template", {})
        pod_spec = template.setdefault("spec", {})
        volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != VOLUME_NAME]
        volumes.append(
            {"name": VOLUME_NAME, "configMap": {"name": config_map, "items": copy.deepcopy(items)}}
        )
        pod_spec["volumes"] = volumes
        containers = pod_spec.setdefault("containers", [])
        if not containers:
            containers.append({"name": constants.DEFAULT_CONTAINER_NAME})
        named = [c for c in containers if c.get("name") == constants.DEFAULT_CONTAINER_NAME]
        container = named[0] if named else containers[0]
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != VOLUME_NAME]
        mounts.append({"name": VOLUME_NAME, "mountPath": CODE_DIR, "readOnly": True})
        container["volumeMounts"] = mounts
        env = list(container.get("env") or [])
        own = next((e for e in env if e.get("name") == "PYTHONPATH"), None)
        if own is None:
            env.append({"name": "PYTHONPATH", "value": CODE_DIR})
        elif CODE_DIR not in str(own.get("value") or "").split(":"):
            own["value"] = ":".join(p for p in (CODE_DIR, own.get("value")) if p)
        container["env"] = env
    return result


def owned_by(config_map: Obj, job: Obj) -> Obj:
    """The ConfigMap, owned by the TrainJob as created (so it goes when the job is deleted)."""
    result = copy.deepcopy(config_map)
    meta = job.get("metadata") or {}
    result["metadata"]["ownerReferences"] = [
        {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        }
    ]
    return result
