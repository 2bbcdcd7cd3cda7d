"""The pure parts of bench/checkpoint_store.py: figures from a run's progress events, the
summary's ratios against the local baseline, the interleaving order, the section it writes."""

from __future__ import annotations

from typing import Any

import pytest

from bench import checkpoint_store as bench


def _events(epochs: int, *, steps: int, train_s: float, save_s: float) -> list[dict[str, Any]]:
    """A chief's events as the runtime writes them (and a non-chief's, which are ignored)."""
    events: list[dict[str, Any]] = [{"event": "start", "chief": True, "time": 0.0, "step": 0}]
    now = 0.0
    for epoch in range(epochs):
        now += train_s
        step = (epoch + 1) * steps
        events.append({"event": "step", "chief": True, "time": now, "epoch": epoch, "step": step})
        events.append({"event": "step", "chief": False, "time": now + 50, "epoch": epoch})
        events.append({"event": "epoch", "chief": True, "time": now + 0.01, "step": step})
        now += save_s
        events.append({"event": "checkpoint", "chief": True, "time": now, "epoch": epoch})
    return events


def test_each_checkpoint_is_timed_from_the_epochs_last_step_to_its_checkpoint_event() -> None:
    run = bench.figures_from_events("s3", _events(3, steps=10, train_s=1.0, save_s=0.5))
    assert run.checkpoint_s == pytest.approx((0.5, 0.5, 0.5))
    # Epoch ends at 1.01, 2.51, 4.01: 20 steps in 3 s, a checkpoint in each interval.
    assert run.steps_per_sec == pytest.approx(20 / 3.0)


def test_a_run_of_one_epoch_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ValueError, match="run at least 2 epochs"):
        bench.figures_from_events("gs", _events(1, steps=10, train_s=1.0, save_s=0.5))


def _run(target: str, checkpoint_s: float, rate: float) -> bench.RunFigures:
    return bench.RunFigures(target, (checkpoint_s, checkpoint_s), rate, 1024)


def test_ratios_and_overhead_are_against_the_local_baseline() -> None:
    runs = [
        _run("local", 0.2, 10.0),
        _run("s3", 0.5, 9.0),
        _run("gs", 1.0, 5.0),
        _run("local", 0.2, 10.0),
        _run("s3", 0.5, 9.0),
        _run("gs", 1.0, 5.0),
    ]
    local, s3, gs = bench.summarize(runs)
    assert (local.target, local.checkpoint_ratio, local.overhead) == ("local", None, None)
    assert (local.runs, local.checkpoints) == (2, 4)
    assert s3.checkpoint_ratio == pytest.approx(2.5)
    assert s3.steps_per_sec_ratio == pytest.approx(0.9)
    assert s3.overhead == pytest.approx(0.1)
    assert gs.overhead == pytest.approx(0.5)
    table = bench.render_table([local, s3, gs])
    assert "| s3:// (versitygw) | 500 ms (500 ms) | 2.50x | 9.00 (9.0, 9.0) | 0.900 | 10.0 % |" in (
        table
    )


def test_a_target_without_runs_is_named() -> None:
    with pytest.raises(ValueError, match="no runs for gs"):
        bench.summarize([_run("local", 0.2, 10.0), _run("s3", 0.5, 9.0)])


def test_each_round_rotates_the_order_so_each_target_takes_each_place() -> None:
    orders = [bench.rotated(bench.TARGETS, r) for r in range(3)]
    assert orders == [["local", "s3", "gs"], ["s3", "gs", "local"], ["gs", "local", "s3"]]
