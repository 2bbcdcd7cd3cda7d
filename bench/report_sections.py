"""bench/RESULTS.md's sections: each benchmark owns the text between its two markers and
replaces only that, and says the command line that regenerates it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def write_section(path: Path, text: str, begin: str, end: str) -> None:
    """Replace the section of `path` between `begin` and `end` with `text` (which carries the
    markers), or append it; the rest of the file is kept."""
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + text.strip() + rest.split(end, 1)[1]
    else:
        current = current.rstrip() + "\n\n" + text.strip() + "\n"
    path.write_text(current, encoding="utf-8")


def shown_command(script: str, argv: Sequence[str], scratch: Sequence[str]) -> str:
    """`python SCRIPT ARGV` without the options in `scratch` (this run's scratch paths: the
    command a reader reruns would not have them), as `--opt value` or `--opt=value`."""
    shown: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg.startswith(tuple(scratch)):
            skip_value = "=" not in arg
        else:
            shown.append(arg)
    return " ".join([f"python {script}", *shown])
