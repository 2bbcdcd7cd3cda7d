"""MNIST in a custom training loop, as TensorFlow's custom-training-loop guides write it, under
any strategy but DTensor: ``TRAINJOB_ENTRYPOINT=trainjob.samples.mnist_loop:build``.

The same ``step_fn`` runs under MultiWorkerMirrored, ParameterServer (the chief schedules it on
the workers), Mirrored, OneDevice and the default strategy: a GradientTape step whose loss is
averaged over the *global* batch (``tf.nn.compute_average_loss``), so the per-replica values sum
to the global loss. Config keys (``TRAINJOB_CONFIG``): ``epochs`` (3), ``steps_per_epoch`` (50),
``batch_size`` (global, 64), ``model`` (``mlp`` or ``cnn``; ``mlp``), ``learning_rate``
(0.001), ``checkpoint_every_steps`` (0 = at each epoch end), ``data_dir`` (or
``$TRAINJOB_DATA_DIR``), ``step_delay_ms`` (0; a pause per input element, only for tests that
must catch training mid-epoch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainjob import runtime
from trainjob.samples import common, mnist


def build(ctx: runtime.TrainContext) -> runtime.LoopTrainSpec:
    import tensorflow as tf  # imported after the runtime set TF_USE_LEGACY_KERAS

    kind = str(ctx.config.get("model", "mlp"))
    learning_rate = ctx.get_float("learning_rate", 0.001)
    global_batch = ctx.global_batch_size
    every = ctx.get_int("checkpoint_every_steps", 0)
    delay_ms = ctx.get_int("step_delay_ms", 0)
    # reduction NONE: the per-example losses are averaged over the global batch below.
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def state_fn() -> dict[str, Any]:  # inside strategy.scope(): variables are distributed
        return {
            "model": mnist.make_model(tf, kind, learning_rate, compiled=False),
            "optimizer": tf.keras.optimizers.Adam(learning_rate),
            "accuracy": tf.keras.metrics.SparseCategoricalAccuracy(),
        }

    def dataset_fn(input_context: Any) -> Any:
        ds = runtime.load_sharded(
            "mnist", split="train", data_dir=ctx.data_dir, input_context=input_context
        )
        ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))
        ds = ds.cache().shuffle(1024, seed=7).repeat()
        ds = ds.batch(ctx.per_replica_batch_size(input_context), drop_remainder=True)
        return common.input_delay(tf, ds, delay_ms).prefetch(tf.data.AUTOTUNE)

    def step_fn(state: Mapping[str, Any], batch: Any) -> dict[str, Any]:
        images, labels = batch
        model = state["model"]
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(
                loss_object(labels, logits), global_batch_size=global_batch
            )
        grads = tape.gradient(loss, model.trainable_variables)
        state["optimizer"].apply_gradients(zip(grads, model.trainable_variables, strict=True))
        state["accuracy"].update_state(labels, logits)
        return {"loss": loss}

    def epoch_end_fn(state: Mapping[str, Any]) -> dict[str, Any]:
        accuracy = state["accuracy"]
        result = {"accuracy": accuracy.result()}
        accuracy.reset_state()
        return result

    return runtime.LoopTrainSpec(
        state_fn=state_fn,
        dataset_fn=dataset_fn,
        step_fn=step_fn,
        steps_per_epoch=ctx.get_int("steps_per_epoch", 50),
        epochs=ctx.get_int("epochs", 3),
        checkpoint_every_steps=every or None,
        epoch_end_fn=epoch_end_fn,
    )
