"""What hang detection measures from: when a job's reported step last moved (progress_status
keeps it per job; runPolicy.progressDeadlineSeconds judges it in the policy engine)."""

from __future__ import annotations

from typing import Any, cast

from trainjob.core import progress
from trainjob_operator import kube, progress_status

JOB = ("team-a", "mnist")


def report(step: int | None, time: float) -> progress.Report:
    raw: dict[str, Any] = {"replica": "worker-0", "state": "Running", "time": time}
    if step is not None:
        raw["step"] = step
    return progress.parse_report(raw)


def test_the_step_clock_moves_only_when_the_step_does() -> None:
    status = progress_status.ProgressStatus(cast(kube.Kube, None), 20.0)
    assert status.progress_at(JOB) is None
    assert status.offer(JOB, report(None, 1.0))  # the first report starts the clock
    first = status.progress_at(JOB)
    assert first is not None
    assert status.offer(JOB, report(10, 2.0))
    stepped = status.progress_at(JOB)
    assert stepped is not first
    # A hung collective reports the same step again (newer time, other figures): no move.
    status.offer(JOB, report(10, 3.0))
    assert status.progress_at(JOB) is stepped
    status.offer(JOB, report(11, 4.0))
    assert status.progress_at(JOB) is not stepped
