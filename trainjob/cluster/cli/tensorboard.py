"""`trainjob tensorboard` for a cluster job: a TensorBoard Pod on the job's checkpoint volume
(`board.tensorboard_pod`), reached through a port-forward, until Ctrl-C (or SIGTERM, SIGHUP:
`trainjob.signals`, which leaves alone a signal the command was started with ignored);
the Pod is deleted however the command ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import TYPE_CHECKING, Any, Final

from trainjob.cliutil import EXIT_FAILED, EXIT_OK, CliError, Streams
from trainjob.cluster import board, describe, objects
from trainjob.cluster.cli.common import connected, load_api_pods
from trainjob.cluster.errors import ClusterError
from trainjob.signals import stop_hint, stop_signals

if TYPE_CHECKING:  # imported when a command runs: it imports the kubernetes package
    from trainjob.cluster import api

TENSORBOARD_START_SECONDS: Final = 180.0  # image on the node, TensorFlow's import: ~10-30 s

TENSORBOARD_POLL_SECONDS: Final = 0.5


def wants_cluster_tensorboard(args: argparse.Namespace, cwd: str, runs_dir: str) -> bool:
    """Whether `trainjob tensorboard` means a cluster job: --cluster or a cluster-only flag,
    or a JOB that is no local run (a directory, or a name under ./trainjob-runs)."""
    if args.cluster or args.namespace or args.context or args.kubeconfig or args.image:
        return True
    if args.job is None:
        return False
    return not (os.path.isdir(args.job) or os.path.isdir(os.path.join(cwd, runs_dir, args.job)))


def cmd_cluster_tensorboard(args: argparse.Namespace, streams: Streams) -> int:
    """A TensorBoard Pod on the job's checkpoint volume, reached through a port-forward, until
    Ctrl-C; the Pod is deleted however the command ends."""
    import secrets

    if args.job is None:
        raise CliError("give the job: trainjob tensorboard JOB")
    with connected(args) as cluster:
        job = cluster.get_job(args.job)
        try:
            body = board.tensorboard_pod(job, secrets.token_hex(3), args.image)
        except board.BoardError as error:
            raise CliError(str(error), EXIT_FAILED) from error
        pods = load_api_pods().Pods(cluster)
        name = objects.name_of(body)
        forwarder = None
        # The handlers first: a signal that comes while the Pod is being created still
        # deletes it (a 404 then is fine).
        with stop_signals(_interrupt):
            try:
                pods.create(body)
                _wait_started(pods, cluster, name)
                forwarder = pods.forward(name, board.PORT, args.address, args.port)
                url = f"http://{forwarder.address}:{forwarder.port}/"
                _wait_serving(pods, forwarder, name, url)
                streams.out.write(
                    f"TensorBoard for {objects.ref_of(job).kind} {cluster.namespace}/"
                    f"{objects.name_of(job)} (Pod {name}): "
                    f"{url}\n{stop_hint()} and deletes the Pod.\n"
                )
                streams.out.flush()
                while True:
                    pod = pods.read(name)
                    problem = "it was deleted" if pod is None else board.failure(pod)
                    if problem is not None:
                        raise CliError(f"TensorBoard Pod {name} stopped: {problem}", EXIT_FAILED)
                    time.sleep(TENSORBOARD_POLL_SECONDS)
            except KeyboardInterrupt:
                streams.out.write(f"Stopped TensorBoard; deleted Pod {name}.\n")
                return EXIT_OK
            finally:
                if forwarder is not None:
                    forwarder.close()
                with contextlib.suppress(ClusterError):
                    pods.delete(name)


def _interrupt(signal_name: str) -> None:
    """Ctrl-C, SIGTERM and SIGHUP end the command alike, so the Pod is deleted in each case."""
    del signal_name
    raise KeyboardInterrupt


def _wait_started(pods: Any, cluster: api.Cluster, name: str) -> None:
    """Until TensorBoard's container runs; CliError with the kubelet's or scheduler's words
    when it cannot (image, volume, refused) or does not in time."""
    deadline = time.monotonic() + TENSORBOARD_START_SECONDS
    while True:
        pod = pods.read(name)
        if pod is None:
            raise CliError(f"TensorBoard Pod {name} was deleted before it started", EXIT_FAILED)
        problem = board.failure(pod)
        if problem is not None:
            raise CliError(f"TensorBoard Pod {name} cannot start: {problem}", EXIT_FAILED)
        if board.started(pod):
            return
        if time.monotonic() > deadline:
            why = board.waiting_reason(pod, describe.sort_events(cluster.events([name])))
            raise CliError(
                f"TensorBoard Pod {name} did not start in {TENSORBOARD_START_SECONDS:.0f}s: {why}",
                EXIT_FAILED,
            )
        time.sleep(TENSORBOARD_POLL_SECONDS)


def _wait_serving(pods: Any, forwarder: Any, name: str, url: str) -> None:
    """Until TensorBoard answers through the port-forward (it imports TensorFlow first)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + TENSORBOARD_START_SECONDS
    last = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last = str(getattr(error, "reason", error))
        while not forwarder.errors.empty():
            last = forwarder.errors.get()
        pod = pods.read(name)
        problem = "it was deleted" if pod is None else board.failure(pod)
        if problem is not None:
            raise CliError(f"TensorBoard Pod {name} stopped: {problem}", EXIT_FAILED)
        if time.monotonic() > deadline:
            raise CliError(
                f"TensorBoard in Pod {name} did not answer in {TENSORBOARD_START_SECONDS:.0f}s: "
                f"{last}",
                EXIT_FAILED,
            )
        time.sleep(TENSORBOARD_POLL_SECONDS)
