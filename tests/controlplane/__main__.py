"""``python -m tests.controlplane up``: run the test control plane until Ctrl-C.

Prints the KUBECONFIG path (and an ``export`` line), then waits. Options:
  --kwok          also start kwok with the fake nodes and TrainJob pod stages
  --crds          apply crds/ (waits until Established) before the controllers start
  --workdir DIR   keep state and logs in DIR instead of a temp dir (kept after exit)
  --node          a real node (containerd, kubelet, kube-proxy, CoreDNS; root; see
                  tests/controlplane/node.py) with the images of images/build.sh; implies --crds

``python -m tests.controlplane up --kind``: the 3-node kind cluster of tests/controlplane/kind.py
(root; the runtime and operator images loaded, Kueue and scheduler-plugins installed) until
Ctrl-C, which deletes it with everything it made.

``python -m tests.controlplane kind-start``: start that kind cluster for the e2e tier and leave it
running (the e2e session adopts it, and deletes it when done): ``bash tests/run`` starts it
beside the other tiers. ``kind-stop`` deletes it, with everything it made.

``python -m tests.controlplane import-images``: import the images of images/build.sh into the
real node's containerd root ahead of its start (`bash tests/run` runs it beside the tiers
before e2e).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Final

from tests.controlplane.cluster import ControlPlane, ControlPlaneError
from tests.controlplane.gang import start_gang_scheduler
from tests.controlplane.node import NODE_NAME, preimport_images, running_node
from tests.controlplane.tools import REPO_ROOT, ToolsMissingError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.controlplane")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and run until Ctrl-C")
    up.add_argument("--kwok", action="store_true", help="start kwok and its fake nodes")
    up.add_argument("--crds", action="store_true", help="apply crds/ before the controllers")
    up.add_argument("--workdir", type=Path, default=None, help="state/log dir (kept)")
    up.add_argument("--node", action="store_true", help="a real node (kubelet, containerd)")
    up.add_argument(
        "--kind",
        action="store_true",
        help="a 3-node kind cluster (root; tests/controlplane/kind.py)",
    )
    up.add_argument(
        "--gang",
        action="store_true",
        help="also run scheduler-plugins' Coscheduling as a second scheduler "
        "(schedulerName scheduler-plugins-scheduler), with its PodGroup CRDs",
    )
    sub.add_parser(
        "import-images",
        help="import the images into the real node's containerd root ahead of its start "
        "(root; nothing while the node runs)",
    )
    kind_start = sub.add_parser(
        "kind-start",
        help="start the e2e tier's kind cluster and leave it running for the tier to adopt",
    )
    kind_start.add_argument(
        "--after",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait this long, or until the --when file exists",
    )
    kind_start.add_argument(
        "--when",
        type=Path,
        default=None,
        metavar="FILE",
        help="start as soon as this file exists (tests/run makes it when the tiers are done)",
    )
    sub.add_parser("kind-stop", help="delete the kind cluster and everything it made")
    args = parser.parse_args(argv)
    if args.command == "import-images":
        return _import_images()
    if args.command == "kind-start":
        return _start_kind(args.after, args.when)
    if args.command == "kind-stop":
        from tests.controlplane.kind import clean_up, leftovers

        clean_up()
        found = leftovers()
        if found:
            print("error: the kind cluster left behind: " + "; ".join(found), file=sys.stderr)
            return 1
        return 0
    if args.node:
        return _up_node(args.workdir)
    if args.kind:
        return _up_kind()

    crds = sorted((REPO_ROOT / "crds").glob("*.yaml")) if args.crds else []
    plane = ControlPlane(workdir=args.workdir, crds=crds)
    stop = _stop_on_signals()
    try:
        plane.start()
        if args.kwok:
            plane.start_kwok()
        if args.gang:
            start_gang_scheduler(plane)
    except (ToolsMissingError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"kube-apiserver {plane.version()} at {plane.apiserver_url}")
        print(f"logs in {plane.root / 'logs'}")
        print(f"kubectl: {plane.kubectl_path}")
        print(f"export KUBECONFIG={plane.kubeconfig}")
        print("Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):
            dead = [c.name for c in plane.components if not c.running()]
            if dead:
                print(f"error: component(s) exited: {', '.join(dead)}", file=sys.stderr)
                return 1
        return 0
    finally:
        plane.stop()
        print("stopped", flush=True)


def _stop_on_signals() -> threading.Event:
    """Set on Ctrl-C or SIGTERM: the caller stops what it runs and cleans up."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _import_images() -> int:
    started = time.monotonic()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # the import's ctr and its containerd stop on the way out

    signal.signal(signal.SIGTERM, stop)
    try:
        preimport_images()
    except (ToolsMissingError, ControlPlaneError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("images: import stopped", file=sys.stderr)
        return 130
    print(f"images imported into the node's containerd in {time.monotonic() - started:.0f}s")
    return 0


def _up_node(workdir: Path | None) -> int:
    stop = _stop_on_signals()
    crds = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    try:
        with running_node(workdir=workdir, crds=crds) as node:
            plane = node.plane
            print(f"kube-apiserver {plane.version()} at {plane.apiserver_url}")
            print(f"node {NODE_NAME} Ready; logs in {plane.root / 'logs'}")
            print(f"kubectl: {plane.kubectl_path}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print("Ctrl-C to stop (removes every process, mount, interface and rule)", flush=True)
            while not stop.wait(1.0):
                dead = [c.name for c in [*plane.components, *node.components] if not c.running()]
                if dead:
                    print(f"error: component(s) exited: {', '.join(dead)}", file=sys.stderr)
                    return 1
            return 0
    except (ToolsMissingError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopped", flush=True)


# Starts of the e2e tier's kind cluster `kind-start` tries (tests/run tries once more after
# the tiers, should both fail).
KIND_START_ATTEMPTS: Final = 2


def _start_kind(after: float, when: Path | None) -> int:
    from tests.controlplane.e2e_cluster import KIND_IMAGES
    from tests.controlplane.kind import start_kind

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # start_kind removes what it made on the way out

    signal.signal(signal.SIGTERM, stop)
    try:
        if after > 0:
            # A ready cluster costs about a third of a core while it waits for the e2e tier
            # (tests/README.md): started later, it is ready nearer the moment it is needed.
            print(f"kind: starting in {after:.0f}s, or when the tiers are done", flush=True)
            _wait_for_file(when, after)
        started = time.monotonic()
        for attempt in range(1, KIND_START_ATTEMPTS + 1):
            try:
                start_kind(KIND_IMAGES)
                break
            except (ControlPlaneError, subprocess.SubprocessError, AssertionError) as exc:
                # AssertionError: a wait's deadline (tests.support.waits). Seen under the
                # tiers' load: kubeadm's wait for the control plane timed out. start_kind
                # removed what it made; trying again now, while the tiers still run, costs
                # the e2e tier nothing (tests/run's retry after the tiers cost it 397 s).
                if attempt == KIND_START_ATTEMPTS:
                    raise
                print(f"kind: the start failed ({exc}); starting it again", flush=True)
    except (
        ToolsMissingError,
        ControlPlaneError,
        subprocess.SubprocessError,
        AssertionError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kind: start stopped, cluster removed", file=sys.stderr)
        return 130
    print(f"kind cluster ready for the e2e tier in {time.monotonic() - started:.0f}s", flush=True)
    return 0


# How often the wait for the --when file looks: a second against a start of minutes.
START_FILE_POLL_S: Final = 1.0


def _wait_for_file(path: Path | None, timeout: float) -> None:
    """Until `path` exists or `timeout` seconds have passed. A file, not a signal: tests/run
    once sent SIGUSR1 while this process was still importing, before it could block the
    signal, and its default action ended the process (a cold CI run, 2026-12-02)."""
    deadline = time.monotonic() + timeout
    while not (path is not None and path.exists()):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(START_FILE_POLL_S, left))


def _up_kind() -> int:
    from tests.controlplane.e2e_cluster import KIND_IMAGES
    from tests.controlplane.kind import running_kind

    stop = _stop_on_signals()
    try:
        with running_kind(KIND_IMAGES) as kind:
            print(kind.kubectl("get", "nodes", "-o", "wide"))
            print(
                f"export KUBECONFIG={kind.kubeconfig} DOCKER_HOST={kind.docker_env['DOCKER_HOST']}"
            )
            print(f"kind: {kind.tools.kind}  kubectl: {kind.tools.kubectl}")
            print("Ctrl-C to stop (deletes the cluster, dockerd and its network)", flush=True)
            stop.wait()
            return 0
    except (ToolsMissingError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
