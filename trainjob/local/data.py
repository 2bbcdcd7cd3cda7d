"""The shared tfds data dir of local runs, and the samples' offline MNIST written into it once
per machine (a subprocess: `python -m trainjob data prepare mnist`)."""

from __future__ import annotations

import fcntl
import glob
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Final

from trainjob.console import logfilter
from trainjob.core import constants
from trainjob.local import plan

PREPARE_MNIST: Final = (sys.executable, "-m", "trainjob", "data", "prepare", "mnist")


def default_data_dir(environ: Mapping[str, str]) -> str:
    """Shared tfds data dir: $TRAINJOB_DATA_DIR, else ~/.cache/trainjob/datasets."""
    if environ.get(constants.ENV_DATA_DIR):
        return environ[constants.ENV_DATA_DIR]
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "trainjob", "datasets")


def _prepared(data_dir: str) -> bool:
    return bool(glob.glob(os.path.join(data_dir, *constants.OFFLINE_MNIST_INFO)))


def _own_message(stderr: str) -> str | None:
    """The line `trainjob data` wrote for its failure (the cause, in its words), if any."""
    prefix = constants.DATA_MESSAGE_PREFIX
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    return lines[-1][len(prefix) :] if lines else None


def prepare_mnist(
    run_plan: plan.RunPlan, environ: Mapping[str, str], cwd: str, announce: Callable[[str], None]
) -> str | None:
    """Write the samples' offline MNIST into the shared data dir once (locked, idempotent);
    `announce` tells the user before the wait.

    Returns None when the data is there, else one line saying why it is not."""
    data_dir = run_plan.data_dir
    if not run_plan.prepare_mnist or data_dir is None or _prepared(data_dir):
        return None
    try:
        os.makedirs(data_dir, exist_ok=True)
        lock = open(  # noqa: SIM115 - closed below
            os.path.join(data_dir, ".trainjob-prepare.lock"), "w", encoding="utf-8"
        )
    except OSError as error:
        return f"cannot write the offline MNIST into data dir {data_dir}: {error.strerror}"
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _prepared(data_dir):
            return None
        announce(f"Preparing the offline MNIST dataset in {data_dir} (once per machine)")
        result = subprocess.run(
            [*PREPARE_MNIST, "--data-dir", data_dir],
            env=plan.process_env(run_plan.processes[0], environ),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        if result.returncode != 0:
            log_path = os.path.join(run_plan.log_dir, "prepare-data.log")
            with open(log_path, "w", encoding="utf-8") as handle:
                handle.write(result.stdout + result.stderr)
            why = _own_message(result.stderr) or logfilter.last_exception_line(
                result.stdout + result.stderr
            )
            return (
                f"preparing the offline MNIST failed (exit {result.returncode}): "
                f"{why or 'no error message'} (log: {log_path})"
            )
    return None
