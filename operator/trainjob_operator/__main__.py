"""`python -m trainjob_operator [--namespace NS] [--cluster-domain D] [--metrics-port P] ...`

Embeds kopf (kopf.run) with the handlers of `trainjob_operator.handlers`.

HA: every replica joins the kopf peering object named by `--peering` (e.g.
trainjob-operator: a ClusterKopfPeering when cluster-wide, a KopfPeering in each watched
namespace; CRDs in deploy/peering.yaml). The replica with the highest priority serves; the
others stay paused and take over when its peering record expires (60 s). Without
`--priority` each replica draws a random one, because kopf freezes *every* replica when two
share a priority. Without `--peering`, kopf auto-detects: peering if its CRDs are installed,
else standalone with a warning; `--standalone` turns peering off (run one replica only).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys

import kopf

from trainjob_operator import config, handlers, progress_server


def main(argv: list[str] | None = None) -> int:
    try:
        settings = config.from_args(sys.argv[1:] if argv is None else argv, os.environ)
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
    priority = settings.priority
    if priority is None and not settings.standalone:
        priority = 1 + secrets.randbelow(2**31 - 2)
    memo = kopf.Memo()
    memo[handlers.SETTINGS_KEY] = settings
    try:
        kopf.run(
            standalone=settings.standalone,
            priority=priority,
            peering_name=None if settings.standalone else settings.peering_name,
            liveness_endpoint=settings.liveness_endpoint,
            clusterwide=settings.serves_every_namespace,
            namespaces=settings.namespaces,
            memo=memo,
        )
    except Exception:
        refused = memo.get(handlers.REFUSED_KEY)
        if refused is None:
            raise
        print(f"trainjob-operator: {refused}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
