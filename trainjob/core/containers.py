"""A Pod's container statuses as the kubelet reports them (`status.containerStatuses`, and
`initContainerStatuses`), read in one place (pure): the operator's observe, the progress
server and the cluster commands all take a container's state from here.

Each container is in one of three states (Kubernetes' ContainerState): `waiting` (with a
reason such as ImagePullBackOff), `running` or `terminated` (exit code, reason, the
termination message). The TensorFlow container comes first, as it is the one that speaks for
a replica.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants

INIT: Final = "initContainerStatuses"
MAIN: Final = "containerStatuses"


@dataclasses.dataclass(frozen=True)
class Container:
    name: str
    image: str
    restart_count: int
    # The state's own object (`{"startedAt": ...}`, `{"reason": ..., "message": ...}`,
    # `{"exitCode": ..., "message": ...}`); None for the states it is not in.
    running: Mapping[str, Any] | None
    waiting: Mapping[str, Any] | None
    terminated: Mapping[str, Any] | None

    @property
    def started(self) -> bool:
        """Running, or ran (so it has a log)."""
        return self.running is not None or self.terminated is not None


def _state(state: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    value = state.get(name)
    return value if isinstance(value, Mapping) else None


def of_pod(pod: Mapping[str, Any], key: str = MAIN) -> list[Container]:
    """The Pod's containers under `key` (MAIN, or INIT), the TensorFlow container's first."""
    found = []
    for raw in (pod.get("status") or {}).get(key) or []:
        if not isinstance(raw, Mapping):
            continue
        state = raw.get("state")
        state = state if isinstance(state, Mapping) else {}
        restarts = raw.get("restartCount")
        found.append(
            Container(
                name=str(raw.get("name") or ""),
                image=str(raw.get("image") or ""),
                restart_count=restarts if isinstance(restarts, int) else 0,
                running=_state(state, "running"),
                waiting=_state(state, "waiting"),
                terminated=_state(state, "terminated"),
            )
        )
    found.sort(key=lambda c: c.name != constants.DEFAULT_CONTAINER_NAME)
    return found


def named(pod: Mapping[str, Any], name: str) -> Container | None:
    """The Pod's container `name`, if the kubelet reported it."""
    return next((c for c in of_pod(pod) if c.name == name), None)


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The terminated state of the TensorFlow container, else of the first one that ended."""
    return next((c.terminated for c in of_pod(pod) if c.terminated is not None), None)
