"""`python -m trainjob_operator [--namespace NS] [--cluster-domain D] [--metrics-port P] ...`

Embeds kopf (kopf.run, its public API) with the handlers of `trainjob_operator.handlers`.

HA: run every replica with `--leader-elect`. The replicas elect a leader on a Lease
(`--leader-election-id`, default trainjob-operator, in `--leader-election-namespace`, default
the Pod's own): the leader writes; the others watch everything and write nothing, and take
over within the lease duration (15 s) when it dies or is cut off, at once when it stops
gracefully (it releases the Lease). A leader that loses the Lease exits with status 1 (the
kubelet starts it again, as a standby). Without `--leader-elect` the operator runs alone:
run one replica only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys

import kopf

from trainjob_operator import config, handlers, progress_server

# The exit status of a leader that lost its Lease (the kubelet starts it again).
LOST_LEASE: int = 1


def main(argv: list[str] | None = None) -> int:
    try:
        settings = config.from_args(sys.argv[1:] if argv is None else argv, os.environ)
        if settings.leader_elect:
            namespace = config.election_namespace(settings, os.environ, handlers.read_file)
            settings = dataclasses.replace(settings, leader_election_namespace=namespace)
    except config.ConfigError as exc:
        print(f"trainjob-operator: {exc}", file=sys.stderr)
        return 2
    problem = config.credentials_problem(os.environ, os.path.expanduser("~"), os.path.exists)
    if problem is None and settings.progress_enabled and settings.progress_cert_dir:
        problem = progress_server.certificate_problem(settings.progress_cert_dir)
    if problem is not None:
        print(f"trainjob-operator: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not settings.verbose:
        # kopf logs every handler success at INFO (one line per watch event); ours say more.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # An asyncio flag, bound to kopf's loop when kopf first waits on it: a threading.Event
    # would hold an executor thread that keeps the process alive after a SIGTERM.
    stop = asyncio.Event()
    memo = kopf.Memo()
    memo[handlers.SETTINGS_KEY] = settings
    memo[handlers.STOP_KEY] = stop
    try:
        # kopf watches nothing (handlers.py): no peering, and every namespace as far as
        # kopf is concerned; the informers watch the namespaces of --namespace.
        kopf.run(
            standalone=True,
            liveness_endpoint=settings.liveness_endpoint,
            clusterwide=True,
            memo=memo,
            stop_flag=stop,
        )
    except Exception:
        refused = memo.get(handlers.REFUSED_KEY)
        if refused is None:
            raise
        print(f"trainjob-operator: {refused}", file=sys.stderr)
        return 2
    lost = memo.get(handlers.LOST_KEY)
    if lost is not None:
        print(f"trainjob-operator: lost the leader Lease ({lost}); exiting", file=sys.stderr)
        return LOST_LEASE
    return 0


if __name__ == "__main__":
    sys.exit(main())
