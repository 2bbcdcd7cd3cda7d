"""What every cluster verb shares: the cluster flags (as kubectl's), the connection and its
error handling (`connected`: a `ClusterError`, or a spec the view cannot read, ends the command
with one line naming the cause), the lazy import of the API modules (the kubernetes package is
imported only when a command talks to a cluster), and the clock."""

from __future__ import annotations

import argparse
import contextlib
import datetime
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from trainjob.cliutil import EXIT_FAILED, CliError
from trainjob.cluster import objects
from trainjob.cluster.errors import DEFAULT_REQUEST_TIMEOUT, INSTALL_HINT, ClusterError
from trainjob.core import constants, times

if TYPE_CHECKING:  # imported when a command runs: it imports the kubernetes package
    from trainjob.cluster import api

POLL_SECONDS: Final = 1.0  # how often attach and wait read the job again

KIND: Final = f"trainjob.{constants.GROUP}"  # how kubectl names the resource in its messages


def add_cluster_flags(parser: argparse.ArgumentParser, *, all_namespaces: bool = False) -> None:
    group = parser.add_argument_group("cluster (as kubectl)")
    group.add_argument(
        "--kubeconfig", metavar="FILE",
        help="default: $KUBECONFIG (':'-separated files), else ~/.kube/config",
    )  # fmt: skip
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument("-n", "--namespace", help="default: the context's namespace, else 'default'")
    group.add_argument(
        "--request-timeout", type=_request_timeout, default=DEFAULT_REQUEST_TIMEOUT,
        metavar="DURATION",
        help="how long to wait for the API server to answer a request before giving up (1s, "
        f"2m; 0: for ever; default {DEFAULT_REQUEST_TIMEOUT:g}s)",
    )  # fmt: skip
    if all_namespaces:
        group.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def _request_timeout(text: str) -> float:
    """kubectl's --request-timeout: a duration (`30s`, `2m`; a bare number is seconds)."""
    try:
        return times.parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_no_tty(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-tty", action="store_true", help="plain lines even on a terminal (no live table)"
    )


def add_name_parser(parser: argparse.ArgumentParser, *, several: bool = False) -> Any:
    parser.add_argument(
        "names" if several else "name", nargs="+" if several else None, metavar="NAME",
        help="a TrainJob's name, or tfjob/NAME: a TFJob the TrainJob operator serves",
    )  # fmt: skip
    add_cluster_flags(parser)
    return parser


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _no_kubernetes(error: ImportError) -> ClusterError:
    return ClusterError(
        f"talking to a cluster needs the kubernetes package ({error}): {INSTALL_HINT}"
    )


def load_api() -> Any:
    """`trainjob.cluster.api`, or ClusterError saying how to install the kubernetes package."""
    try:
        from trainjob.cluster import api
    except ImportError as error:
        raise _no_kubernetes(error) from error
    return api


def load_api_pods() -> Any:
    """`trainjob.cluster.api_pods` (Pods of one's own, port-forwards), as `load_api`."""
    try:
        from trainjob.cluster import api_pods
    except ImportError as error:
        raise _no_kubernetes(error) from error
    return api_pods


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[api.Cluster]:
    """The cluster the flags name; a ClusterError (or a spec the view cannot read) ends the
    command with one line naming the cause."""
    cluster: api.Cluster | None = None
    try:
        cluster_api = load_api()
        cluster = cluster_api.Cluster(
            cluster_api.connect(
                args.kubeconfig, args.context, args.namespace, request_timeout=args.request_timeout
            )
        )
        yield cluster
    except (ClusterError, objects.ShowError) as error:
        raise CliError(str(error), EXIT_FAILED) from error
    finally:
        if cluster is not None:
            cluster.close()
