"""How a local run ended (pure): the summary's data, the final state, the exit code of
`trainjob run`, the replicas to blame, and the status written after the user stopped the run.

The view prints a Summary (`view.summary_text`); this module decides what it says.
"""

from __future__ import annotations

import dataclasses
import datetime
import signal
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob import cliutil
from trainjob.console.replica_progress import ReplicaProgress
from trainjob.core import constants, spec
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey

INTERRUPTED: Final = "Interrupted"
# The exit codes of the SIGKILL / SIGTERM that trainjob sends (137, 143), as the supervisor
# reports a process a signal ended (128 + N).
STOPPED_BY_US: Final = (128 + signal.SIGKILL, 128 + signal.SIGTERM)


@dataclasses.dataclass(frozen=True)
class Cause:
    """Why a replica failed, quoted from its log: the last exception line and the log's path."""

    replica: str
    line: str | None
    log_path: str


def killed_by(exit_code: int | None) -> str | None:
    """`killed by SIGKILL` for 128 + N, as a shell reports a process a signal ended."""
    if exit_code is None or not 128 < exit_code < 128 + 65:
        return None
    try:
        return f"killed by {signal.Signals(exit_code - 128).name}"
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Summary:
    job: spec.TrainJob
    status: st.JobStatus
    interrupted: str | None  # "SIGINT"/"SIGTERM" when stopped by the user
    elapsed_seconds: float
    run_dir: str
    log_dir: str
    checkpoint_dir: str
    export: str | None
    progress: Mapping[ReplicaKey, ReplicaProgress]
    causes: Sequence[Cause] = ()
    has_checkpoint: bool = False
    problem: str | None = None  # the run could not start (e.g. data preparation failed)
    report: core_progress.Report | None = None  # the chief's last progress report
    kind: str = constants.KIND  # what the job is named as (a cluster's TFJob is one)


def final_state(summary: Summary) -> str:
    if summary.problem is not None and not summary.status.finished:
        return st.FAILED
    if summary.interrupted and not summary.status.finished:
        return INTERRUPTED
    return st.state_of(summary.status)


def command_exit_code(summary: Summary) -> int:
    """The exit code of `trainjob run` (and of `trainjob attach`) for how the job ended:
    0 only when the job succeeded; 130/143/129 when interrupted by SIGINT/SIGTERM/SIGHUP;
    2 when it could not start here (e.g. its data dir is not writable); else 1."""
    if summary.problem is not None and not summary.status.finished:
        return cliutil.EXIT_USAGE
    state = final_state(summary)
    if state == st.SUCCEEDED:
        return cliutil.EXIT_OK
    if state == INTERRUPTED:
        return _EXIT_BY_SIGNAL.get(summary.interrupted or "", cliutil.EXIT_SIGTERM)
    return cliutil.EXIT_FAILED


_EXIT_BY_SIGNAL: Final = {
    "SIGINT": cliutil.EXIT_SIGINT,
    "SIGHUP": cliutil.EXIT_SIGHUP,
    "SIGPIPE": cliutil.EXIT_SIGPIPE,
}


def failed_replicas(status: st.JobStatus, job: spec.TrainJob) -> list[ReplicaKey]:
    """Replicas whose last attempt failed by themselves (not stopped by us), first failure
    first as the condition message names it."""
    failed = [
        key
        for key in job.replica_keys()
        if status.record(key).state == st.STATE_FAILED
        and status.record(key).exit_code not in (None, 0, *STOPPED_BY_US)
    ]
    condition = status.condition(st.FAILED)
    if condition is not None:
        named = [key for key in failed if f"{key[0]} {key[1]} " in condition.message + " "]
        failed = named + [key for key in failed if key not in named]
    return failed


def stopped_status(
    status: st.JobStatus,
    exit_codes: Mapping[ReplicaKey, int | None],
    signal_name: str,
    now: datetime.datetime,
) -> st.JobStatus:
    """The status after the user stopped the run: every replica that was still pending or
    running is Stopped with the exit code it stopped with, and Running turns False with reason
    Interrupted, so status.json never claims a run that is over is still Running."""
    replicas = dict(status.replicas)
    for key, code in exit_codes.items():
        record = status.record(key)
        if record.state in (st.STATE_PENDING, st.STATE_RUNNING, st.STATE_NONE):
            replicas[key] = dataclasses.replace(
                record, state=st.STATE_STOPPED, exit_code=code, reason=INTERRUPTED
            )
    conditions = st.set_condition(
        status.conditions,
        st.RUNNING,
        False,
        INTERRUPTED,
        f"trainjob run was stopped by {signal_name}; every replica was stopped",
        now,
    )
    return dataclasses.replace(status, replicas=replicas, conditions=conditions)


def status_file_data(
    job: spec.TrainJob,
    status: st.JobStatus,
    *,
    report: core_progress.Report | None,
    report_received: datetime.datetime,
    stop_signal: str | None,
    problem: str | None,
    devices: Mapping[str, core_progress.Devices] | None = None,
) -> dict[str, Any]:
    """status.json: the job's status as the operator writes it (with the chief's progress and
    every replica's devices, by replica name), but Interrupted while a stop the user asked for
    is under way, and Failed with the problem when the run could not start."""
    data = {"jobName": job.name, **st.to_dict(job, status)}
    if report is not None:
        data["progress"] = core_progress.status_progress(report, report_received, devices)
    if stop_signal is not None and not status.finished:
        data["state"] = INTERRUPTED
    if problem is not None and not status.finished:
        data["state"] = st.FAILED
        data["problem"] = problem
    return data
