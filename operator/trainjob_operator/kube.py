"""The only module of the operator that talks to the API server.

Plain HTTP on aiohttp (kopf's own HTTP library), with credentials from kopf's public login
functions (`login`). Why not the official `kubernetes` client: it is synchronous, so every
call cost a thread-pool hop, and it builds a model object per reply; under load its threads
were the largest share of the operator's CPU (py-spy), and importing it costs ~20 MiB of
RSS. The requests this operator makes are few and simple (create, delete, get, merge-patch,
list, watch), so a small typed layer over HTTP is all it needs.

Error contract, so that callers never inspect HTTP codes:
- create: 409 AlreadyExists is success (deterministic names make creation idempotent);
- delete: 404 NotFound (and a failed uid precondition: the object we meant is gone) is success;
- 400/422 (the API server refused the object itself) -> `RejectedError`, a permanent error;
- 410 Gone on a list/watch -> `GoneError` (the resourceVersion is too old: list again);
- everything else (5xx, 429, 401 while credentials rotate, 403 while a namespace terminates,
  connection trouble) -> `TransientError`, retried by the caller with backoff.
- with leader election, a write while this replica may not write -> `NotLeaderError` (a
  `TransientError`), raised before anything is sent (`gate_writes`).

Why one file of ~800 lines: it is the operator's whole contract with the API server (every
request, its path, its error mapping, the login, the request budget, the crash hook for the
chaos tests), and import-linter holds every other module to it; split, a reader would have
to gather that contract from several files. Each method is one kind of request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import os
import random
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import kopf

from trainjob.core import constants, policy
from trainjob_operator import aio

logger = logging.getLogger(__name__)

REPORTING_COMPONENT: Final = "trainjob.dev/operator"
SOURCE_COMPONENT: Final = "trainjob-operator"
USER_AGENT: Final = "trainjob-operator"


# A request that takes longer than this is treated as failed (and retried by the caller).
REQUEST_TIMEOUT: Final = 60.0
LEASES: Final = "leases"
ENV_CRASH: Final = "TRAINJOB_TEST_CRASH_AFTER"
# Watches ask the server to end the stream after this long to twice this long (random, as
# client-go's reflector does, so that watches do not all end at once); the caller then
# watches again from the last resourceVersion. Each new watch is a request: at rest that
# is all this operator asks of the API server.
WATCH_SECONDS: Final = 300
# Items per page when listing, so that a list of thousands of Pods never sits in memory
# as one reply.
LIST_PAGE: Final = 500

JSON: Final = "application/json"
# Metadata only (PartialObjectMetadataList): when names are all a list needs.
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
MERGE_PATCH: Final = "application/merge-patch+json"

Obj = dict[str, Any]


class TransientError(Exception):
    """A call failed for a reason that may go away: retry later."""

    # The HTTP status the API server answered; None: no answer (unreachable, timed out).
    status: int | None = None
    # The API server's own message (its Status object's), when it answered.
    api_message: str | None = None
    # Seconds the API server asked for before the next try (its Status' retryAfterSeconds:
    # 429 from API priority and fairness, or "storage is (re)initializing" while its watch
    # cache fills after a restart); None when it did not say.
    retry_after: float | None = None

    def refused(self) -> bool:
        """403 Forbidden: the API server will not take this object as it is now (Pod
        Security, a ResourceQuota, a LimitRange, a denying admission webhook, missing RBAC,
        a terminating namespace). It may change: the caller says so and retries later."""
        return self.status == 403

    def answered_no(self) -> bool:
        """The API server answered and refused (a 4xx other than 429), as opposed to being
        unreachable, overloaded or failing (no answer, 429, 5xx)."""
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


class RejectedError(Exception):
    """The API server refused the object itself (400/422): retrying cannot help."""


class ConflictError(TransientError):
    """409 on a conditional write: the object changed since the version the caller read."""


class GoneError(TransientError):
    """410: the resourceVersion a watch started from is too old; list again."""


class NotLeaderError(TransientError):
    """A write refused before it was sent: this replica does not hold the leader Lease now
    (a standby, or a leader whose renewals failed for its renew deadline). See `gate_writes`."""


def retry_delay(failures: int, first: float, cap: float) -> float:
    """Seconds before the next try after `failures` consecutive failures: `first`, doubling,
    at most `cap` (the backoff every caller of this module uses)."""
    return min(cap, first * 2.0 ** max(failures - 1, 0))


def retry_after_failure(failures: int, error: Exception, first: float, cap: float) -> float:
    """As `retry_delay`, unless the API server said when to come back: then that (at most
    `cap`). After an API server restart every watch is refused with "storage is
    (re)initializing, retry after 1 s" until its cache is filled (seconds at 10,000
    TrainJobs); doubling from there would come back up to `cap` late."""
    asked = error.retry_after if isinstance(error, TransientError) else None
    if asked is not None:
        return min(cap, asked)
    return retry_delay(failures, first, cap)


# -- credentials ----------------------------------------------------------------------------


def login(settings: kopf.OperatorSettings, logger: Any) -> kopf.ConnectionInfo:
    """The operator's credentials: the Pod's service account in a cluster, else the current
    context of $KUBECONFIG / ~/.kube/config (token, client certificate or basic auth; kopf's
    own readers of both). A kubeconfig that gets its token from an exec plugin or an
    auth-provider needs the `kubernetes` client library, used then and only then.
    kopf logs in with the same function (handlers.py), so both see the same identity."""
    info = kopf.login_with_service_account(settings=settings, logger=logger)
    if info is None:
        info = kopf.login_with_kubeconfig(settings=settings, logger=logger)
    if info is not None and (
        info.token or info.username or info.certificate_path or info.certificate_data
    ):
        return info
    try:
        via_client = kopf.login_via_client(settings=settings, logger=logger)
    except ImportError:
        via_client = None
    if via_client is not None:
        return via_client
    if info is not None:
        return info  # no credentials at all: anonymous, as kubectl would be
    raise kopf.LoginError(
        "No Kubernetes credentials: no service account, and no usable $KUBECONFIG or "
        "~/.kube/config (an exec plugin or auth-provider there needs `pip install kubernetes`)"
    )


def user_agent(identity: str) -> str:
    """The User-Agent of every request: the product, then the replica (its leader-election
    identity), so that the API server's audit log tells the replicas' writes apart."""
    return f"{USER_AGENT} ({identity})" if identity else USER_AGENT


def _session(info: kopf.ConnectionInfo, agent: str) -> aiohttp.ClientSession:
    headers = {"User-Agent": agent, "Accept": JSON, **info.as_http_headers()}
    return aiohttp.ClientSession(
        # Requests take turns (Kube._turns); long-lived watches come on top of those.
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=headers,
        proxy=info.proxy_url,
        trust_env=info.trust_env,
    )


def _status_body(data: bytes) -> dict[str, Any]:
    """The API server's Status object of a failed reply ({} when it sent none)."""
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(status: int, data: bytes, body: dict[str, Any] | None = None) -> str:
    body = _status_body(data) if body is None else body
    if body.get("message"):
        return str(body["message"])
    return f"HTTP {status}"


def _classify(status: int, data: bytes, what: str) -> Exception:
    body = _status_body(data)
    message = _message(status, data, body)
    if status in (400, 422):
        return RejectedError(f"{what}: {message}")
    error = (GoneError if status == 410 else TransientError)(f"{what}: {message}")
    error.status = status
    error.api_message = message
    error.retry_after = _retry_after(body)
    return error


def _retry_after(body: dict[str, Any]) -> float | None:
    """The Status' details.retryAfterSeconds (what client-go waits on a 429), if any."""
    details = body.get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
        return float(seconds)
    return None


# -- paths ----------------------------------------------------------------------------------


def _selected(plural: str, selector: str) -> str:
    """For messages: the objects listed or watched ("" selects every one)."""
    return f"{plural} ({selector})" if selector else plural


def _path(group: str, version: str, namespace: str | None, plural: str, *rest: str) -> str:
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    return "/".join([base, plural, *(quote(part, safe="") for part in rest)])


def core_path(namespace: str | None, plural: str, *rest: str) -> str:
    return _path("", "v1", namespace, plural, *rest)


def trainjob_path(namespace: str, *rest: str) -> str:
    return _path(constants.GROUP, constants.VERSION, namespace, constants.PLURAL, *rest)


def _delete_options(uid: str | None) -> Obj:
    options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    if uid:
        options["preconditions"] = {"uid": uid}
    return options


def lease_path(namespace: str, *rest: str) -> str:
    return _path("coordination.k8s.io", "v1", namespace, LEASES, *rest)


def writes(method: str, path: str) -> bool:
    """Whether a request changes the cluster (a TokenReview is a POST that changes nothing)."""
    return method != "GET" and not path.endswith("/tokenreviews")


def event_name(job_name: str, event_id: str) -> str:
    """The name of a TrainJob's Event with a deterministic id (`<job>.<event_id>`)."""
    return f"{job_name}.{event_id}"


def _object(payload: bytes, what: str) -> Obj:
    result = json.loads(payload)
    if not isinstance(result, dict):
        raise TransientError(f"{what}: unexpected reply")
    return result


@dataclasses.dataclass
class CrashAfter:
    """For crash tests only (`TRAINJOB_TEST_CRASH_AFTER="METHOD PATH-PART N [SIGSTOP]"`): the
    operator SIGKILLs (or SIGSTOPs) itself right after the reply to its N-th request whose
    method is METHOD and whose path contains PATH-PART, so a test can stop it between any two
    API calls, as a node failure would, at a chosen point of a reconcile."""

    method: str
    path_part: str
    remaining: int
    # SIGKILL: a crash. SIGSTOP: a pause (a long GC, a throttled CPU) that the test ends
    # with SIGCONT after changing the world under the operator.
    signal_number: int = signal.SIGKILL

    @classmethod
    def parse(cls, value: str | None) -> CrashAfter | None:
        if not value:
            return None
        method, path_part, count, *how = value.split()
        number = signal.Signals[how[0]] if how else signal.SIGKILL
        return cls(method.upper(), path_part, int(count), number)

    def after(self, method: str, path: str) -> None:
        if method == self.method and self.path_part in path:
            self.remaining -= 1
            if self.remaining == 0:
                what = signal.Signals(self.signal_number).name
                logger.warning("%s on purpose after %s %s (%s)", what, method, path, ENV_CRASH)
                os.kill(os.getpid(), self.signal_number)


@dataclasses.dataclass(frozen=True)
class Listing:
    items: list[Any]
    resource_version: str


# What a list keeps of each object, applied page by page as the pages arrive (see `_list`).
Keep = Callable[[Obj], Any]


class Kube:
    """Async facade over the Kubernetes API, for Pods, Services, Events, TrainJobs, PodGroups.

    `connections` bounds the requests in flight; further requests wait their turn (first
    come, first served), and a request's timeout starts only when it is sent: under a burst
    thousands wait, which is queueing, not a failure."""

    def __init__(
        self,
        credentials: Callable[[], kopf.ConnectionInfo],
        connections: int,
        instance: str = "",
        crash_after: str | None = None,
        watch_idle_seconds: float = WATCH_SECONDS + REQUEST_TIMEOUT,
        identity: str = "",
    ) -> None:
        """`identity`: this replica's leader-election identity, in every request's
        User-Agent."""
        self._credentials = credentials
        self._watch_idle = watch_idle_seconds
        self._instance = instance or socket.gethostname()
        self._agent = user_agent(identity)
        # Whether a write may be sent now (leader election: `gate_writes`); None: always.
        self._may_write: Callable[[], bool] | None = None
        self._server = ""
        self._client: aiohttp.ClientSession | None = None
        self._retired: set[asyncio.Task[None]] = set()
        # The watch streams being read on each session, ended when it closes (`_retire`).
        self._streams: dict[aiohttp.ClientSession, set[aiohttp.StreamReader]] = {}
        self._turns = asyncio.Semaphore(connections)
        self._crash = CrashAfter.parse(crash_after)

    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            info = self._credentials()
            self._server = info.server.rstrip("/")
            self._client = _session(info, self._agent)
        return self._client

    def gate_writes(self, may_write: Callable[[], bool]) -> None:
        """From now on every write (create, update, patch, delete; the Lease's own excepted)
        is sent only if `may_write()` says so right before it goes out, after its turn
        came, and raises NotLeaderError otherwise. One gate for every writer (the job loops,
        the progress writer, Kueue's releases), so that no path forgets to ask."""
        self._may_write = may_write

    def _retire(self, client: aiohttp.ClientSession, grace: float = REQUEST_TIMEOUT) -> None:
        """Stop using `client`: the next request logs in again and opens fresh connections;
        the old session closes after `grace` seconds, which its requests in flight have to
        end (closing it fails those still waiting: TransientError, retried on a fresh
        connection). Two causes:
        - 401: the credentials expired (a rotated service-account token); `grace` is the
          whole REQUEST_TIMEOUT, the connections being fine;
        - a watch stream went silent (`_watch`): the path to the API server stopped
          forwarding (a NAT entry or load balancer that drops a flow without a FIN or RST),
          so the session's other connections, opened over that same path, are as likely
          dead. Reused from the pool, each would hold its request for the whole
          REQUEST_TIMEOUT (a stalled stream's test once waited 61 s for a status patch),
          and so would a request sent on one before the silence was noticed (60.1 s, once):
          `grace` is then the watch's own idle limit.
        When it closes, the watches still streaming on it end as if the server had ended
        them, and resume at once on a fresh session from the last version they saw:
        aiohttp leaves a stream read on a closed session waiting for good (no error, no
        read timeout), which left every other watch of the operator deaf once one of them
        had been silent (the cluster's nodes, quiet for a minute)."""
        if self._client is not client:
            return
        self._client = None

        async def close_later() -> None:
            try:
                await asyncio.sleep(grace)
            finally:  # also when `close` cancels the wait: no session is left unclosed
                self._end_streams(client)
                await client.close()

        task = asyncio.get_running_loop().create_task(close_later())
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    def _end_streams(self, client: aiohttp.ClientSession) -> None:
        """End the watch streams read on `client`, which is closing: each watch returns as if
        the server had ended it (a read on a closed session would wait for good)."""
        for stream in self._streams.pop(client, set()):
            stream.feed_eof()

    async def close(self) -> None:
        retired = list(self._retired)
        for task in retired:
            task.cancel()
        await asyncio.gather(*retired, return_exceptions=True)
        if self._client is not None:
            self._end_streams(self._client)
            await self._client.close()
            self._client = None

    async def _request(
        self,
        method: str,
        path: str,
        what: str,
        *,
        body: Any = None,
        render: Callable[[], Any] | None = None,
        content_type: str = JSON,
        params: Mapping[str, str] | None = None,
        accept: tuple[int, ...] = (),
        accept_type: str = JSON,
        election: float | None = None,
    ) -> tuple[int, bytes]:
        """One request; returns (status, body) for 2xx and for the statuses in `accept`,
        raises as the module docstring says otherwise. The body is `body`, or what `render`
        returns once it is this request's turn (so that a waiting request holds no body).
        `election`: a leader-election request with this timeout in seconds. It waits for no
        turn (under a burst of thousands of creates a renewal must not queue behind them and
        lose the Lease) and passes the write gate (it is what keeps the gate open)."""
        try:
            if election is not None:
                return await self._send(
                    method, path, what, body, content_type, params, accept, accept_type, election
                )
            async with self._turns:
                if self._may_write is not None and writes(method, path) and not self._may_write():
                    raise NotLeaderError(f"{what}: not sent, this replica is not the leader")
                if render is not None:
                    body = render()
                return await self._send(
                    method, path, what, body, content_type, params, accept, accept_type
                )
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise TransientError(f"{what}: API server unreachable: {exc!r}") from exc

    async def _send(
        self,
        method: str,
        path: str,
        what: str,
        body: Any,
        content_type: str,
        params: Mapping[str, str] | None,
        accept: tuple[int, ...],
        accept_type: str,
        timeout: float = REQUEST_TIMEOUT,
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Accept": accept_type}
        if data is not None:
            headers["Content-Type"] = content_type
        client = self._http()
        async with client.request(
            method,
            self._server + path,
            data=data,
            headers=headers,
            params=params,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            payload = await response.read()
            status = response.status
        if self._crash is not None:
            self._crash.after(method, path)
        if 200 <= status < 300 or status in accept:
            return status, payload
        raise self._failure(client, status, payload, what)

    def _failure(
        self, client: aiohttp.ClientSession, status: int, payload: bytes, what: str
    ) -> Exception:
        """The error for a reply that is not a success; a 401 also retires the session."""
        if status == 401:
            self._retire(client)
        return _classify(status, payload, what)

    # -- create / delete children ---------------------------------------------------------

    async def create(self, kind: str, namespace: str, name: str, render: Callable[[], Obj]) -> bool:
        """Create the Pod or Service `render` returns (called when the request's turn comes:
        a burst queues thousands of creates, and a queued one holds no manifest); False if it
        already existed (409 is success)."""
        plural = "pods" if kind == "Pod" else "services"
        status, _ = await self._request(
            "POST",
            core_path(namespace, plural),
            f"creating {kind} {namespace}/{name}",
            render=render,
            # The CRD keeps pod templates open: without Strict, a misspelt template field
            # (`imagePullPolcy`) would be dropped with a warning nobody reads; with it the
            # API server refuses the Pod naming the field, and the job fails as InvalidSpec.
            params={"fieldValidation": "Strict"},
            accept=(409,),
        )
        if status == 409:
            return False
        logger.info("Created %s %s/%s", kind, namespace, name)
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self._delete(core_path(namespace, "pods", name), "Pod", namespace, name, uid)

    async def delete_service(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self._delete(core_path(namespace, "services", name), "Service", namespace, name, uid)

    async def _delete(
        self, path: str, kind: str, namespace: str, name: str, uid: str | None
    ) -> None:
        # 404: already gone. 409 on a uid precondition: the object we meant is gone and a
        # newer one took the name, which must stay.
        status, _ = await self._request(
            "DELETE",
            path,
            f"deleting {kind} {namespace}/{name}",
            body=_delete_options(uid),
            accept=(404, 409),
        )
        if status < 300:
            logger.info("Deleted %s %s/%s", kind, namespace, name)

    # -- list + watch (children.py's informer) --------------------------------------------

    async def list_labelled(
        self,
        namespace: str | None,
        plural: str,
        selector: str,
        group: str = "",
        version: str = "v1",
        keep: Keep | None = None,
    ) -> Listing:
        """Every object of `plural` (Pods, Services; Workloads with their `group`) matching
        `selector`, in `namespace` or in all namespaces (None), page by page, with the
        resourceVersion to watch from; `keep`: what to keep of each (default: all of it)."""
        return await self._list(
            _path(group, version, namespace, plural),
            f"listing {_selected(plural, selector)} in {namespace or 'all namespaces'}",
            {"labelSelector": selector} if selector else {},
            keep=keep,
        )

    def watch_labelled(
        self,
        namespace: str | None,
        plural: str,
        selector: str,
        resource_version: str,
        group: str = "",
        version: str = "v1",
    ) -> AsyncIterator[Obj]:
        """Watch events ({"type", "object"}) after `resource_version`, bookmarks included,
        until the server ends the stream (about WATCH_SECONDS). Raises GoneError when the
        version is too old, TransientError on other trouble."""
        return self._watch(
            _path(group, version, namespace, plural),
            f"watching {_selected(plural, selector)} in {namespace or 'all namespaces'}",
            {"labelSelector": selector} if selector else {},
            resource_version,
        )

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server's discovery lists `plural` in `group/version`."""
        status, payload = await self._request(
            "GET",
            f"/apis/{group}/{version}",
            f"discovering {group}/{version}",
            accept=(404, 503),
        )
        if status != 200:
            return False
        resources = json.loads(payload).get("resources") or []
        return any(r.get("name") == plural for r in resources if isinstance(r, dict))

    async def _list(
        self,
        path: str,
        what: str,
        params: Mapping[str, str],
        accept_type: str = JSON,
        keep: Keep | None = None,
    ) -> Listing:
        """With `keep`, only what it returns of each object outlives its page: 8,000 Pods
        listed at start-up were 8,000 parsed Pods at once (about 15 KB each in Python), a
        peak whose memory the process kept; now one page of them at a time."""
        items: list[Any] = []
        query = {**params, "limit": str(LIST_PAGE)}
        while True:
            _, payload = await self._request(
                "GET", path, what, params=query, accept_type=accept_type
            )
            page = json.loads(payload)
            objects = (item for item in page.pop("items", None) or [] if isinstance(item, dict))
            items.extend(objects if keep is None else (keep(item) for item in objects))
            del payload
            metadata = page.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return Listing(items, str(metadata.get("resourceVersion") or ""))
            query = {**query, "continue": str(token)}

    async def _watch(
        self,
        path: str,
        what: str,
        params: Mapping[str, str],
        resource_version: str,
        accept_type: str = JSON,
    ) -> AsyncIterator[Obj]:
        client = self._http()
        query = {
            **params,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS + random.randrange(WATCH_SECONDS)),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT)
        silent = False
        try:
            async with client.get(
                self._server + path,
                params=query,
                timeout=timeout,
                headers={"Accept": accept_type},
            ) as response:
                if response.status != 200:
                    payload = await response.read()
                    raise self._failure(client, response.status, payload, what)
                streams = self._streams.setdefault(client, set())
                streams.add(response.content)
                try:
                    pending = b""
                    while True:
                        # A stream silent for watch_idle_seconds is dead (bookmarks keep a
                        # live one talking). Our own deadline, not aiohttp's sock_read: that
                        # one stops counting when the session closes under the read.
                        try:
                            chunk = await aio.within(response.content.readany(), self._watch_idle)
                        except asyncio.TimeoutError:
                            silent = True
                            break
                        if not chunk:
                            break  # the server (or `_retire`) ended the stream
                        lines = (pending + chunk).split(b"\n")
                        pending = lines.pop()
                        for line in lines:
                            if line.strip():
                                event = json.loads(line)
                                if event.get("type") == "ERROR":
                                    status = event.get("object") or {}
                                    code = int(status.get("code") or 500)
                                    raise _classify(code, json.dumps(status).encode(), what)
                                yield event
                finally:
                    streams.discard(response.content)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise TransientError(f"{what}: {exc!r}") from exc
        if silent:
            # Nothing came, not even a bookmark: the stream is stalled (or the API server
            # sends no bookmarks and nothing changed). Ended; the caller resumes from the
            # last version seen, and every request from now on goes out on a fresh
            # connection (`_retire` says why).
            logger.info("%s: silent for %.0fs; watching again", what, self._watch_idle)
            self._retire(client, grace=min(self._watch_idle, REQUEST_TIMEOUT))

    # -- the TrainJob itself --------------------------------------------------------------

    async def get_trainjob(self, namespace: str, name: str) -> Obj | None:
        status, payload = await self._request(
            "GET",
            trainjob_path(namespace, name),
            f"reading TrainJob {namespace}/{name}",
            accept=(404,),
        )
        if status == 404:
            return None
        result = json.loads(payload)
        if not isinstance(result, dict):
            raise TransientError(f"reading TrainJob {namespace}/{name}: unexpected reply")
        return result

    async def patch_status(
        self, namespace: str, name: str, status: Obj, resource_version: str | None = None
    ) -> Obj | None:
        """Merge-patch the status subresource: fields we do not write (status.progress) stay.
        With `resource_version`, only if the TrainJob is still at that version (optimistic
        concurrency: a decision made from an older view must not overwrite a newer status);
        ConflictError otherwise. Returns the TrainJob as the patch left it (None if gone)."""
        body: Obj = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        what = f"patching status of TrainJob {namespace}/{name}"
        code, payload = await self._request(
            "PATCH",
            trainjob_path(namespace, name, "status"),
            what,
            body=body,
            content_type=MERGE_PATCH,
            accept=(404, 409),
        )
        if code == 404:
            return None  # deleted meanwhile: nothing left to report on
        if code == 409:
            raise ConflictError(f"{what}: {_message(code, payload)}")
        result = json.loads(payload)
        return result if isinstance(result, dict) else None

    async def review_token(self, token: str, audiences: list[str]) -> Obj:
        """A TokenReview (authentication.k8s.io/v1) of a progress token: the API server says
        whether `token` is valid for `audiences` and whose it is (progress_auth.py decides)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        _, payload = await self._request(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews", "reviewing a token", body=body
        )
        result = json.loads(payload)
        if not isinstance(result, dict):
            raise TransientError("reviewing a token: unexpected reply")
        return result

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None:
        """TTL deletion; children go with it through the garbage collector."""
        status, _ = await self._request(
            "DELETE",
            trainjob_path(namespace, name),
            f"deleting TrainJob {namespace}/{name}",
            body=_delete_options(uid),
            accept=(404, 409),
        )
        if status < 300:
            logger.info("Deleted TrainJob %s/%s", namespace, name)

    # -- the leader Lease (elector.py) ----------------------------------------------------

    async def get_lease(self, namespace: str, name: str, timeout: float) -> Obj | None:
        """The Lease, or None when there is none."""
        status, payload = await self._request(
            "GET",
            lease_path(namespace, name),
            f"reading Lease {namespace}/{name}",
            accept=(404,),
            election=timeout,
        )
        return None if status == 404 else _object(payload, f"reading Lease {namespace}/{name}")

    async def create_lease(self, namespace: str, name: str, spec: Obj, timeout: float) -> Obj:
        """Create the Lease with `spec`; ConflictError when one exists already (another
        replica created it first)."""
        what = f"creating Lease {namespace}/{name}"
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        status, payload = await self._request(
            "POST", lease_path(namespace), what, body=body, accept=(409,), election=timeout
        )
        if status == 409:
            raise ConflictError(f"{what}: {_message(status, payload)}")
        return _object(payload, what)

    async def update_lease(
        self, namespace: str, name: str, spec: Obj, resource_version: str, timeout: float
    ) -> Obj:
        """Replace the Lease's spec if the Lease is still at `resource_version` (as client-go's
        leader election does: a PUT); ConflictError when another replica wrote it since."""
        what = f"updating Lease {namespace}/{name}"
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "spec": spec,
        }
        status, payload = await self._request(
            "PUT", lease_path(namespace, name), what, body=body, accept=(404, 409), election=timeout
        )
        if status in (404, 409):
            raise ConflictError(f"{what}: {_message(status, payload)}")
        return _object(payload, what)

    # -- events ---------------------------------------------------------------------------

    async def post_event(
        self, job: Obj, event: policy.Event, now: datetime.datetime, event_id: str | None = None
    ) -> str | None:
        """A core/v1 Event on the job (a TrainJob, or a TFJob), so `kubectl describe` tells
        its story; returns its name when this call created it (None: it was there already,
        or refused). `event_id` makes its name deterministic (`<job>.<event_id>`), so a
        decision posted again after a crash posts its Events once (409 = already posted: the
        Event is reworded to this call's message).
        An Event the API server refuses (4xx) is logged and dropped; an unreachable or failing
        API server raises TransientError, so the reconcile is retried before any status write."""
        event_type, reason, message = event.type, event.reason, event.message
        metadata = job.get("metadata") or {}
        namespace = str(metadata.get("namespace"))
        name = str(metadata.get("name"))
        kind = str(job.get("kind") or constants.KIND)
        stamp = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        micro = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        named = event_name(name, event_id) if event_id else None
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": (
                {"name": named, "namespace": namespace}
                if named
                else {"generateName": f"{name}.", "namespace": namespace}
            ),
            "involvedObject": {
                # The job's own kind: a TrainJob, or a TFJob (the SDK's get_job_logs reads
                # the Events whose involvedObject.kind is TFJob).
                "apiVersion": job.get("apiVersion") or constants.API_VERSION,
                "kind": kind,
                "name": name,
                "namespace": namespace,
                "uid": metadata.get("uid"),
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": SOURCE_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self._instance[:128],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "eventTime": micro,
            "action": reason,
            "count": 1,
        }
        try:
            status, payload = await self._request(
                "POST",
                core_path(namespace, "events"),
                f"posting Event {reason}",
                body=body,
                accept=(409,),
            )
            if status == 409:  # only a named Event can be there already
                if named:
                    await self._reword_event(namespace, named, message)
                return None
            return str((json.loads(payload).get("metadata") or {}).get("name") or "") or None
        except TransientError as exc:
            if not exc.answered_no():
                # Unreachable or failing (an API server restart, etcd down): the decision
                # is not recorded yet, so it is made again later and its Events with it,
                # rather than going on to write the status and losing the Event for good.
                raise
            self._event_refused(reason, kind, namespace, name, exc)
        except RejectedError as exc:
            self._event_refused(reason, kind, namespace, name, exc)
        return None

    async def _reword_event(self, namespace: str, name: str, message: str) -> None:
        """An Event posted already (409) for the same transition decided again: it tells the
        words of this decision, the one about to be recorded (the earlier one may have named
        a replica that has since succeeded and is not restarted). The same words are a no-op
        for the API server. Best effort: an Event left in its first words still tells of
        the right transition."""
        try:
            await self._request(
                "PATCH",
                core_path(namespace, "events", name),
                f"rewording Event {namespace}/{name}",
                body={"message": message[:1024]},
                content_type=MERGE_PATCH,
                accept=(404,),
            )
        except (TransientError, RejectedError) as exc:
            logger.info("Could not reword Event %s/%s: %s", namespace, name, exc)

    async def withdraw_events(self, namespace: str, names: Iterable[str]) -> None:
        """Delete Events this operator posted for a decision that was never recorded (its
        status write conflicted), so they do not tell of a transition that did not happen.
        Best effort: an Event left behind only tells a story twice."""
        for name in names:
            try:
                await self._request(
                    "DELETE",
                    core_path(namespace, "events", name),
                    f"withdrawing Event {namespace}/{name}",
                    accept=(404,),
                )
            except (TransientError, RejectedError) as exc:
                logger.info("Could not withdraw Event %s/%s: %s", namespace, name, exc)

    @staticmethod
    def _event_refused(reason: str, kind: str, namespace: str, name: str, exc: Exception) -> None:
        """An Event the API server will not take (no RBAC for Events, the namespace is
        terminating, a malformed Event): the job's story loses a line, the job goes on."""
        logger.warning(
            "Could not post Event %s on %s %s/%s: %s", reason, kind, namespace, name, exc
        )

    # -- any object (Kueue's Workloads, ResourceFlavors, priority classes) ------------------

    async def get_object(
        self, group: str, version: str, namespace: str | None, plural: str, name: str
    ) -> Obj | None:
        """One object, or None when it does not exist (404). A 404 for the whole resource
        (its CRD is not installed) is also None: the caller says what is missing."""
        where = f"{namespace}/{name}" if namespace else name
        status, payload = await self._request(
            "GET",
            _path(group, version, namespace, plural, name),
            f"reading {plural} {where}",
            accept=(404,),
        )
        if status == 404:
            return None
        result = json.loads(payload)
        return result if isinstance(result, dict) else None

    async def create_object(self, manifest: Obj, plural: str) -> Obj | None:
        """Create `manifest`; returns it as stored, or None when one of that name already
        existed (409 is success: names are deterministic)."""
        group, _, version = str(manifest["apiVersion"]).rpartition("/")
        metadata = manifest["metadata"]
        namespace = metadata.get("namespace")
        what = f"creating {manifest['kind']} {namespace}/{metadata['name']}"
        status, payload = await self._request(
            "POST", _path(group, version, namespace, plural), what, body=manifest, accept=(409,)
        )
        if status == 409:
            return None
        logger.info("Created %s %s/%s", manifest["kind"], namespace, metadata["name"])
        result = json.loads(payload)
        return result if isinstance(result, dict) else None

    async def patch_object(
        self,
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        patch: Obj,
        resource_version: str | None = None,
        subresource: str | None = None,
    ) -> Obj | None:
        """A merge patch (of `subresource`, e.g. "status"); with `resource_version`, only if
        the object is still at that version (ConflictError otherwise). Returns the object as
        patched, None when it is gone."""
        body = dict(patch)
        if resource_version:
            body["metadata"] = {
                **dict(body.get("metadata") or {}),
                "resourceVersion": resource_version,
            }
        rest = (name, subresource) if subresource else (name,)
        what = f"patching {plural}{'/' + subresource if subresource else ''} {namespace}/{name}"
        code, payload = await self._request(
            "PATCH",
            _path(group, version, namespace, plural, *rest),
            what,
            body=body,
            content_type=MERGE_PATCH,
            accept=(404, 409),
        )
        if code == 404:
            return None
        if code == 409:
            raise ConflictError(f"{what}: {_message(code, payload)}")
        result = json.loads(payload)
        return result if isinstance(result, dict) else None

    async def delete_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, uid: str | None
    ) -> None:
        await self._delete(
            _path(group, version, namespace, plural, name), plural, namespace, name, uid
        )

    async def patch_trainjob(
        self, namespace: str, name: str, patch: Obj, resource_version: str | None
    ) -> Obj | None:
        """A merge patch of the TrainJob itself (not its status): Kueue's suspend and the
        admission's templates. Conditional on `resource_version` (ConflictError)."""
        result = await self.patch_object(
            constants.GROUP,
            constants.VERSION,
            namespace,
            constants.PLURAL,
            name,
            patch,
            resource_version,
        )
        if result is not None:
            logger.info("Patched TrainJob %s/%s", namespace, name)
        return result

    async def namespace_matches(self, namespace: str, selector: str) -> bool:
        """Whether `namespace` matches the label `selector`: the API server evaluates it
        (a list of the one namespace, by field), so every selector syntax works."""
        _, payload = await self._request(
            "GET",
            core_path(None, "namespaces"),
            f"matching namespace {namespace} against {selector!r}",
            params={"labelSelector": selector, "fieldSelector": f"metadata.name={namespace}"},
            accept_type=METADATA_LIST,
        )
        return bool(json.loads(payload).get("items"))

    # -- a failed container's log tail (log_causes.py) --------------------------------------

    async def read_log_tail(
        self,
        namespace: str,
        pod: str,
        container: str,
        tail_lines: int,
        limit_bytes: int,
        timeout: float,
    ) -> str | None:
        """The last `tail_lines` lines of a container's log (GET pods/<pod>/log), at most
        `limit_bytes` of them (the kubelet counts them from the first line it sends), read
        within `timeout` seconds (shorter than other requests: the API server asks the node's
        kubelet, which may be gone, and a reconcile waits for this). None when there is no log
        to read: the Pod is gone (404), it is not on a node or its container never ran (400);
        TransientError when the API server or the kubelet failed (5xx, unreachable, slow)."""
        what = f"reading the log of {namespace}/{pod} ({container})"
        params = {
            "container": container,
            "tailLines": str(tail_lines),
            "limitBytes": str(limit_bytes),
        }
        try:
            async with self._turns:
                client = self._http()
                async with client.get(
                    self._server + core_path(namespace, "pods", pod, "log"),
                    params=params,
                    # The log is text; a failure is a Status in JSON.
                    headers={"Accept": "text/plain, application/json"},
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as response:
                    status = response.status
                    if status != 200:
                        payload = await response.read()
                    else:
                        # Never more than asked for, even from a server that ignores
                        # limitBytes.
                        chunks: list[bytes] = []
                        size = 0
                        async for chunk in response.content.iter_chunked(65536):
                            chunks.append(chunk)
                            size += len(chunk)
                            if size >= limit_bytes:
                                break
                        payload = b"".join(chunks)[:limit_bytes]
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise TransientError(f"{what}: API server unreachable: {exc!r}") from exc
        if status == 200:
            return payload.decode("utf-8", errors="replace")
        if status in (400, 404):
            return None
        raise self._failure(client, status, payload, what)
