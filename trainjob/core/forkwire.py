"""The fork server's wire format and its rules (pure): which replicas it may start, and what
they may differ in from the process that imported TensorFlow for them.

`trainjob run` starts the replicas of a job that runs the trainjob runtime by forking them from
one process that has imported TensorFlow already (`trainjob.runtime.forkserver`): importing it
costs each new Python process 2-6 CPU-seconds, and a forked replica starts with it done. The
supervisor (`trainjob.local.supervisor`) sends one request a replica over a Unix
SOCK_SEQPACKET socket, with the replica's output file descriptor beside it; the server answers
with the pid it forked or why it would not, and later with each child's exit.

A forked replica must be the process `python -m trainjob train` would have been. What
TensorFlow reads when it is imported (TF_USE_LEGACY_KERAS, TF_CPP_MIN_LOG_LEVEL,
TF_ENABLE_ONEDNN_OPTS, CUDA_VISIBLE_DEVICES...) and what Python reads when it starts
(PYTHONHASHSEED, PYTHONUNBUFFERED...) is already fixed in the server, so a replica's
environment may differ from the server's only in what is read later: the replica's identity
(TF_CONFIG, TRAINJOB_*, DTENSOR_*) and PYTHONPATH (the child puts its entries on sys.path).
Anything else differing, the replica is started as its own process, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

# Read by the runtime after it starts, never by TensorFlow's or Python's start-up.
LATE_ENV: Final = frozenset({"TF_CONFIG"})
LATE_ENV_PREFIXES: Final = ("TRAINJOB_", "DTENSOR_")
PYTHONPATH: Final = "PYTHONPATH"
# The modules a forked replica may run: the runtime's `train` command, by either name.
FORKABLE_MODULES: Final = ("trainjob", "trainjob.runtime")
TRAIN_COMMAND: Final = "train"
# `TRAINJOB_FORK_SERVER=0` starts every replica as its own process (for comparison, or when
# something in one's own environment needs it).
SWITCH_ENV: Final = "TRAINJOB_FORK_SERVER"
READY: Final = "ready"
# A request is a few kilobytes (the environment); a SOCK_SEQPACKET message is read whole.
MAX_MESSAGE_BYTES: Final = 1 << 20


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def late(key: str) -> bool:
    """Whether a variable is read only after the runtime starts (may differ per replica)."""
    return key in LATE_ENV or key.startswith(LATE_ENV_PREFIXES)


def forkable_module(argv: Sequence[str], python: str) -> str | None:
    """The runtime module a replica's command line runs, when it is exactly
    ``<this python> -m trainjob[.runtime] train`` (then it can be forked), else None."""
    if len(argv) != 4 or argv[0] != python or argv[1] != "-m" or argv[3] != TRAIN_COMMAND:
        return None
    return argv[2] if argv[2] in FORKABLE_MODULES else None


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of an environment the server's TensorFlow and Python were started with: all but
    the late variables and PYTHONPATH."""
    return {k: v for k, v in env.items() if not late(k) and k != PYTHONPATH}


def env_difference(server: Mapping[str, str], replica: Mapping[str, str]) -> str | None:
    """Why a replica whose (prepared) environment is `replica` cannot be forked from a server
    prepared with `server`: the first variable that differs; None when none does."""
    ours, theirs = import_env(server), import_env(replica)
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            if key not in theirs:
                return f"{key} is unset in the replica's environment"
            if key not in ours:
                return f"{key} is set in the replica's environment only"
            return f"{key} is different in the replica's environment"
    return None


def python_path(entries: str | None) -> list[str]:
    return [p for p in (entries or "").split(":") if p]


def child_sys_path(
    sys_path: Sequence[str], server_python_path: str | None, replica_python_path: str | None
) -> list[str]:
    """The child's sys.path: the server's, with its PYTHONPATH entries replaced by the
    replica's (they come right after sys.path[0], the working directory, as Python puts
    them)."""
    theirs = python_path(replica_python_path)
    ours = set(python_path(server_python_path))
    rest = [p for p in sys_path[1:] if p not in ours]
    return [sys_path[0], *theirs, *rest] if sys_path else [*theirs]


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, sort_keys=True).encode("utf-8")


def decode(data: bytes) -> dict[str, Any]:
    """A message, or {} for one that is not a JSON object (never raised on)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def request(number: int, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> dict[str, Any]:
    """Request `number`: its answer carries the number, so a late one is told apart."""
    return {"id": number, "argv": list(argv), "env": dict(env), "cwd": cwd}


def started(number: Any, pid: int) -> dict[str, Any]:
    return {"id": number, "started": pid}


def refused(number: Any, reason: str) -> dict[str, Any]:
    return {"id": number, "refused": reason}


def exited(pid: int, returncode: int) -> dict[str, Any]:
    """A child's end, as Popen's returncode says it: the exit status, or -N for signal N."""
    return {"exited": pid, "returncode": returncode}
