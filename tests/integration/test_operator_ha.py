"""HA on a Lease, for real: two operator processes with `--leader-elect` against a real API
server. One leads and writes; the standby writes nothing; a leader killed, cut off from the API
server, or stopped is replaced, and no two replicas ever write at once.

Who wrote what and when is read from the API server's own audit log (this module's control
plane runs with one): every create, update, patch and delete it received, with its arrival
and completion times in microseconds and the User-Agent, which names the replica
(`trainjob-operator (<its leader-election identity>)`). The Lease's own requests are left
out: they are the election itself.

Short durations (lease 4 s, renew deadline 3 s, retry 1 s) keep each test well under its
budget; the same code runs with 15/10/2 in the chart.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.controlplane.cluster import ControlPlane
from tests.integration.conftest import started_control_plane
from tests.integration.operator_harness import Cluster, trainjob
from tests.integration.tcp_proxy import TcpProxy
from tests.reliability import save_figures
from tests.support import operator_process, waits

pytestmark = pytest.mark.integration

LEASE: Final = "trainjob-operator"
LEASE_S: Final = 4
RENEW_S: Final = 3
RETRY_S: Final = 1
SHORT: Final = (
    f"--leader-elect-lease-duration={LEASE_S}",
    f"--leader-elect-renew-deadline={RENEW_S}",
    f"--leader-elect-retry-period={RETRY_S}",
)
# What a loaded 2-core machine adds to a takeover: process scheduling, the standby's read
# of the Lease and the test's poll.
SLACK: Final = 2.0
T: Final = 60.0
# Every write the API server receives, nothing else (reads would swamp the log).
AUDIT_POLICY: Final = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"""
AGENT: Final = re.compile(r"trainjob-operator \((?P<identity>[^)]+)\)")


@dataclasses.dataclass(frozen=True)
class Audited:
    plane: ControlPlane
    log: Path


@dataclasses.dataclass(frozen=True)
class Write:
    """One write the API server received from a replica."""

    author: str
    received: datetime.datetime
    completed: datetime.datetime
    what: str


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    """A control plane of this module's own, with an audit log of every write."""
    folder = tmp_path_factory.mktemp("audit")
    policy = folder / "policy.yaml"
    policy.write_text(AUDIT_POLICY, encoding="utf-8")
    log = folder / "audit.log"
    flags = [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-format=json"]
    for plane in started_control_plane(flags):
        yield Audited(plane, log)


@pytest.fixture
def cluster(audited: Audited, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    api = k8s_config.new_client_from_config(config_file=str(audited.plane.kubeconfig))
    namespace = "ha-" + request.node.name.replace("_", "-")[5:40].strip("-")
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    audited.plane.wait_service_account(namespace)
    try:
        yield Cluster(api, namespace)
    finally:
        core.delete_namespace(namespace)
        api.close()


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def writes(log: Path, namespace: str) -> list[Write]:
    """Every write of an operator replica in `namespace` (the Lease's excepted), in order."""
    found: list[Write] = []
    for line in log.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        agent = AGENT.fullmatch(event.get("userAgent") or "")
        if agent is None or ref.get("namespace") != namespace or ref.get("resource") == "leases":
            continue
        found.append(
            Write(
                agent["identity"],
                _time(event["requestReceivedTimestamp"]),
                _time(event["stageTimestamp"]),
                f"{event['verb']} {ref.get('resource')}/{ref.get('name') or ''}",
            )
        )
    return sorted(found, key=lambda w: w.received)


def by_author(found: list[Write]) -> dict[str, list[Write]]:
    authors: dict[str, list[Write]] = {}
    for write in found:
        authors.setdefault(write.author, []).append(write)
    return authors


def assert_one_writer_at_a_time(found: list[Write], old: str, new: str) -> float:
    """The old leader's writes all ended before the new leader's first arrived (the audit
    log's times are to the microsecond); returns the gap between them in seconds. Not "no
    second saw writes of both": after a graceful stop the Lease is handed over at once, and
    the new leader's first write may come in the same second as the old one's last, strictly
    after it (seen once, 2026-11-30)."""
    authors = by_author(found)
    assert set(authors) <= {old, new}, f"writes from unknown replicas: {set(authors)}"
    assert authors.get(old), "the first leader wrote nothing"
    assert authors.get(new), "the new leader wrote nothing"
    last_old = max(w.completed for w in authors[old])
    first_new = min(w.received for w in authors[new])
    assert last_old < first_new, (
        f"the replicas' writes overlap: the old leader's last ended {last_old}, the new one's "
        f"first arrived {first_new}"
    )
    return (first_new - last_old).total_seconds()


class Replica:
    """An operator process with --leader-elect in the test's namespace."""

    def __init__(self, kubeconfig: Path, log: Path, namespace: str, *timing: str) -> None:
        self.process = operator_process.Operator(
            kubeconfig,
            log,
            f"--namespace={namespace}",
            "--leader-elect",
            f"--leader-election-namespace={namespace}",
            *timing,
        )

    def start(self) -> Replica:
        self.process.start()
        return self

    @property
    def identity(self) -> str:
        found = re.search(r"Standing by for the leader Lease \S+ as (\S+)", self.log())
        assert found, self.log()
        return found.group(1)

    def leader_metric(self) -> float | None:
        """trainjob_operator_leader on /metrics: 1 leader, 0 standby, None: not answering."""
        url = f"http://127.0.0.1:{self.process.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        found = re.search(r"^trainjob_operator_leader (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else None

    def probe(self) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.process.liveness_port}/healthz"
        with urllib.request.urlopen(url, timeout=2) as response:
            body: dict[str, object] = json.loads(response.read())
        return body

    def wait_role(self, leading: bool, timeout: float = T) -> float:
        """Wait until it leads (or stands by); returns the monotonic time it was seen so."""
        want = 1.0 if leading else 0.0
        self.process.wait_answering(
            lambda: self.leader_metric() == want,
            "the leader" if leading else "a standby",
            timeout,
        )
        return time.monotonic()

    def log(self) -> str:
        return self.process.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        self.process.stop()


def lease_spec(cluster: Cluster) -> k8s.V1LeaseSpec:
    leases = k8s.CoordinationV1Api(cluster.core.api_client)
    lease = leases.read_namespaced_lease(LEASE, cluster.namespace)
    assert lease.spec is not None
    return lease.spec


def holder(cluster: Cluster) -> str:
    return lease_spec(cluster).holder_identity or ""


def leader_then_standby(
    kubeconfig: Path, standby_kubeconfig: Path, cluster: Cluster, tmp: Path, *timing: str
) -> tuple[Replica, Replica]:
    first = Replica(kubeconfig, tmp / "a.log", cluster.namespace, *timing).start()
    first.wait_role(leading=True)
    second = Replica(standby_kubeconfig, tmp / "b.log", cluster.namespace, *timing).start()
    second.wait_role(leading=False)
    assert holder(cluster) == first.identity
    return first, second


def test_the_standby_writes_nothing_and_takes_over_from_a_killed_leader(
    audited: Audited, cluster: Cluster, tmp_path: Path
) -> None:
    kubeconfig = audited.plane.kubeconfig
    a, b = leader_then_standby(kubeconfig, kubeconfig, cluster, tmp_path, *SHORT)
    try:
        cluster.create_job(trainjob("one", chief=1, workers=1))
        cluster.wait_pods("one", {"one-chief-0", "one-worker-0"})
        cluster.wait_condition("one", "Created")
        time.sleep(2 * RETRY_S)  # bounded: a standby's write would arrive within this
        before = by_author(writes(audited.log, cluster.namespace))
        assert set(before) == {a.identity}, f"the standby wrote: {before.get(b.identity)}"
        assert b.probe()["leader"] == {
            "role": "standby",
            "identity": b.identity,
            "lease": f"{cluster.namespace}/{LEASE}",
            "holder": a.identity,
        }

        killed = time.monotonic()
        a.process.kill()
        took = b.wait_role(leading=True, timeout=LEASE_S + 10 * SLACK) - killed
        assert holder(cluster) == b.identity
        assert lease_spec(cluster).lease_transitions == 1
        # A takeover, not a release: it waited for the Lease to expire.
        assert LEASE_S - RETRY_S - SLACK / 4 <= took <= LEASE_S + RETRY_S + SLACK, took

        cluster.create_job(trainjob("two", chief=1, workers=1))
        cluster.wait_pods("two", {"two-chief-0", "two-worker-0"})
        cluster.wait_condition("two", "Created")
        gap = assert_one_writer_at_a_time(
            writes(audited.log, cluster.namespace), a.identity, b.identity
        )
        print(f"takeover after SIGKILL: {took:.2f}s (lease {LEASE_S}s, retry {RETRY_S}s)")
        save_figures(
            "ha-leader-killed.json",
            {"takeover after SIGKILL (s)": round(took, 2), "write gap (s)": round(gap, 2)},
        )
    finally:
        a.stop()
        b.stop()


def test_a_leader_cut_off_from_the_api_server_stops_writing_before_the_standby_starts(
    audited: Audited, cluster: Cluster, tmp_path: Path
) -> None:
    match = re.fullmatch(r"https://([^:]+):(\d+)", audited.plane.apiserver_url)
    assert match, audited.plane.apiserver_url
    proxy = TcpProxy(match.group(1), int(match.group(2)))
    config = yaml.safe_load(audited.plane.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    through_proxy = tmp_path / "kubeconfig"
    through_proxy.write_text(yaml.safe_dump(config))
    a, b = leader_then_standby(through_proxy, audited.plane.kubeconfig, cluster, tmp_path, *SHORT)
    # Jobs keep coming the whole time, so that both replicas have something to write.
    stop = threading.Event()
    made: list[str] = []

    def keep_creating() -> None:
        while not stop.wait(0.4):
            name = f"p{len(made)}"
            cluster.create_job(trainjob(name, chief=1, workers=0))
            made.append(name)

    creator = threading.Thread(target=keep_creating, name="job creator")
    creator.start()
    try:
        waits.wait_until(lambda: len(made) >= 5, timeout=T, what="jobs to be made")
        cut = time.monotonic()
        proxy.cut()
        took = b.wait_role(leading=True, timeout=LEASE_S + 10 * SLACK) - cut
        # Healed at once: a leader that kept writing after its renew deadline would now
        # land its writes beside the new leader's.
        proxy.heal()
        under_new = len(made)
        waits.wait_until(
            lambda: len(made) >= under_new + 5, timeout=T, what="jobs made under the new leader"
        )
        stop.set()
        creator.join(timeout=T)
        for name in list(made):
            cluster.wait_pods(name, {f"{name}-chief-0"}, timeout=T)
        # The old leader stepped down by its own clock and exited (status 1).
        waits.wait_until(lambda: not a.process.running(), timeout=T, what="the old leader to exit")
        process = a.process.process
        assert process is not None and process.returncode == 1, a.process.log_tail()
        assert "Lost the leader Lease" in a.log()
        assert holder(cluster) == b.identity
        gap = assert_one_writer_at_a_time(
            writes(audited.log, cluster.namespace), a.identity, b.identity
        )
        print(f"takeover after the cut: {took:.2f}s; no writes for {gap:.2f}s in between")
        assert took <= LEASE_S + RETRY_S + SLACK, took
        assert gap >= LEASE_S - RENEW_S - SLACK / 4, gap
        save_figures(
            "ha-leader-partitioned.json",
            {"takeover after the cut (s)": round(took, 2), "write gap (s)": round(gap, 2)},
        )
    finally:
        stop.set()
        creator.join(timeout=T)
        a.stop()
        b.stop()
        proxy.close()


def test_a_graceful_stop_hands_the_lease_over_at_once(
    audited: Audited, cluster: Cluster, tmp_path: Path
) -> None:
    # client-go's default lease duration: a takeover by expiry would take 15 s or more.
    timing = (
        "--leader-elect-lease-duration=15",
        "--leader-elect-renew-deadline=10",
        f"--leader-elect-retry-period={RETRY_S}",
    )
    kubeconfig = audited.plane.kubeconfig
    a, b = leader_then_standby(kubeconfig, kubeconfig, cluster, tmp_path, *timing)
    try:
        cluster.create_job(trainjob("before", chief=1, workers=0))
        cluster.wait_pods("before", {"before-chief-0"})
        cluster.wait_condition("before", "Created")
        stopped = time.monotonic()
        process = a.process.process
        assert process is not None
        process.send_signal(signal.SIGTERM)  # what the kubelet sends; kopf stops gracefully
        took = b.wait_role(leading=True, timeout=15.0) - stopped
        waits.wait_until(lambda: not a.process.running(), timeout=T, what="the old leader to stop")
        assert process.returncode == 0, a.process.log_tail()
        assert "Released the leader Lease" in a.log()
        assert took < 5.0, f"the standby took {took:.1f}s: it waited for the Lease to expire"
        cluster.create_job(trainjob("after", chief=1, workers=0))
        cluster.wait_pods("after", {"after-chief-0"})
        cluster.wait_condition("after", "Created")
        gap = assert_one_writer_at_a_time(
            writes(audited.log, cluster.namespace), a.identity, b.identity
        )
        print(f"handover on a graceful stop: {took:.2f}s (lease 15s)")
        save_figures(
            "ha-graceful-handover.json",
            {"handover after SIGTERM (s)": round(took, 2), "write gap (s)": round(gap, 2)},
        )
    finally:
        a.stop()
        b.stop()
