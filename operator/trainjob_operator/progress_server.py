"""The HTTPS endpoint where training Pods report progress (aiohttp, in kopf's event loop).

    POST /v1/namespaces/{namespace}/trainjobs/{name}/progress
    Authorization: Bearer <the Pod's projected token, audience trainjob.dev/progress/{ns}/{name}>
    Content-Type: application/json
    <a report: trainjob.core.progress; a replica other than the chief sends one report of
     its replica and `devices` when it starts, folded into status per replica>

Answers (a JSON body {"error": ...} names the problem):
  202 accepted (kept as the job's latest; written to status under the write budget)
  400 the report is invalid (the field is named)   401 no token, or the API server did not
  authenticate it for this job's audience (expired, another job's, deleted Pod's)
  403 authenticated, but not a current Pod of this job   404 not a report path
  413 body over 16 KiB   415 not JSON   429 too many reports (Retry-After)
  503 this operator does not serve the job now (a standby replica, or still starting;
  Retry-After)

Checks are ordered cheapest first, so that a flood costs least where it is least trusted:
size, token present, per-address limit (for tokens not already reviewed: what may cost a
TokenReview), job served, TokenReview (cached), Pod membership, per-Pod limit, and only then
the body is parsed.

Certificates: tls.crt / tls.key / ca.crt in `--progress-cert-dir`, a Secret the kubelet mounts
(Helm generates it, or cert-manager or you provide it): the operator never reads Secrets
through the API. The files are re-read when they change, so a rotated certificate is served
without a restart; `ca.crt` goes into new Pods (see render.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import Final

import prometheus_client
from aiohttp import web

from trainjob.core import progress, render
from trainjob_operator import (
    children,
    config,
    context,
    kube,
    leader,
    metrics,
    progress_auth,
    progress_status,
)

logger = logging.getLogger(__name__)

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"
RELOAD_SECONDS: Final = 30.0
NOT_SERVED_RETRY_SECONDS: Final = 5
KEEPALIVE_SECONDS: Final = 4.0
ROUTE: Final = "/v1/namespaces/{namespace}/trainjobs/{name}/progress"


def certificate_problem(cert_dir: str) -> str | None:
    """Why the progress endpoint cannot serve with the files in `cert_dir` (None: it can),
    checked once at start so that a missing or broken Secret is one clear line."""
    cert, key, ca = (os.path.join(cert_dir, f) for f in (CERT_FILE, KEY_FILE, CA_FILE))
    for path in (cert, key, ca):
        if not os.path.isfile(path):
            return f"--progress-cert-dir: {path} does not exist (tls.crt, tls.key, ca.crt needed)"
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError, ValueError) as exc:
        return f"--progress-cert-dir: {cert_dir} holds no usable certificate, key and CA: {exc}"
    return None


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message, "code": status}, status=status, headers=headers)


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, int(seconds + 0.999)))}


class ProgressServer:
    def __init__(
        self,
        settings: config.Settings,
        api: kube.Kube,
        index: children.ChildIndex,
        served: Callable[[children.JobKey], bool],
        status: progress_status.ProgressStatus,
        registry: prometheus_client.CollectorRegistry | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        assert settings.progress_cert_dir is not None
        self.settings = settings
        self._api = api
        self._index = index
        self._served = served
        self.status = status
        self._wall = wall
        self._cert_dir = settings.progress_cert_dir
        self._cache = progress_auth.ReviewCache()
        self._by_address = progress_auth.RateLimiter(*progress_auth.ADDRESS_RATE)
        self._by_pod = progress_auth.RateLimiter(*progress_auth.POD_RATE)
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._stamp: tuple[float, ...] = ()
        self.ca_pem = ""
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task[None] | None = None
        self.replies = prometheus_client.Counter(
            "progress_reports",
            "Progress reports received, by HTTP status answered",
            ["code"],
            namespace="trainjob",
            registry=registry,
        )
        self.load_certificates()

    # -- certificates -------------------------------------------------------------------------

    def _paths(self) -> tuple[str, str, str]:
        return tuple(os.path.join(self._cert_dir, f) for f in (CERT_FILE, KEY_FILE, CA_FILE))  # type: ignore[return-value]

    def load_certificates(self) -> bool:
        """(Re)load the serving certificate and the CA when their files changed; True if so."""
        paths = self._paths()
        stamp = tuple(os.stat(path).st_mtime for path in paths)
        if stamp == self._stamp:
            return False
        cert, key, ca = paths
        self._ssl.load_cert_chain(cert, key)  # new handshakes use it; open connections keep theirs
        with open(ca, encoding="utf-8") as handle:
            self.ca_pem = handle.read()
        self._stamp = stamp
        return True

    async def _reload_forever(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_SECONDS)
            try:
                if self.load_certificates():
                    logger.info("Loaded the renewed progress certificate from %s", self._cert_dir)
            except (OSError, ssl.SSLError) as exc:
                logger.warning("Kept the old progress certificate: %s", exc)

    # -- serving ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=progress.MAX_BODY_BYTES)
        app.router.add_post(ROUTE, self.handle)
        return app

    async def start(self) -> None:
        # An idle connection closes after KEEPALIVE_SECONDS, below the reporting interval: a
        # client that keeps its connection open (a script's HTTP session) does not make the
        # operator hold one TLS connection per job (1,000 open ones: +270 MiB, measured).
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE_SECONDS
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, host=None, port=self.settings.progress_port, ssl_context=self._ssl
        )
        await site.start()
        self._reloader = asyncio.get_running_loop().create_task(self._reload_forever())
        # From now on a Pod's termination message (its last report) reaches the status too.
        self._index.pod_listeners.append(self.status.observe_pod)
        self.status.start()
        logger.info("Serving progress reports on :%d (HTTPS)", self.settings.progress_port)

    async def close(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
        await self.status.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        response = await self._decide(request)
        self.replies.labels(str(response.status)).inc()
        return response

    async def _decide(self, request: web.Request) -> web.Response:
        now = self._wall()
        namespace = request.match_info["namespace"]
        name = request.match_info["name"]
        job = (namespace, name)
        length = request.content_length
        if length is not None and length > progress.MAX_BODY_BYTES:
            return _error(413, f"body: at most {progress.MAX_BODY_BYTES} bytes, got {length}")
        if request.content_type != "application/json":
            return _error(
                415, f"Content-Type: expected application/json, got {request.content_type}"
            )
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            return _error(
                401,
                "Authorization: a Bearer token is needed (the Pod's progress token)",
                {"WWW-Authenticate": "Bearer"},
            )
        token = header[7:].strip()
        audience = progress.audience(namespace, name)
        digest = progress_auth.token_digest(token, audience)
        known, identity = self._cache.get(digest, now)
        if not (known and identity is not None):
            # Only what may cost a TokenReview is limited by address: a Pod whose token is
            # already reviewed is limited per Pod below (Pods of one node may share an address).
            wait = self._by_address.allow(request.remote or "", now)
            if wait:
                return _error(429, "too many requests from this address", _retry_after(wait))
        if not self._served(job):
            return _error(
                503,
                f"TrainJob {namespace}/{name} is not served by this operator replica now",
                _retry_after(NOT_SERVED_RETRY_SECONDS),
            )
        try:
            if not known:
                identity = await self._review(token, digest, audience, now)
        except kube.TransientError as exc:
            logger.warning("Could not review a progress token: %s", exc)
            return _error(503, "the token cannot be reviewed now", _retry_after(5))
        if identity is None:
            return _error(
                401,
                f"the token is not valid for audience {audience} (expired, another job's, or "
                "its Pod was deleted)",
                {"WWW-Authenticate": "Bearer"},
            )
        reason = progress_auth.refusal(identity, namespace, audience, self._index.pods(job))
        if reason is not None:
            return _error(403, reason)
        wait = self._by_pod.allow(identity.pod_uid or "", now)
        if wait:
            return _error(429, "too many reports from this Pod", _retry_after(wait))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body: at most {progress.MAX_BODY_BYTES} bytes")
        try:
            report = progress.decode(body)
        except progress.ReportError as exc:
            return _error(400, str(exc))
        if report.replica is None:
            report = _with_replica(report, identity.pod_name, name)
        self.status.offer(job, report)
        return web.json_response(
            {"accepted": True, "intervalSeconds": self.settings.progress_interval_seconds},
            status=202,
        )

    async def _review(
        self, token: str, digest: str, audience: str, now: float
    ) -> progress_auth.Identity | None:
        """A TokenReview by the API server, cached (see progress_auth)."""
        review = await self._api.review_token(token, [audience])
        identity = progress_auth.identity_from_review(review)
        self._cache.put(digest, identity, now, progress_auth.token_expiry(token))
        return identity


def _with_replica(report: progress.Report, pod_name: str | None, job: str) -> progress.Report:
    """A report that names no replica is the token's Pod's (`<job>-worker-0` -> `worker-0`)."""
    if not pod_name or not pod_name.startswith(job + "-"):
        return report
    return dataclasses.replace(report, replica=pod_name[len(job) + 1 :])


def build(
    settings: config.Settings,
    api: kube.Kube,
    index: children.ChildIndex,
    reconciled: Callable[[children.JobKey], bool],
    meters: metrics.Metrics,
    leadership: leader.Leadership | None = None,
) -> tuple[ProgressServer, context.Progress]:
    """The progress server for the operator's jobs (the HTTPS server, the status writer, the
    termination-message reader on the Pod informer: all started by `ProgressServer.start`), and
    what the reconcile needs of it: the endpoint (URL + CA) rendered into new Pods and when
    a job's step last advanced."""
    elected = leadership if leadership is not None else leader.Alone()
    status = progress_status.ProgressStatus(
        api, settings.progress_writes_per_second, meters.registry, leadership=elected
    )

    def served(key: children.JobKey) -> bool:
        # A standby answers 503 (Retry-After): the Pod reports again, to the leader.
        return elected.leading() and reconciled(key)

    server = ProgressServer(settings, api, index, served, status, meters.registry)
    assert settings.progress_url is not None

    def endpoint() -> render.ProgressEndpoint:
        return render.ProgressEndpoint(
            settings.progress_url or "", server.ca_pem, settings.progress_interval_seconds
        )

    return server, context.Progress(endpoint=endpoint, at=status.progress_at, forget=status.forget)
