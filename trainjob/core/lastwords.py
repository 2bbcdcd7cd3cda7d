"""A replica's last words, found the way a person reads a failed container's log (pure).

Python ends an uncaught exception with its traceback and, last, the exception's line. In a
container's log that line is rarely the last one: Keras' progress bar is redrawn with
carriage returns and backspaces and never ends its line, so the container runtime writes
what is left of it after the traceback, when the process exits, and it fills the 2 KiB tail
the kubelet keeps as the termination message (issue 32: a job's cause quoted `69/70
[====>.] - ETA: 0s - loss: 1.6131`). So the cause is the exception line of the *last*
traceback, wherever it is in the tail, and a redrawn progress line is never a cause.

Also: the hint a refused write on a mounted volume gets (`ownership_hint`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

# A cause longer than this is cut: it is quoted in a condition message and an Event.
MAX_CAUSE_CHARS: Final = 400
# CSI sequences (colors, cursor moves; Keras 3 colours its bar), OSC sequences, two-byte escapes.
_ANSI_ESCAPE: Final = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])"
)
# Control characters but tab (backspaces: tf-keras' Progbar erases its last bar with them).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TRACEBACK: Final = "Traceback (most recent call last):"
# The line Python prints last for an uncaught exception: `KeyError: 'evaluator'`,
# `tensorflow.python.framework.errors_impl.PermissionDeniedError: ...`, `KeyboardInterrupt`.
_EXCEPTION: Final = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$")
# The same outside a traceback (its header was cut off the tail): only a name that says it
# is an exception counts, so an ordinary `Done` or `loss: 0.3` line is never taken for one.
_NAMED_EXCEPTION: Final = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)(?::\s.*)?$"
)
_MODULE_PATH: Final = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*(?::|$))")
# TensorFlow prefixes an op's error with the function it ran in:
# `{{function_node __wrapped__SaveV2_dtypes_11_device_/job:localhost/...}} /train/ckpt; ...`.
_TF_FUNCTION_NODE: Final = re.compile(r"\{\{function_node [^}]*\}\}\s*")

# A write refused for the file's owner: errno EACCES in any of the words programs use for it.
_ACCESS_DENIED: Final = re.compile(
    r"Permission denied|PermissionDeniedError|PermissionError|EACCES|\[Errno 13\]"
)
# An absolute path, where a message names one: after a space, a quote, `(` or `=`.
_PATH: Final = re.compile(r"(?<![^\s'\"(=`])/[^\s'\";:,()\[\]{}`]*")


def screen_lines(text: str) -> list[str]:
    """`text` as lines a person can read: escape sequences and control characters gone, and
    each part between carriage returns a line of its own (every redraw of a progress bar,
    so none of them hides what came before it on the same line). Indentation is kept."""
    lines: list[str] = []
    for line in text.split("\n"):
        for part in _ANSI_ESCAPE.sub("", line).split("\r"):
            visible = _CONTROL.sub("", part).rstrip()
            if visible.strip():
                lines.append(visible)
    return lines


def short_exception(line: str) -> str:
    """`tensorflow.python.framework.errors_impl.PermissionDeniedError: {{function_node ...}}
    /train/checkpoint; Permission denied` -> `PermissionDeniedError: /train/checkpoint;
    Permission denied`: the class's module path and TensorFlow's function prefix say nothing
    a one-line cause needs (the log keeps them)."""
    line = _MODULE_PATH.sub("", line.strip(), count=1)
    return _TF_FUNCTION_NODE.sub("", line)


def last_exception(text: str) -> str | None:
    """The exception line of the last traceback in a log tail (shortened), else the last line
    named like an exception (`...Error: ...`, when the traceback's start was cut off), else
    None. Chained exceptions end with the one that stopped the program: the last traceback's."""
    lines = screen_lines(text)
    headers = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    for start in reversed(headers):
        for line in lines[start + 1 :]:
            if line[0].isspace():
                continue  # a frame, a source line, a caret line
            if _EXCEPTION.match(line):
                return short_exception(line)
    for line in reversed(lines):
        if not line[0].isspace() and _NAMED_EXCEPTION.match(line):
            return short_exception(line)
    return None


def last_line(text: str) -> str | None:
    """The last line a program wrote, unless it is a redrawn one (a progress bar: carriage
    returns or backspaces in it), which says how far it got, not why it stopped."""
    for raw in reversed(text.split("\n")):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        if "\r" in line or "\b" in line:
            return None
        visible = _CONTROL.sub("", _ANSI_ESCAPE.sub("", line)).strip()
        return visible or None
    return None


def cut_cause(text: str) -> str:
    """A cause as a condition message and an Event quote it: at most `MAX_CAUSE_CHARS`."""
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 3] + "..."


def is_exception_line(cause: str | None) -> bool:
    """Whether a cause is an exception's line (else a log's last words, or nothing)."""
    return cause is not None and _NAMED_EXCEPTION.match(cause.strip()) is not None


def ownership_hint(cause: str, mounts: Iterable[str], replica_type: str) -> str | None:
    """What to do about a write refused on a mounted volume (`PermissionDeniedError:
    /train/checkpoint; Permission denied`, `PermissionError: [Errno 13] Permission denied:
    '/data/x'`): the volume's files belong to a user and group the container's user is not.
    None when the cause is another, or names no path under one of `mounts`."""
    if not _ACCESS_DENIED.search(cause):
        return None
    roots = sorted((m.rstrip("/") for m in mounts if m.rstrip("/")), key=len, reverse=True)
    for path in _PATH.findall(cause):
        mount = next((m for m in roots if path == m or path.startswith(m + "/")), None)
        if mount is not None:
            return (
                f"{mount} is a volume the container's user may not write; set "
                f"spec.replicaSpecs.{replica_type}.template.spec.securityContext.fsGroup to "
                "a group that may write it: the operator sets 1000 when the template sets "
                "none, and hostPath and NFS volumes ignore fsGroup, so change their owner instead"
            )
    return None
