"""Entrypoints for the object-storage checkpoint tests: MNIST whose checkpoints carry ballast.

``ballast_mb`` (config) adds a non-trainable weight of that many MiB: it is in every checkpoint
(so an upload takes long enough to be caught half way) but never in a gradient or an
all-reduce, so steps stay as fast as the sample's.
"""

from __future__ import annotations

from typing import Any

from trainjob import runtime
from trainjob.samples import mnist


def with_ballast(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    import tensorflow as tf

    spec = mnist.build(ctx)
    floats = ctx.get_int("ballast_mb", 0) * 1024 * 1024 // 4

    class Ballast(tf.keras.layers.Layer):  # type: ignore[misc]
        def build(self, input_shape: Any) -> None:
            self.ballast = self.add_weight(
                name="ballast", shape=(floats,), initializer="ones", trainable=False
            )

        def call(self, inputs: Any) -> Any:
            return inputs

    def model_fn() -> Any:
        model = mnist.make_model(tf, str(ctx.config.get("model", "mlp")), 0.001)
        if floats:
            outputs = Ballast()(model.output)
            ballasted = tf.keras.Model(model.input, outputs)
            ballasted.compile(
                optimizer=tf.keras.optimizers.Adam(0.001),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
            return ballasted
        return model

    return runtime.TrainSpec(
        model_fn=model_fn,
        dataset_fn=spec.dataset_fn,
        epochs=spec.epochs,
        steps_per_epoch=spec.steps_per_epoch,
        save_freq=spec.save_freq,
        export_format=spec.export_format,
    )
