"""An entrypoint (``hook_timing:build``) that trains the MNIST sample and times each callback's
batch hooks over the first batches, the ones tf-keras times itself before it warns "Callback
method `on_train_batch_end` is slow compared to the batch time ... Check your callbacks".

tf-keras exposes no per-callback timing, so this wraps its ``CallbackList`` (tf-keras 2.x
internals: ``_call_batch_hook_helper`` runs one hook of every callback). At the end of
training it writes ``hook_times.json`` in the checkpoint directory: seconds per callback class
over the timed batches, and which TensorBoard records the train run holds (the graph must be
there still, written outside the batch hooks).
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

from trainjob import runtime
from trainjob.samples import mnist

TIMED_BATCHES = 6  # tf-keras checks after 5 timed batches: their end hooks and batch 0's
REPORT = "hook_times.json"


def build(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    import tensorflow as tf
    import tf_keras.src.callbacks as keras_callbacks

    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    original = keras_callbacks.CallbackList._call_batch_hook_helper

    def timed(self: Any, hook_name: str, batch: int, logs: Any) -> None:
        calls[hook_name] = calls.get(hook_name, 0) + 1
        if not hook_name.startswith("on_train_batch") or calls[hook_name] > TIMED_BATCHES:
            original(self, hook_name, batch, logs)
            return
        started = time.perf_counter()
        logs = self._process_logs(logs, is_batch_hook=True)
        for callback in self.callbacks:
            before = time.perf_counter()
            getattr(callback, hook_name)(batch, logs)
            name = type(callback).__name__
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - before
        if self._check_timing:  # tf-keras' own check goes on as it would
            self._hook_times.setdefault(hook_name, []).append(time.perf_counter() - started)

    keras_callbacks.CallbackList._call_batch_hook_helper = timed

    class Report(tf.keras.callbacks.Callback):  # type: ignore[misc]
        """Last in the list: the runtime's TensorBoard callback has closed its files."""

        def on_train_end(self, logs: Any = None) -> None:
            records: dict[str, int] = {}
            pattern = os.path.join(ctx.checkpoint_dir, "tensorboard", "train", "*tfevents*")
            for path in glob.glob(pattern):
                for event in tf.compat.v1.train.summary_iterator(path):
                    kind = event.WhichOneof("what")
                    records[kind] = records.get(kind, 0) + 1
            with open(os.path.join(ctx.checkpoint_dir, REPORT), "w", encoding="utf-8") as out:
                json.dump({"seconds": seconds, "train_records": records}, out)

    spec = mnist.build(ctx)
    return runtime.TrainSpec(
        model_fn=spec.model_fn,
        dataset_fn=spec.dataset_fn,
        epochs=spec.epochs,
        steps_per_epoch=spec.steps_per_epoch,
        callbacks=[Report()],
        export_format="none",
    )
