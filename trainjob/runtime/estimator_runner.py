"""Run an :class:`~trainjob.runtime.contract.EstimatorTrainSpec` with
``tf.estimator.train_and_evaluate`` (legacy image: TF <= 2.15 + tensorflow-estimator).

Chief and workers train under MultiWorkerMirrored when there are several of them; an
``evaluator`` task evaluates checkpoints and must not build that strategy (it is not part of the
all-reduce group). Estimator resumes from the latest checkpoint in its model_dir by itself.
SIGTERM keeps its default meaning here (the process ends, exit 143): checkpoints every
``save_checkpoints_steps`` bound the lost work.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
from typing import Any

from trainjob.core import constants
from trainjob.runtime import contract, layout, progress
from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import UnsupportedError
from trainjob.runtime.settings import RuntimeSettings


def estimator_strategy(settings: RuntimeSettings) -> str:
    """The strategy name Estimator trains under in this task (pure)."""
    if settings.task_type == constants.EVALUATOR:
        return settings_mod.DEFAULT
    if settings.strategy in (settings_mod.AUTO, settings_mod.MULTI_WORKER_MIRRORED) and (
        settings.num_workers > 1
    ):
        return settings_mod.MULTI_WORKER_MIRRORED
    if settings.strategy in (settings_mod.MIRRORED, settings_mod.ONE_DEVICE):
        return settings.strategy
    return settings_mod.DEFAULT


def _require_estimator(tf: Any) -> Any:
    try:
        importlib.import_module("tensorflow_estimator")
    except ImportError as exc:
        raise UnsupportedError(
            f"framework Estimator needs TensorFlow <= 2.15 with tensorflow-estimator (the "
            f"trainjob-legacy image); this is TensorFlow {tf.__version__}"
        ) from exc
    return tf.estimator


def _hooks(
    tf: Any, emitter: progress.Emitter, every: int, examples_per_step: int, model_dir: str
) -> Any:
    class ProgressHook(tf.estimator.SessionRunHook):  # type: ignore[misc]
        """Start, step and checkpoint events; the loss comes from the LOSSES collection.

        Estimator ignores saving listeners under distribution strategies, so new checkpoints
        are noticed here, when a step event is due (a directory read every N steps).
        """

        def begin(self) -> None:
            self._step_tensor = tf.compat.v1.train.get_global_step()
            losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
            self._fetches = {"step": self._step_tensor}
            if losses:
                self._fetches["loss"] = losses[0]
            self._last: tuple[int, float] | None = None
            self._checkpoint: str | None = tf.train.latest_checkpoint(model_dir)

        def after_create_session(self, session: Any, coord: Any) -> None:
            step = int(session.run(self._step_tensor))
            self._last = (step, time.perf_counter())
            emitter.emit("start", step=step, initial_step=step, tf_version=tf.__version__)

        def before_run(self, run_context: Any) -> Any:
            return tf.estimator.SessionRunArgs(self._fetches)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            results = run_values.results
            step = int(results["step"])
            emitter.tick(step)
            if every <= 0 or self._last is None or step - self._last[0] < every:
                return
            now = time.perf_counter()
            rate = (step - self._last[0]) * examples_per_step / max(now - self._last[1], 1e-9)
            self._last = (step, now)
            logs = {"loss": float(results["loss"])} if "loss" in results else {}
            emitter.emit("step", step=step, logs=logs, examples_per_sec=rate)
            latest = tf.train.latest_checkpoint(model_dir)
            if latest and latest != self._checkpoint:
                self._checkpoint = latest
                emitter.emit("checkpoint", step=step, checkpoint=latest)

    return ProgressHook()


def run(
    tf: Any, settings: RuntimeSettings, build: Any, emitter: progress.Emitter, checkpoint_dir: str
) -> dict[str, Any]:
    estimator_mod = _require_estimator(tf)
    name = estimator_strategy(settings)
    ctx = contract.TrainContext(
        config=settings.config,
        strategy=name,
        framework=settings.framework,
        task_type=settings.task_type,
        task_index=settings.task_index,
        is_chief=settings.is_chief,
        num_workers=settings.num_workers,
        num_replicas_in_sync=1,
        checkpoint_dir=checkpoint_dir,
        data_dir=settings.data_dir,
    )
    spec = build(ctx)
    contract.validate_train_spec(spec, strategy=name, framework=settings.framework)
    assert isinstance(spec, contract.EstimatorTrainSpec)

    strategies = {
        # The V1 (experimental) class: what Estimator's distribute coordinator expects.
        settings_mod.MULTI_WORKER_MIRRORED: tf.distribute.experimental.MultiWorkerMirroredStrategy,
        settings_mod.MIRRORED: tf.distribute.MirroredStrategy,
        settings_mod.ONE_DEVICE: lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    }
    train_distribute = strategies[name]() if name in strategies else None
    model_dir = layout.estimator_dir(checkpoint_dir)
    run_config = estimator_mod.RunConfig(
        model_dir=model_dir,
        train_distribute=train_distribute,
        save_checkpoints_steps=spec.save_checkpoints_steps,
        log_step_count_steps=spec.log_step_count_steps,
    )
    estimator = estimator_mod.Estimator(
        model_fn=spec.model_fn,
        config=run_config,
        # None, not {}: Estimator rejects any params (even empty ones) for a model_fn without
        # a params argument, as TF's tutorials write it; with one it still gets {}.
        params=dict(spec.params) or None,
    )
    if isinstance(spec.max_steps, int) and spec.max_steps > 0:
        emitter.plan(total_steps=spec.max_steps)
    hook = _hooks(
        tf,
        emitter,
        int(settings.config.get("progress_every_steps", 50)),
        ctx.global_batch_size,
        model_dir,
    )
    train_spec = estimator_mod.TrainSpec(
        spec.train_input_fn, max_steps=spec.max_steps, hooks=[hook]
    )
    eval_spec = estimator_mod.EvalSpec(
        spec.eval_input_fn or spec.train_input_fn,
        steps=spec.eval_steps,
        start_delay_secs=0,
        throttle_secs=1,
    )
    estimator_mod.train_and_evaluate(estimator, train_spec, eval_spec)

    result: dict[str, Any] = {"checkpoint": tf.train.latest_checkpoint(model_dir)}
    if settings.task_type == constants.EVALUATOR:
        # In a cluster train_and_evaluate returns nothing: evaluate the final checkpoint once
        # more (eval_steps batches) so the end event carries its metrics.
        metrics = dict(estimator.evaluate(eval_spec.input_fn, steps=spec.eval_steps))
        step = metrics.pop("global_step", None)
        result["step"] = None if step is None else int(step)
        result["logs"] = {k: float(v) for k, v in metrics.items()}
    else:
        result["step"] = int(estimator.get_variable_value("global_step"))
    if settings.is_chief and spec.serving_input_receiver_fn is not None:
        export_base = os.path.join(checkpoint_dir, layout.EXPORT)
        exported = estimator.export_saved_model(export_base, spec.serving_input_receiver_fn)
        result["export"] = exported.decode() if isinstance(exported, bytes) else str(exported)
    if not settings.is_chief and settings.task_type == constants.WORKER:
        # MWMS Estimator leaves a per-worker scratch model_dir behind (measured on 2.15).
        shutil.rmtree(
            os.path.join(model_dir, f"tmp_worker_{settings.task_index}"), ignore_errors=True
        )
    return result
