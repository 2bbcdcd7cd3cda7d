"""TensorBoard scalars from the progress events, for every kind of training.

Keras ``fit`` has TensorBoard's own callback (``<checkpoint_dir>/tensorboard/train``); a custom
loop, DTensor, an Estimator's progress and anything else that reports through
:class:`~trainjob.runtime.progress.Emitter` had nothing to plot. This module turns the events
the reporting replica already emits into scalar summaries in
``<checkpoint_dir>/tensorboard/progress``, named as Keras names its own so the charts of a
loop and of ``fit`` read alike:

- ``epoch`` events: ``epoch_loss`` and ``epoch_<metric>`` at the (0-based) epoch, as Keras'
  callback writes them, plus ``epoch_examples_per_sec``;
- ``step`` events: ``batch_loss`` and ``batch_<metric>`` at the global step, every
  ``progress_every_steps`` steps.

Only the chief writes (other replicas hold the same numbers, and one writer per file is what
TensorBoard expects). The events are written as TensorBoard's event files are (a TFRecord file
of `Event` protos, each scalar a `simple_value`) with `tf.io.TFRecordWriter`, not with
`tf.summary` ops: the emitter is called from inside Keras callbacks, a custom loop, a DTensor
mesh or an Estimator's session hooks, and the last run in a finalized graph where no op can
be created (measured on TF 2.15); `tf.summary.scalar` also needs the tensorboard package,
which TensorFlow >= 2.21 no longer installs, while the logs must be written wherever training
runs (TensorBoard itself may run elsewhere, e.g. in `trainjob tensorboard`'s Pod).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

from trainjob.runtime import layout

log = logging.getLogger(__name__)

RUN: Final = "progress"  # the run's name under tensorboard/ (Keras' are train, validation)

Scalar = tuple[str, int, float]  # tag, step, value


# --- pure -----------------------------------------------------------------------------------


def logdir(checkpoint_dir: str) -> str:
    return os.path.join(layout.tensorboard_dir(checkpoint_dir), RUN)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def scalars_of(record: Mapping[str, Any]) -> list[Scalar]:
    """The scalars one progress event gives (pure): [] for events without numbers. A loss that
    diverged is reported as null by the event and is left out here too (TensorBoard would draw
    NaN as a gap anyway)."""
    event = record.get("event")
    if event == "epoch":
        prefix, at = "epoch_", record.get("epoch")
    elif event == "step":
        prefix, at = "batch_", record.get("step")
    else:
        return []
    if not isinstance(at, int) or isinstance(at, bool):
        return []
    values: dict[str, Any] = {"loss": record.get("loss")}
    metrics = record.get("metrics")
    if isinstance(metrics, Mapping):
        values.update({str(k): v for k, v in metrics.items() if k != "loss"})
    if event == "epoch":
        values["examples_per_sec"] = record.get("examples_per_sec")
    scalars = []
    for name, value in values.items():
        number = _finite(value)
        if number is not None:
            scalars.append((prefix + name, at, number))
    return scalars


def wanted(*, is_chief: bool, checkpoint_dir: str | None, config: Mapping[str, Any]) -> bool:
    """Whether this replica writes summaries: the chief, with a checkpoint dir, unless the
    runtime config says ``tensorboard: false`` (the switch Keras' callback obeys too)."""
    return is_chief and bool(checkpoint_dir) and config.get("tensorboard", True) is not False


# --- TensorFlow -----------------------------------------------------------------------------


class SummaryWriter:
    """Called with every progress event of the reporting replica; writes its scalars.

    TensorFlow is imported at the first event with numbers (the runtime has imported it by
    then). A failure to write (a full or read-only volume) is logged once and never stops
    training: the summaries are a view, the checkpoints are what matters."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._writer: Any = None
        self._broken = False

    def __call__(self, record: Mapping[str, Any]) -> None:
        scalars = scalars_of(record)
        if not scalars or self._broken:
            return
        try:
            self._write(scalars)
        except Exception as exc:  # any TF or OS error: training goes on without summaries
            self._broken = True
            log.warning("Stopped writing TensorBoard summaries to %s: %s", self.directory, exc)

    def _write(self, scalars: list[Scalar]) -> None:
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2
        from tensorflow.core.util import event_pb2

        now = time.time()
        if self._writer is None:
            tf.io.gfile.makedirs(self.directory)  # gs:: TensorFlow writes it, not os
            # TensorBoard reads every file with "tfevents" in its name; a restarted chief
            # starts a file of its own (time, host and pid differ).
            name = f"events.out.tfevents.{now:.0f}.{socket.gethostname()}.{os.getpid()}.trainjob"
            self._writer = tf.io.TFRecordWriter(os.path.join(self.directory, name))
            header = event_pb2.Event(wall_time=now, file_version="brain.Event:2")
            self._writer.write(header.SerializeToString())
        for tag, step, value in scalars:
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
            )
            event = event_pb2.Event(wall_time=now, step=step, summary=summary)
            self._writer.write(event.SerializeToString())
        # TensorBoard reads what is on disk: a running job's charts move with each event.
        self._writer.flush()
