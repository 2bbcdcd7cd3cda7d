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
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.support import ports  # noqa: E402 - after the sys.path line above

PLAIN = "--plain-replica"


def _env(config: dict[str, Any], workdir: Path, index: int, cluster: list[str]) -> dict[str, str]:
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
    return env


def _launch(args: list[str], config: dict[str, Any], workdir: Path, workers: int) -> None:
    cluster = [f"127.0.0.1:{ports.free_port()}" for _ in range(workers)] if workers > 1 else []
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            env=_env(config, workdir, i, cluster),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(workers)
    ]
    codes = [p.wait(timeout=900) for p in procs]
    if any(codes):
        raise SystemExit(f"{args} failed with {codes}; rerun by hand to see its log")


def _steps_per_sec(epoch_ends: list[tuple[float, int]]) -> float:
    """(time, global step) at each epoch end -> steps/s after the first (warm-up) epoch."""
    (t0, s0), (t1, s1) = epoch_ends[0], epoch_ends[-1]
    return (s1 - s0) / (t1 - t0)


def measure_runtime(config: dict[str, Any], workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        _launch(["-m", "trainjob.runtime", "train"], config, workdir, workers)
        events = [
            json.loads(line) for line in (workdir / "progress.jsonl").read_text().splitlines()
        ]
        ends = [(e["time"], e["step"]) for e in events if e["event"] == "epoch" and e["chief"]]
        return _steps_per_sec(ends)


def measure_plain(config: dict[str, Any], workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        _launch([__file__, PLAIN], config, workdir, workers)
        ends = json.loads((workdir / "plain.json").read_text())
        return _steps_per_sec([tuple(e) for e in ends])


def plain_replica() -> None:
    """The baseline: the same build(), plain tf.distribute + Model.fit, no trainjob runtime."""
    import tensorflow as tf

    from trainjob.runtime.contract import TrainContext
    from trainjob.samples import mnist

    config = json.loads(os.environ["TRAINJOB_CONFIG"])
    multi = "TF_CONFIG" in os.environ
    strategy = (
        tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.get_strategy()
    )
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

    class EpochTimes(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            ends.append((time.time(), int(self.model.optimizer.iterations.numpy())))

    model.fit(
        data,
        epochs=spec.epochs,
        steps_per_epoch=spec.steps_per_epoch,
        callbacks=[EpochTimes()],
        verbose=0,
    )
    if task["index"] == 0:
        out = Path(os.environ["TRAINJOB_CHECKPOINT_DIR"]).parent / "plain.json"
        out.write_text(json.dumps(ends))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1, choices=[1, 2])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="trainjob-bench-data-"))
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
    config = {
        "epochs": args.epochs,
        "steps_per_epoch": args.steps,
        "batch_size": 64,
        "model": args.model,
        "data_dir": str(data_dir),
        "export_format": "none",
        "progress_every_steps": 100,
    }
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
