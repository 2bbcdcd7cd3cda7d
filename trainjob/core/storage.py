"""Checkpoint locations on object storage: ``s3://bucket/prefix`` and ``gs://bucket/prefix`` (pure).

``spec.checkpoint.path`` is either a path (a mounted volume) or one of these URLs. The core
only parses and validates them (so ``trainjob validate``, ``trainjob run --dry-run`` and the
operator reject a bad one before anything starts); the runtime does the I/O
(:mod:`trainjob.runtime.objectstore`).

Which schemes work, and how:

- ``gs://``: TensorFlow's own GCS filesystem (built into TensorFlow): checkpoints, TensorBoard
  logs and the exported model are written there directly.
- ``s3://``: TensorFlow 2.21 has no S3 filesystem (it left TensorFlow's core in 2.6; the
  tensorflow-io 0.37.1 plugin does not load into 2.21), so the runtime writes to local disk
  and uploads each complete checkpoint with a completion marker written last.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

S3: Final = "s3"
GS: Final = "gs"
SCHEMES: Final = (S3, GS)

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# S3: 3-63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or
# digit. GCS also allows underscores, and up to 222 characters when the name has dots.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


@dataclasses.dataclass(frozen=True)
class StoreURL:
    """``scheme://bucket/prefix``; ``prefix`` has no leading or trailing slash ("" for the
    bucket's root)."""

    scheme: str
    bucket: str
    prefix: str

    def url(self, *parts: str) -> str:
        """The URL of ``parts`` under this location (the location itself without parts)."""
        return f"{self.scheme}://{self.bucket}/{self.key(*parts)}".rstrip("/")

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` under the prefix (a key never starts with a slash)."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))


class InvalidStoreURL(ValueError):  # noqa: N818 - read as "invalid store URL: why"
    """The path looks like a URL but is not one the runtime can write."""


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a filesystem path."""
    return _SCHEME.match(path) is not None


def parse(path: str) -> StoreURL:
    """Parse ``s3://bucket/prefix`` or ``gs://bucket/prefix``; :class:`InvalidStoreURL` says why
    anything else is refused."""
    match = _SCHEME.match(path)
    if match is None:
        raise InvalidStoreURL(f"{path!r} is not a URL (scheme://bucket/prefix)")
    scheme = match.group(1)
    if scheme not in SCHEMES:
        raise InvalidStoreURL(
            f"scheme {scheme!r} is not supported: use s3://bucket/prefix, gs://bucket/prefix "
            "or a mounted path (with claimName)"
        )
    rest = path[match.end() :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise InvalidStoreURL(f"{path!r} names no bucket ({scheme}://bucket/prefix)")
    pattern = _S3_BUCKET if scheme == S3 else _GS_BUCKET
    if not pattern.match(bucket):
        raise InvalidStoreURL(
            f"{bucket!r} is not a valid {scheme}:// bucket name (3-63 lower-case letters, "
            "digits, dots and hyphens, starting and ending with a letter or digit)"
        )
    segments = prefix.strip("/").split("/") if prefix.strip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        raise InvalidStoreURL(f"{path!r}: the prefix has an empty, '.' or '..' segment")
    return StoreURL(scheme=scheme, bucket=bucket, prefix="/".join(segments))


def problem(path: str) -> str | None:
    """Why ``path`` cannot be a checkpoint location, or ``None`` (paths are always fine here;
    the claim rules are the spec's)."""
    if not is_url(path):
        return None
    try:
        parse(path)
    except InvalidStoreURL as exc:
        return str(exc)
    return None


ESTIMATOR: Final = "Estimator"


def framework_problem(path: str, framework: str) -> str | None:
    """Why ``path`` cannot hold the checkpoints of ``framework``, or ``None``.

    ``s3://`` is refused for Estimator: Estimator (TensorFlow 2.15, the legacy image) writes its
    model_dir itself, and an evaluator reads each new checkpoint there while the others train.
    An ``s3://`` location is a staging directory that the chief uploads and every replica
    downloads once, at its start, so an evaluator would never see a new checkpoint and wait for
    ever; TensorFlow 2.15 has no ``s3://`` filesystem of its own either."""
    if framework != ESTIMATOR or not is_url(path):
        return None
    try:
        url = parse(path)
    except InvalidStoreURL:
        return None  # problem() says why
    if url.scheme != S3:
        return None
    return (
        "s3:// does not work with framework Estimator (its evaluator reads each new checkpoint "
        "from the model_dir while training runs, and TensorFlow 2.15 has no s3:// filesystem): "
        "put an Estimator job's checkpoints on a volume (claimName and a path)"
    )
