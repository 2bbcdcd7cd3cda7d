"""What every `trainjob` command shares, in a leaf module: exit codes, the user-error exception,
reading and parsing manifests, printing YAML/JSON, and the streams a command writes to
(`trainjob.signals`: the signals that stop one).

`trainjob.cli` (the parser and the core commands) and `trainjob.local.cli` (run, status, logs)
both import this module and never each other's internals, so there is no import cycle and
mypy sees every type (import-linter contracts in pyproject.toml keep it so).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, Final, TextIO

import yaml

from trainjob.core import spec

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # the job failed; validate: the manifests have problems
EXIT_USAGE: Final = 2  # a bad command line, or input that cannot be used at all
EXIT_TIMEOUT: Final = 124  # wait: --timeout passed first, as timeout(1) exits
EXIT_SIGHUP: Final = 129  # the terminal closed, as 128 + SIGHUP
EXIT_SIGINT: Final = 130  # Ctrl-C, as 128 + SIGINT
EXIT_SIGPIPE: Final = 141  # the reader of our output went away (`| head -1`), as 128 + SIGPIPE
EXIT_SIGTERM: Final = 143  # stopped by SIGTERM, as 128 + SIGTERM

EXIT_CODES_HELP: Final = """\
exit codes:
  0    success (run, attach, wait: the job Succeeded)
  1    run, attach, wait: the job Failed; validate: a manifest has problems;
       a cluster command: the API server refused or could not be reached
  2    bad command line or unusable input: unreadable file, not YAML, duplicate key,
       invalid TrainJob (render/run/convert), run directory in use, cannot run locally
  124  wait: --timeout passed before the job got there
  130  run: stopped by Ctrl-C (SIGINT); 143: by SIGTERM; 129: the terminal closed (SIGHUP);
       attach: detached by Ctrl-C (the job keeps running)
  141  the reader of the output went away (| head); run stops every replica first
"""
OUTPUT_FORMATS: Final = ("yaml", "json")


class CliError(Exception):
    """A user mistake: one line (or a few) for stderr, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclasses.dataclass(frozen=True)
class Streams:
    """Where a command reads its `-f -` input and writes its output and notes."""

    out: TextIO
    stdin: TextIO
    err: TextIO


def source_name(path: str) -> str:
    """How messages name an input file (`-` is stdin)."""
    return "<stdin>" if path == "-" else path


# ----- input -----
def read_source(path: str, stdin: TextIO) -> str:
    """The text of a file (`-`: stdin); CliError for anything that is not readable UTF-8 text."""
    name = source_name(path)
    try:
        if path == "-":
            return stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except IsADirectoryError as error:
        raise CliError(f"cannot read {name}: it is a directory") from error
    except OSError as error:
        raise CliError(f"cannot read {name}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise CliError(
            f"cannot read {name}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at "
            f"offset {error.start}); a manifest is YAML text"
        ) from error
    except ValueError as error:  # e.g. NUL bytes from a binary file given as stdin
        raise CliError(f"cannot read {name}: {error}") from error


def load_documents(path: str, stdin: TextIO) -> list[Any]:
    """Every YAML document of one file, at least one."""
    name = source_name(path)
    text = read_source(path, stdin)
    if "\x00" in text:
        raise CliError(f"cannot read {name}: a binary file (NUL bytes); a manifest is YAML text")
    try:
        documents = spec.load_documents(text, name)
    except spec.YamlError as error:
        raise CliError(str(error)) from error
    if not documents:
        raise CliError(f"{name} holds no YAML document")
    return documents


def parse_job(document: Any, name: str, *, require_images: bool = True) -> spec.TrainJob:
    """A TrainJob, or CliError listing every problem with `name` in front."""
    try:
        return spec.parse(document, require_images=require_images)
    except spec.SpecError as error:
        lines = "\n".join(f"{name}: {problem}" for problem in error.problems)
        raise CliError(f"{lines}\n{name} is not a valid TrainJob") from error


# ----- output -----
# libyaml's emitter when PyYAML has it: 100x faster on a 1,000-replica render (TF_CONFIG grows
# with the square of the replica count, and the pure-Python emitter scans every character).
_DUMPER: Final[Any] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(data: Any, out: TextIO, output: str) -> None:
    """One object as YAML or (indented) JSON."""
    if output == "json":
        json.dump(data, out, indent=2)
        out.write("\n")
    else:
        yaml.dump(data, out, Dumper=_DUMPER, sort_keys=False, default_flow_style=False)


def dump_all(documents: Sequence[Any], out: TextIO, output: str) -> None:
    """Several objects: multi-document YAML, or a Kubernetes `List` in JSON (as kubectl)."""
    if output == "json":
        dump({"apiVersion": "v1", "kind": "List", "items": list(documents)}, out, "json")
    else:
        yaml.dump_all(documents, out, Dumper=_DUMPER, sort_keys=False, default_flow_style=False)
