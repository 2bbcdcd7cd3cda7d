"""The kubelet's part, for tests and benchmarks whose Pods run nowhere: the status a kubelet
would report (container running, exited, waiting), as a patch of the Pod's status."""

from __future__ import annotations

import datetime
from typing import Any

from tests.support import manifests

Obj = dict[str, Any]


def now() -> str:
    """A kubelet's timestamp: UTC, whole seconds."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def container_status(
    state: Obj, *, image: str, ready: bool, name: str = manifests.CONTAINER
) -> Obj:
    """One entry of `containerStatuses` in `state` (running, terminated or waiting)."""
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "state": state,
    }


def running(image: str, started_at: str) -> Obj:
    """The training container running since `started_at`."""
    return container_status({"running": {"startedAt": started_at}}, image=image, ready=True)


def exited(image: str, exit_code: int, at: str, reason: str | None = None) -> Obj:
    """The training container ended with `exit_code` (reason Completed or Error by default)."""
    terminated: Obj = {"exitCode": exit_code, "startedAt": at, "finishedAt": at}
    terminated["reason"] = reason or ("Completed" if exit_code == 0 else "Error")
    return container_status({"terminated": terminated}, image=image, ready=False)


def exit_phase(exit_code: int) -> str:
    """The phase of a Pod that never restarts its container, once that exited."""
    return "Succeeded" if exit_code == 0 else "Failed"


def pod_status(phase: str, container: Obj, **extra: Any) -> Obj:
    """A patch of a Pod's status: `phase`, `extra` fields (startTime), one container."""
    return {"status": {"phase": phase, **extra, "containerStatuses": [container]}}
