"""Draws the live table of `trainjob run` and `trainjob attach` on this process's terminal, over
and over, as those commands do, for tests that run it inside a real terminal multiplexer.

    python -m tests.local.table_driver WORKERS COUNTER [--logs] [--pause FILE]

It redraws through `trainjob.console.terminal.Terminal` (the code both commands share) with the
terminal's size read at each draw, as they do, until it is killed; after each draw it writes how
many it has made to the file COUNTER, so a test can wait for the next draws (after a resize, for
instance) instead of sleeping. With --logs, a log line goes above the table every 5th draw.
With --pause, it draws nothing while FILE exists, and says so by creating FILE.paused (between
two whole draws, so a reader that drains the terminal then has every byte drawn so far).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainjob.console import terminal, view
from trainjob.console.replica_progress import ReplicaProgress
from trainjob.core import spec
from trainjob.core import status as st

PACE_S = 0.02  # between draws: the real commands draw every 0.5-1 s; this is many draws a second
JOB_LINE = "TrainJob table "  # how the table's first line starts (the job is named "table")


def _showing(snapshot: view.Snapshot) -> Callable[[], view.Snapshot]:
    return lambda: snapshot


def paused_marker(pause: Path) -> Path:
    return pause.with_suffix(".paused")


def _wait_while_paused(pause: Path) -> None:
    if not pause.exists():
        return
    paused_marker(pause).touch()
    while pause.exists():
        time.sleep(PACE_S)
    paused_marker(pause).unlink()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workers", type=int)
    parser.add_argument("counter", type=Path)
    parser.add_argument("--logs", action="store_true")
    parser.add_argument("--pause", type=Path)
    args = parser.parse_args()
    job = spec.parse(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "table"},
            "spec": {
                "image": "img",
                "runtime": {
                    "entrypoint": "trainjob.samples.mnist:build",
                    "config": {"epochs": 3, "steps_per_epoch": 1000},
                },
                "replicaSpecs": {"worker": {"replicas": args.workers}},
            },
        }
    )
    keys = job.replica_keys()
    rows = [view.ReplicaRow(key, "Running", 0, None, 1000 + i) for i, key in enumerate(keys)]
    out = terminal.Terminal(sys.stdout, tty=True, color=False)
    frame = 0
    while True:
        if args.pause is not None:
            _wait_while_paused(args.pause)
        frame += 1
        progress = {key: ReplicaProgress(epoch=2, step=frame, loss=0.5) for key in keys}
        if args.logs and frame % 5 == 0:
            out.emit(f"log line {frame}")
        snapshot = view.Snapshot(job, st.JobStatus(), rows, progress, float(frame))
        out.draw(_showing(snapshot), force=True)
        # Written next to the counter, then renamed: a reader never sees half a number.
        partial = args.counter.with_suffix(".partial")
        partial.write_text(str(frame))
        os.replace(partial, args.counter)
        time.sleep(PACE_S)


if __name__ == "__main__":
    main()
