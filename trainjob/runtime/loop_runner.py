"""Run a custom training loop (:class:`~trainjob.runtime.contract.LoopTrainSpec`) under its
strategy, as TensorFlow's custom-training-loop guides write it, with the runtime's checkpoints.

* MultiWorkerMirrored, Mirrored, OneDevice, default: ``strategy.run(step_fn)`` inside one
  ``tf.function`` over a distributed iterator; values reduced with ``strategy.reduce``.
* ParameterServer: the chief is the coordinator (``ClusterCoordinator``): per-worker datasets,
  ``schedule`` per step, ``join`` at checkpoints and epoch ends; a lost worker's steps are
  retried on the others by the coordinator.

Checkpoints: one ``tf.train.Checkpoint`` of the user's state plus the runtime's step counter,
managed by a ``CheckpointManager`` in ``<checkpoint_dir>/loop``. Under MultiWorkerMirrored every
worker saves (reading synced variables needs all of them) and only the chief's copy is kept.
TensorFlow writes a checkpoint's files first and then points the ``checkpoint`` index file at it
(an atomic rename), so a process killed during a save leaves the previous checkpoint as the
latest one.

SIGTERM: where one process holds the whole state (single worker, ParameterServer chief) the loop
saves at the next step boundary and exits 143 (0 lost steps). Under MultiWorkerMirrored with
several workers a lone save would wait for peers, so TF's ``PreemptionCheckpointHandler`` agrees
on a step over the coordination service: every worker saves there and exits 143, whichever of
them got the signal (see :mod:`trainjob.runtime.preemption`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainjob.runtime import contract, devices, exitcodes, layout, preemption, progress
from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import ConfigError, Preempted
from trainjob.runtime.preemption import StopRequest, StopWatcher
from trainjob.runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_EVERY_STEPS = 100


# --- pure decisions ------------------------------------------------------------------------


def epoch_of(step: int, steps_per_epoch: int) -> int:
    """The epoch a global step (number of completed steps) falls in."""
    return step // steps_per_epoch


def save_due(step: int, *, steps_per_epoch: int, every: int | None) -> bool:
    """Whether to checkpoint after ``step`` completed steps: every N steps, else at epoch ends."""
    if every is None:
        return step % steps_per_epoch == 0
    return step % every == 0


def progress_due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def writes_alone(strategy_name: str, num_workers: int) -> bool:
    """Whether this process holds the whole state, so it can save on its own when stopped."""
    return strategy_name != settings_mod.MULTI_WORKER_MIRRORED or num_workers == 1


# --- the loop ------------------------------------------------------------------------------


def example_count(tf: Any, first: Any) -> Any:
    """How many examples an element of the dataset holds (a float32 tensor): its first
    dimension when batched, one when it is a scalar (TensorFlow's ParameterServer sample
    iterates `Dataset.range(1, 6)` unbatched; `tf.shape(x)[0]` of a scalar fails to trace)."""
    rank = first.shape.rank
    if rank == 0:
        return tf.constant(1.0, tf.float32)
    if rank is None:  # known only when the step runs
        return tf.cond(
            tf.rank(first) > 0,
            lambda: tf.cast(tf.shape(first)[0], tf.float32),
            lambda: tf.constant(1.0, tf.float32),
        )
    return tf.cast(tf.shape(first)[0], tf.float32)


@dataclass
class _Epoch:
    """Host-side bookkeeping of the running epoch (examples are counted from the data)."""

    started: float
    first_step: int
    examples: float = 0.0
    examples_at_start: float = 0.0  # the on-device counter's value when the epoch began


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v.numpy() if hasattr(v, "numpy") else v) for k, v in values.items()}


class LoopRunner:
    """One replica's loop; the strategy-specific parts are ``_run_step`` and ``_barrier``."""

    def __init__(
        self,
        tf: Any,
        settings: RuntimeSettings,
        spec: contract.LoopTrainSpec,
        strategy: Any,
        strategy_name: str,
        emitter: progress.Emitter,
        checkpoint_dir: str,
    ) -> None:
        self.tf = tf
        self.settings = settings
        self.spec = spec
        self.strategy = strategy
        self.name = strategy_name
        self.emitter = emitter
        self.checkpoint_dir = checkpoint_dir
        self.is_ps = strategy_name == settings_mod.PARAMETER_SERVER
        self.read_dir = layout.loop_dir(checkpoint_dir)
        self.write_dir = layout.loop_dir(
            checkpoint_dir, is_chief=settings.is_chief, replica=settings.replica
        )
        self.every_progress = int(
            settings.config.get("progress_every_steps", DEFAULT_PROGRESS_EVERY_STEPS)
        )
        self.stop_on_nonfinite_loss = settings_mod.stop_on_nonfinite_loss(settings.config)
        # On a GPU the step keeps its numbers on the device (examples, a non-finite loss flag)
        # and the host reads them at reports only (see devices.loss_check_mode); the CPU path
        # reads each step's loss and example count, which costs nothing there.
        on_gpu = bool(tf.config.list_physical_devices("GPU"))
        self.on_device = not self.is_ps and (
            devices.loss_check_mode(settings.config, on_gpu=on_gpu) == devices.AT_REPORTS
        )
        self.handler: Any = None
        self.coordinator: Any = None
        self._pending: list[Any] = []  # ParameterServer: RemoteValues of this epoch's steps

    # -- set-up -----------------------------------------------------------------------------

    def build_state(self) -> None:
        tf = self.tf
        with self.strategy.scope():
            self.state = contract.validate_loop_state(self.spec.state_fn())
            self.step_var = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="trainjob_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        try:
            self.checkpoint = tf.train.Checkpoint(
                **{contract.LOOP_STEP_KEY: self.step_var}, **self.state
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"LoopTrainSpec.state_fn returned a non-trackable value: {exc}"
            ) from exc
        self.read_manager = tf.train.CheckpointManager(
            self.checkpoint, self.read_dir, max_to_keep=self.spec.max_to_keep
        )
        self.write_manager = (
            self.read_manager
            if self.write_dir == self.read_dir
            else tf.train.CheckpointManager(self.checkpoint, self.write_dir, max_to_keep=1)
        )
        latest = self.read_manager.latest_checkpoint
        if latest:
            # Every worker restores the chief's copy (the only one kept).
            self.checkpoint.restore(latest)
            log.info("Restored %s (step %d)", latest, int(self.step_var.numpy()))

    def build_data_and_step(self) -> None:
        tf, strategy, spec = self.tf, self.strategy, self.spec
        sum_op = tf.distribute.ReduceOp.SUM
        op = sum_op if spec.reduction == "sum" else tf.distribute.ReduceOp.MEAN
        state = self.state

        def replica_fn(batch: Any) -> tuple[dict[str, Any], Any]:
            logs = dict(spec.step_fn(state, batch))
            # Examples are counted from the data, whatever batch size the dataset uses.
            return logs, example_count(tf, tf.nest.flatten(batch)[0])

        if self.on_device:
            self._build_on_device_step(replica_fn)
        else:
            self._build_host_step(replica_fn, op)
        if self.is_ps:
            self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

            def per_worker_dataset_fn() -> Any:
                return strategy.distribute_datasets_from_function(spec.dataset_fn)

            dataset = self.coordinator.create_per_worker_dataset(tf.function(per_worker_dataset_fn))
        else:
            dataset = strategy.distribute_datasets_from_function(spec.dataset_fn)
        self.iterator = iter(dataset)

    def _build_host_step(self, replica_fn: Any, op: Any) -> None:
        """The step returns its reduced logs and example count (read by the host each step)."""
        tf, strategy, step_var = self.tf, self.strategy, self.step_var
        sum_op = tf.distribute.ReduceOp.SUM
        counts_in_graph = not self.is_ps

        def train_step(iterator: Any) -> tuple[dict[str, Any], Any]:
            logs, examples = strategy.run(replica_fn, args=(next(iterator),))
            reduced = {k: strategy.reduce(op, v, axis=None) for k, v in logs.items()}
            if counts_in_graph:
                # In the graph, so whatever saves (the runtime or TF's preemption handler)
                # sees the step it is saving at.
                step_var.assign_add(1)
            return reduced, strategy.reduce(sum_op, examples, axis=None)

        self.train_step = tf.function(train_step)

    def _build_on_device_step(self, replica_fn: Any) -> None:
        """The step keeps its numbers on the device and returns this worker's logs unreduced.

        No collective beyond the gradients' and no value the host waits for: examples add up
        in a variable (this worker's replicas, times the workers, which run in step with one
        batch each, as the Keras counter counts), and the first step whose loss (on any of this
        worker's replicas) is NaN/Inf is kept in another with its loss; the host reads them,
        and reduces the logs, at reports only."""
        tf, strategy, step_var = self.tf, self.strategy, self.step_var
        workers = float(self.settings.num_workers)
        # Plain variables (this worker's own, not mirrored), on the device the step runs on.
        self.examples_var = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.bad_step_var = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.bad_loss_var = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        examples_var, bad_step, bad_loss = self.examples_var, self.bad_step_var, self.bad_loss_var

        def train_step(iterator: Any) -> Any:
            logs, examples = strategy.run(replica_fn, args=(next(iterator),))
            step_var.assign_add(1)
            local = tf.add_n(
                [tf.cast(x, tf.float64) for x in strategy.experimental_local_results(examples)]
            )
            examples_var.assign_add(local * workers)
            if "loss" in logs:
                losses = [
                    tf.reduce_mean(tf.cast(x, tf.float32))
                    for x in strategy.experimental_local_results(logs["loss"])
                ]
                loss = tf.add_n(losses) / float(len(losses))
                first = tf.logical_and(bad_step < 0, tf.logical_not(tf.math.is_finite(loss)))
                step = tf.cast(tf.convert_to_tensor(step_var), tf.int64)
                bad_step.assign(tf.where(first, step, bad_step))
                bad_loss.assign(tf.where(first, loss, bad_loss))
            return logs

        self.train_step = tf.function(train_step)

    def build_preemption_handler(self, stop: StopRequest) -> None:
        """TF's handler where a stop must be agreed on by several workers (MWMS)."""
        if writes_alone(self.name, self.settings.num_workers):
            return

        def exit_fn() -> None:
            raise Preempted(f"signal {stop.signum} received by a worker of the job")

        def save_fn() -> None:
            self.save(reason="preempted")

        with self.strategy.scope():
            self.handler = preemption.checkpoint_handler(
                self.tf,
                self.strategy.cluster_resolver,
                self.read_manager,
                stop,
                exit_fn=exit_fn,
                save_fn=save_fn,
            )

    # -- steps, saves ---------------------------------------------------------------------

    def _check_device_flag(self) -> None:
        """The on-device path's check (at reports): the first NaN/Inf step, by its number."""
        if not self.on_device or not self.stop_on_nonfinite_loss:
            return
        bad = int(self.bad_step_var.numpy())
        if bad >= 0:
            loss = float(self.bad_loss_var.numpy())
            exitcodes.check_loss(loss, step=bad, epoch=epoch_of(bad - 1, self.spec.steps_per_epoch))

    def _check_loss(self, logs: Mapping[str, Any]) -> None:
        """Stop the replica (exit 6) when the step's ``loss`` is NaN or +/-Inf: every step
        after a diverged one is NaN too, so training on wastes the job's time."""
        loss = logs.get("loss")
        if loss is None or not self.stop_on_nonfinite_loss:
            return
        value = float(loss.numpy() if hasattr(loss, "numpy") else loss)
        step = self.host_step
        exitcodes.check_loss(value, step=step, epoch=epoch_of(step - 1, self.spec.steps_per_epoch))

    def _run_step(self) -> Any:
        if self.coordinator is not None:
            remote = self.coordinator.schedule(self.train_step, args=(self.iterator,))
            self._pending.append(remote)
            return remote
        if self.handler is not None:
            return self.handler.run(self.train_step, self.iterator)
        return self.train_step(self.iterator)

    def _barrier(self, epoch: _Epoch) -> None:
        """ParameterServer: wait for every scheduled step; count their examples."""
        if self.coordinator is None:
            return
        self.coordinator.join()
        counts = [r[1] for r in map(self._remote, self._pending) if r is not None]
        if counts:
            # A step whose worker died after running it counts as an average one.
            epoch.examples += sum(float(c) for c in counts) * len(self._pending) / len(counts)
        self._pending.clear()

    def _remote(self, remote: Any) -> Any:
        """A ParameterServer step's result, or None when the worker holding it is gone.

        The coordinator retries a lost worker's unfinished steps elsewhere, but the results of
        steps it had finished stay on it: reading one then fails with UnavailableError.
        """
        try:
            return remote.fetch()
        except (self.tf.errors.UnavailableError, self.tf.errors.CancelledError) as exc:
            log.info("Skipped a step result lost with its worker: %s", type(exc).__name__)
            return None

    def _fetch(self, result: Any) -> dict[str, float]:
        if self.on_device:
            # This worker's per-replica logs, reduced now (a collective under
            # MultiWorkerMirrored: every worker reports at the same steps).
            op = (
                self.tf.distribute.ReduceOp.SUM
                if self.spec.reduction == "sum"
                else self.tf.distribute.ReduceOp.MEAN
            )
            return _numbers({k: self.strategy.reduce(op, v, axis=None) for k, v in result.items()})
        if self.coordinator is not None:
            fetched = self._remote(result)
            return {} if fetched is None else _numbers(fetched[0])
        return _numbers(result[0])

    def _examples_so_far(self) -> float:
        return float(self.examples_var.numpy()) if self.on_device else 0.0

    def save(self, *, reason: str | None = None) -> None:
        step = self.host_step
        if self.is_ps:
            self.step_var.assign(step)
        path = self.write_manager.save(checkpoint_number=step)
        if self.write_manager is not self.read_manager:
            # A worker's copy is only its part in a collective save: never kept.
            with contextlib.suppress(self.tf.errors.OpError):
                self.tf.io.gfile.rmtree(os.path.dirname(self.write_dir))
            path = None
        extra = {"reason": reason} if reason else {}
        self.emitter.emit(
            "checkpoint",
            epoch=epoch_of(max(step - 1, 0), self.spec.steps_per_epoch),
            step=step,
            checkpoint=path if path else self.read_dir,
            **extra,
        )

    def loop(self, stop: StopRequest) -> dict[str, Any]:
        spec = self.spec
        total = spec.epochs * spec.steps_per_epoch
        self.emitter.plan(total_epochs=spec.epochs, steps_per_epoch=spec.steps_per_epoch)
        self.host_step = int(self.step_var.numpy())
        start_epoch = epoch_of(self.host_step, spec.steps_per_epoch)
        self.emitter.emit(
            "start",
            epoch=start_epoch,
            step=self.host_step,
            initial_epoch=start_epoch,
            initial_step=self.host_step,
            tf_version=self.tf.__version__,
        )
        alone = writes_alone(self.name, self.settings.num_workers)
        logs: dict[str, float] = {}
        epoch = _Epoch(time.perf_counter(), self.host_step, 0.0, self._examples_so_far())
        while self.host_step < total:
            result = self._run_step()
            self.host_step += 1
            self.emitter.tick(self.host_step)
            if self.coordinator is None and not self.on_device:
                # On the CPU the step's results are host tensors already (free to read).
                epoch.examples += float(result[1])
                self._check_loss(result[0])
            if progress_due(self.host_step, self.every_progress):
                self._check_device_flag()
                logs = self._fetch(result)
                self._check_loss(logs)  # ParameterServer: where results are fetched anyway
                self.emitter.emit(
                    "step",
                    epoch=epoch_of(self.host_step - 1, spec.steps_per_epoch),
                    step=self.host_step,
                    logs=logs,
                )
            if stop.requested and alone:
                self._barrier(epoch)
                self.save(reason="preempted")
                raise Preempted(f"signal {stop.signum} received at step {self.host_step}")
            epoch_done = self.host_step % spec.steps_per_epoch == 0
            if epoch_done or save_due(
                self.host_step,
                steps_per_epoch=spec.steps_per_epoch,
                every=spec.checkpoint_every_steps,
            ):
                self._barrier(epoch)
            if epoch_done:
                self._check_device_flag()
                logs = self._fetch(result)
                self._check_loss(logs)
                if self.on_device:
                    epoch.examples = float(self.examples_var.numpy()) - epoch.examples_at_start
                if spec.epoch_end_fn is not None:
                    logs.update(_numbers(spec.epoch_end_fn(self.state)))
                elapsed = max(time.perf_counter() - epoch.started, 1e-9)
                self.emitter.emit(
                    "epoch",
                    epoch=epoch_of(self.host_step - 1, spec.steps_per_epoch),
                    step=self.host_step,
                    logs=logs,
                    examples_per_sec=epoch.examples / elapsed,
                )
            if save_due(
                self.host_step,
                steps_per_epoch=spec.steps_per_epoch,
                every=spec.checkpoint_every_steps,
            ):
                self.save()
            if epoch_done:
                epoch = _Epoch(time.perf_counter(), self.host_step, 0.0, self._examples_so_far())
        self._barrier(epoch)
        return {"step": self.host_step, "logs": logs}

    def export(self) -> str | None:
        """Chief writes ``export/``; other workers save to scratch (collectives) and delete it."""
        export_fn = self.spec.export_fn
        if export_fn is None:
            model = self.state.get("model")
            if model is None:
                return None
            tf = self.tf

            def export_fn(state: Mapping[str, Any], path: str) -> None:
                tf.saved_model.save(model, path)

        path = layout.export_path(
            self.checkpoint_dir,
            is_chief=self.settings.is_chief,
            replica=self.settings.replica,
            export_format="savedmodel",
        )
        gfile = self.tf.io.gfile  # a gs:// checkpoint dir is TensorFlow's to write, not os's
        if gfile.exists(path):
            # A restarted chief that had exported already: replace, never mix two exports.
            gfile.rmtree(path)
        gfile.makedirs(os.path.dirname(path))
        export_fn(self.state, path)
        if self.settings.is_chief:
            return path
        with contextlib.suppress(self.tf.errors.OpError):
            gfile.rmtree(layout.scratch_dir(self.checkpoint_dir, self.settings.replica))
        return None


def run(
    tf: Any,
    settings: RuntimeSettings,
    spec: contract.LoopTrainSpec,
    emitter: progress.Emitter,
    checkpoint_dir: str,
    watcher: StopWatcher,
    *,
    strategy: Any,
    strategy_name: str,
) -> dict[str, Any]:
    """Train a custom loop to its last step; return the fields of the ``end`` event."""
    runner = LoopRunner(tf, settings, spec, strategy, strategy_name, emitter, checkpoint_dir)
    runner.build_state()
    runner.build_data_and_step()
    stop = StopRequest()
    with watcher.cooperative(stop):
        runner.build_preemption_handler(stop)
        end = runner.loop(stop)
    end["export"] = runner.export()
    return end
