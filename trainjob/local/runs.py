"""`trainjob status` (pure): a run directory's status.json, the pid holding its lock and its
latest step, shown as a kubectl-style table or one run in detail."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.console.outcome import INTERRUPTED
from trainjob.core import status as st

UNKNOWN: Final = "Unknown"
_ENDED: Final = (st.SUCCEEDED, st.FAILED, INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class RunEntry:
    """One local run as `trainjob status` sees it: its status.json data and the pid of the
    `trainjob run` holding it (None: no run is in progress there)."""

    run_dir: str
    data: Mapping[str, Any]
    holder: int | None
    step: int | None = None  # the latest global step in progress.jsonl


def last_step(progress_text: str) -> int | None:
    """The highest `step` in the end of a progress.jsonl (torn or foreign lines skipped)."""
    steps: list[int] = []
    for line in progress_text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        step = event.get("step") if isinstance(event, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            steps.append(step)
    return max(steps) if steps else None


def effective_state(entry: RunEntry) -> str:
    """status.json's state, except that a run nobody holds any more cannot be Running: its
    `trainjob run` was killed before it could write the end (Unknown, as kubectl says)."""
    state = str(entry.data.get("state") or "Pending")
    if entry.holder is None and state not in _ENDED:
        return UNKNOWN
    return state


def status_data(entry: RunEntry) -> dict[str, Any]:
    """What `trainjob status -o json|yaml` prints for one run."""
    return {
        **entry.data,
        "state": effective_state(entry),
        "runDir": entry.run_dir,
        "inProgress": entry.holder is not None,
        "step": entry.step,
    }


def _name_of(entry: RunEntry) -> str:
    name = entry.data.get("jobName")
    return str(name) if name else entry.run_dir.rstrip("/").rsplit("/", 1)[-1]


def runs_table(entries: Sequence[RunEntry]) -> list[str]:
    """`NAME  STATE  READY  RESTARTS  COMPLETED  RUN DIR`, kubectl style."""
    rows = [("NAME", "STATE", "READY", "RESTARTS", "COMPLETED", "RUN DIR")]
    for entry in entries:
        rows.append(
            (
                _name_of(entry),
                effective_state(entry),
                str(entry.data.get("ready", "-")),
                str(entry.data.get("restartCount", 0)),
                str(entry.data.get("completionTime", "-")),
                entry.run_dir,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]


def status_lines(entry: RunEntry) -> list[str]:
    """One run in detail: state and why, times, restarts, then one line per replica."""
    data = entry.data
    state = effective_state(entry)
    running = f" (trainjob run pid {entry.holder})" if entry.holder and entry.holder > 0 else ""
    lines = [f"TrainJob {_name_of(entry)}: {state}{running}", f"  run dir:    {entry.run_dir}"]
    if state == UNKNOWN:
        lines.append(
            f"  note:       status.json says {data.get('state')}, but no trainjob run holds this "
            "run dir: it was killed before it could record the end"
        )
    for condition in data.get("conditions") or []:
        if not isinstance(condition, Mapping) or condition.get("status") != "True":
            continue
        if condition.get("type") in (st.SUCCEEDED, st.FAILED, st.RESTARTING):
            lines.append(f"  reason:     {condition.get('reason')}: {condition.get('message')}")
    if data.get("state") == INTERRUPTED:
        for condition in data.get("conditions") or []:
            if isinstance(condition, Mapping) and condition.get("reason") == INTERRUPTED:
                lines.append(f"  reason:     {INTERRUPTED}: {condition.get('message')}")
    if data.get("problem"):
        lines.append(f"  reason:     {data['problem']}")
    for key, title in (("startTime", "started"), ("completionTime", "completed")):
        if data.get(key):
            lines.append(f"  {title + ':':<11} {data[key]}")
    lines.append(f"  restarts:   {data.get('restartCount', 0)}   ready: {data.get('ready', '-')}")
    if entry.step is not None:
        lines.append(f"  step:       {entry.step}")
    rows = [("REPLICA", "STATE", "ATTEMPT", "EXIT")]
    statuses = data.get("replicaStatuses") or {}
    for rtype, per_type in statuses.items() if isinstance(statuses, Mapping) else ():
        for index in per_type.get("indexes") or [] if isinstance(per_type, Mapping) else []:
            code = index.get("exitCode")
            rows.append(
                (
                    f"{rtype}-{index.get('index')}",
                    str(index.get("state") or "-"),
                    str(index.get("attempt", 0)),
                    "-" if code is None else str(code),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines.extend(
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    )
    return lines
