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


# What the kubelet keeps of a container's log as its termination message under
# FallbackToLogsOnError: the last 2 KiB of the last 80 lines
# (kubecontainer.MaxContainerTerminationMessageLogLines / ...LogLength).
TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048


def log_output(cri_log: bytes, tail_lines: int | None = None) -> str:
    """What the kubelet serves of a container's log file in the CRI format (`<time> <stream>
    <F|P> <content>` per entry, as containerd writes it; `kubectl logs`): each entry's content,
    a newline after full (F) entries only, so the parts of a partial line join up again.
    `tail_lines` counts entries, as the kubelet's tailLines does."""
    # Entries end with "\n" only: the carriage returns of a progress bar are content.
    entries = cri_log.removesuffix(b"\n").split(b"\n")
    if tail_lines is not None:
        entries = entries[-tail_lines:]
    out = b""
    for entry in entries:
        _, _, tag, content = [*entry.split(b" ", 3), b""][:4]
        out += content + (b"\n" if tag == b"F" else b"")
    return out.decode("utf-8", errors="replace")


def termination_message_from_log(cri_log: bytes) -> str:
    """The termination message the kubelet writes for a container that failed with an empty
    one under FallbackToLogsOnError: its log's tail."""
    tail = log_output(cri_log, TERMINATION_LOG_LINES).encode()
    return tail[-TERMINATION_LOG_BYTES:].decode("utf-8", errors="replace")
