"""`trainjob run`, `trainjob status` and `trainjob logs`: arguments, checks made before anything
starts, and wiring. `trainjob.cli` builds the command line from these parsers and calls these
handlers; what both share (errors, loading, dumping, streams) is in `trainjob.cliutil`."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.cliutil import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    Streams,
    dump,
    load_documents,
    parse_job,
    source_name,
)
from trainjob.console import outcome, view
from trainjob.core import spec
from trainjob.local import board, data, executor, gpus, plan, rundir, runs, supervisor, usernet
from trainjob.signals import stop_hint, stop_signals

RUN_DESCRIPTION: Final = """\
Run a TrainJob on this machine: every replica is a process on 127.0.0.1 with the same
TF_CONFIG, restart policy, backoff and deadlines as on Kubernetes. On a terminal a live table
shows each replica's state and progress; TensorFlow's routine messages are kept in the logs
(--verbose shows them). Ends with a summary; the exit code says how the job ended."""
RUN_EXAMPLES: Final = """\
  trainjob run -f examples/mnist-multiworker.yaml
  trainjob run -f job.yaml --run-dir /tmp/run1 --verbose
  trainjob run -f job.yaml --dry-run          # processes, ports and TF_CONFIG; starts nothing
  trainjob convert -f tfjob.yaml | trainjob run -f -"""
STATUS_DESCRIPTION: Final = """\
Show the state of local runs: without an argument every run under ./trainjob-runs, else the
run in RUN_DIR (a directory, or a job name under ./trainjob-runs). A run whose `trainjob run`
was killed without a chance to clean up is shown as such, not as Running."""
STATUS_EXAMPLES: Final = """\
  trainjob status
  trainjob status mnist-multiworker
  trainjob status /tmp/run1 -o json"""
LOGS_DESCRIPTION: Final = """\
Print the logs of a local run's replicas, prefixed with the replica name (all replicas, or
only REPLICA such as worker-0). Logs hold everything a replica printed, TensorFlow's messages
included. -f follows them until the run ends."""
LOGS_EXAMPLES: Final = """\
  trainjob logs                          # the only run under ./trainjob-runs
  trainjob logs mnist-multiworker worker-1
  trainjob logs /tmp/run1 -f"""
_REPLICA_NAME: Final = re.compile(r"^(chief|worker|ps|evaluator)-\d+$")


# ----- parsers -----
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > usernet.MAX_PORT:
        raise argparse.ArgumentTypeError(f"a TCP port is at most {usernet.MAX_PORT}, got {value}")
    return value


def _non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def add_run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "-f", "--file", action="append", required=True, metavar="FILE",
        help="the TrainJob's YAML file, or - for stdin",
    )  # fmt: skip
    parser.add_argument(
        "--run-dir",
        type=_non_empty,
        help=f"checkpoints, logs and status (default: ./{plan.DEFAULT_RUNS_DIR}/<job name>); "
        "running again with the same directory resumes from its checkpoint",
    )
    parser.add_argument(
        "--data-dir",
        type=_non_empty,
        help="tfds data_dir given to replicas as TRAINJOB_DATA_DIR (default: $TRAINJOB_DATA_DIR, "
        "else ~/.cache/trainjob/datasets); the samples' offline MNIST is prepared there once",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the processes, ports and environment (TF_CONFIG included); start nothing",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true",
        help="do not echo replica logs (still saved to files)",
    )  # fmt: skip
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="echo every replica line, TensorFlow's routine messages included",
    )  # fmt: skip
    parser.add_argument(
        "--no-tty", action="store_true", help="plain lines even on a terminal (no live table)"
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run a job that already Succeeded in this run dir again (it resumes from its last "
        "checkpoint and overwrites the exported model)",
    )
    parser.add_argument(
        "--host-network",
        action="store_true",
        help="run the replicas on this machine's network, as spec.networkIsolation: None does; "
        "their TensorFlow ports then listen on every interface. Default: a network of the "
        "run's own, which nothing outside reaches and which connects out through pasta",
    )
    parser.add_argument(
        "--expose-host-port",
        type=_port,
        action="append",
        default=[],
        metavar="PORT",
        help="let the replicas reach this machine's loopback on TCP PORT (e.g. 5000 for an "
        "MLflow server on 127.0.0.1:5000) at the same address, 127.0.0.1:PORT; repeatable. "
        "Default: none of this machine's loopback (needs pasta: Debian package passt)",
    )
    parser.add_argument(
        "--gpus",
        metavar="all|none|IDS",
        help="GPUs to share out round-robin over the processes that train (e.g. 0,1; default: "
        "$CUDA_VISIBLE_DEVICES, else every GPU the NVIDIA driver lists); a GPU shared by "
        "several processes gets memory growth; none: every process on the CPU",
    )
    parser.add_argument(
        "--ps-on-gpu",
        action="store_true",
        help="give parameter servers GPUs too (default: ps on the CPU)",
    )
    parser.add_argument(
        "--max-processes",
        type=_positive_int,
        metavar="N",
        help="refuse jobs with more replicas than this (default: "
        f"{plan.MAX_PROCESSES_PER_CORE} per CPU core, at least {plan.MIN_MAX_PROCESSES})",
    )
    return parser


def add_status_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run dir or job name")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), help="print status.json data")
    return parser


def add_logs_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "targets", nargs="*", metavar="[RUN_DIR] [REPLICA]",
        help="a run dir or job name, and a replica such as worker-0",
    )  # fmt: skip
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the run ends"
    )
    return parser


# ----- run -----
def _up_front_problems(job: spec.TrainJob, run_plan: plan.RunPlan, cwd: str) -> list[str]:
    """What this machine lacks to run the job, found before anything starts."""
    import importlib.util

    needs_runtime = any(plan.uses_runtime(job, rtype) for rtype in job.replica_specs)
    modules = {
        name
        for name in ("tensorflow", "tensorflow_estimator")
        if needs_runtime and importlib.util.find_spec(name) is not None
    }
    scripts = {
        process.key[0]: plan.script_of(process.argv, sys.executable)
        for process in run_plan.processes
    }
    missing_scripts = {
        rtype: script
        for rtype, script in scripts.items()
        if script is not None and not os.path.exists(os.path.join(cwd, script))
    }
    return plan.local_requirements(
        job,
        python=sys.executable,
        modules=frozenset(modules),
        tf_version=_tf_version() if "tensorflow" in modules else None,
        missing_scripts=missing_scripts,
    )


def _tf_version() -> str | None:
    """TensorFlow's version from package metadata (importing it takes seconds)."""
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# One entry per GPU the NVIDIA kernel driver manages (its PCI bus id): counted without
# TensorFlow in the CLI and without starting nvidia-smi.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"


def _detected_gpus() -> int:
    try:
        return len(os.listdir(NVIDIA_GPUS_DIR))
    except OSError:
        return 0


def _gpu_plan(
    job: spec.TrainJob, args: argparse.Namespace, environ: Mapping[str, str]
) -> gpus.GpuPlan | None:
    option = gpus.parse_option(args.gpus) if args.gpus else None
    pool, source = gpus.gpu_pool(
        option,
        caller_visible=environ.get(gpus.CUDA_VISIBLE_DEVICES),
        detected=_detected_gpus() if option in (None, gpus.ALL) else 0,
    )
    if pool is None:
        return None
    return gpus.assign(job.replica_keys(), pool, source=source, ps_on_gpu=args.ps_on_gpu)


def cmd_run(args: argparse.Namespace, streams: Streams) -> int:
    out = streams.out
    files: list[str] = args.file
    if len(files) > 1:
        raise CliError(
            f"give one -f (got {len(files)}: {', '.join(files)}); trainjob run runs one TrainJob"
        )
    path = files[0]
    name = source_name(path)
    documents = load_documents(path, streams.stdin)
    if len(documents) != 1:
        raise CliError(f"{name} must hold exactly one TrainJob, found {len(documents)} documents")
    job = parse_job(documents[0], name, require_images=False)
    if job.run_policy.suspend:
        out.write(f"TrainJob {job.name} has runPolicy.suspend: true; nothing to run\n")
        return 0
    environ = dict(os.environ)
    too_many = plan.too_many_processes(job, args.max_processes, os.cpu_count() or 1)
    if too_many is not None:
        raise CliError(f"{name}: {too_many}")
    cwd = os.getcwd()
    run_dir = os.path.abspath(args.run_dir or plan.default_run_dir(cwd, job.name))
    data_dir = os.path.abspath(args.data_dir or data.default_data_dir(environ))
    ports = dict(
        zip(job.replica_keys(), supervisor.free_ports(len(job.replica_keys())), strict=True)
    )
    try:
        run_plan = plan.make_plan(
            job,
            ports=ports,
            run_dir=run_dir,
            python=sys.executable,
            data_dir=data_dir,
            python_path=supervisor.package_root(),
            host_network=args.host_network,
            expose_host_ports=args.expose_host_port,
            gpu_plan=_gpu_plan(job, args, environ),
        )
    except (plan.PlanError, gpus.GpuOptionError) as error:
        raise CliError(f"{name}: {error}") from error
    if args.dry_run:
        out.write(plan.format_plan(run_plan))
        return 0
    problems = _up_front_problems(job, run_plan, cwd)
    if run_plan.private_network:
        refusal = usernet.exposure_refusal(
            run_plan.exposed_host_ports, supervisor.find_pasta(environ)
        )
        problems += [refusal] if refusal is not None else []
    if problems:
        raise CliError("\n".join(f"{name}: {problem}" for problem in problems))
    previous = rundir.read_status_file(run_plan.status_file)
    again = plan.rerun_refusal(job, previous, run_dir) if not args.rerun else None
    if again is not None:
        raise CliError(again)
    try:
        lock = rundir.lock_run_dir(run_dir)
    except rundir.RunDirError as error:
        raise CliError(str(error)) from error
    tty = out.isatty() and not args.no_tty and environ.get("TERM") != "dumb"
    color = tty and not environ.get("NO_COLOR")
    try:
        runner = executor.Executor(
            run_plan,
            environ=environ,
            out=out,
            tty=tty,
            show_logs=not args.quiet,
            verbose=args.verbose,
            color=color,
            cwd=cwd,
        )
        try:
            summary = runner.run()
        except OSError as error:
            raise CliError(f"run directory {run_dir}: {error}") from error
        with contextlib.suppress(OSError):  # the terminal or pipe may be gone (SIGHUP, EPIPE)
            out.write(view.summary_text(summary, color=color))
            out.flush()
    finally:
        lock.release()
    return outcome.command_exit_code(summary)


# ----- status and logs -----
def _run_dirs(target: str | None, cwd: str) -> list[str]:
    """The run dirs a command means: TARGET as a directory or a job name under ./trainjob-runs;
    without TARGET every run under ./trainjob-runs."""
    runs = os.path.join(cwd, plan.DEFAULT_RUNS_DIR)
    if target is None:
        if os.path.isfile(os.path.join(cwd, plan.STATUS_FILE)):
            return [cwd]
        try:
            names = sorted(os.listdir(runs))
        except OSError as error:
            raise CliError(
                f"no runs here: {runs} does not exist; give a run dir (trainjob run --run-dir)"
            ) from error
        found = [
            os.path.join(runs, n)
            for n in names
            if os.path.isfile(os.path.join(runs, n, plan.STATUS_FILE))
        ]
        if not found:
            raise CliError(f"no runs in {runs}")
        return found
    for candidate in (target, os.path.join(runs, target)):
        if os.path.isfile(os.path.join(candidate, plan.STATUS_FILE)) or os.path.isdir(
            os.path.join(candidate, plan.LOGS_DIR)
        ):
            return [os.path.abspath(candidate)]
    raise CliError(
        f"{target} is not a run dir (no {plan.STATUS_FILE}) and no run named so is in {runs}"
    )


def cmd_status(args: argparse.Namespace, streams: Streams) -> int:
    out = streams.out
    entries = []
    for run_dir in _run_dirs(args.run_dir, os.getcwd()):
        data = rundir.read_status_file(os.path.join(run_dir, plan.STATUS_FILE)) or {}
        holder = rundir.run_dir_holder(run_dir)
        progress = rundir.read_log_tail(os.path.join(run_dir, plan.PROGRESS_FILE), 16 * 1024)
        entries.append(runs.RunEntry(run_dir, data, holder, runs.last_step(progress)))
    if args.output is not None:
        payload: Any = [runs.status_data(e) for e in entries]
        dump(payload[0] if args.run_dir is not None else payload, out, args.output)
        return 0
    if args.run_dir is None and len(entries) > 1:
        out.write("\n".join(runs.runs_table(entries)) + "\n")
    else:
        for entry in entries:
            out.write("\n".join(runs.status_lines(entry)) + "\n")
    return 0


def _logs_target(targets: Sequence[str], cwd: str) -> tuple[str, str | None]:
    if len(targets) > 2:
        raise CliError(f"expected [RUN_DIR] [REPLICA], got {len(targets)} arguments")
    replica: str | None = None
    target: str | None = None
    if len(targets) == 2:
        target, replica = targets
    elif len(targets) == 1:
        only = targets[0]
        looks_like_replica = _REPLICA_NAME.match(only) and not os.path.isdir(only)
        replica, target = (only, None) if looks_like_replica else (None, only)
    dirs = _run_dirs(target, cwd)
    if len(dirs) > 1:
        names = ", ".join(os.path.basename(d) for d in dirs)
        raise CliError(f"several runs here ({names}); name one: trainjob logs RUN_DIR")
    if replica is not None and not _REPLICA_NAME.match(replica):
        raise CliError(f"{replica} is not a replica name such as worker-0 or chief-0")
    return dirs[0], replica


def cmd_logs(args: argparse.Namespace, streams: Streams) -> int:
    run_dir, replica = _logs_target(args.targets, os.getcwd())
    log_dir = os.path.join(run_dir, plan.LOGS_DIR)
    names = rundir.log_names(log_dir)
    if replica is not None:
        if f"{replica}.log" not in names:
            have = ", ".join(n.removesuffix(".log") for n in names) or "none yet"
            raise CliError(f"no log for {replica} in {log_dir} (replicas: {have})")
        names = [f"{replica}.log"]
    if not names and not args.follow:
        raise CliError(f"no logs yet in {log_dir}")
    rundir.print_logs(
        log_dir,
        None if replica is None else names,
        streams.out,
        follow_until_free=run_dir if args.follow else None,
    )
    return 0


# ----- tensorboard -----
TENSORBOARD_START_SECONDS: Final = 120.0  # TensorBoard imports TensorFlow: seconds, not minutes
_POLL_SECONDS: Final = 0.2


def _has_event_files(directory: str) -> bool:
    return any("tfevents" in name for _, _, names in os.walk(directory) for name in names)


def cmd_tensorboard(args: argparse.Namespace, streams: Streams) -> int:
    """TensorBoard on a local run's checkpoint directory until Ctrl-C (see board)."""
    import importlib.util
    import tempfile
    import time

    dirs = _run_dirs(args.job, os.getcwd())
    if len(dirs) > 1:
        names = ", ".join(os.path.basename(d) for d in dirs)
        raise CliError(f"several runs here ({names}); name one: trainjob tensorboard RUN")
    run_dir = dirs[0]
    if importlib.util.find_spec("tensorboard") is None:
        raise CliError(
            f"TensorBoard is not installed in this Python ({sys.executable}): "
            "pip install tensorboard (or pip install 'trainjob[tf]')"
        )
    logdir = board.logdir(run_dir)
    if not _has_event_files(logdir):
        streams.err.write(
            f"note: no TensorBoard logs in {logdir} yet; TensorBoard shows them once the job "
            "writes them\n"
        )
    handle, log_path = tempfile.mkstemp(prefix="trainjob-tensorboard-", suffix=".log")
    os.close(handle)
    command = board.argv(sys.executable, logdir, args.address, args.port)
    server = None
    try:
        # The handlers first: a signal during the start still stops TensorBoard.
        with stop_signals(_interrupt):
            server = supervisor.Server(command, log_path)
            deadline = time.monotonic() + TENSORBOARD_START_SECONDS
            url = None
            while url is None:
                output = _read_text(log_path)
                url = board.announced_url(output)
                code = server.exit_code()
                if url is None and code is not None:
                    raise CliError(
                        f"TensorBoard exited with code {code}: {board.last_words(output)}",
                        EXIT_FAILED,
                    )
                if url is None and time.monotonic() > deadline:
                    raise CliError(
                        f"TensorBoard did not start in {TENSORBOARD_START_SECONDS:.0f}s: "
                        f"{board.last_words(output)}",
                        EXIT_FAILED,
                    )
                time.sleep(_POLL_SECONDS)
            streams.out.write(
                f"TensorBoard for {run_dir} (logs: {logdir}): {url}\n{stop_hint()}.\n"
            )
            streams.out.flush()
            while (code := server.exit_code()) is None:
                time.sleep(_POLL_SECONDS)
            raise CliError(
                f"TensorBoard exited with code {code}: {board.last_words(_read_text(log_path))}",
                EXIT_FAILED,
            )
    except KeyboardInterrupt:
        streams.out.write("Stopped TensorBoard.\n")
        return EXIT_OK
    finally:
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            os.remove(log_path)


def _interrupt(signal_name: str) -> None:
    """SIGTERM and SIGHUP end the command as Ctrl-C does: TensorBoard is stopped."""
    del signal_name
    raise KeyboardInterrupt


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""
