"""The trainjob runtime: what runs inside every training replica (pod or local process).

User contract (details in docs/content/guides/training-code.md, "Your code in each replica")::

    # my_pkg/train.py                      TRAINJOB_ENTRYPOINT=my_pkg.train:build
    import tensorflow as tf                # tf.keras is tf-keras: the runtime sets
    from trainjob import runtime           # TF_USE_LEGACY_KERAS=1 before TF is imported

    def build(ctx: runtime.TrainContext) -> runtime.TrainSpec:
        def model_fn():                    # called inside strategy.scope()
            model = tf.keras.Sequential([...])
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
            return model

        def dataset_fn(input_context):     # this worker's shard, per-replica batches
            ds = runtime.load_sharded("mnist", data_dir=ctx.data_dir,
                                      input_context=input_context)
            return ds.repeat().batch(ctx.per_replica_batch_size(input_context))

        return runtime.TrainSpec(model_fn=model_fn, dataset_fn=dataset_fn,
                                 epochs=ctx.get_int("epochs", 3), steps_per_epoch=100)

A custom training loop returns :class:`LoopTrainSpec` instead (``state_fn``, ``dataset_fn``,
``step_fn``): the runtime runs the step under every strategy and checkpoints the state.

Importing this package does not import TensorFlow; ``trainjob train`` does, lazily.
"""

from trainjob.runtime.contract import (
    DTensorTrainSpec,
    EstimatorTrainSpec,
    LoopTrainSpec,
    TrainContext,
    TrainSpec,
)
from trainjob.runtime.data import load_sharded

__all__ = [
    "DTensorTrainSpec",
    "EstimatorTrainSpec",
    "LoopTrainSpec",
    "TrainContext",
    "TrainSpec",
    "load_sharded",
]
