"""Watch loss for real: the operator's watches broken on a real API server, not a scripted one.

The API server here runs with `--watch-cache=false`, so a watch reads etcd directly and a
resume from a compacted resourceVersion is answered 410 Gone, as on a busy cluster whose
history moved on while the operator was cut off. The operator reaches the API server through
a TCP proxy on loopback (tests/integration/tcp_proxy.py) that can partition it or freeze its
connections.

- Partition + compaction: while the operator is cut off, the job's Pods finish and etcd is
  compacted past every version the operator saw. On reconnect its Pod watch gets 410, lists
  again, and the job is decided from the list (Succeeded, no restart), not from the Pods it
  remembered as Running.
- Stalled streams: every connection open now stops forwarding but stays open (no FIN, no
  RST). The operator notices within `--watch-idle-seconds` and watches again on a fresh
  connection: a Pod that finished and a job suspended meanwhile are both acted on.
- The same stall seen by kube.py in-process: the idle keep-alive connections in its pool
  were frozen too, and a request after the stall must not be sent on one of them (it would
  wait out the whole request timeout: CI once saw a stalled job acted on after 61 s).
- A watch still streaming when the session retired by another's silence closes: it ends and
  resumes from its last version on a fresh session, instead of reading a closed connection
  for good (the operator was deaf to every job from then on).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
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
from trainjob.core import constants
from trainjob_operator import kube

pytestmark = pytest.mark.integration
logger = logging.getLogger(__name__)

IDLE = 4  # --watch-idle-seconds for the stall test
T = 60.0


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """A control plane of this module's own: the tests break it on purpose."""
    yield from started_control_plane(["--watch-cache=false"])


@pytest.fixture
def proxy(plane: ControlPlane) -> Iterator[TcpProxy]:
    match = re.fullmatch(r"https://([^:]+):(\d+)", plane.apiserver_url)
    assert match, plane.apiserver_url
    tcp = TcpProxy(match.group(1), int(match.group(2)))
    try:
        yield tcp
    finally:
        tcp.close()


@pytest.fixture
def cluster(plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
    namespace = "wl-" + request.node.name.replace("_", "-")[5:40].strip("-")
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    plane.wait_service_account(namespace)
    try:
        yield Cluster(api, namespace)
    finally:
        core.delete_namespace(namespace)
        api.close()


def kubeconfig_through(plane: ControlPlane, proxy: TcpProxy, path: Path) -> Path:
    config = yaml.safe_load(plane.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(config))
    return path


def running_job(cluster: Cluster, name: str) -> set[str]:
    pods = {f"{name}-worker-0", f"{name}-worker-1"}
    cluster.create_job(trainjob(name, chief=0, workers=2))
    cluster.run_all(name, pods)
    cluster.wait_condition(name, "Running", timeout=T)
    return pods


def state(cluster: Cluster, name: str) -> str:
    return str(((cluster.job(name) or {}).get("status") or {}).get("state"))


def test_a_partition_past_a_compaction_lists_again_and_decides_from_the_list(
    plane: ControlPlane, proxy: TcpProxy, cluster: Cluster, tmp_path: Path
) -> None:
    kubeconfig = kubeconfig_through(plane, proxy, tmp_path / "kubeconfig")
    log = tmp_path / "operator.log"
    operator = operator_process.Operator(
        kubeconfig, log, f"--namespace={cluster.namespace}"
    ).start()
    try:
        pods = running_job(cluster, "cut")
        proxy.cut()
        for pod in sorted(pods):
            cluster.set_exited(pod, 0)
        compacted = plane.compact_etcd()
        time.sleep(1.0)  # a few refused reconnects: the operator knows it is cut off
        proxy.heal()
        waits.wait_until(lambda: state(cluster, "cut") == "Succeeded", timeout=T, what="Succeeded")
        status = (cluster.job("cut") or {})["status"]
        assert status["restartCount"] == 0, status
        text = log.read_text()
        assert re.search(r"Watch of pods in \S+ expired; listing again", text), (
            f"no 410 relist after compacting to {compacted}:\n{operator.log_tail()}"
        )
        assert operator.running(), operator.log_tail()
        relists = len(re.findall(r"expired; listing again", text))
        save_figures(
            "watch-loss-partition.json",
            {
                "partition + etcd compaction: relists after 410 Gone": relists,
                "  job decided from the list (Succeeded, no restart)": "yes",
            },
        )
    finally:
        operator.stop()


def test_a_stalled_stream_is_noticed_and_watched_again(
    plane: ControlPlane, proxy: TcpProxy, cluster: Cluster, tmp_path: Path
) -> None:
    kubeconfig = kubeconfig_through(plane, proxy, tmp_path / "kubeconfig")
    log = tmp_path / "operator.log"
    operator = operator_process.Operator(
        kubeconfig, log, f"--namespace={cluster.namespace}", f"--watch-idle-seconds={IDLE}"
    ).start()
    try:
        finishing = running_job(cluster, "fin")
        running_job(cluster, "sus")
        frozen = proxy.stall()
        assert frozen >= 3, frozen  # the TrainJob, Pod and Service watches
        stalled_at = time.monotonic()
        for pod in sorted(finishing):
            cluster.set_exited(pod, 0)
        cluster.patch_job("sus", {"spec": {"runPolicy": {"suspend": True}}})
        # Noticed through a fresh connection by the Pod watch and the TrainJob watch, each
        # within the idle window plus a reconcile.
        waits.wait_until(lambda: state(cluster, "fin") == "Succeeded", timeout=T, what="Succeeded")
        waits.wait_until(
            lambda: not cluster.pods("sus"), timeout=T, what="suspended job's Pods gone"
        )
        took = time.monotonic() - stalled_at
        print(f"stalled connections: {frozen}; both jobs acted on after {took:.1f}s")
        assert took < IDLE + 30, took
        assert f"silent for {IDLE}s; watching again" in log.read_text(), operator.log_tail()
        save_figures(
            "watch-loss-stall.json",
            {
                "stalled connections (open, forwarding nothing)": frozen,
                f"  a Pod change and a suspend acted on after (idle {IDLE} s)": f"{took:.1f} s",
            },
        )
    finally:
        operator.stop()


DISCOVERY = (constants.GROUP, constants.VERSION, constants.PLURAL)


def kube_through_proxy(
    plane: ControlPlane, proxy: TcpProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> kube.Kube:
    """The operator's API client, logged in through the proxy, with 4 connections and the
    stall test's idle limit."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_through(plane, proxy, tmp_path / "kc")))
    return kube.Kube(
        lambda: kube.login(kopf.OperatorSettings(), logger),
        connections=4,
        watch_idle_seconds=IDLE,
    )


async def stall_a_watch(api: kube.Kube, proxy: TcpProxy) -> tuple[asyncio.Future[Any], int]:
    """Four keep-alive connections left idle in the pool, a watch's request out, then the
    proxy stalled: -> the watch's first event (None once it notices the silence), and how
    many connections were frozen."""
    # Four requests at once leave four keep-alive connections idle in the pool.
    assert all(await asyncio.gather(*(api.serves(*DISCOVERY) for _ in range(4))))
    listing = await api.list_labelled("default", "pods", "trainjob.dev/none")
    stream = api.watch_labelled("default", "pods", "trainjob.dev/none", listing.resource_version)
    first = asyncio.ensure_future(anext(stream, None))
    await asyncio.sleep(0.5)  # the watch's request is out: its connection is open
    return first, proxy.stall()


def test_after_a_stalled_watch_requests_go_out_on_fresh_connections(
    plane: ControlPlane, proxy: TcpProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = kube_through_proxy(plane, proxy, tmp_path, monkeypatch)

    async def scenario() -> tuple[int, float]:
        try:
            first, frozen = await stall_a_watch(api, proxy)
            # The watch notices the silence after IDLE seconds and ends its stream.
            assert await asyncio.wait_for(first, timeout=IDLE + 10) is None
            started = time.monotonic()
            # Before the fix this went out on a frozen pooled connection and waited out
            # REQUEST_TIMEOUT (60 s); the wait_for turns that into a plain failure sooner.
            assert await asyncio.wait_for(api.serves(*DISCOVERY), timeout=20)
            return frozen, time.monotonic() - started
        finally:
            await api.close()

    frozen, took = asyncio.run(scenario())
    assert frozen >= 3, frozen  # the watch's connection and the idle pooled ones
    assert took < 5, took


def test_a_request_caught_by_the_stall_before_it_is_noticed_fails_soon_and_is_retried(
    plane: ControlPlane, proxy: TcpProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request sent on a pooled connection after the path stalled but before the watch
    noticed: it ends when the retired session closes, IDLE seconds after the silence was
    noticed, as a TransientError the caller retries, not after the 60-s REQUEST_TIMEOUT."""
    api = kube_through_proxy(plane, proxy, tmp_path, monkeypatch)

    async def scenario() -> tuple[BaseException | None, float, bool]:
        try:
            first, _ = await stall_a_watch(api, proxy)
            stalled_at = time.monotonic()
            caught = asyncio.ensure_future(
                api.list_labelled("default", "pods", "trainjob.dev/none")
            )
            assert await asyncio.wait_for(first, timeout=IDLE + 10) is None
            # Before the fix this waited out REQUEST_TIMEOUT (60 s); wait_for ends it sooner.
            error = None
            try:
                await asyncio.wait_for(caught, timeout=30)
            except kube.TransientError as exc:
                error = exc
            took = time.monotonic() - stalled_at
            # The retry goes out on a fresh connection and is answered.
            retried = await asyncio.wait_for(
                api.list_labelled("default", "pods", "trainjob.dev/none"), timeout=20
            )
            return error, took, retried is not None
        finally:
            await api.close()

    error, took, answered = asyncio.run(scenario())
    assert isinstance(error, kube.TransientError), error
    assert "unreachable" in str(error), error
    assert took < 2 * IDLE + 5, took
    assert answered


def test_a_watch_streaming_when_its_retired_session_closes_resumes_on_a_fresh_one(
    plane: ControlPlane,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One quiet watch, silent for IDLE seconds, retires the session; it closes IDLE seconds
    later. A busy watch on that same session (a ConfigMap changed twice a second) must end
    when it closes, as if the server had ended it, and resume from its last version on a
    fresh session. aiohttp leaves a read on a closed session waiting for good (no event, no
    error, no read timeout): the operator was deaf to every job from then on (CI: the TFJob
    differential test's operator created no Pod for any job after its nodes watch had been
    quiet for 70 s)."""
    monkeypatch.setenv("KUBECONFIG", str(plane.kubeconfig))
    api = kube.Kube(
        lambda: kube.login(kopf.OperatorSettings(), logger),
        connections=4,
        watch_idle_seconds=IDLE,
    )
    client = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
    core = k8s.CoreV1Api(client)
    name, selector = "busy", "trainjob.dev/busy=yes"
    core.create_namespaced_config_map(
        "default",
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name=name, labels={"trainjob.dev/busy": "yes"}),
            data={"n": "0"},
        ),
    )

    def touch(n: int) -> None:
        core.patch_namespaced_config_map(name, "default", {"data": {"n": str(n)}})

    async def toucher() -> None:
        for n in range(1, 10_000):
            await asyncio.to_thread(touch, n)
            await asyncio.sleep(0.5)

    async def read_until_it_ends(stream: Any, seen: list[tuple[int, str]]) -> None:
        async for event in stream:
            body = event.get("object") or {}
            if event.get("type") != "BOOKMARK":
                seen.append((int(body["data"]["n"]), body["metadata"]["resourceVersion"]))

    async def scenario() -> tuple[float, float, list[tuple[int, str]], list[tuple[int, str]]]:
        touching = asyncio.ensure_future(toucher())
        try:
            quiet_from = await api.list_labelled("default", "pods", "trainjob.dev/none")
            busy_from = await api.list_labelled("default", "configmaps", selector)
            quiet = api.watch_labelled(
                "default", "pods", "trainjob.dev/none", quiet_from.resource_version
            )
            before: list[tuple[int, str]] = []
            busy = asyncio.ensure_future(
                read_until_it_ends(
                    api.watch_labelled(
                        "default", "configmaps", selector, busy_from.resource_version
                    ),
                    before,
                )
            )
            started = time.monotonic()
            assert await asyncio.wait_for(anext(quiet, None), timeout=IDLE + 10) is None
            silent_after = time.monotonic() - started
            try:
                await asyncio.wait_for(busy, timeout=IDLE + 20)
            except asyncio.TimeoutError:
                raise AssertionError(
                    f"the busy watch was still waiting {IDLE + 20} s after the quiet one "
                    f"retired the session (closed {IDLE} s later): deaf, having seen "
                    f"{len(before)} changes"
                ) from None
            ended_after = time.monotonic() - started
            assert before, "the busy watch saw no change before the session closed"
            after: list[tuple[int, str]] = []
            resumed = api.watch_labelled("default", "configmaps", selector, before[-1][1])
            reading = asyncio.ensure_future(read_until_it_ends(resumed, after))
            deadline = time.monotonic() + 20
            while len(after) < 3:
                assert time.monotonic() < deadline, f"the resumed watch saw only {after}"
                await asyncio.sleep(0.2)
            reading.cancel()
            return silent_after, ended_after, before, after
        finally:
            touching.cancel()
            await api.close()

    try:
        with caplog.at_level(logging.INFO, logger="trainjob_operator.kube"):
            silent_after, ended_after, before, after = asyncio.run(scenario())
    finally:
        core.delete_namespaced_config_map(name, "default")
        client.close()
    # It ended when the session closed (IDLE after the retire), not by going silent itself.
    assert not [r for r in caplog.records if "configmaps" in r.getMessage()], caplog.text
    assert silent_after >= IDLE and ended_after >= silent_after, (silent_after, ended_after)
    # Resumed from its last version: the next change is the one after, nothing lost.
    assert after[0][0] == before[-1][0] + 1, (before[-3:], after[:3])
    assert [n for n, _ in after] == sorted(n for n, _ in after), after
