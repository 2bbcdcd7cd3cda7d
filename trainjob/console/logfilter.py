"""Replica output as a terminal may show it (pure): escape sequences and carriage returns
removed, TensorFlow's routine noise recognised and hidden, the expected traceback of a replica we
stopped folded into one line, and the exception line that explains a failure.

Everything filtered here stays in logs/<replica>.log; `trainjob run --verbose` shows it all.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

# CSI sequences (colors, cursor moves), OSC sequences (titles, links), two-byte escapes.
_ANSI_ESCAPE: Final = re.compile(
    r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])"
)
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def terminal_safe(line: str) -> str:
    """A child's line as one printable line: what a carriage return would leave visible (Keras
    progress bars redraw with \\r), without escape sequences or control characters that would
    move the cursor under the live table. Tabs become spaces."""
    line = line.rstrip("\r\n")
    line = _ANSI_ESCAPE.sub("", line)
    if "\r" in line:
        parts = [part for part in line.split("\r") if part.strip()]
        line = parts[-1] if parts else ""
    return _CONTROL.sub("", line).expandtabs(8)  # tab stops counted on what is visible


# ----- TensorFlow's noise -----
# Lines TensorFlow (and its C++ libraries) print that say nothing about the user's training on a
# CPU machine. They stay in logs/<replica>.log; `--verbose` shows them. Each pattern was seen in
# a real run of the examples (TF 2.21 / 2.15, CPU).
_NOISE: Final = re.compile(
    "|".join(
        (
            # INFO records of TensorFlow's and absl's Python loggers, in the runtime's format
            # (`2026-11-23 13:08:25,466 INFO tensorflow ...`) and in logging's default one.
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO (tensorflow|absl|h5py)\b",
            r"^INFO:(tensorflow|absl):",
            # C++ (absl/glog) info and warning lines: `I0000 00:00:1795439295.226345 18621 x.cc:31]`
            r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\]",
            # TensorFlow's own C++ logging: `2026-11-23 13:02:27.443295: I tensorflow/...`
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] ",
            r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
            # A CPU-only machine: TensorFlow looks for CUDA and says so, at error level.
            r"failed call to cuInit",
            r"Could not find cuda drivers",
            r"Unable to register cu(DNN|FFT|BLAS) factory",
            r"TF-TRT Warning",
            r"This TensorFlow binary is optimized to use available CPU instructions",
            r"rebuild TensorFlow with the appropriate compiler flags",
            r"oneDNN custom operations are on",
        )
    )
)


def is_noise(line: str) -> bool:
    """Whether a replica's log line is TensorFlow noise (hidden on the terminal by default)."""
    return _NOISE.search(line) is not None


_TIMESTAMPED: Final = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
_STOPPED_FAILURE: Final = re.compile(
    r"Replica (?P<replica>\S+) failed \(Preempted, exit (?P<code>\d+)\)"
)


# The rest of a hidden record that spans lines: TensorFlow logs protobuf text (session configs
# of ParameterServer and DTensor, 40-60 lines each): `key: "GPU"`, `job {`, `}`, blank.
_PROTO_TEXT: Final = re.compile(r"^\s*(\}?|[a-z_][a-z0-9_]*(: .*| \{))\s*$")


@dataclasses.dataclass(frozen=True)
class FilterState:
    """Per replica: inside a traceback that a stop we asked for produced, or inside the
    protobuf text that a hidden record goes on with (both hidden)."""

    hiding_traceback: bool = False
    continuing_noise: bool = False


def filter_line(
    line: str, state: FilterState, *, verbose: bool, stopping: bool
) -> tuple[str | None, FilterState]:
    """What the terminal shows of one replica line (None: nothing), and the next state.

    `stopping`: trainjob itself asked this replica to stop (Ctrl-C, a restart of its group, the
    end of the job); its "failed (Preempted)" report and traceback are the expected way to stop,
    so they become one line. Everything is kept in the replica's log file."""
    if verbose:
        return line, FilterState()
    if state.hiding_traceback:
        if not _TIMESTAMPED.search(line):
            return None, state
        state = FilterState()
    stopped = _STOPPED_FAILURE.search(line)
    if stopped is not None and (stopping or "Traceback" in line):
        return f"stopped (exit {stopped['code']})", FilterState(hiding_traceback=True)
    if is_noise(line):
        return None, FilterState(continuing_noise=True)
    if state.continuing_noise and _PROTO_TEXT.match(line):
        return None, state
    return line, FilterState()


# An exception line as Python prints it last in a traceback: `ValueError: bad shape`,
# `tensorflow.python.framework.errors_impl.UnavailableError: ...`, `KeyboardInterrupt`.
_EXCEPTION_LINE: Final = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Preempted|Warning)"
    r"(?::\s.*)?$"
)


def last_exception_line(log_text: str) -> str | None:
    """The last exception line of a log (the cause a failure summary quotes), else the last
    error-like line (`Could not start gRPC server`, `Rejected ...`). Noise is never quoted."""
    # Noise out first: on a CPU machine every replica's log starts with TensorFlow's "failed call
    # to cuInit: ... CUDA error", the only error-like line a SIGKILLed replica leaves.
    lines = [
        safe
        for safe in (terminal_safe(line).strip() for line in log_text.splitlines())
        if not is_noise(safe)
    ]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    for line in reversed(lines):
        if re.search(r"\b(ERROR|error|Error|FATAL|cannot|Could not)\b", line) and not (
            line.startswith("=== trainjob:") and "started" in line
        ):
            return line
    return None
