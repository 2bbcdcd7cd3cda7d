"""Entrypoints written as TensorFlow's tutorials write them (for the training tests): their own
batch size, a finite dataset and no steps_per_epoch."""

from __future__ import annotations

from typing import Any

from trainjob import runtime
from trainjob.samples import mnist

BATCH = 16  # not config.batch_size (64 by default)


def finite_test_split(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    import tensorflow as tf

    def dataset_fn(input_context: Any) -> Any:
        ds = runtime.load_sharded(
            "mnist", split="test", data_dir=ctx.data_dir, input_context=input_context
        )
        return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).batch(BATCH)

    return runtime.TrainSpec(
        model_fn=lambda: mnist.make_model(tf, "mlp", 0.001),
        dataset_fn=dataset_fn,
        epochs=2,
        export_format="none",
    )


def estimator_without_params(ctx: runtime.TrainContext) -> runtime.EstimatorTrainSpec:
    """TF's multi-worker Estimator tutorial: ``model_fn(features, labels, mode)``, no params."""
    import tensorflow as tf

    v1 = tf.compat.v1

    def input_fn(input_context: Any = None) -> Any:
        ds = runtime.load_sharded(
            "mnist", split="train", data_dir=ctx.data_dir, input_context=input_context
        )
        ds = ds.map(lambda x, y: (tf.reshape(tf.cast(x, tf.float32) / 255.0, [784]), y))
        return ds.repeat().batch(BATCH)

    def model_fn(features: Any, labels: Any, mode: Any) -> Any:
        logits = v1.layers.dense(features, 10)
        loss = v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
        train_op = v1.train.GradientDescentOptimizer(0.05).minimize(
            loss, global_step=v1.train.get_global_step()
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return runtime.EstimatorTrainSpec(
        model_fn=model_fn, train_input_fn=input_fn, max_steps=5, eval_steps=1
    )


def tutorial_slice(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    """A tutorial's ``tfds.load("mnist", split="train[:5000]")``: more than the offline split."""
    import tensorflow_datasets as tfds

    tfds.load("mnist", split="train[:5000]", data_dir=ctx.data_dir)
    return finite_test_split(ctx)  # not reached


def counter_loop(ctx: runtime.TrainContext) -> runtime.LoopTrainSpec:
    """A custom loop whose only state is a 1 MiB variable that counts steps (a few milliseconds
    per save, no dataset to load): each step event's ``w`` equals its step unless a restore
    brought back state from another step than the one it claims."""
    import tensorflow as tf

    def state_fn() -> dict[str, Any]:
        return {"weights": tf.Variable(tf.zeros([512, 512]))}

    def dataset_fn(input_context: Any) -> Any:
        return tf.data.Dataset.from_tensors(tf.ones([1])).repeat()

    def step_fn(state: Any, batch: Any) -> dict[str, Any]:
        weights = state["weights"]
        weights.assign_add(tf.ones_like(weights) * batch[0])
        return {"w": weights[0, 0]}

    return runtime.LoopTrainSpec(
        state_fn=state_fn,
        dataset_fn=dataset_fn,
        step_fn=step_fn,
        steps_per_epoch=ctx.get_int("steps_per_epoch", 100_000),
        checkpoint_every_steps=1,
        max_to_keep=2,
    )


def scalar_sum_loop(ctx: runtime.TrainContext) -> runtime.LoopTrainSpec:
    """TensorFlow's ParameterServer sample as a LoopTrainSpec: an unbatched dataset of scalars
    (`Dataset.range(1, 6)`) summed into a Variable, one element per step."""
    import tensorflow as tf

    def state_fn() -> dict[str, Any]:
        return {"total": tf.Variable(0.0)}

    def dataset_fn(input_context: Any) -> Any:
        return tf.data.Dataset.range(1, 6).repeat()

    def step_fn(state: Any, x: Any) -> dict[str, Any]:
        state["total"].assign_add(tf.cast(x, tf.float32))
        return {"total": state["total"].read_value()}

    return runtime.LoopTrainSpec(
        state_fn=state_fn, dataset_fn=dataset_fn, step_fn=step_fn, steps_per_epoch=5
    )


def learning_rate_check(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    """User code that rejects its configuration, as a real build() would."""
    raise ValueError("learning rate must be > 0")
