"""Built-in example models for TrainJob (used by ``examples/`` and the training tests).

* ``trainjob.samples.mnist:build`` -- Keras CNN/MLP on tfds ``mnist`` (any Keras strategy).
* ``trainjob.samples.mnist_estimator:build`` -- the same data through ``tf.estimator``
  (legacy image, TF 2.15).
* ``trainjob.samples.mnist_dtensor:build`` -- data-parallel DTensor (see its docstring).
* ``trainjob.samples.diverge:build`` / ``:build_loop`` -- a made-up regression whose loss
  becomes NaN at ``nan_at_step``: what a diverged job does (exit code 6, reason NonFiniteLoss).

All read MNIST with the unchanged ``tfds.load("mnist", data_dir=...)`` from ``config.data_dir``
or ``$TRAINJOB_DATA_DIR``; ``trainjob data prepare mnist --data-dir D`` makes it offline.
"""
