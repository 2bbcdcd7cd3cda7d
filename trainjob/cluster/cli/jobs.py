"""`trainjob get`, `describe`, `wait` and `delete`: a job read (once, or until it gets where
`--for` says) and printed, or deleted. A job is a TrainJob (`mnist`) or a TFJob the TrainJob
operator serves (`tfjob/mnist`); `get` lists both, or the kind it is given (`get tfjobs`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, Final

from trainjob.cliutil import EXIT_OK, EXIT_TIMEOUT, CliError, Streams, dump, dump_all
from trainjob.cluster import describe, objects, show
from trainjob.cluster.cli.common import (
    POLL_SECONDS,
    add_cluster_flags,
    add_name_parser,
    connected,
    utc_now,
)
from trainjob.core import constants, tfjob, times

WAIT_FOR: Final = show.WAIT_FOR

GET_DESCRIPTION: Final = """\
List TrainJobs (the columns of `kubectl get tj`) and the TFJobs the TrainJob operator serves
(named tfjob/NAME), or print them as YAML or JSON. A first word naming a kind (tfjobs,
trainjobs) lists that kind only, as kubectl."""

GET_EXAMPLES: Final = """\
  trainjob get
  trainjob get mnist -o yaml
  trainjob get tfjobs -A -o wide
  trainjob get tfjob/mnist"""

DESCRIBE_DESCRIPTION: Final = """\
Show a TrainJob's (or a TFJob's) state, cause, progress, conditions, replicas with their exit
codes and Pods, and the Events of the job and its Pods."""

DESCRIBE_EXAMPLES: Final = """\
  trainjob describe mnist
  trainjob describe mnist -n team-a --context prod
  trainjob describe tfjob/mnist"""

WAIT_DESCRIPTION: Final = """\
Wait until a TrainJob (or tfjob/NAME) succeeded (default), finished either way, or is running.
Exits 0 when it got there, 1 when the job Failed (unless --for finished), 124 on --timeout."""

WAIT_EXAMPLES: Final = """\
  trainjob wait mnist --timeout 30m
  trainjob wait mnist --for finished && trainjob describe mnist
  trainjob wait tfjob/mnist --for running"""

DELETE_DESCRIPTION: Final = (
    "Delete TrainJobs (or tfjob/NAME); their Pods and Services go with them."
)

DELETE_EXAMPLES: Final = "  trainjob delete mnist\n  trainjob delete a b -n team-a"


def add_get_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help="jobs: NAME (a TrainJob), tfjob/NAME (a TFJob); first, a kind (tfjobs, trainjobs) "
        "lists only that kind (default: every job)",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", choices=("wide", "yaml", "json", "name"),
        help="name: one trainjob.trainjob.dev/NAME (tfjob.kubeflow.org/NAME) per line, as "
        "kubectl (scripts, completion)",
    )  # fmt: skip
    add_cluster_flags(parser, all_namespaces=True)
    return parser


def add_wait_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_name_parser(parser)
    parser.add_argument("--for", dest="wait_for", choices=show.WAIT_FOR, default="succeeded")
    parser.add_argument(
        "--timeout", type=_duration, help="give up after this long (30s, 5m, 1h; default: never)"
    )
    return parser


def _duration(text: str) -> float:
    try:
        return times.parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def wanted(words: list[str]) -> tuple[str | None, list[str]]:
    """kubectl's `get [KIND] [NAME...]`: the kind a first word names (None: every kind), and
    the jobs named, as the commands take them (`tfjob/NAME` for a TFJob)."""
    kind = objects.kind_named(words[0]) if words and "/" not in words[0] else None
    if kind is None:
        return None, words
    return kind, [str(objects.JobRef(kind, name)) for name in words[1:]]


def cmd_get(args: argparse.Namespace, streams: Streams) -> int:
    kind, names = wanted(args.names)
    others: list[str] = []
    kinds = "TrainJobs"
    with connected(args) as cluster:
        if names:
            if args.all_namespaces:
                raise CliError("a name cannot be given with -A (names are per namespace)")
            jobs = [cluster.get_job(name) for name in names]
        else:
            jobs = [] if kind == tfjob.KIND else cluster.list_jobs(args.all_namespaces)
            if kind != constants.KIND:
                listed = cluster.list_tfjobs(args.all_namespaces, optional=kind is None)
                if listed is not None:
                    jobs = [*jobs, *listed[0]]
                    others = listed[1] if kind == tfjob.KIND else []
                    kinds = "TFJobs" if kind == tfjob.KIND else "TrainJobs or TFJobs"
    if args.output == "name":
        streams.out.writelines(
            f"{objects.ref_of(job).resource}/{objects.name_of(job)}\n" for job in jobs
        )
        return EXIT_OK
    if args.output in ("yaml", "json"):
        stored = [objects.source_of(job) for job in jobs]  # a TFJob as it is, not its view
        if len(names) == 1:
            dump(stored[0], streams.out, args.output)
        else:
            dump_all(stored, streams.out, args.output)
        return EXIT_OK
    if others:
        names_shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        plural = "" if len(others) == 1 else "s"
        streams.err.write(
            f"Not shown: {len(others)} TFJob{plural} another controller runs ({names_shown}); "
            "kubectl get tfjobs shows them\n"
        )
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"{cluster.namespace} namespace"
        streams.err.write(f"No {kinds} found in {where}.\n")
        return EXIT_OK
    lines = show.jobs_table(
        jobs, utc_now(), all_namespaces=args.all_namespaces, wide=args.output == "wide"
    )
    streams.out.write("\n".join(lines) + "\n")
    return EXIT_OK


def cmd_describe(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        job = cluster.get_job(args.name)
        pods = describe.order_pods(cluster.pods(args.name))
        events = describe.sort_events(
            cluster.events([objects.name_of(job), *(objects.name_of(p) for p in pods)])
        )
        streams.out.write(describe.describe_text(job, pods, events, utc_now()))
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        for name in args.names:
            ref = objects.job_ref(name)
            cluster.delete_job(name)
            streams.out.write(f'{ref.resource} "{ref.name}" deleted\n')
    return EXIT_OK


def wait_for(
    read: Callable[[], dict[str, Any]],
    wait_for_state: str,
    timeout: float | None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, dict[str, Any]]:
    """Read the job until `show.wait_outcome` decides, or `timeout` seconds have passed:
    (exit code, the job as last read)."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        job = read()
        decided = show.wait_outcome(job, wait_for_state)
        if decided is not None:
            return decided, job
        if deadline is not None and clock() >= deadline:
            return EXIT_TIMEOUT, job
        left = POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - clock())
        sleep(max(0.0, left))


def cmd_wait(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        code, job = wait_for(lambda: cluster.get_job(args.name), args.wait_for, args.timeout)
    status = objects.status_of(job)
    ref = objects.ref_of(job)
    state = show.job_state(job)
    message = show.state_message(status) or show.waiting_note(job)
    detail = f" ({message})" if message else ""
    if code == EXIT_TIMEOUT:
        streams.err.write(
            f"trainjob wait: timed out after {args.timeout:g}s waiting for {ref.kind} "
            f"{ref.name} to be {args.wait_for}; it is {state}{detail}\n"
        )
    else:
        streams.out.write(f"{ref.kind} {ref.name} {state}{detail}\n")
    return code
