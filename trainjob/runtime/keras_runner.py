"""Run a Keras :class:`~trainjob.runtime.contract.TrainSpec` under its strategy (tf-keras).

Multi-worker ``Model.fit`` needs tf-keras (``TF_USE_LEGACY_KERAS=1``, set by the entry before
TensorFlow is imported): Keras 3's fit fails under MultiWorkerMirrored and ParameterServer.
The callbacks the runtime adds are :mod:`trainjob.runtime.callbacks`; when to stop at a
NaN/Inf loss is :mod:`trainjob.runtime.losscheck`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from trainjob.runtime import contract, layout, loop_runner, progress
from trainjob.runtime import settings as settings_mod
from trainjob.runtime import strategy as strategy_mod
from trainjob.runtime.exitcodes import ConfigError
from trainjob.runtime.losscheck import loss_check_for
from trainjob.runtime.preemption import StopRequest, StopWatcher
from trainjob.runtime.settings import RuntimeSettings


def make_context(
    settings: RuntimeSettings, strategy_name: str, replicas: int, checkpoint_dir: str
) -> contract.TrainContext:
    return contract.TrainContext(
        config=settings.config,
        strategy=strategy_name,
        framework=settings.framework,
        task_type=settings.task_type,
        task_index=settings.task_index,
        is_chief=settings.is_chief,
        num_workers=settings.num_workers,
        num_replicas_in_sync=replicas,
        checkpoint_dir=checkpoint_dir,
        data_dir=settings.data_dir,
    )


def counting_dataset_fn(tf: Any, dataset_fn: Callable[[Any], Any], counter: Any) -> Any:
    """``dataset_fn`` whose batches add their size to ``counter`` as the input reads them.

    examples/s is measured from the data, whatever batch size the user's dataset has. Each
    worker counts its own input pipeline and scales by the number of pipelines (all-reduce
    workers run in step, one batch each per step), so the chief reports the job's rate.
    """

    def wrapped(input_context: Any) -> Any:
        pipelines = int(input_context.num_input_pipelines)

        def count(*element: Any) -> Any:
            first = tf.nest.flatten(element)[0]
            counter.assign_add(tf.cast(tf.shape(first)[0], tf.int64) * pipelines)
            return element if len(element) > 1 else element[0]

        return dataset_fn(input_context).map(count)

    return wrapped


def finite_steps(tf: Any, dataset_fn: Any, replicas: int, strategy_name: str) -> int:
    """Steps of one pass over this worker's dataset, for ``steps_per_epoch=None``.

    tf-keras refuses a distributed dataset without a step count, even a finite one; with one
    input pipeline the dataset's own length (its cardinality) is that count.
    """
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=replicas
    )
    steps = int(dataset_fn(context).cardinality())
    if steps <= 0:
        reason = "infinite" if steps == -1 else "unknown" if steps == -2 else "empty"
        raise ConfigError(
            f"TrainSpec.steps_per_epoch is None but the dataset's length is {reason} under "
            f"{strategy_name}: set steps_per_epoch (and repeat() the dataset), or return a "
            "finite dataset whose length tf.data knows"
        )
    return steps


def run(
    tf: Any,
    settings: RuntimeSettings,
    build: Any,
    emitter: progress.Emitter,
    checkpoint_dir: str,
    watcher: StopWatcher,
) -> dict[str, Any]:
    """Train; return the fields of the ``end`` event."""
    # Subclasses of tf.keras' callbacks: importable only now that TensorFlow is.
    from trainjob.runtime import callbacks as runtime_callbacks

    num_gpus, has_tpu = strategy_mod.detect_devices(tf)
    name = settings_mod.resolve_strategy(
        settings.strategy, settings.cluster, num_gpus=num_gpus, has_tpu=has_tpu
    )
    strategy = strategy_mod.build(tf, name, settings.config, env=os.environ, local_gpus=num_gpus)
    is_ps = name == settings_mod.PARAMETER_SERVER
    ctx = make_context(
        settings, name, 1 if is_ps else strategy.num_replicas_in_sync, checkpoint_dir
    )
    spec = build(ctx)
    contract.validate_train_spec(spec, strategy=name, framework=settings.framework)
    if isinstance(spec, contract.LoopTrainSpec):
        return loop_runner.run(
            tf,
            settings,
            spec,
            emitter,
            checkpoint_dir,
            watcher,
            strategy=strategy,
            strategy_name=name,
        )
    assert isinstance(spec, contract.TrainSpec)
    contract.validate_steps_per_epoch(spec, strategy=name, num_workers=settings.num_workers)
    steps_per_epoch, dataset_fn = spec.steps_per_epoch, spec.dataset_fn
    if steps_per_epoch is None and name not in (
        settings_mod.DEFAULT,
        settings_mod.PARAMETER_SERVER,
    ):
        steps_per_epoch = finite_steps(tf, spec.dataset_fn, strategy.num_replicas_in_sync, name)

        def dataset_fn(input_context: Any) -> Any:
            # fit keeps one iterator over all epochs once it has a step count: one pass each.
            return spec.dataset_fn(input_context).repeat()

    with strategy.scope():
        model = spec.model_fn()
    examples_seen: Callable[[], int] | None = None
    if is_ps:
        # The datasets live on the workers: examples/s is estimated from config.batch_size.
        data = tf.keras.utils.experimental.DatasetCreator(spec.dataset_fn)
    else:
        # Where the input pipeline runs (tf.data runs on the host): created without a device
        # it would land on GPU:0, a cross-device update per batch from the pipeline.
        with tf.device("/cpu:0"):
            counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="trainjob_examples")
        data = strategy.distribute_datasets_from_function(
            counting_dataset_fn(tf, dataset_fn, counter)
        )

        def examples_seen() -> int:
            return int(counter.numpy())

    backup = layout.backup_dir(checkpoint_dir)
    every = int(settings.config.get("progress_every_steps", 100))
    stop = StopRequest()
    agreed_stop = name == settings_mod.MULTI_WORKER_MIRRORED and settings.num_workers > 1
    callbacks: list[Any] = [
        runtime_callbacks.BackupCallback(
            backup, spec.save_freq, emitter=emitter, stop=stop if agreed_stop else None
        ),
        runtime_callbacks.ProgressCallback(
            emitter,
            stop,
            examples_per_step=ctx.global_batch_size,
            examples_seen=examples_seen,
            every_steps=every,
            save_freq=spec.save_freq,
            backup_dir=backup,
            single_writer=not agreed_stop,
            loss_check=loss_check_for(settings.config, parameter_server=is_ps, on_gpu=num_gpus > 0),
        ),
    ]
    # TF >= 2.21 no longer depends on the tensorboard package; log only where it is installed.
    if (
        settings.is_chief
        and settings.config.get("tensorboard", True)
        and importlib.util.find_spec("tensorboard")
    ):
        callbacks.append(
            runtime_callbacks.TensorBoardCallback(layout.tensorboard_dir(checkpoint_dir))
        )
    callbacks.extend(spec.callbacks)
    validation = spec.validation_fn() if spec.validation_fn and not is_ps else None

    with watcher.cooperative(stop):
        history = model.fit(
            data,
            epochs=spec.epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation,
            validation_steps=spec.validation_steps,
            callbacks=callbacks,
            verbose=0,
        )
    final = {k: v[-1] for k, v in history.history.items() if v}
    step = int(model.optimizer.iterations.numpy())
    exported = export(model, checkpoint_dir, settings, spec.export_format)
    return {"step": step, "logs": final, "export": exported}


def export(
    model: Any, checkpoint_dir: str, settings: RuntimeSettings, export_format: str
) -> str | None:
    """Chief writes the final model; others save to scratch (for collectives) and delete it."""
    if export_format == "none":
        return None
    path = layout.export_path(
        checkpoint_dir,
        is_chief=settings.is_chief,
        replica=settings.replica,
        export_format=export_format,
    )
    import tensorflow as tf  # imported already; gfile also writes a gs:// checkpoint dir

    gfile = tf.io.gfile
    if settings.is_chief and gfile.exists(path):
        # A restarted chief that had exported already: replace, never leave a half-mixed dir.
        gfile.rmtree(path) if gfile.isdir(path) else gfile.remove(path)
    gfile.makedirs(os.path.dirname(path) if export_format == "keras" else path)
    model.save(path)
    if settings.is_chief:
        return path
    with contextlib.suppress(tf.errors.OpError):
        gfile.rmtree(layout.scratch_dir(checkpoint_dir, settings.replica))
    return None


def serve(
    tf: Any, settings: RuntimeSettings, emitter: progress.Emitter, watcher: StopWatcher
) -> None:
    """A ps or worker task of a ParameterServer job: serve the coordinator until stopped."""
    # On SIGTERM stay up a little: the chief, stopped at the same time, backs up from the ps.
    watcher.exit_delay = float(settings.config.get("server_stop_delay_seconds", 3))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=settings.task_type,
        task_index=settings.task_index,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    emitter.emit("start", tf_version=tf.__version__)
    # Blocks in C++ until the process is stopped (the executor's job once the chief is done).
    server.join()
