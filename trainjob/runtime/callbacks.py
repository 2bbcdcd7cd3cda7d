"""The Keras callbacks the runtime adds to ``fit`` (tf-keras).

- :class:`ProgressCallback`: progress events, the SIGTERM stop at a step boundary and the
  NaN/Inf loss stop;
- :class:`BackupCallback`: BackupAndRestore, plus a save agreed by all workers when one of
  them is stopped;
- :class:`TensorBoardCallback`: tf-keras' TensorBoard callback with nothing to do in batch hooks.

This module imports TensorFlow when it is imported, because its classes subclass tf.keras' own:
:mod:`trainjob.runtime.keras_runner` imports it inside ``run``, after the entry has chosen
tf-keras (``TF_USE_LEGACY_KERAS=1``) and imported TensorFlow. Nothing else may import it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainjob.runtime import devices, preemption, progress
from trainjob.runtime.exitcodes import Preempted
from trainjob.runtime.losscheck import LaggedLossCheck, LossCheck, check_logs
from trainjob.runtime.preemption import StopRequest

log = logging.getLogger(__name__)


def fetched(value: Any) -> Any:
    """A value as the host sees it: a RemoteValue (ParameterServer) is fetched first."""
    fetch = getattr(value, "fetch", None)
    return fetch() if callable(fetch) else value


def fetched_logs(logs: Any) -> dict[str, Any]:
    """Keras logs as a dict of host values; under ParameterServer batch logs are one
    RemoteValue holding the dict."""
    values = fetched(logs) if logs is not None else {}
    return {k: fetched(v) for k, v in values.items()} if isinstance(values, dict) else {}


class ProgressCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """The runtime's callback: progress events, the SIGTERM stop at a step boundary and the
    NaN/Inf loss stop (``loss_check``).

    Keras only calls batch hooks of callbacks that override them; this one always does (for
    the stop signal), at the cost of one Python call per step."""

    def __init__(
        self,
        emitter: progress.Emitter,
        stop: StopRequest,
        *,
        examples_per_step: int,
        examples_seen: Callable[[], int] | None,
        every_steps: int,
        save_freq: str | int,
        backup_dir: str,
        single_writer: bool,
        loss_check: LossCheck,
    ) -> None:
        super().__init__()
        self._emitter = emitter
        self._stop = stop
        self._examples_per_step = examples_per_step
        self._examples_seen = examples_seen
        self._every_steps = every_steps
        self._save_freq = save_freq
        self._backup_dir = backup_dir
        self._single_writer = single_writer
        self._loss_check = loss_check
        # Raw (tensor) logs: converting them every step would sync the device each step.
        self._supports_tf_logs = True
        self._started = False
        self._epoch = 0
        self._epoch_start = 0.0
        self._epoch_step0 = 0
        self._epoch_examples0 = 0
        self._last_step = 0
        self._lagged = LaggedLossCheck()

    def _global_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs: Any = None) -> None:
        params = self.params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        self._emitter.plan(
            total_epochs=epochs if isinstance(epochs, int) else None,
            steps_per_epoch=steps if isinstance(steps, int) else None,
        )

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        self._epoch_step0 = self._global_step()
        self._last_step = self._epoch_step0
        self._epoch_examples0 = self._examples_seen() if self._examples_seen is not None else 0
        self._epoch_start = time.perf_counter()
        if not self._started:
            # BackupAndRestore has restored by now: this is where training really resumes.
            self._started = True
            self._emitter.emit(
                "start",
                epoch=epoch,
                step=self._epoch_step0,
                initial_epoch=epoch,
                initial_step=self._epoch_step0,
                tf_version=tf.__version__,
            )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # With several MultiWorkerMirrored workers TF's preemption handler (in the backup
        # callback) decides when every worker saves and stops; the watcher's grace period
        # still bounds a step that never ends.
        if self._stop.requested and self._single_writer:
            self._save_before_stop(batch)
            raise Preempted(f"signal {self._stop.signum} received during epoch {self._epoch}")
        # The step from counters already on the host (no device sync): the reporter's
        # clock for the ETA; reports go from its own thread. With steps_per_execution=N,
        # `batch` is the execution's last batch and the hook runs once per N steps.
        step = self._epoch_step0 + batch + 1
        self._emitter.tick(step)
        previous, self._last_step = self._last_step, step
        if devices.report_due(previous, step, self._every_steps):
            values = fetched_logs(logs)
            if self._loss_check is not LossCheck.OFF:
                # Fetched for the event anyway: this step's loss is checked at once.
                self._lagged.flush()
                check_logs(values, step=step, epoch=self._epoch)
            self._emitter.emit("step", epoch=self._epoch, step=self._global_step(), logs=values)
        elif self._loss_check is LossCheck.EVERY_STEP and isinstance(logs, dict):
            self._lagged.push(logs.get("loss"), step=step, epoch=self._epoch)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        step = self._global_step()
        elapsed = max(time.perf_counter() - self._epoch_start, 1e-9)
        if self._examples_seen is not None:
            rate = (self._examples_seen() - self._epoch_examples0) / elapsed
        else:
            rate = (step - self._epoch_step0) * self._examples_per_step / elapsed
        values = fetched_logs(logs)
        if self._loss_check is not LossCheck.OFF:
            self._lagged.flush()  # the epoch's last step, by its own step number
            check_logs(values, step=step, epoch=epoch)
        self._emitter.emit("epoch", epoch=epoch, step=step, logs=values, examples_per_sec=rate)
        if self._save_freq == "epoch":
            # BackupAndRestore (earlier in the callback list) has just written this epoch.
            self._emitter.emit("checkpoint", epoch=epoch, step=step, checkpoint=self._backup_dir)

    def _save_before_stop(self, batch: int) -> None:
        # Only where one process holds the whole state: under MultiWorkerMirrored a lone
        # save would wait for its peers (TF's preemption handler saves them together).
        state = getattr(self.model, "_training_state", None)
        if state is None:
            return
        try:
            # back_up() saves the counters as they are in tf-keras' training state (its
            # arguments are ignored), so set them first, as BackupAndRestore itself does.
            if self._save_freq == "epoch":
                # "Previous epoch complete": the interrupted epoch is redone, starting from
                # the weights it had reached (-1, tf-keras' "unused", restarts at epoch 0).
                state._ckpt_saved_epoch.assign(self._epoch - 1)
            else:
                state._ckpt_saved_epoch.assign(self._epoch)
                state._ckpt_saved_batch.assign(batch)
            state.back_up(epoch=self._epoch, batch=batch)
            self._emitter.emit(
                "checkpoint",
                epoch=self._epoch,
                step=self._global_step(),
                checkpoint=self._backup_dir,
                reason="preempted",
            )
        except Exception:
            log.exception("Failed to save a backup before stopping")


class BackupCallback(tf.keras.callbacks.BackupAndRestore):  # type: ignore[misc]
    """BackupAndRestore, plus a save agreed by all workers when one of them is stopped.

    Keras calls every callback's batch hooks as soon as one callback has them (the runtime's
    progress callback does), and BackupAndRestore then assigns a variable every step, which
    costs about 1% of a small model's step time for nothing in ``"epoch"`` mode: skipped there
    unless preemption saves need the batch index.

    ``stop`` (several MultiWorkerMirrored workers only) turns on what
    ``BackupAndRestore(save_before_preemption=True)`` does on Google Cloud: tf-keras enables it
    nowhere else, so the runtime builds the same ``PreemptionCheckpointHandler`` itself, driven
    by its stop watcher (see :func:`trainjob.runtime.preemption.checkpoint_handler`).
    """

    def __init__(
        self,
        backup_dir: str,
        save_freq: str | int,
        *,
        emitter: progress.Emitter,
        stop: StopRequest | None,
    ) -> None:
        super().__init__(backup_dir, save_freq=save_freq)
        self._backup_path = backup_dir
        self._emitter = emitter
        self._stop_request = stop
        self._batch_hooks = save_freq != "epoch" or stop is not None

    def on_train_begin(self, logs: Any = None) -> None:
        super().on_train_begin(logs)  # builds the training state and restores the backup
        if self._stop_request is not None:
            self._enable_preemption_save(self._stop_request)

    def _enable_preemption_save(self, request: StopRequest) -> None:
        state = self._training_state
        model = self.model
        emitter, backup_dir = self._emitter, self._backup_path

        def save() -> None:
            # back_up() saves the counters as they are: the batch index BackupAndRestore
            # assigned when this batch began, so the restart resumes at the next batch.
            state.back_up(epoch=0)
            emitter.emit(
                "checkpoint",
                epoch=int(state._ckpt_saved_epoch.numpy()),
                step=int(model.optimizer.iterations.numpy()),
                checkpoint=backup_dir,
                reason="preempted",
            )

        def exit_fn() -> None:
            raise Preempted(f"signal {request.signum} received by a worker of the job")

        # Restores from the chief's backup (as every worker just did), never from this
        # worker's scratch copy.
        handler = preemption.checkpoint_handler(
            tf,
            model.distribute_strategy.cluster_resolver,
            state.read_checkpoint_manager,
            request,
            exit_fn=exit_fn,
            save_fn=save,
        )
        # What WorkerTrainingState sets up itself where tf-keras supports it: the batch
        # hooks then ask the handler at every step, and fit resumes at the saved batch.
        state.preemption_handler = handler
        state._enable_save_before_preemption = True
        model._preemption_handler = handler

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._batch_hooks:
            super().on_train_batch_begin(batch, logs)

    def _backup(self, epoch: int, batch: int = 0) -> None:
        super()._backup(epoch, batch)
        if self.save_freq != "epoch":
            # Every N steps (the progress callback announces epoch backups): a checkpoint dir
            # on object storage uploads each one as it is announced.
            self._emitter.emit(
                "checkpoint",
                epoch=epoch,
                step=int(self.model.optimizer.iterations.numpy()),
                checkpoint=self._backup_path,
            )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if self._batch_hooks:
            super().on_train_batch_end(batch, logs)


class TensorBoardCallback(tf.keras.callbacks.TensorBoard):  # type: ignore[misc]
    """tf-keras' TensorBoard callback, per epoch (no profiling), with no work in batch hooks.

    Keras calls every callback's batch hooks once any callback has them (the runtime's progress
    callback does), and the stock callback then writes the train function's graph at the end of
    the first batch (93 ms for the sample CNN under MultiWorkerMirrored here, several batches'
    worth on a busy machine) and calls ``tf.summary.scalar`` for each batch metric at every
    batch end (about 1 ms a step, written nowhere when logging per epoch). tf-keras times the
    batch hooks of the first batches only, and that graph made it warn on the first run of the
    example: "Callback method `on_train_batch_end` is slow compared to the batch time ... Check
    your callbacks", about a callback the user never wrote. The same graph is written at the
    end of the first epoch instead, so TensorBoard's Graphs tab is unchanged.
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir, update_freq="epoch", profile_batch=0)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """Nothing: the stock hook only counts batches for profiling, which is off."""

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        """Nothing: per-epoch logging writes no batch scalars; the graph waits for the epoch."""

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        # set_model() asked for the graph (write_graph); the train function is traced by now.
        if getattr(self, "_should_write_train_graph", False):
            self._should_write_train_graph = False
            self._write_keras_model_train_graph()
        super().on_epoch_end(epoch, logs)
