"""The user contract: what ``TRAINJOB_ENTRYPOINT`` points at, and what it returns.

``TRAINJOB_ENTRYPOINT="my_pkg.train:build"`` names a function ``build(ctx: TrainContext)``.
The runtime imports it, calls it once per replica, and runs what it returns:

* :class:`TrainSpec` for ``framework: Keras`` (tf-keras ``Model.fit``),
* :class:`EstimatorTrainSpec` for ``framework: Estimator`` (``tf.estimator.train_and_evaluate``).

``build`` must not create TensorFlow variables itself: the runtime calls ``TrainSpec.model_fn``
inside ``strategy.scope()`` so the same code runs under every strategy. ``dataset_fn`` gets a
``tf.distribute.InputContext`` and returns this pipeline's shard, batched with the *per-replica*
batch size (``ctx.per_replica_batch_size(input_context)``); the runtime distributes it.

Everything the runtime does around ``fit`` (strategy from TF_CONFIG, BackupAndRestore to the
shared checkpoint dir, resume at the right epoch, chief-only export, TensorBoard logs, progress
events, exit codes) is not the user's concern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from trainjob.runtime.exitcodes import ConfigError

ExportFormat = Literal["savedmodel", "keras", "none"]
EXPORT_FORMATS: Final = ("savedmodel", "keras", "none")


@dataclass(frozen=True)
class TrainContext:
    """What ``build(ctx)`` may use to shape the model and the data. Plain data, no TensorFlow.

    ``config`` is ``TRAINJOB_CONFIG`` (the TrainJob's free-form settings, e.g. ``epochs``);
    ``strategy`` is the resolved strategy name (``MultiWorkerMirrored``, ``ParameterServer``,
    ``Mirrored``, ``OneDevice``, ``DTensor``, ``TPU`` or ``Default``); ``num_workers`` counts
    the tasks holding a model replica (chief + workers); ``num_replicas_in_sync`` is known once
    the strategy is built (1 for Estimator and ParameterServer, whose batch is per worker).
    """

    config: Mapping[str, Any]
    strategy: str
    framework: str
    task_type: str
    task_index: int
    is_chief: bool
    num_workers: int
    num_replicas_in_sync: int
    checkpoint_dir: str
    data_dir: str | None

    def get_int(self, key: str, default: int) -> int:
        value = self.config.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"config key {key!r} must be an integer, got {value!r}")
        return value

    def get_float(self, key: str, default: float) -> float:
        value = self.config.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key {key!r} must be a number, got {value!r}")
        return float(value)

    @property
    def global_batch_size(self) -> int:
        """``config.batch_size`` (default 64): the batch over all replicas of one step."""
        return self.get_int("batch_size", 64)

    def per_replica_batch_size(self, input_context: Any = None) -> int:
        """The batch one replica sees: ``global_batch_size`` split over the replicas in sync."""
        if input_context is not None:
            return int(input_context.get_per_replica_batch_size(self.global_batch_size))
        return max(1, self.global_batch_size // max(1, self.num_replicas_in_sync))


@dataclass(frozen=True)
class TrainSpec:
    """What a Keras ``build(ctx)`` returns.

    model_fn:        () -> compiled ``tf.keras.Model`` (called inside ``strategy.scope()``).
    dataset_fn:      (tf.distribute.InputContext) -> ``tf.data.Dataset`` of (x, y) batches for
                     this input pipeline, batched per replica and repeated if
                     ``steps_per_epoch`` is set.
    epochs:          total epochs; a resumed run continues where the backup left off.
    steps_per_epoch: required for ParameterServer (its datasets are infinite).
    validation_fn:   optional () -> ``tf.data.Dataset`` (batched globally) for ``fit``'s
                     validation; not used under ParameterServer.
    save_freq:       ``"epoch"`` or every N steps: how often BackupAndRestore backs up (and so how
                     much work a restart redoes).
    export_format:   ``"savedmodel"`` (default), ``"keras"`` or ``"none"``: what the chief writes
                     to ``<checkpoint_dir>/export`` when training ends.
    callbacks:       extra Keras callbacks (created by the user; keep them strategy-agnostic).
    """

    model_fn: Callable[[], Any]
    dataset_fn: Callable[[Any], Any]
    epochs: int = 1
    steps_per_epoch: int | None = None
    validation_fn: Callable[[], Any] | None = None
    validation_steps: int | None = None
    save_freq: str | int = "epoch"
    export_format: ExportFormat = "savedmodel"
    callbacks: Sequence[Any] = field(default_factory=tuple)


@dataclass(frozen=True)
class EstimatorTrainSpec:
    """What an Estimator ``build(ctx)`` returns (legacy image, TF <= 2.15).

    model_fn:         the ``tf.estimator`` model_fn(features, labels, mode, params).
    train_input_fn:   (input_context=None) -> ``tf.data.Dataset``; Estimator passes the
                      InputContext when the function has a parameter of that name.
    eval_input_fn:    optional; evaluation runs only in an ``evaluator`` task.
    max_steps:        global step to train to; a restarted job resumes from the latest checkpoint.
    serving_input_receiver_fn: optional; when set the chief exports a SavedModel at the end.
    """

    model_fn: Callable[..., Any]
    train_input_fn: Callable[..., Any]
    max_steps: int
    eval_input_fn: Callable[..., Any] | None = None
    eval_steps: int | None = 100
    params: Mapping[str, Any] = field(default_factory=dict)
    save_checkpoints_steps: int = 100
    log_step_count_steps: int = 50
    serving_input_receiver_fn: Callable[[], Any] | None = None


@dataclass(frozen=True)
class DTensorTrainSpec:
    """What a DTensor ``build(ctx)`` returns (``strategy: DTensor``, multi-client).

    The runtime initializes DTensor on every client (from the ``DTENSOR_*`` env the executors
    render) and builds a 1-D data-parallel mesh named ``"batch"`` over every device of every
    client. ``train_fn(mesh, report)`` runs the training loop on it; ``report(step, logs)`` emits
    a progress ``step`` event. It returns the final metrics (name -> number), ``step`` included.
    Keras ``fit`` does not run on DTensor meshes, so this is a custom-loop contract.
    """

    train_fn: Callable[[Any, Callable[[int, Mapping[str, Any]], None]], Mapping[str, Any]]


def validate_train_spec(spec: object, *, strategy: str, framework: str) -> None:
    """Reject what ``build`` returned when it cannot run under the strategy (pure)."""
    expected: type = (
        EstimatorTrainSpec
        if framework == "Estimator"
        else DTensorTrainSpec
        if strategy == "DTensor"
        else TrainSpec
    )
    if not isinstance(spec, expected):
        raise ConfigError(
            f"the entrypoint returned {type(spec).__name__}; framework {framework} expects "
            f"trainjob.runtime.{expected.__name__}"
        )
    if isinstance(spec, TrainSpec):
        if spec.epochs < 1:
            raise ConfigError(f"TrainSpec.epochs must be >= 1, got {spec.epochs}")
        if spec.steps_per_epoch is not None and spec.steps_per_epoch < 1:
            raise ConfigError(f"TrainSpec.steps_per_epoch must be >= 1, got {spec.steps_per_epoch}")
        if strategy == "ParameterServer" and spec.steps_per_epoch is None:
            raise ConfigError("TrainSpec.steps_per_epoch is required under ParameterServer")
        if not (
            spec.save_freq == "epoch" or (isinstance(spec.save_freq, int) and spec.save_freq > 0)
        ):
            raise ConfigError(
                f"TrainSpec.save_freq must be 'epoch' or a positive int, got {spec.save_freq!r}"
            )
        if spec.export_format not in EXPORT_FORMATS:
            raise ConfigError(f"TrainSpec.export_format must be one of {EXPORT_FORMATS}")
    if isinstance(spec, EstimatorTrainSpec) and spec.max_steps < 1:
        raise ConfigError(f"EstimatorTrainSpec.max_steps must be >= 1, got {spec.max_steps}")
