"""A tiny regression whose loss becomes NaN at a chosen step, to see what a diverged job does:
``TRAINJOB_ENTRYPOINT=trainjob.samples.diverge:build`` (Keras fit) or ``...:build_loop`` (a
custom training loop). No dataset to download: the inputs are made up.

Every input is 1.0 except the batch of step ``nan_at_step`` (1-based, counted from the first
step of a fresh run), which is NaN: its loss is NaN, the gradient makes every weight NaN, and
every later loss is NaN too, as in a real divergence. With the runtime's default the replica
stops there with exit code 6; with ``stop_on_nonfinite_loss: false`` it trains to the end.

Config keys (``TRAINJOB_CONFIG``): ``nan_at_step`` (5; 0 = never), ``epochs`` (2),
``steps_per_epoch`` (5), ``batch_size`` (global, 8), ``steps_per_execution`` (fit only, 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainjob import runtime

FEATURES = 4


def _dataset_fn(tf: Any, ctx: runtime.TrainContext) -> Any:
    nan_at = ctx.get_int("nan_at_step", 5)

    def dataset_fn(input_context: Any) -> Any:
        batch = ctx.per_replica_batch_size(input_context)

        def element(index: Any) -> tuple[Any, Any]:
            # Element i is the batch of step i + 1 (one pipeline, no shuffling).
            value = tf.where(index == nan_at - 1, float("nan"), 1.0)
            return tf.fill([batch, FEATURES], value), tf.ones([batch, 1])

        return tf.data.Dataset.counter().map(element)

    return dataset_fn


def build(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    import tensorflow as tf  # imported after the runtime set TF_USE_LEGACY_KERAS

    def model_fn() -> Any:
        model = tf.keras.Sequential([tf.keras.Input(shape=(FEATURES,)), tf.keras.layers.Dense(1)])
        # steps_per_execution: N steps per tf.function call (fewer host round trips).
        model.compile(
            optimizer=tf.keras.optimizers.SGD(0.01),
            loss="mse",
            steps_per_execution=ctx.get_int("steps_per_execution", 1),
        )
        return model

    return runtime.TrainSpec(
        model_fn=model_fn,
        dataset_fn=_dataset_fn(tf, ctx),
        epochs=ctx.get_int("epochs", 2),
        steps_per_epoch=ctx.get_int("steps_per_epoch", 5),
        export_format="none",
    )


def build_loop(ctx: runtime.TrainContext) -> runtime.LoopTrainSpec:
    import tensorflow as tf

    global_batch = ctx.global_batch_size

    def state_fn() -> dict[str, Any]:
        model = tf.keras.Sequential([tf.keras.Input(shape=(FEATURES,)), tf.keras.layers.Dense(1)])
        return {"model": model, "optimizer": tf.keras.optimizers.SGD(0.01)}

    def step_fn(state: Mapping[str, Any], batch: Any) -> dict[str, Any]:
        x, y = batch
        model = state["model"]
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        state["optimizer"].apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return {"loss": loss}

    def no_export(state: Mapping[str, Any], path: str) -> None:
        del state, path  # nothing worth keeping from a made-up regression

    return runtime.LoopTrainSpec(
        state_fn=state_fn,
        dataset_fn=_dataset_fn(tf, ctx),
        step_fn=step_fn,
        steps_per_epoch=ctx.get_int("steps_per_epoch", 5),
        epochs=ctx.get_int("epochs", 2),
        export_fn=no_export,
    )
