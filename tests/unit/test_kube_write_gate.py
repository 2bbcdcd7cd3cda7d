"""The API layer's write gate (kube.Kube.gate_writes): with leader election, a replica that
may not write sends no create, update, patch or delete at all; reads, TokenReviews and the
Lease's own requests still go out. The API server here is a closed port: a request that is
sent fails as unreachable, one that the gate stops fails as NotLeaderError before that."""

from __future__ import annotations

import asyncio
import datetime
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import pytest

from trainjob.core import policy
from trainjob_operator import kube


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def outcome(call: Callable[[kube.Kube], Awaitable[Any]], may_write: bool) -> str:
    async def attempt() -> str:
        info = kopf.ConnectionInfo(server=f"http://127.0.0.1:{closed_port()}")
        api = kube.Kube(lambda: info, connections=2, identity="pod-a_1234")
        api.gate_writes(lambda: may_write)
        try:
            await call(api)
        except kube.NotLeaderError:
            return "held back"
        except kube.TransientError:
            return "sent"
        finally:
            await api.close()
        return "answered"

    return asyncio.run(attempt())


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def pod(_: None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}


WRITES: dict[str, Callable[[kube.Kube], Awaitable[Any]]] = {
    "create": lambda api: api.create("Pod", "ns", "p", pod),
    "delete": lambda api: api.delete_pod("ns", "p"),
    "patch status": lambda api: api.patch_status("ns", "job", {"state": "Running"}),
    "patch object": lambda api: api.patch_object("", "v1", "ns", "pods", "p", {}),
    "create object": lambda api: api.create_object(pod(), "pods"),
    "event": lambda api: api.post_event(pod(), policy.Event("Normal", "Created", "m"), NOW),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_replica_that_may_not_write_sends_no_write(write: str) -> None:
    assert outcome(WRITES[write], may_write=False) == "held back"
    assert outcome(WRITES[write], may_write=True) == "sent"


def test_reads_reviews_and_the_lease_itself_pass_a_closed_gate() -> None:
    assert outcome(lambda api: api.get_trainjob("ns", "job"), may_write=False) == "sent"
    assert outcome(lambda api: api.review_token("t", ["a"]), may_write=False) == "sent"
    assert outcome(lambda api: api.get_lease("ns", "l", 1.0), may_write=False) == "sent"
    spec = {"holderIdentity": "pod-a_1234"}
    renew = outcome(lambda api: api.update_lease("ns", "l", spec, "7", 1.0), may_write=False)
    assert renew == "sent"


def test_every_request_names_the_replica_in_its_user_agent() -> None:
    assert kube.user_agent("pod-a_1234") == "trainjob-operator (pod-a_1234)"
    assert kube.user_agent("") == "trainjob-operator"
