"""The cluster side's API module (the `kubernetes` package): the connection, TrainJobs, their
Pods, Events and logs, and the code's ConfigMap. A job named `tfjob/NAME` is Kubeflow's TFJob
of that name, read as its view (`objects.tfjob_view`: the TrainJob it means, with the TrainJob
operator's status), so every command reads it as it reads a TrainJob.
`trainjob.cluster.api_pods` (Pods of one's own and port-forwards, for `trainjob tensorboard`)
is the only other module that calls the API server, and it does so through what this module
shares: `connect`, `Cluster.core`, `Cluster.call`, `Cluster.translate` and `network_cause`, so
there is one connection helper and one error mapping.

Everything it returns is plain data (dicts as `kubectl get -o json` prints them, strings), so
formatting and decisions stay pure (`trainjob.cluster.objects`, `show`, `describe`). Every
failure, whatever raised it (an ApiException, an unreachable server, a broken kubeconfig),
becomes one `ClusterError` whose message names the cause in the API server's own words:
callers never see a traceback.

Every request is made once and has one deadline, the connection's request timeout
(`--request-timeout`, default `errors.DEFAULT_REQUEST_TIMEOUT`), from its start to the last
byte of its answer, however the server misbehaves: never answering, stalling or dribbling the
body after the headers (urllib3's timeouts bound each read, not the whole: `Deadline` ends it),
resetting the connection (urllib3's default retries would try four times). The message says how
long it waited. A followed log is the exception (`Cluster._stream`): connecting is bounded, a
quiet replica's silence is not.

kubeconfig and context are resolved as kubectl does: `--kubeconfig`, else $KUBECONFIG (a
list of files, merged), else ~/.kube/config; `--context`, else the current context; the
namespace is `-n`, else the context's namespace, else `default`. Inside a Pod without a
kubeconfig (a notebook on the cluster), the Pod's service account is used, as kubectl does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

from kubernetes import client as _k8s
from kubernetes import config as _k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ReadTimeoutError,
)
from urllib3.util.retry import Retry

from trainjob.cluster import describe, objects
from trainjob.cluster.errors import DEFAULT_REQUEST_TIMEOUT, ClusterError, no_answer
from trainjob.core import constants, tfjob

# The kubernetes package is only partly typed (untyped functions, `object` results): its
# objects are handled as Any here and every result is checked where it is turned into data.
k8s: Any = _k8s
k8s_config: Any = _k8s_config

Obj = dict[str, Any]
T = TypeVar("T")
_Line = tuple[str, str, str | None]  # stream instance, Pod name, line (None: the stream ended)

IN_CLUSTER_NAMESPACE_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
LOG_POLL_SECONDS: Final = 1.0  # how often a followed job's Pods are listed again
# A followed container quiet this long has its stream opened again from where it was (the
# client refuses a connect timeout without a read timeout: kubernetes>=37 validates
# `_request_timeout` as a number or a pair of numbers). Opening again also finds a connection
# that died unseen (a NAT entry dropped) within this long, which no read timeout would.
FOLLOW_QUIET_SECONDS: Final = 600.0


def _server_message(error: ApiException) -> str:
    """The API server's own words (the `message` of its Status body), else the HTTP reason."""
    with contextlib.suppress(ValueError, TypeError):
        body = json.loads(error.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    return f"{error.status} {error.reason}".strip()


def timed_out(error: BaseException) -> bool:
    """Whether the request waited its whole timeout (connecting, the TLS handshake, or the
    answer), as opposed to failing at once (refused, reset, a bad certificate)."""
    cause = getattr(error, "reason", None) or error  # urllib3's MaxRetryError wraps it
    if isinstance(cause, NewConnectionError):  # a subclass of ConnectTimeoutError: refused
        return False
    return isinstance(cause, (ReadTimeoutError, ConnectTimeoutError, TimeoutError))


def quiet(error: BaseException) -> bool:
    """Whether a followed log's request or stream read nothing for its read timeout (the
    container wrote nothing), as opposed to failing to connect or failing outright."""
    cause = getattr(error, "reason", None) or error
    return isinstance(cause, ReadTimeoutError)


def follow_arguments(
    tail: int | None, since_seconds: int | None, request_timeout: float | None
) -> dict[str, Any]:
    """read_namespaced_pod_log's arguments for a followed container: from its last `tail`
    lines, or (opened again after a quiet spell) its lines of the last `since_seconds`.
    Connecting is bounded by the request timeout; reading by FOLLOW_QUIET_SECONDS, as a pair of
    numbers, the one form every supported client accepts ((connect, None) is refused)."""
    arguments: dict[str, Any] = {"container": constants.DEFAULT_CONTAINER_NAME, "follow": True}
    if since_seconds is not None:
        arguments["since_seconds"] = since_seconds
    elif tail is not None:
        arguments["tail_lines"] = tail
    if request_timeout is not None:
        arguments["_request_timeout"] = (request_timeout, FOLLOW_QUIET_SECONDS)
    return arguments


def since_quiet(quiet_since: float, now: float) -> int:
    """The sinceSeconds that opens a quiet stream again without losing or repeating a line:
    nothing came for FOLLOW_QUIET_SECONDS before `quiet_since`, so every line written since
    then (and a second more, for the kubelet's whole-second view) is new."""
    return max(1, math.ceil(now - quiet_since) + 1)


# ----- one request, one deadline -----
class DeadlineExceededError(TimeoutError):
    """The request had not ended when its deadline came (its connection was shut)."""


class _InFlight(threading.local):
    """The connections the request in progress on this thread took from its pools (None: no
    request under a deadline here)."""

    connections: list[Any] | None = None


_IN_FLIGHT: Final = _InFlight()


@functools.cache
def _tracking(pool_class: type) -> type:
    """urllib3's connection pool class `pool_class`, noting each connection it hands out in
    `_IN_FLIGHT`, so the request's deadline can shut that connection."""

    def _get_conn(self: Any, timeout: float | None = None) -> Any:
        connection = pool_class._get_conn(self, timeout)  # type: ignore[attr-defined]
        held = _IN_FLIGHT.connections
        if held is not None:
            held.append(connection)
        return connection

    return type(f"Deadline{pool_class.__name__}", (pool_class,), {"_get_conn": _get_conn})


def track_connections(api: Any) -> None:
    """Let deadlines shut this ApiClient's connections (its pools are made on first use)."""
    manager = api.rest_client.pool_manager
    manager.pool_classes_by_scheme = {
        scheme: _tracking(pool_class)
        for scheme, pool_class in manager.pool_classes_by_scheme.items()
    }


def _shut(connection: Any) -> None:
    # None: not connected yet (the connect timeout bounds that). During a TLS handshake it is
    # the plain socket the handshake took over, closed here: its reads wait request_timeout.
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the read blocked on it, TLS or not


def within_deadline(seconds: float, function: Callable[[], T]) -> T:
    """function() (one request), its connections shut when `seconds` have passed: urllib3's
    timeouts bound each read, so a body dribbled a byte at a time, or a body read after the
    headers (kubernetes>=37 reads it outside urllib3's accounting), would wait longer. Whatever
    the shut connection raised then is DeadlineExceededError."""
    held: list[Any] = []
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for connection in list(held):
            _shut(connection)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    outer, _IN_FLIGHT.connections = _IN_FLIGHT.connections, held
    timer.start()
    try:
        return function()
    except Exception as error:
        if expired.is_set():
            raise DeadlineExceededError(f"no answer in {seconds:g}s") from error
        raise
    finally:
        timer.cancel()
        _IN_FLIGHT.connections = outer


def request_timeout(seconds: float) -> tuple[float, float]:
    """The client's `_request_timeout` for one request: connecting (the TLS handshake too) and
    each read wait at most `seconds`, as a pair of numbers: kubernetes<=30 takes a lone float
    for no timeout at all (only an int is a timeout there), kubernetes>=37 refuses None in a
    pair. The whole request's bound is `within_deadline`'s."""
    return (seconds, seconds)


class Deadline:
    """An API object (CoreV1Api, CustomObjectsApi) whose every call is one request with
    `request_timeout` under `within_deadline` (None: neither, it waits for ever). A call that
    streams its body (`_preload_content=False`: a followed log) sets its own timeout, and its
    reader bounds it."""

    def __init__(self, api: Any, seconds: float | None) -> None:
        self._api = api
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        seconds = self._seconds
        if seconds is None or not callable(method):
            return method

        def bounded(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_preload_content") is False:
                return method(*args, **kwargs)
            kwargs["_request_timeout"] = request_timeout(seconds)
            return within_deadline(seconds, lambda: method(*args, **kwargs))

        return bounded


# The CRD of each kind of job, as `kubectl get crd` names it.
CRDS: Final = {
    constants.KIND: f"{constants.PLURAL}.{constants.GROUP}",
    tfjob.KIND: f"{tfjob.PLURAL}.{tfjob.GROUP}",
}
# group, version, plural of each kind of job (CustomObjectsApi's arguments).
RESOURCES: Final = {
    constants.KIND: (constants.GROUP, constants.VERSION, constants.PLURAL),
    tfjob.KIND: (tfjob.GROUP, tfjob.VERSION, tfjob.PLURAL),
}


def no_such_kind(error: ApiException) -> bool:
    """A 404 that says the API server has no such resource at all (its CRD is not installed:
    `the server could not find the requested resource`, or a bare `404 page not found` for a
    group it does not serve), not that one object is missing (a Status naming it)."""
    if error.status != 404:
        return False
    with contextlib.suppress(ValueError, TypeError):
        body = json.loads(error.body or "")
        if isinstance(body, dict) and (body.get("details") or {}).get("name"):
            return False
    return True


def translate(what: str, error: Exception, kind: str = constants.KIND) -> ClusterError:
    """One ClusterError for any failure of a call (`Cluster.translate` also says how long a
    request that timed out waited); `kind`: the kind of job the call was about."""
    if isinstance(error, ApiException):
        message = _server_message(error)
        if error.status == 401:
            message += " (the kubeconfig's credentials were refused)"
        if no_such_kind(error):
            message += f" (is the {kind} CRD installed? kubectl get crd {CRDS[kind]})"
        return ClusterError(f"{what}: {message}", error.status)
    if isinstance(error, ConfigException):
        return ClusterError(f"kubeconfig: {error}")
    return ClusterError(f"{what}: cannot reach the API server: {network_cause(error)}")


def network_cause(error: Exception) -> str:
    """The root of urllib3's retry error: `Failed to establish a new connection: [Errno 111]
    Connection refused`, without the pool and URL it wraps it in."""
    cause = getattr(error, "reason", None) or error
    text = str(cause)
    _, found, rest = text.partition("): ")
    return rest if found and rest else text


# ----- connecting -----
@dataclasses.dataclass(frozen=True)
class Connection:
    """Where the commands go: the API client, the namespace meant, the context's name, and how
    long one request may wait (None: for ever, as kubectl's --request-timeout=0)."""

    api: Any  # kubernetes.client.ApiClient
    namespace: str
    context: str | None
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)


def kubeconfig_files(explicit: str | None, environ: Mapping[str, str]) -> str:
    """kubectl's order: --kubeconfig, else $KUBECONFIG (':'-separated, merged), else
    ~/.kube/config."""
    return explicit or environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def _existing(paths: str) -> list[str]:
    return [
        p
        for p in (os.path.expanduser(x) for x in paths.split(os.pathsep) if x)
        if os.path.exists(p)
    ]


def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    environ: Mapping[str, str] | None = None,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> Connection:
    """An API client for the kubeconfig/context kubectl would pick, and the namespace; each
    request waits at most `request_timeout` seconds (0: for ever)."""
    if request_timeout < 0:
        raise ClusterError(f"request timeout {request_timeout:g}s: expected 0 or more seconds")
    timeout = request_timeout or None
    env = os.environ if environ is None else environ
    files = kubeconfig_files(kubeconfig, env)
    if not _existing(files):
        if kubeconfig is None and context is None and env.get("KUBERNETES_SERVICE_HOST"):
            return _in_cluster(namespace, timeout)
        raise ClusterError(
            f"no kubeconfig: {files} does not exist (give --kubeconfig, set KUBECONFIG, or "
            "run inside a Pod with a service account)"
        )
    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=files)
    except Exception as error:  # any failure to read a user's file (YAML, types, keys)
        problem = " ".join(str(error).split())
        raise ClusterError(f"kubeconfig {files} cannot be used: {problem}") from error
    names = [c.get("name") for c in contexts or []]
    chosen = (
        current
        if context is None
        else next((c for c in contexts if c.get("name") == context), None)
    )
    if chosen is None:
        which = f"context {context!r}" if context else "a current context"
        raise ClusterError(
            f"kubeconfig {files} has no {which} (contexts: {', '.join(map(str, names)) or 'none'})"
        )
    try:
        api = k8s_config.new_client_from_config(
            config_file=files,
            context=chosen.get("name"),
            persist_config=False,
            client_configuration=_configuration(),
        )
    except Exception as error:  # a context naming a missing user or cluster, a bad cert...
        problem = " ".join(str(error).split())
        raise ClusterError(
            f"kubeconfig {files}, context {chosen.get('name')}: {problem}"
        ) from error
    track_connections(api)
    context_namespace = (chosen.get("context") or {}).get("namespace")
    return Connection(api, namespace or context_namespace or "default", chosen.get("name"), timeout)


def _configuration() -> Any:
    """A client configuration of its own (not the package's global default), whose requests
    are made once: urllib3's pool otherwise tries a failed request three times more (a reset
    connection four times, a timed-out one four times its timeout)."""
    configuration = k8s.Configuration()
    configuration.retries = Retry(total=0)
    return configuration


def _in_cluster(namespace: str | None, timeout: float | None) -> Connection:
    configuration = _configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException as error:
        raise ClusterError(f"in-cluster configuration: {error}") from error
    own = None
    with contextlib.suppress(OSError), open(IN_CLUSTER_NAMESPACE_FILE, encoding="utf-8") as handle:
        own = handle.read().strip() or None
    api = k8s.ApiClient(configuration=configuration)
    track_connections(api)
    return Connection(api, namespace or own or "default", None, timeout)


# ----- TrainJobs -----
class Cluster:
    """TrainJobs, their Pods, Events and logs in one namespace (or all of them)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.namespace = connection.namespace
        self.timeout = connection.request_timeout  # each request's (None: none)
        self._custom: Any = Deadline(k8s.CustomObjectsApi(connection.api), self.timeout)
        self._core: Any = Deadline(k8s.CoreV1Api(connection.api), self.timeout)

    @property
    def core(self) -> Any:
        """The CoreV1Api of this connection (`api_pods` makes its Pod calls through it)."""
        return self._core

    def close(self) -> None:
        self.connection.api.close()

    def in_namespace(self, namespace: str) -> Cluster:
        """The same connection, another namespace (a manifest's metadata.namespace)."""
        return Cluster(dataclasses.replace(self.connection, namespace=namespace))

    def translate(self, what: str, error: Exception, kind: str = constants.KIND) -> ClusterError:
        """`translate`; a request that timed out says where it went and how long it waited."""
        if self.timeout is not None and timed_out(error):
            return ClusterError(f"{what}: {no_answer(self.connection.server, self.timeout)}")
        return translate(what, error, kind)

    def call(self, what: str, function: Callable[[], T]) -> T:
        """function(), its failure one ClusterError (`translate`)."""
        try:
            return function()
        except (ApiException, HTTPError, OSError, ConfigException) as error:
            raise self.translate(what, error) from error

    def _job_call(
        self, verb: str, name: str, function: Callable[[], T], kind: str = constants.KIND
    ) -> T:
        try:
            return function()
        except ApiException as error:
            if error.status == 404 and not no_such_kind(error):
                raise ClusterError(
                    f"{kind} {name} not found in namespace {self.namespace}", 404
                ) from error
            raise self.translate(f"{verb} {kind} {self.namespace}/{name}", error, kind) from error
        except (HTTPError, OSError, ConfigException) as error:
            raise self.translate(f"{verb} {kind} {self.namespace}/{name}", error, kind) from error

    def _trainjobs(self, method: str, *args: Any, kind: str = constants.KIND) -> Any:
        """CustomObjectsApi.<method> on the TrainJobs (or TFJobs) of this namespace."""
        group, version, plural = RESOURCES[kind]
        call = getattr(self._custom, method)
        return call(group, version, self.namespace, plural, *args)

    def get_job(self, name: str) -> Obj:
        """The job `name` names (`objects.job_ref`): a TrainJob, or for `tfjob/NAME` the view
        of that TFJob (`objects.tfjob_view`; ShowError for one another controller runs)."""
        ref = objects.job_ref(name)
        result: Obj = self._job_call(
            "get",
            ref.name,
            lambda: self._trainjobs("get_namespaced_custom_object", ref.name, kind=ref.kind),
            ref.kind,
        )
        return objects.tfjob_view(result) if ref.is_tfjob else result

    def list_jobs(self, all_namespaces: bool = False) -> list[Obj]:
        if all_namespaces:
            result: Obj = self.call(
                "list TrainJobs in all namespaces",
                lambda: self._custom.list_cluster_custom_object(
                    constants.GROUP, constants.VERSION, constants.PLURAL,
                ),
            )  # fmt: skip
        else:
            result = self.call(
                f"list TrainJobs in namespace {self.namespace}",
                lambda: self._trainjobs("list_namespaced_custom_object"),
            )
        items: list[Obj] = result.get("items") or []
        return items

    def list_tfjobs(
        self, all_namespaces: bool = False, *, optional: bool = False
    ) -> tuple[list[Obj], list[str]] | None:
        """The views of the TFJobs the TrainJob operator serves (or may yet), and the
        `namespace/name` of those another controller runs (`objects.tfjob_views`). `optional`
        (a list of every kind of job): None where the cluster has no TFJobs, or this user may
        not list them, rather than an error."""
        group, version, plural = RESOURCES[tfjob.KIND]
        where = "in all namespaces" if all_namespaces else f"in namespace {self.namespace}"
        try:
            if all_namespaces:
                result = self._custom.list_cluster_custom_object(group, version, plural)
            else:
                result = self._trainjobs("list_namespaced_custom_object", kind=tfjob.KIND)
        except ApiException as error:
            if optional and (error.status == 403 or no_such_kind(error)):
                return None
            raise self.translate(f"list TFJobs {where}", error, tfjob.KIND) from error
        except (HTTPError, OSError, ConfigException) as error:
            raise self.translate(f"list TFJobs {where}", error, tfjob.KIND) from error
        return objects.tfjob_views(result.get("items") or [])

    def create_job(self, body: Obj) -> Obj:
        name = objects.name_of(body)
        result: Obj = self._job_call(
            "create", name, lambda: self._trainjobs("create_namespaced_custom_object", body)
        )
        return result

    def apply_job(self, body: Obj) -> tuple[Obj, str]:
        """Create the job, or give an existing one this spec, labels and annotations (the
        server keeps its status). Returns the object and `created`, `configured` or
        `unchanged` (the spec's generation did not move), as kubectl apply says."""
        try:
            return self.create_job(body), "created"
        except ClusterError as error:
            if error.status != 409:
                raise
        name = objects.name_of(body)
        for _ in range(3):  # a concurrent writer (the operator's finalizer) moved the version
            current = self.get_job(name)
            replacement = objects.applied(current, body)
            try:
                result: Obj = self._trainjobs("replace_namespaced_custom_object", name, replacement)
            except ApiException as error:
                if error.status == 409:
                    continue
                raise self.translate(f"apply TrainJob {self.namespace}/{name}", error) from error
            except (HTTPError, OSError) as error:
                raise self.translate(f"apply TrainJob {self.namespace}/{name}", error) from error
            moved = result["metadata"].get("generation") != current["metadata"].get("generation")
            return result, "configured" if moved else "unchanged"
        raise ClusterError(f"apply TrainJob {self.namespace}/{name}: it kept changing; try again")

    def delete_job(self, name: str) -> None:
        """Delete the TrainJob (or `tfjob/NAME`: the TFJob) and, with it, its Pods."""
        ref = objects.job_ref(name)
        self._job_call(
            "delete",
            ref.name,
            lambda: self._trainjobs("delete_namespaced_custom_object", ref.name, kind=ref.kind),
            ref.kind,
        )

    def apply_config_map(self, body: Obj) -> Obj:
        """Create the ConfigMap, or replace the data of the one of that name."""
        name = body["metadata"]["name"]
        what = f"create ConfigMap {self.namespace}/{name}"
        try:
            created = self._core.create_namespaced_config_map(self.namespace, body)
        except ApiException as error:
            if error.status != 409:
                raise self.translate(what, error) from error
            created = self.call(
                f"replace ConfigMap {self.namespace}/{name}",
                lambda: self._core.replace_namespaced_config_map(name, self.namespace, body),
            )
        except (HTTPError, OSError, ConfigException) as error:
            raise self.translate(what, error) from error
        result: Obj = self.connection.api.sanitize_for_serialization(created)
        return result

    def own_config_map(self, name: str, owners: list[Obj]) -> None:
        """Give the ConfigMap these ownerReferences (the garbage collector then removes it
        with its owner)."""
        self.call(
            f"set the owner of ConfigMap {self.namespace}/{name}",
            lambda: self._core.patch_namespaced_config_map(
                name,
                self.namespace,
                {"metadata": {"ownerReferences": owners}},
            ),
        )

    def delete_config_map(self, name: str) -> None:
        with contextlib.suppress(ClusterError):
            self.call(
                f"delete ConfigMap {self.namespace}/{name}",
                lambda: self._core.delete_namespaced_config_map(name, self.namespace),
            )

    def pods(self, job: str) -> list[Obj]:
        """The Pods of the job (a TFJob's carry the same labels of ours beside Kubeflow's)."""
        ref = objects.job_ref(job)
        selector = f"{constants.LABEL_JOB_NAME}={ref.name}"
        result = self.call(
            f"list the Pods of {ref.kind} {self.namespace}/{ref.name}",
            lambda: self._core.list_namespaced_pod(self.namespace, label_selector=selector),
        )
        pods: list[Obj] = self.connection.api.sanitize_for_serialization(result.items)
        return pods

    def events(self, names: list[str]) -> list[Obj]:
        """Events about any of these objects (the job and its Pods), oldest first."""
        # One object: the server filters; several (a job and its Pods): one list, filtered here.
        selector = f"involvedObject.name={names[0]}" if len(names) == 1 else None
        result = self.call(
            f"list Events in namespace {self.namespace}",
            lambda: self._core.list_namespaced_event(self.namespace, field_selector=selector),
        )
        wanted = set(names)
        events: list[Obj] = self.connection.api.sanitize_for_serialization(
            [e for e in result.items if e.involved_object and e.involved_object.name in wanted]
        )
        return events

    def pod_log(
        self,
        pod: str,
        *,
        previous: bool = False,
        tail: int | None = None,
        container: str = constants.DEFAULT_CONTAINER_NAME,
    ) -> str:
        """The log of the replica container of one Pod; ClusterError with the server's reason
        when there is none (no node yet, no kubelet, no previous container)."""
        kwargs: dict[str, Any] = {
            "container": container,
            "previous": previous,
        }
        if tail is not None:
            kwargs["tail_lines"] = tail
        text = self.call(
            f"log of Pod {pod}",
            lambda: self._core.read_namespaced_pod_log(pod, self.namespace, **kwargs),
        )
        return str(text or "")  # the client gives None for an empty body

    def _stream(
        self,
        pod: str,
        instance: str,
        tail: int | None,
        out: queue.Queue[_Line],
        responses: list[Any],
    ) -> None:
        """One followed container's lines into `out`, then None (the stream ended). The open
        response goes into `responses`, so a reader that stops early can close it. Connecting
        waits the request timeout; a container quiet for FOLLOW_QUIET_SECONDS (no head comes
        before its first line) has its stream opened again from then (`since_quiet`)."""
        quiet_since: float | None = None  # when the stream last read nothing for so long
        pending = b""
        try:
            while True:
                since = None if quiet_since is None else since_quiet(quiet_since, time.monotonic())
                response = None
                try:
                    response = self._core.read_namespaced_pod_log(
                        pod,
                        self.namespace,
                        _preload_content=False,
                        **follow_arguments(tail, since, self.timeout),
                    )
                    responses.append(response)
                    for chunk in response.stream(4096):
                        pending += chunk
                        *lines, pending = pending.split(b"\n")
                        for line in lines:
                            out.put((instance, pod, line.decode("utf-8", "replace")))
                    break
                except (HTTPError, OSError) as error:
                    if self.timeout is None or not quiet(error):
                        raise
                    quiet_since = time.monotonic()
                    if response is not None:
                        response.close()
            if pending:
                out.put((instance, pod, pending.decode("utf-8", "replace")))
        except (ApiException, HTTPError, OSError) as error:
            note = self.translate(f"log of Pod {pod}", error).message
            out.put((instance, pod, f"{describe.NOTE_PREFIX}{note}"))
        except Exception as error:  # no traceback on the terminal from a stream's thread
            out.put((instance, pod, f"{describe.NOTE_PREFIX}log of Pod {pod}: {error!r}"))
        finally:
            out.put((instance, pod, None))

    def follow_logs(self, job: str, tail: int | None = None) -> Iterator[tuple[str, str]]:
        """(Pod name, line) of every replica of `job` as they come, across container restarts
        and Pods recreated under the same name, until the job has finished and every stream
        has ended. A line starting with `describe.NOTE_PREFIX` is a note about a stream."""
        lines: queue.Queue[_Line] = queue.Queue()
        streamed: set[str] = set()  # describe.log_instance keys already followed
        noted: set[str] = set()  # instances whose Pod can have no log (said once)
        open_streams: set[str] = set()
        responses: list[Any] = []
        try:
            while True:
                finished = objects.finished(self.get_job(job))
                for pod in self.pods(job):
                    instance = describe.log_instance(pod)
                    if instance is None or instance in streamed:
                        continue
                    name = pod["metadata"]["name"]
                    unavailable = describe.log_unavailable(pod)
                    if unavailable is not None:  # followed once it has a node
                        if instance not in noted:
                            noted.add(instance)
                            yield name, f"{describe.NOTE_PREFIX}{unavailable}"
                        continue
                    streamed.add(instance)
                    open_streams.add(instance)
                    threading.Thread(
                        target=self._stream,
                        args=(name, instance, tail, lines, responses),
                        daemon=True,
                    ).start()
                deadline = time.monotonic() + LOG_POLL_SECONDS
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        instance, pod_name, line = lines.get(timeout=left)
                    except queue.Empty:
                        break
                    if line is None:
                        open_streams.discard(instance)
                    else:
                        yield pod_name, line
                if finished and not open_streams:
                    return
        finally:  # the reader stopped (or the job ended): no stream goes on reading unseen
            for response in list(responses):
                # Shut first: close() waits for the lock of the stream's thread's read, which
                # a quiet container never ends (Ctrl-C hung there); shut, that read ends.
                _shut(getattr(response, "connection", None))
                with contextlib.suppress(HTTPError, OSError):
                    response.close()
