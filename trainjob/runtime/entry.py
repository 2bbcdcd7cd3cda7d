"""``trainjob train`` and ``trainjob data``: the process edge of the runtime.

``train_main`` reads the env the executors set, imports TensorFlow (only here, lazily), runs the
replica's role and turns whatever happened into an exit code (see
:mod:`trainjob.runtime.exitcodes`). ``python -m trainjob.runtime train|data ...`` reaches the same
functions without the ``trainjob`` CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from trainjob.core import constants, storage
from trainjob.core import progress as core_progress
from trainjob.runtime import data, devices, exitcodes, progress, reporter, summaries
from trainjob.runtime import settings as settings_mod
from trainjob.runtime.exitcodes import EntrypointError, FailureKind
from trainjob.runtime.preemption import StopWatcher
from trainjob.runtime.settings import RuntimeSettings

log = logging.getLogger("trainjob.runtime")

TFDS_DATA_DIR = "TFDS_DATA_DIR"


def prepare_process_env(env: MutableMapping[str, str], settings: RuntimeSettings) -> None:
    """Env that must be in place before TensorFlow is imported (setdefault: users may override)."""
    if settings.framework == settings_mod.KERAS:
        # Keras 3 fit fails under multi-worker strategies; tf-keras is what `tf.keras` must be.
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if settings.checkpoint_dir and settings.checkpoint_dir.startswith(f"{storage.GS}://"):
        from trainjob.runtime import objectstore

        key = objectstore.google_credentials(env)
        if key is not None:
            # The job's credentials Secret; else TensorFlow's application default credentials
            # (GOOGLE_APPLICATION_CREDENTIALS, gcloud's file, Workload Identity's metadata).
            env.setdefault("GOOGLE_APPLICATION_CREDENTIALS", key)
    if settings.data_dir:
        # tensorflow-datasets reads it when imported: an unchanged tfds.load("mnist") of the
        # tutorials then finds the offline data the image or `trainjob run` prepared.
        env.setdefault(TFDS_DATA_DIR, settings.data_dir)
    if settings.cluster.get(constants.PS):
        # Lets the coordinator see a lost worker/ps as an error instead of retrying forever.
        env.setdefault("GRPC_FAIL_FAST", "use_caller")
    if devices.memory_growth(settings.config, env):
        # TF reads it when it creates its GPU devices: set before anything touches a GPU.
        env.setdefault(devices.TF_FORCE_GPU_ALLOW_GROWTH, "true")


def load_entrypoint(entrypoint: str) -> Callable[..., Any]:
    module_name, _, attr_path = entrypoint.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise EntrypointError(f"cannot import {module_name!r} from {entrypoint!r}: {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise EntrypointError(f"{module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise EntrypointError(f"{entrypoint!r} is not callable")
    return target  # type: ignore[no-any-return]


def _role(settings: RuntimeSettings) -> str:
    return settings_mod.task_role(
        settings_mod.PARAMETER_SERVER if settings.cluster.get(constants.PS) else settings.strategy,
        settings.task_type,
    )


def open_checkpoint_store(
    settings: RuntimeSettings, env: Mapping[str, str]
) -> tuple[RuntimeSettings, Any]:
    """A checkpoint dir on ``s3://``: restore its newest complete checkpoint into a local
    staging dir, which the replica then trains against (see trainjob.runtime.objectstore);
    returns the settings with that dir and the mirror (``None`` for any other location)."""
    path = settings.checkpoint_dir
    if not path or not storage.is_url(path):
        return settings, None
    try:
        url = storage.parse(path)
    except storage.InvalidStoreURL as exc:
        raise exitcodes.ConfigError(f"{constants.ENV_CHECKPOINT_DIR}: {exc}") from None
    if url.scheme != storage.S3:
        return settings, None  # TensorFlow's own filesystem (gs://): checked once it is imported
    refused = storage.framework_problem(path, settings.framework)
    if refused is not None:  # the spec's validation says it first; a hand-made env lands here
        raise exitcodes.ConfigError(f"{constants.ENV_CHECKPOINT_DIR}: {refused}")
    if _role(settings) == settings_mod.ROLE_SERVE:
        # ps tasks (and a ParameterServer job's workers) hold no checkpoint of their own.
        return dataclasses.replace(settings, checkpoint_dir=None), None
    from trainjob.runtime import objectstore

    mirror = objectstore.open_mirror(url, env, writer=settings.is_chief)
    return dataclasses.replace(settings, checkpoint_dir=mirror.staging), mirror


def _run(
    settings: RuntimeSettings, emitter: progress.Emitter, watcher: StopWatcher
) -> dict[str, Any]:
    import tensorflow as tf  # lazily: the CLI and the core never pay for it

    from trainjob.runtime import strategy as strategy_mod

    # Before any runner: a replica given GPUs that would train on its CPU stops here, and the
    # start event (whoever writes it) says which devices training uses.
    seen = strategy_mod.check_gpus(tf, os.environ, settings.config)
    emitter.start_fields["devices"] = seen.event_fields()
    checkpoint_dir = settings.checkpoint_dir or tempfile.mkdtemp(prefix="trainjob-")
    role = _role(settings)
    if storage.is_url(checkpoint_dir) and role != settings_mod.ROLE_SERVE:
        from trainjob.runtime import objectstore

        objectstore.check_tensorflow_location(
            tf, checkpoint_dir, writer=settings.is_chief, replica=settings.replica
        )
    if settings.framework == settings_mod.ESTIMATOR:
        from trainjob.runtime import estimator_runner

        return estimator_runner.run(
            tf, settings, load_entrypoint(settings.entrypoint), emitter, checkpoint_dir
        )
    if settings.strategy == settings_mod.DTENSOR:
        from trainjob.runtime import dtensor_runner

        return dtensor_runner.run(
            tf, settings, load_entrypoint(settings.entrypoint), emitter, checkpoint_dir
        )
    from trainjob.runtime import keras_runner

    if role == settings_mod.ROLE_SERVE:
        keras_runner.serve(tf, settings, emitter, watcher)
        return {}
    if role == settings_mod.ROLE_EVALUATE:
        raise exitcodes.UnsupportedError(
            "evaluator tasks run only with framework Estimator; for Keras, give TrainSpec a "
            "validation_fn instead of an evaluator replica"
        )
    return keras_runner.run(
        tf, settings, load_entrypoint(settings.entrypoint), emitter, checkpoint_dir, watcher
    )


def train_parser() -> argparse.ArgumentParser:
    """``trainjob train``'s command line (a function: the CLI reference is generated from it)."""
    parser = argparse.ArgumentParser(
        prog="trainjob train",
        description="Run one TrainJob replica from TF_CONFIG and TRAINJOB_* env vars.",
    )
    parser.add_argument("--entrypoint", help=f"overrides {constants.ENV_ENTRYPOINT}")
    parser.add_argument("--strategy", help=f"overrides {constants.ENV_STRATEGY}")
    parser.add_argument("--framework", help=f"overrides {constants.ENV_FRAMEWORK}")
    parser.add_argument("--config", help=f"overrides {constants.ENV_CONFIG} (JSON object)")
    return parser


def configure_logging() -> None:
    """The replica's log lines: before TensorFlow's import, whose logger adds a handler of
    its own (another format) when the root logger has none."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def train_main(argv: list[str]) -> int:
    """``trainjob train``: run this replica; return its exit code."""
    args = train_parser().parse_args(argv)
    configure_logging()

    env = dict(os.environ)
    for key, value in (
        (constants.ENV_ENTRYPOINT, args.entrypoint),
        (constants.ENV_STRATEGY, args.strategy),
        (constants.ENV_FRAMEWORK, args.framework),
        (constants.ENV_CONFIG, args.config),
    ):
        if value is not None:
            env[key] = value
    try:
        settings = settings_mod.from_env(env)
    except exitcodes.ConfigError as exc:
        log.error("Rejected the runtime configuration: %s", exc)
        reporter.write_termination_error(os.environ, exc)
        return exitcodes.exit_code(FailureKind.INVALID_CONFIG)

    try:
        settings, mirror = open_checkpoint_store(settings, os.environ)
    except (exitcodes.CheckpointStorageError, exitcodes.ConfigError) as exc:
        return _failed_before_start(settings, exc)
    prepare_process_env(os.environ, settings)
    emitter = progress.Emitter(
        replica=settings.replica,
        chief=settings.is_chief,
        progress_file=settings.progress_file,
        reporter=_reporter(settings, os.environ),
        summaries=_summaries(settings),
        # The other replicas say once, when they start, which devices they train on.
        announce=None if settings.is_chief else functools.partial(reporter.announce, os.environ),
    )
    if mirror is not None:
        emitter.publish = functools.partial(_publish, mirror)
    try:
        return _train(settings, emitter, mirror)
    finally:
        if mirror is not None:
            mirror.close()


def _publish(mirror: Any, fields: Mapping[str, Any]) -> str | None:
    """A checkpoint on disk: the chief uploads it; the event names it in the store."""
    step = fields.get("step")
    where: str | None = mirror.publish(step if isinstance(step, int) else None)
    return where if mirror.writer else mirror.remote(fields.get("checkpoint"))


def _failed_before_start(settings: RuntimeSettings, exc: BaseException) -> int:
    """The checkpoint store refused before training: one line, no traceback."""
    kind = exitcodes.classify_exception(exc, default=FailureKind.CHECKPOINT_STORAGE)
    code = exitcodes.exit_code(kind)
    line = reporter.exception_line(exc)
    log.error("Replica %s failed (%s, exit %d): %s", settings.replica, kind.value, code, line)
    print(line, file=sys.stderr, flush=True)  # local mode's summary quotes the last line
    reporter.write_termination_error(os.environ, exc)
    return code


def _train(settings: RuntimeSettings, emitter: progress.Emitter, mirror: Any) -> int:

    def _on_stop(code: int) -> None:
        emitter.emit("end", status=FailureKind.PREEMPTED.value, exit_code=code)

    watcher = StopWatcher(
        on_exit=_on_stop,
        grace_seconds=float(settings.config.get("preemption_grace_seconds", 20)),
    )
    # Before TensorFlow is imported: its threads must inherit the blocked SIGTERM.
    watcher.start()
    try:
        end = _run(settings, emitter, watcher)
        if mirror is not None:
            mirror.finish()
            end = {k: mirror.remote(v) if k == "export" else v for k, v in end.items()}
    except BaseException as exc:
        kind = exitcodes.classify_exception(exc, default=FailureKind.USER_CODE_ERROR)
        code = exitcodes.exit_code(kind)
        hint = data.offline_size_hint(str(exc))
        if hint is not None:
            exc.add_note(f"trainjob: {hint}")  # printed right under the error's own line
        verdict = kind in exitcodes.VERDICTS
        log.error(
            "Replica %s failed (%s, exit %d): %s",
            settings.replica,
            kind.value,
            code,
            # The runtime's verdict on the model is no bug to trace: its line says it all.
            reporter.exception_line(exc) if verdict else "".join(traceback.format_exception(exc)),
        )
        if verdict:
            # A plain last line, as a traceback ends: local mode's summary quotes it.
            print(reporter.exception_line(exc), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # stdout may be gone; the exit code still counts
            emitter.emit("end", status=kind.value, exit_code=code)
        if kind is not FailureKind.PREEMPTED:
            # After the final report: the error goes beside it in the termination message.
            reporter.write_termination_error(os.environ, exc)
        if kind is FailureKind.PREEMPTED and settings.cluster:
            # Measured under MultiWorkerMirrored: after an agreed preemption save, interpreter
            # shutdown blocked in TensorFlow's coordination service for good (every peer
            # stopping at once). The state is saved; end the process now.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    emitter.emit("end", status="succeeded", exit_code=0, **end)
    return 0


def _summaries(settings: RuntimeSettings) -> summaries.SummaryWriter | None:
    """The chief's TensorBoard scalars of its progress events (custom loops, DTensor and
    Estimator included), next to Keras' own logs on the checkpoint volume."""
    if not summaries.wanted(
        is_chief=settings.is_chief, checkpoint_dir=settings.checkpoint_dir, config=settings.config
    ):
        return None
    return summaries.SummaryWriter(summaries.logdir(settings.checkpoint_dir or ""))


def _reporter(
    settings: RuntimeSettings, env: Mapping[str, str]
) -> reporter.ProgressReporter | None:
    """The chief (worker 0 without a chief) reports the job's progress; totals come from the
    config until the runner learns them (Keras `fit` params, a loop's spec)."""
    if not settings.is_chief:
        return None
    epochs, total = core_progress.planned_totals(settings.config)
    per_epoch = settings.config.get("steps_per_epoch")
    tracker = reporter.Tracker(
        settings.replica,
        total_epochs=epochs,
        total_steps=total,
        steps_per_epoch=per_epoch if isinstance(per_epoch, int) and per_epoch > 0 else None,
    )
    return reporter.ProgressReporter(tracker, env)


def data_parser() -> argparse.ArgumentParser:
    """``trainjob data``'s command line (a function: the CLI reference is generated from it)."""
    parser = argparse.ArgumentParser(prog="trainjob data", description="Offline datasets.")
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="write a dataset in tfds format under --data-dir")
    prepare.add_argument("dataset", choices=["mnist"])
    prepare.add_argument(
        "--data-dir",
        required=True,
        help="tfds data_dir; afterwards tfds.load(name, data_dir=...) works",
    )
    return parser


def data_main(argv: list[str]) -> int:
    """``trainjob data prepare mnist --data-dir D``: write offline datasets for tfds."""
    args = data_parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        path = data.prepare_mnist(args.data_dir)
    except FileNotFoundError as exc:
        print(f"{constants.DATA_MESSAGE_PREFIX}{exc}", file=sys.stderr)
        return exitcodes.exit_code(FailureKind.INVALID_CONFIG)
    print(path)
    return 0
