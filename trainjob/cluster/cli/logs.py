"""`trainjob logs` for a cluster job: when the command means one (`wants_cluster`), every
replica's Pod log prefixed with the replica, TensorFlow's routine messages filtered out as
`trainjob run` does (`filtered`); `-f` follows across restarts and new Pods."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from trainjob.cliutil import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, CliError, Streams
from trainjob.cluster import describe, objects, show
from trainjob.cluster.cli.common import add_cluster_flags, connected
from trainjob.cluster.errors import ClusterError
from trainjob.console import logfilter, view

if TYPE_CHECKING:  # imported when a command runs: it imports the kubernetes package
    from trainjob.cluster import api


def add_cluster_log_flags(parser: argparse.ArgumentParser) -> None:
    """The flags `trainjob logs` takes for a cluster job (next to the local ones)."""
    parser.add_argument(
        "--cluster", action="store_true",
        help="read the job's Pod logs on the cluster (implied by -n, --context, --kubeconfig, "
        "--previous, --tail, or a JOB that is no local run)",
    )  # fmt: skip
    parser.add_argument(
        "--previous", action="store_true", help="cluster: the previous container's log"
    )
    parser.add_argument("--tail", type=int, metavar="N", help="cluster: the last N lines")
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="cluster: keep TensorFlow's routine messages (filtered out by default)",
    )  # fmt: skip
    add_cluster_flags(parser)


def wants_cluster(args: argparse.Namespace, cwd: str, runs_dir: str) -> bool:
    """Whether `trainjob logs` means a cluster job: --cluster or a cluster-only flag, or a
    first argument that is neither a local run (a directory, or a name under ./trainjob-runs)
    nor a replica name (`trainjob logs worker-1` reads the only local run)."""
    if args.cluster or args.namespace or args.context or args.kubeconfig:
        return True
    if args.previous or args.tail is not None:
        return True
    if not args.targets:
        return False
    target = args.targets[0]
    if show.replica_key(target) is not None:  # `trainjob logs worker-1`: the only local run's
        return False
    return not (os.path.isdir(target) or os.path.isdir(os.path.join(cwd, runs_dir, target)))


def cmd_cluster_logs(args: argparse.Namespace, streams: Streams) -> int:
    if not args.targets or len(args.targets) > 2:
        raise CliError("give the job, and optionally a replica: trainjob logs JOB [worker-0]")
    request = describe.LogRequest(*args.targets)
    with connected(args) as cluster:
        job = cluster.get_job(request.job)  # a missing job is named as such, not as "no Pods"
        if args.follow:
            return _follow_logs(cluster, request, args, streams)
        pods = [p for p in describe.order_pods(cluster.pods(request.job)) if request.wants(p)]
        if not pods:
            which = f"replica {request.replica}" if request.replica else "any replica"
            ref = objects.ref_of(job)
            raise CliError(
                f"{ref.kind} {ref.name} has no Pod for {which} now (Pods are removed when "
                "the job is cleaned up, per runPolicy.cleanPodPolicy)",
                EXIT_FAILED,
            )
        width = max(len(objects.pod_label(p)) for p in pods)
        missing = []
        for pod in pods:
            replica = objects.pod_label(pod)
            unavailable = describe.log_unavailable(pod)
            if unavailable is not None and not args.previous:
                missing.append(f"no log for {replica}: {unavailable}")
                continue
            try:
                text = cluster.pod_log(objects.name_of(pod), previous=args.previous, tail=args.tail)
            except ClusterError as error:
                missing.append(f"no log for {replica}: {error.message}")
                continue
            for line in filtered(text.splitlines(), args.verbose):
                streams.out.write(view.log_line(replica, line, width) + "\n")
    for note in missing:
        streams.err.write(f"trainjob logs: {note}\n")
    if missing and len(missing) == len(pods):
        return EXIT_FAILED
    return EXIT_OK


def filtered(lines: list[str], verbose: bool) -> Iterator[str]:
    """A replica's lines without TensorFlow's routine noise (unless verbose), as `trainjob run`
    shows them."""
    state = logfilter.FilterState()
    for line in lines:
        shown, state = logfilter.filter_line(line, state, verbose=verbose, stopping=False)
        if shown is not None:
            yield shown


def _follow_logs(
    cluster: api.Cluster, request: describe.LogRequest, args: argparse.Namespace, streams: Streams
) -> int:
    states: dict[str, logfilter.FilterState] = {}
    labels: dict[str, str] = {}
    width = len("worker-0")
    try:
        for pod_name, line in cluster.follow_logs(request.job, args.tail):
            if pod_name not in labels:
                pods = {objects.name_of(p): p for p in cluster.pods(request.job)}
                labels[pod_name] = (
                    objects.pod_label(pods[pod_name]) if pod_name in pods else pod_name
                )
                width = max(width, len(labels[pod_name]))
            replica = labels[pod_name]
            if request.replica is not None and replica != request.replica:
                continue
            if line.startswith(describe.NOTE_PREFIX):
                streams.err.write(
                    f"trainjob logs: {replica}: {line[len(describe.NOTE_PREFIX) :]}\n"
                )
                continue
            shown, states[pod_name] = logfilter.filter_line(
                line, states.get(pod_name, logfilter.FilterState()),
                verbose=args.verbose, stopping=False,
            )  # fmt: skip
            if shown is not None:
                streams.out.write(view.log_line(replica, shown, width) + "\n")
                streams.out.flush()
    except KeyboardInterrupt:
        return EXIT_SIGINT
    return EXIT_OK
