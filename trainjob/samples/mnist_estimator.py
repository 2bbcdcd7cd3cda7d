"""MNIST with ``tf.estimator`` (legacy image, TF 2.15):
``TRAINJOB_FRAMEWORK=Estimator TRAINJOB_ENTRYPOINT=trainjob.samples.mnist_estimator:build``.

A two-layer MLP written with ``tf.compat.v1`` variables (no Keras), fed by the same offline tfds
``mnist``. Config keys: ``max_steps`` (200), ``batch_size`` (global, 64), ``learning_rate``
(0.05), ``hidden_units`` (64), ``save_checkpoints_steps`` (50), ``eval_steps`` (10),
``data_dir`` (or ``$TRAINJOB_DATA_DIR``), ``step_delay_ms`` (0; tests only).
"""

from __future__ import annotations

from typing import Any

from trainjob import runtime
from trainjob.samples import common


def build(ctx: runtime.TrainContext) -> runtime.EstimatorTrainSpec:
    import tensorflow as tf

    v1 = tf.compat.v1
    hidden = ctx.get_int("hidden_units", 64)

    def input_fn(split: str, input_context: Any = None) -> Any:
        ds = runtime.load_sharded(
            "mnist", split=split, data_dir=ctx.data_dir, input_context=input_context
        )
        ds = ds.map(lambda x, y: ({"image": tf.reshape(tf.cast(x, tf.float32) / 255.0, [784])}, y))
        if split == "train":
            ds = ds.shuffle(1024, seed=7).repeat()
        ds = ds.batch(ctx.per_replica_batch_size(input_context), drop_remainder=True)
        return common.input_delay(
            tf, ds, ctx.get_int("step_delay_ms", 0) if split == "train" else 0
        )

    def train_input_fn(input_context: Any = None) -> Any:
        return input_fn("train", input_context)

    def eval_input_fn() -> Any:
        return input_fn("test")

    def model_fn(features: Any, labels: Any, mode: Any, params: Any) -> Any:
        del params
        init = v1.glorot_uniform_initializer(seed=1)
        w1 = v1.get_variable("w1", [784, hidden], initializer=init)
        b1 = v1.get_variable("b1", [hidden], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [hidden, 10], initializer=init)
        b2 = v1.get_variable("b2", [10], initializer=v1.zeros_initializer())
        logits = tf.matmul(tf.nn.relu(tf.matmul(features["image"], w1) + b1), w2) + b2
        predictions = tf.argmax(logits, axis=1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"class": predictions})
        # v1.losses registers the loss in the LOSSES collection the runtime's hook reports.
        loss = v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            accuracy = v1.metrics.accuracy(labels=labels, predictions=predictions)
            return tf.estimator.EstimatorSpec(
                mode, loss=loss, eval_metric_ops={"accuracy": accuracy}
            )
        optimizer = v1.train.GradientDescentOptimizer(ctx.get_float("learning_rate", 0.05))
        train_op = optimizer.minimize(loss, global_step=v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    def serving_input_receiver_fn() -> Any:
        image = v1.placeholder(tf.float32, [None, 784], name="image")
        return tf.estimator.export.ServingInputReceiver({"image": image}, {"image": image})

    return runtime.EstimatorTrainSpec(
        model_fn=model_fn,
        train_input_fn=train_input_fn,
        eval_input_fn=eval_input_fn,
        max_steps=ctx.get_int("max_steps", 200),
        eval_steps=ctx.get_int("eval_steps", 10),
        save_checkpoints_steps=ctx.get_int("save_checkpoints_steps", 50),
        serving_input_receiver_fn=serving_input_receiver_fn,
    )
