"""Progress reports on a real API server: the operator's HTTPS endpoint, tokens requested
with the TokenRequest API bound to the job's Pods (as the kubelet does for the projected
volume), TokenReview by the real API server, status.progress written under the budget.

One operator for the module (serving namespaces `test-progress-*`), progress on, a status
write budget of 2 a second. Its certificate is the test control plane's serving certificate
(SANs 127.0.0.1 and localhost), its CA the plane's CA.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from kubernetes import client as k8s

from tests.controlplane.cluster import ControlPlane
from tests.integration.operator_harness import TEST_IMAGE, Cluster, meta, pod_spec, trainjob
from tests.support import kubelet, operator_process, ports, waits
from trainjob.core import constants, termination
from trainjob.core import progress as core_progress

pytestmark = pytest.mark.integration

T = 30.0
BUDGET = 2.0  # status writes a second


@pytest.fixture(scope="module")
def progress_operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    root = tmp_path_factory.mktemp("progress-operator")
    certs = root / "certs"
    certs.mkdir()
    pki = control_plane.pki
    shutil.copy(pki.serving_cert, certs / "tls.crt")
    shutil.copy(pki.serving_key, certs / "tls.key")
    shutil.copy(pki.ca_cert, certs / "ca.crt")
    port = ports.free_port()
    op = operator_process.Operator(
        control_plane.kubeconfig,
        root / "operator.log",
        "--namespace=test-progress-*",
        f"--progress-port={port}",
        f"--progress-url=https://127.0.0.1:{port}",
        f"--progress-cert-dir={certs}",
        f"--progress-status-writes={BUDGET:g}",
    ).start()
    op.progress_port = port  # type: ignore[attr-defined]
    try:
        yield op.wait_answering(lambda: _reachable(port), "the operator's progress endpoint", T)
    finally:
        op.stop()
        print(f"operator log:\n{op.log_tail(30)}")


def _reachable(port: int) -> bool:
    try:
        _post(port, "/", b"{}", None, pki_ca=None)
    except OSError:
        return False
    return True


@pytest.fixture
def cluster(
    progress_operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    assert namespace.startswith("test-progress-"), namespace
    yield Cluster(api_client, namespace)
    print(f"operator log, last lines:\n{progress_operator.log_tail(25)}")


# -- helpers ----------------------------------------------------------------------------------

_CA: dict[str, ssl.SSLContext] = {}
Reply = tuple[int, dict[str, str], dict[str, Any]]  # status, headers, JSON body


def _post(
    port: int,
    path: str,
    body: bytes,
    token: str | None,
    *,
    pki_ca: Path | None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, JSON body) of one POST to the operator's progress endpoint."""
    if pki_ca is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = _CA.setdefault(str(pki_ca), ssl.create_default_context(cafile=str(pki_ca)))
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}", data=body, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            data = json.loads(payload or b"{}")
        except ValueError:
            data = {"raw": payload.decode("utf-8", "replace")}
        return exc.code, dict(exc.headers), data


class Reporter:
    """Posts reports for one job, as a Pod would."""

    def __init__(
        self, plane: ControlPlane, op: operator_process.Operator, namespace: str, job: str
    ) -> None:
        self.ca = plane.pki.ca_cert
        self.port: int = op.progress_port  # type: ignore[attr-defined]
        self.path = core_progress.report_path(namespace, job)

    def post(
        self, report: dict[str, Any] | bytes, token: str | None, **kw: Any
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        body = report if isinstance(report, bytes) else json.dumps(report).encode()
        return _post(self.port, self.path, body, token, pki_ca=self.ca, **kw)


FLOODERS = 10


def _flood_of_unknown_tokens(reporter: Reporter, report: dict[str, Any]) -> list[int]:
    """The codes of a flood of reports with tokens nobody issued, sent from FLOODERS
    connections at once until one is refused with 429 (or T passes).

    A flood is concurrent: one request after another is paced by its own TokenReview, and on a
    loaded machine (a CI run: 30 sequential posts took 2.5 s) that pace stays under the
    address's refill rate, so the limit is never reached, rightly."""
    refused = threading.Event()
    deadline = time.monotonic() + T
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    def flood() -> list[int]:
        codes: list[int] = []
        while not refused.is_set() and time.monotonic() < deadline:
            with lock:
                number = next(counter)
            code = reporter.post(report, f"not-a-token-{number}")[0]
            codes.append(code)
            if code == 429:
                refused.set()
        return codes

    with concurrent.futures.ThreadPoolExecutor(FLOODERS) as pool:
        return [code for part in pool.map(lambda _: flood(), range(FLOODERS)) for code in part]


def _pod_token(cluster: Cluster, pod: str, audience: str) -> str:
    """A token of the Pod's service account bound to the Pod, as the kubelet requests it."""
    live = cluster.pod(pod)
    assert live is not None
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(
            audiences=[audience],
            expiration_seconds=600,
            bound_object_ref=k8s.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod, uid=meta(live).uid
            ),
        )
    )
    account = pod_spec(live).service_account_name or "default"
    reply = cluster.core.create_namespaced_service_account_token(
        account, cluster.namespace, request
    )
    assert reply.status is not None
    return str(reply.status.token)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _expired_token(plane: ControlPlane, cluster: Cluster, pod: str, audience: str) -> str:
    """A Pod-bound token exactly as the API server issues them, signed with the plane's
    service-account key, that expired a minute ago (TokenRequest refuses lifetimes under 10
    minutes, so an expired token cannot be requested)."""
    live = cluster.pod(pod)
    account = cluster.core.read_namespaced_service_account("default", cluster.namespace)
    key = serialization.load_pem_private_key(plane.pki.sa_key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and live is not None
    now = int(time.time())
    claims = {
        "aud": [audience],
        "exp": now - 60,
        "iat": now - 700,
        "nbf": now - 700,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": f"system:serviceaccount:{cluster.namespace}:default",
        "kubernetes.io": {
            "namespace": cluster.namespace,
            "pod": {"name": pod, "uid": meta(live).uid},
            "serviceaccount": {"name": "default", "uid": meta(account).uid},
        },
    }
    header = {"alg": "ES256", "typ": "JWT"}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    r, s = utils.decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _progress(cluster: Cluster, job: str) -> dict[str, Any]:
    status = (cluster.job(job) or {}).get("status") or {}
    return dict(status.get("progress") or {})


def _metric(op: operator_process.Operator, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def _printed(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The job's row as `kubectl get tj` receives it: the server-side Table of the CRD's
    printer columns, by column name."""
    method, url, headers, _, _ = api.param_serialize(
        "GET",
        f"/apis/{constants.API_VERSION}/namespaces/{namespace}/trainjobs/{name}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers)
    table = json.loads(response.read() or b"{}")
    assert table["kind"] == "Table", table
    names = [column["name"] for column in table["columnDefinitions"]]
    return dict(zip(names, table["rows"][0]["cells"], strict=True))


def _start_job(cluster: Cluster, name: str) -> dict[str, k8s.V1Pod]:
    cluster.create_job(trainjob(name, chief=1, workers=1))
    pods = cluster.wait_pods(name, {f"{name}-chief-0", f"{name}-worker-0"}, timeout=T)
    cluster.run_all(name, set(pods))
    return pods


# -- tests ------------------------------------------------------------------------------------


def test_progress_pods_get_a_job_token_and_the_ca(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    pods = _start_job(cluster, "tok")
    pod = pods["tok-chief-0"]
    spec = pod_spec(pod)
    volume = next(v for v in spec.volumes or [] if v.name == constants.PROGRESS_VOLUME_NAME)
    assert volume.projected is not None and volume.projected.sources is not None
    token = volume.projected.sources[0].service_account_token
    assert token is not None
    assert token.audience == core_progress.audience(cluster.namespace, "tok")
    assert (meta(pod).annotations or {})[constants.ANNOTATION_PROGRESS_CA] == (
        control_plane.pki.ca_cert.read_text()
    )
    assert spec.automount_service_account_token is False  # training needs no API rights
    env = {e.name: e.value for e in spec.containers[0].env or []}
    url = env[constants.ENV_PROGRESS_URL]
    assert url is not None
    assert url.endswith(core_progress.report_path(cluster.namespace, "tok"))


def test_progress_accepted_refused_and_written_within_budget(
    cluster: Cluster, control_plane: ControlPlane, progress_operator: operator_process.Operator
) -> None:
    ns = cluster.namespace
    _start_job(cluster, "a")
    _start_job(cluster, "b")
    job_a = Reporter(control_plane, progress_operator, ns, "a")
    audience = core_progress.audience(ns, "a")
    chief = _pod_token(cluster, "a-chief-0", audience)
    report = {
        "epoch": 3,
        "totalEpochs": 10,
        "step": 450,
        "totalSteps": 1000,
        "loss": 0.23141,
        "metrics": {"accuracy": 0.91},
        "etaSeconds": 240,
        "examplesPerSecond": 812.5,
    }

    def served() -> Reply | None:
        reply = job_a.post(report, chief)
        return reply if reply[0] not in (429, 503) else None

    # Accepted, and visible in status within one budget slot (+ slack for a loaded machine).
    sent = time.monotonic()
    code, _, body = waits.wait_until(
        served, timeout=T, what="job a served by the operator (not 503)"
    )
    assert code == 202, body
    shown = waits.wait_until(
        lambda: _progress(cluster, "a").get("summary"), timeout=T, what="status"
    )
    visible_after = time.monotonic() - sent
    assert shown == "45% (3/10)"
    progress = _progress(cluster, "a")
    assert progress["eta"] == "4m" and progress["loss"] == 0.2314
    assert progress["replica"] == "chief-0" and progress["lastUpdateTime"]
    assert visible_after < 1 / BUDGET + 5, visible_after

    refusals: dict[str, tuple[int, str]] = {}

    def refused(what: str, result: tuple[int, dict[str, str], dict[str, Any]]) -> None:
        refusals[what] = (result[0], str(result[2].get("error", ""))[:90])

    # Wrong audience: a token of this very Pod, but for the API server's default audience.
    refused("no token", job_a.post(report, None))
    wrong = _pod_token(cluster, "a-chief-0", "https://kubernetes.default.svc.cluster.local")
    refused("wrong audience", job_a.post(report, wrong))
    # Job b's token (its audience) sent to job a; and b's Pod with a's audience.
    b_token = _pod_token(cluster, "b-chief-0", core_progress.audience(ns, "b"))
    refused("other job's token", job_a.post(report, b_token))
    b_pod_a_audience = _pod_token(cluster, "b-chief-0", audience)
    refused("other job's pod", job_a.post(report, b_pod_a_audience))
    refused(
        "expired token",
        job_a.post(report, _expired_token(control_plane, cluster, "a-worker-0", audience)),
    )
    refused("oversized body", job_a.post(b"{" + b" " * 20_000 + b"}", chief))
    refused("not JSON", job_a.post(b"epoch=3", chief, content_type="text/plain"))
    refused("invalid field", job_a.post({"step": -1}, chief))
    assert {k: v[0] for k, v in refusals.items()} == {
        "no token": 401,
        "wrong audience": 401,
        "other job's token": 401,
        "other job's pod": 403,
        "expired token": 401,
        "oversized body": 413,
        "not JSON": 415,
        "invalid field": 400,
    }, refusals
    assert "step" in refusals["invalid field"][1]

    # A flood from one Pod: 429 with Retry-After once its burst is spent.
    worker = _pod_token(cluster, "a-worker-0", audience)
    codes = []
    retry_after = None
    for step in range(12):
        code, headers, _ = job_a.post({**report, "step": 451 + step}, worker)
        codes.append(code)
        retry_after = retry_after or headers.get("Retry-After")
    assert 429 in codes and codes[0] == 202 and retry_after and int(retry_after) >= 1, codes
    refusals["flood (12 reports at once)"] = (
        429,
        f"{codes.count(429)} of 12, Retry-After {retry_after}",
    )

    # A flood of unknown tokens from one address: 429 before any TokenReview is asked for.
    bad_codes = _flood_of_unknown_tokens(job_a, report)
    assert 429 in bad_codes and set(bad_codes) <= {401, 429}, bad_codes
    refusals[f"flood of bad tokens ({len(bad_codes)} from {FLOODERS} connections)"] = (
        429,
        f"{bad_codes.count(429)} of {len(bad_codes)} by address, the rest 401",
    )

    # The budget: 8 reports over ~2 s from several jobs' Pods coalesce into few writes.
    before = _metric(progress_operator, "trainjob_progress_status_writes_total")
    b_reporter = Reporter(control_plane, progress_operator, ns, "b")
    started = time.monotonic()
    for i in range(4):
        assert job_a.post({**report, "step": 500 + i}, chief)[0] in (202, 429)
        assert b_reporter.post({**report, "step": 600 + i}, b_token)[0] in (202, 429)
        time.sleep(0.5)  # the Pods' reporting pace, compressed
    waits.wait_until(
        lambda: (
            _progress(cluster, "b").get("step") == 603
            and _progress(cluster, "a").get("step") == 503
        ),
        timeout=T,
        what="the latest reports in status",
    )
    elapsed = time.monotonic() - started
    writes = _metric(progress_operator, "trainjob_progress_status_writes_total") - before
    assert writes <= BUDGET * elapsed + 2, (writes, elapsed)

    # A deleted Pod's token is refused even while its review is cached.
    cluster.core.delete_namespaced_pod("b-chief-0", ns, grace_period_seconds=0)

    def refused_now() -> Reply | None:
        reply = b_reporter.post(report, b_token)
        return reply if reply[0] in (401, 403) else None

    result = waits.wait_until(refused_now, timeout=T, what="the deleted Pod's token refused")
    refused("deleted pod (review cached)", result)
    assert result[0] == 403, result

    # A final report is written at once, whatever the budget.
    final = {**report, "state": "Succeeded", "step": 1000, "epoch": 10}
    assert job_a.post(final, chief)[0] in (202, 429)
    waits.wait_until(
        lambda: _progress(cluster, "a").get("summary") == "100% (10/10)",
        timeout=T,
        what="the final report",
    )
    print("refused requests:\n" + "\n".join(f"  {k}: {v[0]} {v[1]}" for k, v in refusals.items()))


def test_progress_final_figures_from_the_termination_message(
    cluster: Cluster, control_plane: ControlPlane
) -> None:
    """The chief ended between two reports: its termination message carries the final figures."""
    _start_job(cluster, "term")
    final = core_progress.Report(
        replica="chief-0",
        state="Succeeded",
        epoch=5,
        total_epochs=5,
        step=500,
        total_steps=500,
        loss=0.1,
        time=time.time(),
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": now,
        "finishedAt": now,
        "message": termination.with_report(final),
    }
    container = kubelet.container_status({"terminated": terminated}, image=TEST_IMAGE, ready=False)
    cluster.core.patch_namespaced_pod_status(
        "term-chief-0", cluster.namespace, kubelet.pod_status("Succeeded", container)
    )
    waits.wait_until(
        lambda: _progress(cluster, "term").get("summary") == "100% (5/5)",
        timeout=T,
        what="final progress from the termination message",
    )
    cluster.wait_condition("term", "Succeeded", timeout=T)
    table = subprocess.run(
        [
            str(control_plane.kubectl_path),
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "get",
            "tj",
            "term",
            "-n",
            cluster.namespace,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    header, row = table.splitlines()[:2]
    assert "PROGRESS" in header and "ETA" in header and "LOSS" in header, table
    assert "100% (5/5)" in row and "0.1" in row, table


def test_progress_devices_of_every_replica_in_status_and_the_devices_column(
    cluster: Cluster,
    control_plane: ControlPlane,
    progress_operator: operator_process.Operator,
    api_client: k8s.ApiClient,
) -> None:
    """The chief's reports carry its devices; worker 0 (not the reporting replica) sends one
    report of its devices when it starts: both land in status per replica, the job's line in
    the Devices column, and the worker's report never replaces the chief's progress."""
    ns = cluster.namespace
    _start_job(cluster, "dev")
    job = Reporter(control_plane, progress_operator, ns, "dev")
    audience = core_progress.audience(ns, "dev")
    chief = _pod_token(cluster, "dev-chief-0", audience)
    worker = _pod_token(cluster, "dev-worker-0", audience)
    gpus = {"gpus": 2, "names": ["GPU:0", "GPU:1"], "cudaBuild": True, "cudaVersion": "12.5"}
    report = {"replica": "chief-0", "step": 40, "totalSteps": 100, "devices": gpus}

    def served() -> Reply | None:
        reply = job.post({**report, "time": time.time()}, chief)
        return reply if reply[0] not in (429, 503) else None

    code, _, body = waits.wait_until(served, timeout=T, what="job dev served (not 503)")
    assert code == 202, body
    waits.wait_until(
        lambda: _progress(cluster, "dev").get("deviceSummary") == "2 GPU",
        timeout=T,
        what="the chief's devices in status",
    )
    # A garbage devices field is refused naming it (the endpoint's 400), not a traceback.
    code, _, body = job.post({"devices": {"gpus": "two"}}, worker)
    assert code == 400 and body["error"].startswith("devices.gpus:"), body
    code, _, body = job.post({"devices": [1]}, worker)
    assert code == 400 and body["error"].startswith("devices:"), body
    # Worker 0 trains on its CPU (a CUDA build that sees no GPU): said, not silent.
    cpu = {"gpus": 0, "cudaBuild": True, "cudaVersion": "12.5"}
    announce = {"replica": "worker-0", "devices": cpu, "time": time.time()}
    assert job.post(announce, worker)[0] == 202
    waits.wait_until(
        lambda: _progress(cluster, "dev").get("deviceSummary") == "2 GPU + CPU",
        timeout=T,
        what="worker 0's devices folded into the job's line",
    )
    progress = _progress(cluster, "dev")
    assert progress["replicaDevices"] == {"chief-0": gpus, "worker-0": cpu}, progress
    # The job's progress is still the chief's.
    assert (progress["replica"], progress["step"], progress["summary"]) == (
        "chief-0",
        40,
        "40% (40/100)",
    ), progress
    # The chief's next report (the operator keeps what worker 0 said).
    assert job.post({**report, "step": 50, "time": time.time()}, chief)[0] in (202, 429)
    waits.wait_until(
        lambda: _progress(cluster, "dev").get("step") == 50, timeout=T, what="the next report"
    )
    assert _progress(cluster, "dev")["deviceSummary"] == "2 GPU + CPU"
    # What kubectl get tj shows: the CRD's printer column, from the server-side Table.
    row = _printed(api_client, ns, "dev")
    assert row["Devices"] == "2 GPU + CPU" and row["Progress"] == "50% (50/100)", row
