"""Stand-in for Kubeflow's ``gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0`` (the image the
kubeflow-training SDK's e2e test runs), working offline.

It takes the flags of Kubeflow's original ``mnist_with_summaries.py`` (only ``--log_dir``,
``--learning_rate`` and ``--batch_size`` are used by the SDK test), trains a small Keras model
on the real MNIST digits the TrainJob runtime image bakes in for tfds (``$TRAINJOB_DATA_DIR``,
``/data``), writes TensorBoard summaries (Keras' callback plus the test accuracy) under
``--log_dir`` and exits 0, within seconds on one CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log_dir", default="/tmp/tensorflow/mnist/logs/mnist_with_summaries")
    parser.add_argument("--learning_rate", type=float, default=0.001)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--max_steps", type=int, default=30, help="training steps")
    parser.add_argument("--dropout", type=float, default=0.9, help="keep probability")
    parser.add_argument(
        "--data_dir", default=os.environ.get("TRAINJOB_DATA_DIR", "/data"), help="tfds data_dir"
    )
    parser.add_argument("--fake_data", action="store_true", help="accepted, ignored")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    import tensorflow as tf
    import tensorflow_datasets as tfds

    tf.random.set_seed(0)

    def prepare(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.cast(image, tf.float32) / 255.0, label

    def load(split: str) -> tf.data.Dataset:
        dataset = tfds.load(
            "mnist", split=split, data_dir=args.data_dir, as_supervised=True, download=False
        )
        return dataset.map(prepare).batch(args.batch_size)

    train, test = load("train"), load("test")
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(28, 28, 1)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(1.0 - args.dropout),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(args.learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    os.makedirs(args.log_dir, exist_ok=True)
    model.fit(
        train.repeat(),
        epochs=1,
        steps_per_epoch=args.max_steps,
        callbacks=[tf.keras.callbacks.TensorBoard(log_dir=args.log_dir)],
        verbose=2,
    )
    loss, accuracy = model.evaluate(test, verbose=0)
    writer = tf.summary.create_file_writer(os.path.join(args.log_dir, "test"))
    with writer.as_default():
        tf.summary.scalar("accuracy", accuracy, step=args.max_steps)
        tf.summary.scalar("cross_entropy", loss, step=args.max_steps)
    writer.close()
    print(
        f"Accuracy at step {args.max_steps}: {accuracy:.4f} (loss {loss:.4f}); "
        f"summaries in {args.log_dir}; {time.monotonic() - started:.1f}s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
