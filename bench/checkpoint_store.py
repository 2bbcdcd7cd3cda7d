"""The cost of checkpoints on object storage: time per checkpoint and steps/s of the same job
with its checkpoints on a local directory (the baseline, as a volume), on ``s3://`` and on
``gs://``, in one run, and each store's ratio against the baseline (issue #48, item 5; the
anchor is CheckFreq's <= 3.5 % overhead, FAST '21).

    .venv/bin/python bench/checkpoint_store.py [--epochs 4] [--steps 20] [--ballast-mb 16]
        [--repeats 3] [--model mlp|cnn] [--json out.json] [--write-results bench/RESULTS.md]

The job is the training tier's object-storage job: the runtime's 2-worker MultiWorkerMirrored
``fit`` (``python -m trainjob.runtime train``, as ``bench/runtime_overhead.py`` launches it) of
the MNIST sample, whose model carries ``--ballast-mb`` MiB of non-trainable weight: it is in
every checkpoint but in no gradient or all-reduce, so the checkpoint has a realistic size while
the steps stay as fast as the sample's. BackupAndRestore checkpoints at every epoch end. The
stores are the tests' real servers (tests/controlplane/objectstore.py, built by
tests/controlplane/install.sh): versitygw's S3 API over a directory (the runtime stages each
checkpoint locally and uploads it, marker last) and fake-gcs-server behind its TLS proxy
(TensorFlow's own GCS filesystem writes there). All three on this machine's loopback: a real
cloud store adds its network's latency and bandwidth, which this does not measure.

Runs are interleaved (round r runs the targets in an order rotated by r) to spread machine
noise. From the chief's progress events:

* **time per checkpoint**: from the step event of an epoch's last step to that epoch's
  ``checkpoint`` event, which the chief writes once the checkpoint is stored (on ``s3://`` after
  the upload and its marker). It also holds the epoch-end work every target shares (the epoch's
  metrics, the progress event), which the baseline's figure shows.
* **steps/s**: between the end of the first epoch (warm-up, tracing) and the end of the last,
  as in bench/runtime_overhead.py: every interval holds one checkpoint, so this is the rate a
  user sees with a checkpoint every ``--steps`` steps.

Ratios are store / baseline (time per checkpoint: above 1 costs more; steps/s: below 1 costs
more), and the overhead is 1 - steps/s ratio. The checkpoint size is the bytes of the model's
and optimizer's variables (what BackupAndRestore saves), as the chief counts them at the end.
Not a timed test: run it by hand; tests/training/test_bench_checkpoint_store_smoke.py runs it at
its smallest size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import report_sections  # noqa: E402 - after the sys.path line above

TARGETS: Final = ("local", "s3", "gs")
BASELINE: Final = "local"
BEGIN: Final = "<!-- checkpoint-store:begin -->"
END: Final = "<!-- checkpoint-store:end -->"
ENTRYPOINT: Final = "checkpoint_store:build"  # this file, imported by the replicas


# --------------------------------------------------------------------------- the replicas' side


def build(ctx: Any) -> Any:
    """The replicas' entrypoint: the MNIST sample with ``ballast_mb`` MiB of non-trainable
    weight (as the training tier's storage_entrypoints.with_ballast), and a callback by which
    the chief writes the checkpoint's size (its variables' bytes) to ``size_file``."""
    import tensorflow as tf

    from trainjob import runtime
    from trainjob.samples import mnist

    spec = mnist.build(ctx)
    floats = ctx.get_int("ballast_mb", 0) * 1024 * 1024 // 4
    size_file = str(ctx.config.get("size_file", ""))

    class Ballast(tf.keras.layers.Layer):  # type: ignore[misc]
        def build(self, input_shape: Any) -> None:
            self.ballast = self.add_weight(
                name="ballast", shape=(floats,), initializer="ones", trainable=False
            )

        def call(self, inputs: Any) -> Any:
            return inputs

    def model_fn() -> Any:
        model = mnist.make_model(tf, str(ctx.config.get("model", "mlp")), 0.001)
        if not floats:
            return model
        ballasted = tf.keras.Model(model.input, Ballast()(model.output))
        ballasted.compile(
            optimizer=tf.keras.optimizers.Adam(0.001),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return ballasted

    class CheckpointSize(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_end(self, logs: Any = None) -> None:
            if not (ctx.is_chief and size_file):
                return
            slots = self.model.optimizer.variables
            variables = [*self.model.weights, *(slots() if callable(slots) else slots)]
            size = sum(int(v.numpy().nbytes) for v in variables)
            Path(size_file).write_text(str(size), encoding="utf-8")

    return runtime.TrainSpec(
        model_fn=model_fn,
        dataset_fn=spec.dataset_fn,
        epochs=spec.epochs,
        steps_per_epoch=spec.steps_per_epoch,
        save_freq="epoch",
        export_format="none",
        callbacks=(CheckpointSize(),),
    )


# --------------------------------------------------------------------------- figures (pure)


@dataclass(frozen=True)
class RunFigures:
    """One run of the job on one target, from its chief's progress events."""

    target: str
    checkpoint_s: tuple[float, ...]  # each epoch's: last step -> checkpoint stored
    steps_per_sec: float
    checkpoint_bytes: int | None
    # gs:// only: the HTTP requests TensorFlow sent the store in the whole run (its proxy counts)
    store_requests: int | None = None


def figures_from_events(target: str, events: Sequence[Mapping[str, Any]]) -> RunFigures:
    """Time per checkpoint and steps/s from one run's events (the chief's only)."""
    chief = [e for e in events if e.get("chief")]
    last_step: dict[int, float] = {}
    stored: dict[int, float] = {}
    ends: list[tuple[float, int]] = []
    for event in chief:
        kind = event["event"]
        if kind == "step":
            last_step[int(event["epoch"])] = float(event["time"])  # the epoch's latest
        elif kind == "checkpoint":
            stored.setdefault(int(event["epoch"]), float(event["time"]))
        elif kind == "epoch":
            ends.append((float(event["time"]), int(event["step"])))
    epochs = sorted(set(last_step) & set(stored))
    if not epochs or len(ends) < 2:
        raise ValueError(
            f"{target}: the run left {len(epochs)} timed checkpoints and {len(ends)} epoch "
            "ends (needs 1 and 2): run at least 2 epochs"
        )
    (t0, s0), (t1, s1) = ends[0], ends[-1]
    return RunFigures(
        target=target,
        checkpoint_s=tuple(stored[e] - last_step[e] for e in epochs),
        steps_per_sec=(s1 - s0) / (t1 - t0),
        checkpoint_bytes=None,
    )


@dataclass(frozen=True)
class TargetSummary:
    target: str
    runs: int
    checkpoints: int
    checkpoint_s_median: float
    checkpoint_s_max: float
    steps_per_sec_median: float
    steps_per_sec_runs: tuple[float, ...]
    # store / baseline (None for the baseline itself)
    checkpoint_ratio: float | None
    steps_per_sec_ratio: float | None
    overhead: float | None  # 1 - steps_per_sec_ratio


def summarize(runs: Sequence[RunFigures]) -> list[TargetSummary]:
    """Medians per target, and each store's ratios against the baseline's medians."""
    by_target = {t: [r for r in runs if r.target == t] for t in TARGETS}
    missing = [t for t, rs in by_target.items() if not rs]
    if missing:
        raise ValueError(f"no runs for {', '.join(missing)}")

    def medians(target: str) -> tuple[float, float, float, tuple[float, ...], int]:
        times = [t for r in by_target[target] for t in r.checkpoint_s]
        rates = tuple(r.steps_per_sec for r in by_target[target])
        return statistics.median(times), max(times), statistics.median(rates), rates, len(times)

    base_ckpt, _, base_rate, _, _ = medians(BASELINE)
    summaries = []
    for target in TARGETS:
        ckpt, ckpt_max, rate, rates, count = medians(target)
        baseline = target == BASELINE
        summaries.append(
            TargetSummary(
                target=target,
                runs=len(by_target[target]),
                checkpoints=count,
                checkpoint_s_median=ckpt,
                checkpoint_s_max=ckpt_max,
                steps_per_sec_median=rate,
                steps_per_sec_runs=rates,
                checkpoint_ratio=None if baseline else ckpt / base_ckpt,
                steps_per_sec_ratio=None if baseline else rate / base_rate,
                overhead=None if baseline else 1 - rate / base_rate,
            )
        )
    return summaries


def rotated(targets: Sequence[str], round_index: int) -> list[str]:
    """Round r's order: the targets rotated by r (each takes each position in turn)."""
    shift = round_index % len(targets)
    return [*targets[shift:], *targets[:shift]]


LABELS: Final = {
    "local": "local directory (baseline)",
    "s3": "s3:// (versitygw)",
    "gs": "gs:// (fake-gcs-server)",
}


def render_table(summaries: Sequence[TargetSummary]) -> str:
    rows = [
        "| checkpoints on | time per checkpoint, median (max) | ratio | steps/s, median "
        "(runs) | ratio | overhead |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        runs = ", ".join(f"{r:.1f}" for r in s.steps_per_sec_runs)
        ckpt_ratio = "1 (baseline)" if s.checkpoint_ratio is None else f"{s.checkpoint_ratio:.2f}x"
        rate_ratio = (
            "1 (baseline)" if s.steps_per_sec_ratio is None else f"{s.steps_per_sec_ratio:.3f}"
        )
        overhead = "-" if s.overhead is None else f"{s.overhead * 100:.1f} %"
        rows.append(
            f"| {LABELS[s.target]} | {s.checkpoint_s_median * 1000:.0f} ms "
            f"({s.checkpoint_s_max * 1000:.0f} ms) | {ckpt_ratio} | {s.steps_per_sec_median:.2f}"
            f" ({runs}) | {rate_ratio} | {overhead} |"
        )
    return "\n".join(rows)


def describe(settings: Mapping[str, Any], checkpoint_bytes: int | None) -> str:
    size = "unknown" if checkpoint_bytes is None else f"{checkpoint_bytes / 2**20:.1f} MiB"
    return (
        f"2-worker MultiWorkerMirrored `fit`, model {settings['model']} + "
        f"{settings['ballast_mb']} MiB ballast (checkpoint {size}), {settings['epochs']} epochs x "
        f"{settings['steps']} steps (a checkpoint every {settings['steps']} steps), global batch "
        f"{settings['batch_size']}, {settings['repeats']} interleaved runs per target"
    )


# --------------------------------------------------------------------------- running


def _stores(stack: ExitStack, workdir: Path) -> Iterator[tuple[str, Any]]:
    from tests.controlplane import objectstore

    yield "s3", stack.enter_context(objectstore.s3_server(workdir / "s3"))
    yield "gs", stack.enter_context(objectstore.fake_gcs(workdir / "gcs"))


def run_once(
    target: str,
    server: Any,
    config: dict[str, Any],
    workdir: Path,
    name: str,
) -> RunFigures:
    """One 2-worker run with its checkpoints on ``target``; its chief's figures."""
    from bench import runtime_overhead  # the launcher runtime_overhead.py and gpu_check.py use

    run_dir = workdir / name
    run_dir.mkdir(parents=True)
    size_file = run_dir / "checkpoint-bytes"
    extra = {
        "TRAINJOB_ENTRYPOINT": ENTRYPOINT,
        "TRAINJOB_STRATEGY": "MultiWorkerMirrored",
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{BENCH_DIR}",
        "TRAINJOB_CONFIG": json.dumps({**config, "size_file": str(size_file)}),
    }
    if target == "s3":
        bucket = server.make_bucket(name)
        extra.update(server.env(), TRAINJOB_CHECKPOINT_DIR=f"s3://{bucket}/job")
    elif target == "gs":
        bucket = server.make_bucket(name)
        extra.update(server.env(), TRAINJOB_CHECKPOINT_DIR=f"gs://{bucket}/job")
    # local: runtime_overhead's own <workdir>/ckpt, a directory on this machine's disk.
    requests_before = len(server.proxy.requests) if target == "gs" else 0
    runtime_overhead._launch(
        ["-m", "trainjob.runtime", "train"],
        config,
        run_dir,
        2,
        worker_env=[extra, extra],
        log_dir=run_dir / "logs",
    )
    events = [json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines()]
    figures = figures_from_events(target, events)
    size = int(size_file.read_text()) if size_file.exists() else None
    requests = len(server.proxy.requests) - requests_before if target == "gs" else None
    return RunFigures(target, figures.checkpoint_s, figures.steps_per_sec, size, requests)


def machine_info() -> dict[str, str]:
    import contextlib

    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), cpu)
    tf_version = "unknown"
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        tf_version = version("tensorflow")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu}, {os.cpu_count()} logical cores",
        "kernel": platform.release(),
        "load average at start (1/5/15 min)": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "tensorflow": tf_version,
    }


def render_section(
    command: str, machine: Mapping[str, str], settings: Mapping[str, Any], result: Mapping[str, Any]
) -> str:
    summaries = [TargetSummary(**s) for s in result["targets"]]
    stores = [s for s in summaries if s.target != BASELINE]
    worst = max(stores, key=lambda s: s.overhead or 0.0)
    requests = [r["store_requests"] for r in result["runs"] if r.get("store_requests")]
    gs_note = (
        f"On gs:// TensorFlow's GCS filesystem sent {statistics.median(requests):.0f} HTTP "
        f"requests per run ({settings['epochs']} checkpoints of the chief and of the other "
        "worker's scratch copy, the TensorBoard logs, the start-up checks), each through a TLS "
        "tunnel of its own to the tests' Python proxy (TensorFlow's GCS endpoint cannot be "
        "changed): the number of requests is TensorFlow's, their latency is the test bed's."
        if requests
        else ""
    )
    return f"""{BEGIN}
## Checkpoints on object storage: a local directory vs s3:// vs gs://

`{command}` (bench/checkpoint_store.py; method in its docstring). The same job, in one run,
runs interleaved with its checkpoints on a local directory (the baseline, as a volume), on
versitygw's S3 API (the runtime stages each checkpoint and uploads it, marker last) and on
fake-gcs-server (TensorFlow's own GCS filesystem), both real servers on this machine's loopback:
no cloud network's latency or bandwidth is in these figures. Time per checkpoint: from the
epoch's last step to the checkpoint stored (the chief's events); steps/s: first epoch end to
last, one checkpoint in every interval. Ratios are store / baseline; overhead is 1 - the steps/s
ratio (CheckFreq's anchor: <= 3.5 %). {describe(settings, result.get("checkpoint_bytes"))}.
machine: {"; ".join(f"{k} {v}" for k, v in machine.items())}

{render_table(summaries)}

Largest overhead: {worst.target}, {(worst.overhead or 0.0) * 100:.1f} % with a checkpoint every
{settings["steps"]} steps; the overhead scales with how often a job checkpoints. {gs_note}
{END}"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4, help="at least 2 (the first is warm-up)")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (per checkpoint)")
    parser.add_argument("--ballast-mb", type=int, default=16)
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per target, interleaved")
    parser.add_argument("--data-dir", type=Path, help="prepared MNIST (else prepared here)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--workdir", type=Path, help="keep the runs' logs here (else a temp dir)")
    parser.add_argument("--write-results", type=Path, help="replace its section in this file")
    args = parser.parse_args(argv)
    if args.epochs < 2 or args.steps < 1 or args.repeats < 1 or args.ballast_mb < 0:
        parser.error("--epochs must be >= 2, --steps and --repeats >= 1, --ballast-mb >= 0")
    from bench import runtime_overhead

    machine = machine_info()
    print("machine: " + "; ".join(f"{k} {v}" for k, v in machine.items()), flush=True)
    settings = {
        "epochs": args.epochs,
        "steps": args.steps,
        "ballast_mb": args.ballast_mb,
        "model": args.model,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
    }
    with ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ckpt-bench-")))
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        data_dir = args.data_dir
        if data_dir is None:
            data_dir = workdir / "data"
            runtime_overhead.prepare_mnist(data_dir)
        config = runtime_overhead.bench_config(
            epochs=args.epochs,
            steps=args.steps,
            model=args.model,
            data_dir=data_dir,
            batch_size=args.batch_size,
        )
        # One step event per epoch, at its last step: no extra host syncs inside an epoch.
        config.update(ballast_mb=args.ballast_mb, progress_every_steps=args.steps)
        servers: dict[str, Any] = {"local": None, **dict(_stores(stack, workdir))}
        runs: list[RunFigures] = []
        for round_index in range(args.repeats):
            for target in rotated(TARGETS, round_index):
                run = run_once(target, servers[target], config, workdir, f"r{round_index}-{target}")
                runs.append(run)
                print(
                    f"round {round_index + 1}/{args.repeats} {target}: "
                    f"{run.steps_per_sec:.2f} steps/s, checkpoints "
                    f"{', '.join(f'{t * 1000:.0f}' for t in run.checkpoint_s)} ms"
                    + (f", {run.store_requests} requests" if run.store_requests else ""),
                    flush=True,
                )
    summaries = summarize(runs)
    sizes = [r.checkpoint_bytes for r in runs if r.checkpoint_bytes is not None]
    checkpoint_bytes = max(sizes) if sizes else None
    print(describe(settings, checkpoint_bytes))
    print(render_table(summaries))
    result = {
        "machine": machine,
        "settings": settings,
        "checkpoint_bytes": checkpoint_bytes,
        "targets": [asdict(s) for s in summaries],
        "runs": [asdict(r) for r in runs],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    if args.write_results:
        command = report_sections.shown_command(
            "bench/checkpoint_store.py",
            argv if argv is not None else sys.argv[1:],
            ("--json", "--data-dir", "--workdir"),
        )
        report_sections.write_section(
            args.write_results, render_section(command, machine, settings, result), BEGIN, END
        )


if __name__ == "__main__":
    main()
