"""MNIST on a multi-client DTensor mesh: ``TRAINJOB_STRATEGY=DTensor``,
``TRAINJOB_ENTRYPOINT=trainjob.samples.mnist_dtensor:build``.

A two-layer MLP whose weights are replicated ``DVariable``s and whose batch is sharded over the
mesh dimension ``"batch"``: each client reads its own shard of tfds ``mnist`` and packs it into
the global batch, the loss is a mean over the global batch, so gradients are all-reduced by
DTensor. Config keys: ``steps`` (100), ``batch_size`` (global, 64), ``learning_rate`` (0.1),
``hidden_units`` (64), ``data_dir`` (or ``$TRAINJOB_DATA_DIR``), ``progress_every_steps`` (20).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainjob import runtime


def build(ctx: runtime.TrainContext) -> runtime.DTensorTrainSpec:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    steps = ctx.get_int("steps", 100)
    every = ctx.get_int("progress_every_steps", 20)
    hidden = ctx.get_int("hidden_units", 64)
    lr = ctx.get_float("learning_rate", 0.1)

    def train_fn(mesh: Any, report: Callable[[int, Mapping[str, Any]], None]) -> dict[str, Any]:
        replicated = dtensor.Layout.replicated(mesh, rank=2)
        replicated1 = dtensor.Layout.replicated(mesh, rank=1)
        x_layout = dtensor.Layout.batch_sharded(mesh, "batch", rank=2)
        y_layout = dtensor.Layout.batch_sharded(mesh, "batch", rank=1)
        init = tf.keras.initializers.GlorotUniform(seed=1)
        weights = [
            dtensor.DVariable(dtensor.copy_to_mesh(init((784, hidden)), replicated)),
            dtensor.DVariable(dtensor.copy_to_mesh(tf.zeros((hidden,)), replicated1)),
            dtensor.DVariable(dtensor.copy_to_mesh(init((hidden, 10)), replicated)),
            dtensor.DVariable(dtensor.copy_to_mesh(tf.zeros((10,)), replicated1)),
        ]

        def eager_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                w1, b1, w2, b2 = weights
                logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                )
            for var, grad in zip(weights, tape.gradient(loss, weights), strict=True):
                var.assign_sub(lr * grad)
            return loss

        step = tf.function(eager_step)

        # One input pipeline per client, each packing its local devices' slices.
        local_devices = len(mesh.local_devices())
        context = tf.distribute.InputContext(
            ctx.num_workers, dtensor.client_id(), ctx.num_replicas_in_sync
        )
        per_device = ctx.per_replica_batch_size(context)
        ds = runtime.load_sharded("mnist", data_dir=ctx.data_dir, input_context=context)
        ds = ds.map(
            lambda x, y: (tf.reshape(tf.cast(x, tf.float32) / 255.0, [784]), tf.cast(y, tf.int32))
        )
        ds = (
            ds.shuffle(1024, seed=7).repeat().batch(per_device * local_devices, drop_remainder=True)
        )
        loss = None
        for number, (x, y) in enumerate(ds.take(steps), start=1):
            gx = dtensor.pack(tf.split(x, local_devices), x_layout)
            gy = dtensor.pack(tf.split(y, local_devices), y_layout)
            loss = float(step(gx, gy))
            if every and number % every == 0:
                report(number, {"loss": loss})
        return {"step": steps, "loss": loss}

    return runtime.DTensorTrainSpec(train_fn=train_fn)
