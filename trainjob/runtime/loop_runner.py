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

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainjob.runtime import contract, exitcodes, layout, preemption, progress
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

        step_var = self.step_var
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
        if self.is_ps:
            self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

            def per_worker_dataset_fn() -> Any:
                return strategy.distribute_datasets_from_function(spec.dataset_fn)

            dataset = self.coordinator.create_per_worker_dataset(tf.function(per_worker_dataset_fn))
        else:
            dataset = strategy.distribute_datasets_from_function(spec.dataset_fn)
        self.iterator = iter(dataset)

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
        if self.coordinator is not None:
            fetched = self._remote(result)
            return {} if fetched is None else _numbers(fetched[0])
        return _numbers(result[0])

    def save(self, *, reason: str | None = None) -> None:
        step = self.host_step
        if self.is_ps:
            self.step_var.assign(step)
        path = self.write_manager.save(checkpoint_number=step)
        if self.write_manager is not self.read_manager:
            # A worker's copy is only its part in a collective save: never kept.
            shutil.rmtree(os.path.dirname(self.write_dir), ignore_errors=True)
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
        epoch = _Epoch(time.perf_counter(), self.host_step)
        while self.host_step < total:
            result = self._run_step()
            self.host_step += 1
            self.emitter.tick(self.host_step)
            if self.coordinator is None:
                epoch.examples += float(result[1])  # on the host each step already
                self._check_loss(result[0])
            if progress_due(self.host_step, self.every_progress):
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
                logs = self._fetch(result)
                self._check_loss(logs)
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
                epoch = _Epoch(time.perf_counter(), self.host_step)
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
        if os.path.exists(path):
            # A restarted chief that had exported already: replace, never mix two exports.
            shutil.rmtree(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        export_fn(self.state, path)
        if self.settings.is_chief:
            return path
        shutil.rmtree(
            layout.scratch_dir(self.checkpoint_dir, self.settings.replica), ignore_errors=True
        )
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
