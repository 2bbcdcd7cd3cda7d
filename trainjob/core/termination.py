"""A container's termination message: the one wire format the runtime writes there and the
operator and the CLI read (pure).

The runtime writes one JSON object, compact, with up to two keys::

    {"trainjobProgress": {"state": "Succeeded", "step": 300, ...},
     "trainjobError": "ValueError: learning rate must be > 0"}

`trainjobProgress` is the chief's final progress report (:mod:`trainjob.core.progress`'s wire
format): the operator shows the final figures even when the last POST never arrived.
`trainjobError` is a failed replica's exception line: the job's status quotes it even after
cleanPodPolicy deleted the Pod and its log. Anything else a container wrote there (a script of
one's own; FallbackToLogsOnError puts the log's 2 KiB tail there) is read as a person would
read it (:mod:`trainjob.core.lastwords`).

The kubelet keeps the first 4 KiB of a termination message; what is written here stays under
`LIMIT`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import lastwords, progress

# The kubelet keeps the first 4 KiB of a termination message; leave room to spare.
LIMIT: Final = 4000
PROGRESS_KEY: Final = "trainjobProgress"
ERROR_KEY: Final = "trainjobError"


@dataclasses.dataclass(frozen=True)
class Message:
    """What a termination message says: the final report, and the replica's own last words."""

    report: progress.Report | None = None
    cause: str | None = None


def _encode(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"))


def with_report(report: progress.Report) -> str:
    """The final report as a termination message. Only a huge checkpoint path can pass
    `LIMIT`: then what is optional (metrics, the checkpoint) is left out."""
    text = _encode({PROGRESS_KEY: progress.to_wire(report)})
    if len(text) > LIMIT:
        slim = dataclasses.replace(report, metrics={}, last_checkpoint=None)
        text = _encode({PROGRESS_KEY: progress.to_wire(slim)})
    return text


def with_error(previous: str, line: str) -> str:
    """The message with the replica's exception line beside what it held already (the chief's
    final report). Past `LIMIT` the error alone is kept, as it says why the job failed."""
    line = lastwords.cut_cause(line)
    merged: dict[str, Any] = {}
    try:
        parsed = json.loads(previous) if previous.strip() else {}
    except ValueError:
        parsed = {}
    if isinstance(parsed, dict):
        merged = parsed
    merged[ERROR_KEY] = line
    text = _encode(merged)
    if len(text) > LIMIT:
        text = _encode({ERROR_KEY: line})
    return text


def read(text: object) -> Message:
    """The final report (None: none, or a bad one) and the cause: the runtime's error line,
    else whatever else the container wrote there read as a person reads a log's tail: the last
    traceback's exception line, else the last line unless it is a redrawn progress bar. No
    cause for a progress report alone, or for nothing."""
    if not isinstance(text, str) or not text.strip():
        return Message()
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            error = parsed.get(ERROR_KEY)
            return Message(
                _report(parsed.get(PROGRESS_KEY)),
                lastwords.cut_cause(str(error)) if error else None,
            )
    found = lastwords.last_exception(text) or lastwords.last_line(text)
    return Message(None, lastwords.cut_cause(found) if found else None)


def _report(raw: object) -> progress.Report | None:
    if raw is None:
        return None
    try:
        return progress.parse_report(raw)
    except progress.ReportError:
        return None
