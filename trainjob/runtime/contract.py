"""The user contract: what ``TRAINJOB_ENTRYPOINT`` points at, and what it returns.

``TRAINJOB_ENTRYPOINT="my_pkg.train:build"`` names a function ``build(ctx: TrainContext)``.
The runtime imports it, calls it once per replica, and runs what it returns:

* :class:`TrainSpec` for ``framework: Keras`` (tf-keras ``Model.fit``),
* :class:`LoopTrainSpec` for ``framework: Keras`` too, when you write the training step
  yourself (a custom loop: ``strategy.run`` under every strategy, ``ClusterCoordinator.schedule``
  under ParameterServer), as in TensorFlow's custom-training-loop guides,
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
Reduction = Literal["sum", "mean"]
REDUCTIONS: Final = ("sum", "mean")
# The runtime's own entry in a custom loop's tf.train.Checkpoint (the global step counter).
LOOP_STEP_KEY: Final = "step"


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
    steps_per_epoch: required under ParameterServer (its datasets are infinite) and under
                     MultiWorkerMirrored with several workers; elsewhere ``None`` means one
                     pass over a finite dataset (its length is read from the dataset).
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
class LoopTrainSpec:
    """What a custom-training-loop ``build(ctx)`` returns (``framework: Keras``, any strategy
    but DTensor). You write the step; the runtime owns the loop around it.

    state_fn:        () -> {name: trackable} (model, optimizer, metrics, ...), called inside
                     ``strategy.scope()``. Everything here goes into the runtime's
                     ``tf.train.Checkpoint`` (next to its step counter, ``"step"``) and is
                     restored before the first step.
    dataset_fn:      (tf.distribute.InputContext) -> ``tf.data.Dataset`` of per-replica
                     batches for this input pipeline, repeated (the loop counts steps, never
                     runs a dataset dry). Under ParameterServer each worker builds its own copy.
    step_fn:         (state, batch) -> {name: scalar tensor}: one training step on one replica
                     (runs inside ``strategy.run``; traced once by ``tf.function``). Compute the
                     loss over the *global* batch, e.g. ``tf.nn.compute_average_loss(...,
                     global_batch_size=ctx.global_batch_size)``, and apply the gradients.
    steps_per_epoch: steps of one epoch (required: the loop counts steps).
    epochs:          total epochs; a resumed job continues at the restored step.
    checkpoint_every_steps: save every N steps; ``None`` saves at each epoch end. Bounds the
                     work a killed replica redoes.
    max_to_keep:     checkpoints kept by the ``CheckpointManager``.
    reduction:       how ``step_fn``'s values are combined over replicas: ``"sum"`` (TF's
                     guides: per-replica losses already divided by the global batch size) or
                     ``"mean"``.
    epoch_end_fn:    optional (state) -> {name: number}, called on every worker at each epoch
                     end (outside ``tf.function``): metrics for the epoch event, e.g.
                     ``accuracy.result()``; reset your metrics here.
    export_fn:       optional (state, path) -> None: writes the final model (the chief's
                     ``path`` is ``<checkpoint_dir>/export``; other workers get a scratch path
                     that is deleted). Default: ``tf.saved_model.save(state["model"], path)``
                     when the state has a ``"model"``, else no export.
    """

    state_fn: Callable[[], Mapping[str, Any]]
    dataset_fn: Callable[[Any], Any]
    step_fn: Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
    steps_per_epoch: int
    epochs: int = 1
    checkpoint_every_steps: int | None = None
    max_to_keep: int = 3
    reduction: Reduction = "sum"
    epoch_end_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    export_fn: Callable[[Mapping[str, Any], str], None] | None = None


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


def expected_specs(strategy: str, framework: str) -> tuple[type, ...]:
    """What ``build`` may return under a framework and (resolved) strategy (pure)."""
    if framework == "Estimator":
        return (EstimatorTrainSpec,)
    if strategy == "DTensor":
        return (DTensorTrainSpec,)
    return (TrainSpec, LoopTrainSpec)


def validate_train_spec(spec: object, *, strategy: str, framework: str) -> None:
    """Reject what ``build`` returned when it cannot run under the strategy (pure)."""
    expected = expected_specs(strategy, framework)
    if not isinstance(spec, expected):
        names = " or ".join(f"trainjob.runtime.{cls.__name__}" for cls in expected)
        raise ConfigError(
            f"the entrypoint returned {type(spec).__name__}; framework {framework} with "
            f"strategy {strategy} expects {names}"
        )
    if isinstance(spec, LoopTrainSpec):
        validate_loop_spec(spec)
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


def validate_steps_per_epoch(spec: TrainSpec, *, strategy: str, num_workers: int) -> None:
    """``steps_per_epoch=None`` (one pass over a finite dataset) where ``fit`` can count (pure).

    Several MultiWorkerMirrored workers cannot: each reads its own shard, the shards' lengths
    may differ by a batch, and a worker that runs out first leaves the others blocked in a
    collective, which is why tf-keras refuses distributed datasets without a step count.
    """
    if spec.steps_per_epoch is None and strategy == "MultiWorkerMirrored" and num_workers > 1:
        raise ConfigError(
            "TrainSpec.steps_per_epoch is required under MultiWorkerMirrored with "
            f"{num_workers} workers (each worker reads its own shard; fit must know how many "
            "steps make an epoch): set it and repeat() the dataset"
        )


def validate_loop_spec(spec: LoopTrainSpec) -> None:
    """The numbers and names of a custom loop that can never work (pure)."""
    for name in ("state_fn", "dataset_fn", "step_fn"):
        if not callable(getattr(spec, name)):
            raise ConfigError(f"LoopTrainSpec.{name} must be callable")
    for name in ("steps_per_epoch", "epochs", "max_to_keep"):
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"LoopTrainSpec.{name} must be an integer >= 1, got {value!r}")
    every = spec.checkpoint_every_steps
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise ConfigError(
            f"LoopTrainSpec.checkpoint_every_steps must be None or an integer >= 1, got {every!r}"
        )
    if spec.reduction not in REDUCTIONS:
        raise ConfigError(
            f"LoopTrainSpec.reduction must be one of {REDUCTIONS}, got {spec.reduction!r}"
        )


def validate_loop_state(state: object) -> dict[str, Any]:
    """What ``LoopTrainSpec.state_fn`` returned, as checkpoint entries (pure)."""
    if not isinstance(state, Mapping) or not state:
        raise ConfigError(
            "LoopTrainSpec.state_fn must return a non-empty mapping of name -> trackable "
            f"(model, optimizer, ...), got {type(state).__name__}"
        )
    for key in state:
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            raise ConfigError(
                f"LoopTrainSpec.state_fn returned the key {key!r}; keys must be identifiers "
                "not starting with '_'"
            )
        if key == LOOP_STEP_KEY:
            raise ConfigError(
                f"LoopTrainSpec.state_fn returned the key {LOOP_STEP_KEY!r}, which the runtime "
                "uses for its step counter; rename it"
            )
    return dict(state)
