"""Checkpoint snapshots on an object store without a TensorFlow filesystem (``s3://``): the
keys, the completion marker and which snapshot to restore (pure; the I/O is
:mod:`trainjob.runtime.objectstore`).

A checkpoint directory the runtime writes (``backup/``, ``loop/``, ``estimator/``: an *area*)
is uploaded whole as one numbered snapshot, its files first and its marker last::

    <prefix>/<area>/0000000007/checkpoint
    <prefix>/<area>/0000000007/ckpt-3.index
    <prefix>/<area>/0000000007/ckpt-3.data-00000-of-00001
    <prefix>/<area>/0000000007.complete      {"files": {"checkpoint": 97, ...}, "step": 300}

Object stores have no rename, so "complete" cannot come from moving a finished directory into
place as TensorFlow does on a filesystem: it comes from the marker, which lists every file and
its size and is written only once they are all uploaded. A replica killed during an upload
leaves files without a marker, and the snapshot before it stays the newest complete one.
Numbers only grow (one writer, the chief, which continues after the highest number it sees),
so a snapshot is never overwritten in place.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

MARKER_SUFFIX: Final = ".complete"
FORMAT: Final = 1
# Snapshots kept after a new one completes: the newest, and the one before it (a replica that
# is still downloading it when the next completes is not left with half a snapshot).
KEEP: Final = 2

_NUMBER = re.compile(r"^(\d{10})(/.+|\.complete)$")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a marker says: every file of the snapshot (path relative to it -> size)."""

    number: int
    files: Mapping[str, int]
    step: int | None = None


def name(number: int) -> str:
    return f"{number:010d}"


def data_key(area_key: str, number: int, relative: str) -> str:
    return f"{area_key}/{name(number)}/{relative}"


def marker_key(area_key: str, number: int) -> str:
    return f"{area_key}/{name(number)}{MARKER_SUFFIX}"


def encode(manifest: Manifest) -> bytes:
    body = {
        "format": FORMAT,
        "number": manifest.number,
        "step": manifest.step,
        "files": dict(sorted(manifest.files.items())),
    }
    return json.dumps(body, sort_keys=True).encode()


def decode(raw: bytes) -> Manifest | None:
    """The marker's manifest, or ``None`` when it is not one (never trusted then)."""
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        return None
    files, number, step = body.get("files"), body.get("number"), body.get("step")
    if not isinstance(number, int) or not isinstance(files, dict) or not files:
        return None
    if not all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in files.items()):
        return None
    return Manifest(number=number, files=files, step=step if isinstance(step, int) else None)


@dataclasses.dataclass(frozen=True)
class Listing:
    """An area's objects, by snapshot number: its files (relative path -> size) and markers."""

    files: Mapping[int, Mapping[str, int]]
    markers: frozenset[int]

    def numbers(self) -> set[int]:
        return set(self.files) | set(self.markers)


def read_listing(area_key: str, objects: Iterable[tuple[str, int]]) -> Listing:
    """Group ``(key, size)`` pairs listed under ``<area_key>/`` into snapshots; other keys are
    not the runtime's and are ignored."""
    files: dict[int, dict[str, int]] = {}
    markers: set[int] = set()
    head = f"{area_key}/" if area_key else ""
    for key, size in objects:
        if not key.startswith(head):
            continue
        match = _NUMBER.match(key[len(head) :])
        if match is None:
            continue
        number, rest = int(match.group(1)), match.group(2)
        if rest == MARKER_SUFFIX:
            markers.add(number)
        else:
            files.setdefault(number, {})[rest[1:]] = size
    return Listing(files=files, markers=frozenset(markers))


def candidates(listing: Listing) -> list[int]:
    """Snapshots whose marker exists, newest first: the ones worth reading a manifest of."""
    return sorted(listing.markers, reverse=True)


def complete(listing: Listing, manifest: Manifest | None, number: int) -> bool:
    """Whether snapshot ``number`` is whole: its marker's manifest is valid, names this
    snapshot, and every file it lists is there with its size."""
    if manifest is None or manifest.number != number or number not in listing.markers:
        return False
    present = listing.files.get(number, {})
    return all(present.get(path) == size for path, size in manifest.files.items())


def newest_complete(listing: Listing, manifests: Mapping[int, Manifest | None]) -> int | None:
    """The snapshot to restore: the highest-numbered complete one (``manifests`` holds the
    decoded markers read so far; a number missing there is not complete)."""
    for number in candidates(listing):
        if complete(listing, manifests.get(number), number):
            return number
    return None


def next_number(listing: Listing) -> int:
    """The number of the next snapshot: above every number seen, complete or not."""
    return max(listing.numbers(), default=0) + 1


def stale(listing: Listing, newest: int, *, keep: int = KEEP) -> list[int]:
    """Snapshots to delete once ``newest`` is complete: all but the ``keep`` highest complete
    ones at or below it (half uploads included); none above it (not this writer's)."""
    kept = sorted((n for n in listing.markers if n <= newest), reverse=True)[:keep]
    return sorted(n for n in listing.numbers() if n <= newest and n not in kept)


def local_manifest(number: int, files: Mapping[str, int], step: int | None) -> Manifest:
    return Manifest(number=number, files=dict(files), step=step)


def upload_order(files: Mapping[str, int]) -> list[str]:
    """Files in the order they are uploaded: smallest first, TensorFlow's index files before
    its data. Only the marker, written after all of them, makes a snapshot complete, so the
    order is free; this one leaves the longest stretch of an upload (the data) with files
    already visible and no marker, the state the half-upload test kills a replica in: a
    reader that trusted the files would find an index naming data not there yet."""
    return sorted(files, key=lambda path: (files[path], path))
