"""The failure of issue 32, as a script of one's own (no trainjob runtime): Kubeflow's
keras-API example checkpoints to its claim mounted at /train; the claim's root-owned volume is
not writable by the image's user, so the first checkpoint (here in epoch 2, step 69 of 70)
fails with TensorFlow's PermissionDeniedError while Keras' progress bar is mid-line. Run by
capture.py (see there) to make keras-permission-denied.log; needs TensorFlow and tf-keras."""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf

STEPS = 70
BATCH = 8

features = np.random.RandomState(0).rand(STEPS * BATCH, 28, 28).astype("float32")
labels = np.random.RandomState(1).randint(0, 10, size=(STEPS * BATCH,))
model = tf.keras.Sequential(
    [
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer="sgd",
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
checkpoint = tf.keras.callbacks.ModelCheckpoint(
    filepath="/train/checkpoint", save_weights_only=True, save_freq=STEPS + STEPS - 1
)
# Steps as slow as on a busy cluster: Keras redraws its bar at most every 0.05 s.
pace = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.06))
callbacks = [pace, checkpoint]
model.fit(features, labels, batch_size=BATCH, epochs=3, steps_per_epoch=STEPS, callbacks=callbacks)
