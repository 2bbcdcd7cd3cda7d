"""The TensorBoard scalars the chief writes from its progress events (pure part)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import pytest

from trainjob.core import progress_events
from trainjob.runtime import progress, summaries

pytestmark = pytest.mark.unit


def test_an_epoch_event_gives_keras_named_epoch_scalars_at_the_epoch() -> None:
    record = progress_events.make_event(
        "epoch",
        replica="worker-0",
        chief=True,
        now=1.0,
        epoch=2,
        step=120,
        logs={"loss": 0.25, "accuracy": 0.9, "val_loss": 0.3},
        examples_per_sec=512.0,
    )
    assert summaries.scalars_of(record) == [
        ("epoch_loss", 2, 0.25),
        ("epoch_accuracy", 2, 0.9),
        ("epoch_val_loss", 2, 0.3),
        ("epoch_examples_per_sec", 2, 512.0),
    ]


def test_a_step_event_gives_batch_scalars_at_the_global_step() -> None:
    record = progress_events.make_event(
        "step", replica="chief-0", chief=True, now=1.0, epoch=0, step=40, logs={"loss": 1.5}
    )
    assert summaries.scalars_of(record) == [("batch_loss", 40, 1.5)]


@pytest.mark.parametrize(
    "record",
    [
        {"event": "start", "step": 0, "loss": 1.0},
        {"event": "checkpoint", "step": 40, "epoch": 0},
        {"event": "end", "step": 80, "loss": 0.1},
        {"event": "epoch", "epoch": None, "loss": 0.1},  # Estimator has no epochs
        {"event": "step", "step": True, "loss": 0.1},
    ],
)
def test_events_without_a_position_or_numbers_give_nothing(record: Mapping[str, Any]) -> None:
    assert summaries.scalars_of(record) == []


def test_a_diverged_loss_and_non_numbers_are_left_out() -> None:
    record = progress_events.make_event(
        "step",
        replica="worker-0",
        chief=True,
        now=1.0,
        step=7,
        logs={"loss": float("nan"), "acc": float("inf"), "name": "x", "lr": 0.01},
    )
    assert summaries.scalars_of(record) == [("batch_lr", 7, 0.01)]


def test_only_the_chief_with_a_checkpoint_dir_writes_unless_switched_off() -> None:
    assert summaries.wanted(is_chief=True, checkpoint_dir="/c", config={})
    assert not summaries.wanted(is_chief=False, checkpoint_dir="/c", config={})
    assert not summaries.wanted(is_chief=True, checkpoint_dir=None, config={})
    assert not summaries.wanted(is_chief=True, checkpoint_dir="/c", config={"tensorboard": False})
    assert summaries.logdir("/c") == "/c/tensorboard/progress"


def test_the_emitter_hands_every_event_to_the_summaries() -> None:
    seen: list[Mapping[str, Any]] = []
    emitter = progress.Emitter("worker-0", True, stream=io.StringIO(), summaries=seen.append)
    emitter.emit("start", step=0)
    emitter.emit("epoch", epoch=0, step=10, logs={"loss": 0.5})
    assert [r["event"] for r in seen] == ["start", "epoch"]
    assert summaries.scalars_of(seen[1])[0] == ("epoch_loss", 0, 0.5)
