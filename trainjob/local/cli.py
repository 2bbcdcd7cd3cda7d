"""`trainjob run`: parse the command line, read and validate the TrainJob, plan, then execute."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from trainjob.core import spec
from trainjob.local import display, executor, plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainjob run",
        description=(
            "Run a TrainJob on this machine: every replica is a process on 127.0.0.1 with the "
            "same TF_CONFIG, restart policy, backoff and deadlines as on Kubernetes."
        ),
    )
    parser.add_argument("-f", "--file", required=True, help="TrainJob YAML, or - for stdin")
    parser.add_argument(
        "--run-dir",
        help=f"checkpoints, logs and status (default: ./{plan.DEFAULT_RUNS_DIR}/<job name>); "
        "running again with the same directory resumes from its checkpoint",
    )
    parser.add_argument(
        "--data-dir",
        help="tfds data_dir given to replicas as TRAINJOB_DATA_DIR (default: $TRAINJOB_DATA_DIR, "
        "else ~/.cache/trainjob/datasets); the samples' offline MNIST is prepared there once",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the processes, ports and environment (TF_CONFIG included); start nothing",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="do not echo replica logs (still saved to files)"
    )
    parser.add_argument(
        "--no-tty",
        action="store_true",
        help="plain lines even on a terminal (no live table)",
    )
    return parser


def read_job(path: str, stdin: TextIO) -> spec.TrainJob:
    """The one TrainJob of a file (`-`: stdin); SystemExit with every problem otherwise."""
    try:
        if path == "-":
            text = stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as error:
        raise SystemExit(f"trainjob run: cannot read {path}: {error.strerror}") from error
    try:
        documents: list[Any] = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise SystemExit(f"trainjob run: {path} is not valid YAML: {error}") from error
    if len(documents) != 1:
        raise SystemExit(
            f"trainjob run: {path} must hold exactly one TrainJob, found {len(documents)} documents"
        )
    try:
        return spec.parse(documents[0])
    except spec.SpecError as error:
        lines = "\n".join(f"{path}: {problem}" for problem in error.problems)
        raise SystemExit(f"{lines}\ntrainjob run: {path} is not a valid TrainJob") from error


def run_main(argv: list[str], *, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    job = read_job(args.file, stdin or sys.stdin)
    environ = dict(os.environ)
    if job.run_policy.suspend:
        stream.write(f"TrainJob {job.name} has runPolicy.suspend: true; nothing to run\n")
        return 0
    cwd = os.getcwd()
    run_dir = args.run_dir or plan.default_run_dir(cwd, job.name)
    data_dir = os.path.abspath(args.data_dir or executor.default_data_dir(environ))
    ports = dict(zip(job.replica_keys(), executor.free_ports(len(job.replica_keys())), strict=True))
    try:
        run_plan = plan.make_plan(
            job,
            ports=ports,
            run_dir=run_dir,
            python=sys.executable,
            data_dir=data_dir,
            python_path=executor.package_root(),
        )
    except plan.PlanError as error:
        stream.write(f"trainjob run: {error}\n")
        return 2
    if args.dry_run:
        stream.write(plan.format_plan(run_plan))
        return 0
    tty = stream.isatty() and not args.no_tty and environ.get("TERM") != "dumb"
    runner = executor.Executor(
        run_plan, environ=environ, out=stream, tty=tty, show_logs=not args.quiet, cwd=cwd
    )
    summary = runner.run()
    stream.write(display.summary_text(summary))
    stream.flush()
    return display.exit_code_of(summary)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(list(sys.argv[1:] if argv is None else argv))
