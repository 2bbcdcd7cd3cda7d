"""Run a Keras :class:`~trainjob.runtime.contract.TrainSpec` under its strategy (tf-keras).

Multi-worker ``Model.fit`` needs tf-keras (``TF_USE_LEGACY_KERAS=1``, set by the entry before
TensorFlow is imported): Keras 3's fit fails under MultiWorkerMirrored and ParameterServer.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainjob.runtime import contract, exitcodes, layout, loop_runner, preemption, progress
from trainjob.runtime import settings as settings_mod
from trainjob.runtime import strategy as strategy_mod
from trainjob.runtime.exitcodes import ConfigError, Preempted
from trainjob.runtime.preemption import StopRequest, StopWatcher
from trainjob.runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)


def make_context(
    settings: RuntimeSettings, strategy_name: str, replicas: int, checkpoint_dir: str
) -> contract.TrainContext:
    return contract.TrainContext(
        config=settings.config,
        strategy=strategy_name,
        framework=settings.framework,
        task_type=settings.task_type,
        task_index=settings.task_index,
        is_chief=settings.is_chief,
        num_workers=settings.num_workers,
        num_replicas_in_sync=replicas,
        checkpoint_dir=checkpoint_dir,
        data_dir=settings.data_dir,
    )


class LossCheck(enum.Enum):
    """When the runtime reads the training loss to stop at NaN/Inf."""

    OFF = "off"  # config stop_on_nonfinite_loss: false
    # Every step's loss, as tf.keras' TerminateOnNaN does, but read one step late (see
    # LaggedLossCheck) unless a step event fetches the logs anyway.
    EVERY_STEP = "every-step"
    # ParameterServer: only where the logs are fetched anyway (step events, epoch ends);
    # fetching each step would make the coordinator wait for every step it schedules.
    FETCHED = "fetched"


def loss_check_for(config: Mapping[str, Any], *, parameter_server: bool) -> LossCheck:
    if not settings_mod.stop_on_nonfinite_loss(config):
        return LossCheck.OFF
    return LossCheck.FETCHED if parameter_server else LossCheck.EVERY_STEP


def _check_loss(logs: Mapping[str, Any], *, step: int, epoch: int) -> None:
    """TerminateOnNaN's test, but failing the replica (exit 6) instead of ending fit as if
    training had succeeded."""
    loss = logs.get("loss")
    if loss is not None:
        exitcodes.check_loss(float(loss), step=step, epoch=epoch)


class LaggedLossCheck:
    """Checks each step's loss when the next step ends.

    Reading a step's loss at once (TerminateOnNaN) makes the host wait for that step on the
    device before it dispatches the next one; read one step later, it is (almost always)
    already computed while the next step runs. A NaN step is still named by its own step
    number; at most one more step runs, on weights that are NaN already.
    """

    def __init__(self) -> None:
        self._pending: tuple[Any, int, int] | None = None

    def push(self, loss: Any, *, step: int, epoch: int) -> None:
        """Check the step before, then keep this one's (a scalar, or None without a loss)."""
        self.flush()
        if loss is not None:
            self._pending = (loss, step, epoch)

    def flush(self) -> None:
        """Check the kept loss now (raises :class:`NonFiniteLossError`)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            loss, step, epoch = pending
            exitcodes.check_loss(float(loss), step=step, epoch=epoch)


def _progress_callback(
    tf: Any,
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
) -> Any:
    """The runtime's callback: progress events, the SIGTERM stop at a step boundary and the
    NaN/Inf loss stop (``loss_check``)."""

    def _value(value: Any) -> Any:
        fetch = getattr(value, "fetch", None)  # RemoteValue under ParameterServer
        return fetch() if callable(fetch) else value

    def _logs(logs: Any) -> dict[str, Any]:
        # Under ParameterServer batch logs are one RemoteValue holding the dict.
        fetched = _value(logs) if logs is not None else {}
        return {k: _value(v) for k, v in fetched.items()} if isinstance(fetched, dict) else {}

    class TrainJobProgress(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            # Raw (tensor) logs: converting them every step would sync the device each step.
            self._supports_tf_logs = True
            self._started = False
            self._epoch = 0
            self._epoch_start = 0.0
            self._epoch_step0 = 0
            self._epoch_examples0 = 0
            self._batches = 0
            self._lagged = LaggedLossCheck()

        def _global_step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def on_train_begin(self, logs: Any = None) -> None:
            params = self.params or {}
            epochs, steps = params.get("epochs"), params.get("steps")
            emitter.plan(
                total_epochs=epochs if isinstance(epochs, int) else None,
                steps_per_epoch=steps if isinstance(steps, int) else None,
            )

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch
            self._epoch_step0 = self._global_step()
            self._epoch_examples0 = examples_seen() if examples_seen is not None else 0
            self._epoch_start = time.perf_counter()
            if not self._started:
                # BackupAndRestore has restored by now: this is where training really resumes.
                self._started = True
                emitter.emit(
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
            if stop.requested and single_writer:
                self._save_before_stop(batch)
                raise Preempted(f"signal {stop.signum} received during epoch {self._epoch}")
            # The step from counters already on the host (no device sync): the reporter's
            # clock for the ETA; reports go from its own thread.
            step = self._epoch_step0 + batch + 1
            emitter.tick(step)
            self._batches += 1
            if every_steps > 0 and self._batches % every_steps == 0:
                fetched = _logs(logs)
                if loss_check is not LossCheck.OFF:
                    # Fetched for the event anyway: this step's loss is checked at once.
                    self._lagged.flush()
                    _check_loss(fetched, step=step, epoch=self._epoch)
                emitter.emit("step", epoch=self._epoch, step=self._global_step(), logs=fetched)
            elif loss_check is LossCheck.EVERY_STEP and isinstance(logs, dict):
                self._lagged.push(logs.get("loss"), step=step, epoch=self._epoch)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            step = self._global_step()
            elapsed = max(time.perf_counter() - self._epoch_start, 1e-9)
            if examples_seen is not None:
                rate = (examples_seen() - self._epoch_examples0) / elapsed
            else:
                rate = (step - self._epoch_step0) * examples_per_step / elapsed
            fetched = _logs(logs)
            if loss_check is not LossCheck.OFF:
                self._lagged.flush()  # the epoch's last step, by its own step number
                _check_loss(fetched, step=step, epoch=epoch)
            emitter.emit("epoch", epoch=epoch, step=step, logs=fetched, examples_per_sec=rate)
            if save_freq == "epoch":
                # BackupAndRestore (earlier in the callback list) has just written this epoch.
                emitter.emit("checkpoint", epoch=epoch, step=step, checkpoint=backup_dir)

        def _save_before_stop(self, batch: int) -> None:
            # Only where one process holds the whole state: under MultiWorkerMirrored a lone
            # save would wait for its peers (TF's preemption handler saves them together).
            state = getattr(self.model, "_training_state", None)
            if state is None:
                return
            try:
                # back_up() saves the counters as they are in tf-keras' training state (its
                # arguments are ignored), so set them first, as BackupAndRestore itself does.
                if save_freq == "epoch":
                    # "Previous epoch complete": the interrupted epoch is redone, starting from
                    # the weights it had reached (-1, tf-keras' "unused", restarts at epoch 0).
                    state._ckpt_saved_epoch.assign(self._epoch - 1)
                else:
                    state._ckpt_saved_epoch.assign(self._epoch)
                    state._ckpt_saved_batch.assign(batch)
                state.back_up(epoch=self._epoch, batch=batch)
                emitter.emit(
                    "checkpoint",
                    epoch=self._epoch,
                    step=self._global_step(),
                    checkpoint=backup_dir,
                    reason="preempted",
                )
            except Exception:
                log.exception("Failed to save a backup before stopping")

    # Keras only calls batch hooks of callbacks that override them; this one always does (for
    # the stop signal), at the cost of one Python call per step.
    return TrainJobProgress()


def _backup_callback(
    tf: Any,
    backup_dir: str,
    save_freq: str | int,
    *,
    emitter: progress.Emitter,
    stop: StopRequest | None,
) -> Any:
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
    batch_hooks = save_freq != "epoch" or stop is not None

    class RuntimeBackupAndRestore(tf.keras.callbacks.BackupAndRestore):  # type: ignore[misc]
        def on_train_begin(self, logs: Any = None) -> None:
            super().on_train_begin(logs)  # builds the training state and restores the backup
            if stop is not None:
                self._enable_preemption_save(stop)

        def _enable_preemption_save(self, request: StopRequest) -> None:
            state = self._training_state
            model = self.model

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
            if batch_hooks:
                super().on_train_batch_begin(batch, logs)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch_hooks:
                super().on_train_batch_end(batch, logs)

    return RuntimeBackupAndRestore(backup_dir, save_freq=save_freq)


def counting_dataset_fn(tf: Any, dataset_fn: Callable[[Any], Any], counter: Any) -> Any:
    """``dataset_fn`` whose batches add their size to ``counter`` as the input reads them.

    examples/s is measured from the data, whatever batch size the user's dataset has. Each
    worker counts its own input pipeline and scales by the number of pipelines (all-reduce
    workers run in step, one batch each per step), so the chief reports the job's rate.
    """

    def wrapped(input_context: Any) -> Any:
        pipelines = int(input_context.num_input_pipelines)

        def count(*element: Any) -> Any:
            first = tf.nest.flatten(element)[0]
            counter.assign_add(tf.cast(tf.shape(first)[0], tf.int64) * pipelines)
            return element if len(element) > 1 else element[0]

        return dataset_fn(input_context).map(count)

    return wrapped


def finite_steps(tf: Any, dataset_fn: Any, replicas: int, strategy_name: str) -> int:
    """Steps of one pass over this worker's dataset, for ``steps_per_epoch=None``.

    tf-keras refuses a distributed dataset without a step count, even a finite one; with one
    input pipeline the dataset's own length (its cardinality) is that count.
    """
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
    )
    steps = int(dataset_fn(context).cardinality())
    if steps <= 0:
        reason = "infinite" if steps == -1 else "unknown" if steps == -2 else "empty"
        raise ConfigError(
            f"TrainSpec.steps_per_epoch is None but the dataset's length is {reason} under "
            f"{strategy_name}: set steps_per_epoch (and repeat() the dataset), or return a "
            "finite dataset whose length tf.data knows"
        )
    return steps


def run(
    tf: Any,
    settings: RuntimeSettings,
    build: Any,
    emitter: progress.Emitter,
    checkpoint_dir: str,
    watcher: StopWatcher,
) -> dict[str, Any]:
    """Train; return the fields of the ``end`` event."""
    num_gpus, has_tpu = strategy_mod.detect_devices(tf)
    name = settings_mod.resolve_strategy(
        settings.strategy, settings.cluster, num_gpus=num_gpus, has_tpu=has_tpu
    )
    strategy = strategy_mod.build(tf, name, settings.config)
    is_ps = name == settings_mod.PARAMETER_SERVER
    ctx = make_context(
        settings, name, 1 if is_ps else strategy.num_replicas_in_sync, checkpoint_dir
    )
    spec = build(ctx)
    contract.validate_train_spec(spec, strategy=name, framework=settings.framework)
    if isinstance(spec, contract.LoopTrainSpec):
        return loop_runner.run(
            tf,
            settings,
            spec,
            emitter,
            checkpoint_dir,
            watcher,
            strategy=strategy,
            strategy_name=name,
        )
    assert isinstance(spec, contract.TrainSpec)
    contract.validate_steps_per_epoch(spec, strategy=name, num_workers=settings.num_workers)
    steps_per_epoch, dataset_fn = spec.steps_per_epoch, spec.dataset_fn
    if steps_per_epoch is None and name not in (
        settings_mod.DEFAULT,
        settings_mod.PARAMETER_SERVER,
    ):
        steps_per_epoch = finite_steps(tf, spec.dataset_fn, strategy.num_replicas_in_sync, name)

        def dataset_fn(input_context: Any) -> Any:
            # fit keeps one iterator over all epochs once it has a step count: one pass each.
            return spec.dataset_fn(input_context).repeat()

    with strategy.scope():
        model = spec.model_fn()
    examples_seen: Callable[[], int] | None = None
    if is_ps:
        # The datasets live on the workers: examples/s is estimated from config.batch_size.
        data = tf.keras.utils.experimental.DatasetCreator(spec.dataset_fn)
    else:
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="trainjob_examples")
        data = strategy.distribute_datasets_from_function(
            counting_dataset_fn(tf, dataset_fn, counter)
        )

        def examples_seen() -> int:
            return int(counter.numpy())

    backup = layout.backup_dir(checkpoint_dir)
    every = int(settings.config.get("progress_every_steps", 100))
    stop = StopRequest()
    agreed_stop = name == settings_mod.MULTI_WORKER_MIRRORED and settings.num_workers > 1
    callbacks: list[Any] = [
        _backup_callback(
            tf, backup, spec.save_freq, emitter=emitter, stop=stop if agreed_stop else None
        )
    ]
    callbacks.append(
        _progress_callback(
            tf,
            emitter,
            stop,
            examples_per_step=ctx.global_batch_size,
            examples_seen=examples_seen,
            every_steps=every,
            save_freq=spec.save_freq,
            backup_dir=backup,
            single_writer=not agreed_stop,
            loss_check=loss_check_for(settings.config, parameter_server=is_ps),
        )
    )
    # TF >= 2.21 no longer depends on the tensorboard package; log only where it is installed.
    if (
        settings.is_chief
        and settings.config.get("tensorboard", True)
        and importlib.util.find_spec("tensorboard")
    ):
        callbacks.append(
            tf.keras.callbacks.TensorBoard(
                layout.tensorboard_dir(checkpoint_dir), update_freq="epoch", profile_batch=0
            )
        )
    callbacks.extend(spec.callbacks)
    validation = spec.validation_fn() if spec.validation_fn and not is_ps else None

    with watcher.cooperative(stop):
        history = model.fit(
            data,
            epochs=spec.epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation,
            validation_steps=spec.validation_steps,
            callbacks=callbacks,
            verbose=0,
        )
    final = {k: v[-1] for k, v in history.history.items() if v}
    step = int(model.optimizer.iterations.numpy())
    exported = export(model, checkpoint_dir, settings, spec.export_format)
    return {"step": step, "logs": final, "export": exported}


def export(
    model: Any, checkpoint_dir: str, settings: RuntimeSettings, export_format: str
) -> str | None:
    """Chief writes the final model; others save to scratch (for collectives) and delete it."""
    if export_format == "none":
        return None
    path = layout.export_path(
        checkpoint_dir,
        is_chief=settings.is_chief,
        replica=settings.replica,
        export_format=export_format,
    )
    if settings.is_chief and os.path.exists(path):
        # A restarted chief that had exported already: replace, never leave a half-mixed dir.
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(os.path.dirname(path) if export_format == "keras" else path, exist_ok=True)
    model.save(path)
    if settings.is_chief:
        return path
    shutil.rmtree(layout.scratch_dir(checkpoint_dir, settings.replica), ignore_errors=True)
    return None


def serve(
    tf: Any, settings: RuntimeSettings, emitter: progress.Emitter, watcher: StopWatcher
) -> None:
    """A ps or worker task of a ParameterServer job: serve the coordinator until stopped."""
    # On SIGTERM stay up a little: the chief, stopped at the same time, backs up from the ps.
    watcher.exit_delay = float(settings.config.get("server_stop_delay_seconds", 3))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=settings.task_type,
        task_index=settings.task_index,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    emitter.emit("start", tf_version=tf.__version__)
    # Blocks in C++ until the process is stopped (the executor's job once the chief is done).
    server.join()
