"""MNIST with tf-keras under any strategy: ``TRAINJOB_ENTRYPOINT=trainjob.samples.mnist:build``.

Config keys (``TRAINJOB_CONFIG``): ``epochs`` (3), ``batch_size`` (global, 64),
``steps_per_epoch`` (50), ``model`` (``cnn`` or ``mlp``), ``learning_rate`` (0.001),
``data_dir`` (tfds data_dir holding ``mnist``; or ``$TRAINJOB_DATA_DIR``), ``save_freq``
(``epoch`` or N steps), ``step_delay_ms`` (0; a pause inside each input element, only for tests
that must catch training mid-epoch), ``validation_steps`` (0 = no validation),
``steps_per_execution`` (1; N steps per ``tf.function`` call, fewer host round trips on a GPU).
"""

from __future__ import annotations

from typing import Any

from trainjob import runtime
from trainjob.samples import common


def _preprocess(tf: Any, image: Any, label: Any) -> tuple[Any, Any]:
    return tf.cast(image, tf.float32) / 255.0, label


def make_model(
    tf: Any,
    kind: str,
    learning_rate: float,
    *,
    compiled: bool = True,
    steps_per_execution: int = 1,
) -> Any:
    """A small classifier, compiled unless a custom loop brings its own optimizer; built
    (Input layer) so BackupAndRestore can restore it."""
    keras = tf.keras
    if kind == "mlp":
        layers = [keras.layers.Flatten(), keras.layers.Dense(128, activation="relu")]
    else:
        layers = [
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
        ]
    model = keras.Sequential([keras.Input(shape=(28, 28, 1)), *layers, keras.layers.Dense(10)])
    if not compiled:
        return model
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def build(ctx: runtime.TrainContext) -> runtime.TrainSpec:
    import tensorflow as tf  # imported after the runtime set TF_USE_LEGACY_KERAS

    kind = str(ctx.config.get("model", "cnn"))
    delay_ms = ctx.get_int("step_delay_ms", 0)
    save_freq = ctx.config.get("save_freq", "epoch")

    def dataset_fn(input_context: Any) -> Any:
        ds = runtime.load_sharded(
            "mnist", split="train", data_dir=ctx.data_dir, input_context=input_context
        )
        ds = ds.map(lambda x, y: _preprocess(tf, x, y)).cache().shuffle(1024, seed=7).repeat()
        ds = ds.batch(ctx.per_replica_batch_size(input_context), drop_remainder=True)
        return common.input_delay(tf, ds, delay_ms).prefetch(tf.data.AUTOTUNE)

    def validation_fn() -> Any:
        ds = runtime.load_sharded("mnist", split="test", data_dir=ctx.data_dir)
        return ds.map(lambda x, y: _preprocess(tf, x, y)).batch(ctx.global_batch_size)

    validation_steps = ctx.get_int("validation_steps", 0)
    return runtime.TrainSpec(
        model_fn=lambda: make_model(
            tf,
            kind,
            ctx.get_float("learning_rate", 0.001),
            steps_per_execution=ctx.get_int("steps_per_execution", 1),
        ),
        dataset_fn=dataset_fn,
        epochs=ctx.get_int("epochs", 3),
        steps_per_epoch=ctx.get_int("steps_per_epoch", 50),
        validation_fn=validation_fn if validation_steps else None,
        validation_steps=validation_steps or None,
        save_freq=save_freq if save_freq == "epoch" else int(save_freq),
        export_format=ctx.config.get("export_format", "savedmodel"),
    )
