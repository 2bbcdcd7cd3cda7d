"""The only module of the operator that talks to the API server.

Why the synchronous `kubernetes` client in a thread pool (not kopf's internal aiohttp API):
kopf's API helpers are private and unversioned; the official client is typed enough, handles
every auth method of a kubeconfig and in-cluster service accounts, and its calls are short
and few per reconcile (children are read from the in-memory index, children.py). A dedicated
executor keeps those calls off kopf's own handler executor.

Error contract, so that callers never inspect HTTP codes:
- create: 409 AlreadyExists is success (deterministic names make creation idempotent);
- delete: 404 NotFound (and a failed uid precondition: the object we meant is gone) is success;
- 400/422 (the API server refused the object itself) -> `RejectedError`, a permanent error;
- everything else (5xx, 429, 403 while a namespace terminates, connection trouble)
  -> `TransientError`, retried by the caller with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import json
import logging
import socket
from collections.abc import Callable
from typing import Any, Final, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import exceptions as k8s_exceptions

from trainjob.core import constants

T = TypeVar("T")

logger = logging.getLogger("trainjob_operator.kube")

REPORTING_COMPONENT: Final = "trainjob.dev/operator"
SOURCE_COMPONENT: Final = "trainjob-operator"

VOLCANO_GROUP: Final = "scheduling.volcano.sh"
VOLCANO_VERSION: Final = "v1beta1"
PLUGINS_GROUP: Final = "scheduling.x-k8s.io"
PLUGINS_VERSION: Final = "v1alpha1"
PODGROUP_PLURAL: Final = "podgroups"


class TransientError(Exception):
    """A call failed for a reason that may go away: retry later."""


class RejectedError(Exception):
    """The API server refused the object itself (400/422): retrying cannot help."""


def _message(exc: k8s_exceptions.ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return f"{exc.status} {exc.reason}"


def _classify(exc: k8s_exceptions.ApiException, what: str) -> Exception:
    if exc.status in (400, 422):
        return RejectedError(f"{what}: {_message(exc)}")
    return TransientError(f"{what}: {_message(exc)}")


def load_api_client() -> k8s.ApiClient:
    """In-cluster service account if there is one, else $KUBECONFIG / ~/.kube/config."""
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = 32
    return k8s.ApiClient(configuration)


def _read_raw(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> bytes:
    """Call `fn` and return the reply's bytes undecoded (the client's models are slow to build
    and the callers want plain dicts)."""
    response = fn(*args, _preload_content=False, **kwargs)
    try:
        data = response.read()
    finally:
        response.release_conn()
    return bytes(data)


def _unread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
    """Call `fn` and drop the reply undecoded (2xx; otherwise ApiException as usual); reading
    it returns the connection to the pool."""
    _read_raw(fn, *args, **kwargs)


class Kube:
    """Async facade over the Kubernetes API, for Pods, Services, Events, TrainJobs, PodGroups."""

    def __init__(self, api_client: k8s.ApiClient, workers: int, instance: str = "") -> None:
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="trainjob-api"
        )
        self._instance = instance or socket.gethostname()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    async def _call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, functools.partial(fn, *args, **kwargs)
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientError(f"API server unreachable: {exc}") from exc

    async def _call_unread(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """`_call` for a request whose reply is not used (creates, deletes, Events): the reply
        is read and dropped undecoded. Building the client's models from it (a V1Pod per Pod
        created) was a large share of the operator's CPU under load. Error replies still raise
        ApiException with status and body, so the error contract above is unchanged."""
        await self._call(_unread, fn, *args, **kwargs)

    # -- create / delete children ---------------------------------------------------------

    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create a Pod or Service; False if it already existed (409 is success)."""
        kind = manifest["kind"]
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        fn = (
            self._core.create_namespaced_pod
            if kind == "Pod"
            else self._core.create_namespaced_service
        )
        try:
            await self._call_unread(fn, namespace, manifest)
        except k8s_exceptions.ApiException as exc:
            if exc.status == 409:
                return False
            raise _classify(exc, f"creating {kind} {namespace}/{name}") from exc
        logger.info("Created %s %s/%s", kind, namespace, name)
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self._delete(self._core.delete_namespaced_pod, "Pod", namespace, name, uid)

    async def delete_service(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self._delete(self._core.delete_namespaced_service, "Service", namespace, name, uid)

    async def _delete(
        self, fn: Callable[..., Any], kind: str, namespace: str, name: str, uid: str | None
    ) -> None:
        body = k8s.V1DeleteOptions(
            preconditions=k8s.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Background",
        )
        try:
            await self._call_unread(fn, name, namespace, body=body)
        except k8s_exceptions.ApiException as exc:
            # 404: already gone. 409 on a uid precondition: the object we meant is gone and
            # a newer one took the name, which must stay.
            if exc.status in (404, 409):
                return
            raise _classify(exc, f"deleting {kind} {namespace}/{name}") from exc
        logger.info("Deleted %s %s/%s", kind, namespace, name)

    async def list_children(self, namespace: str, kind: str, job: str) -> list[dict[str, Any]]:
        """The Pods or Services labelled as `job`'s children, as plain dicts."""
        fn = self._core.list_namespaced_pod if kind == "Pod" else self._core.list_namespaced_service
        selector = f"{constants.LABEL_JOB_NAME}={job}"
        try:
            raw = await self._call(_read_raw, fn, namespace, label_selector=selector)
        except k8s_exceptions.ApiException as exc:
            raise _classify(exc, f"listing {kind}s of TrainJob {namespace}/{job}") from exc
        items = json.loads(raw).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    # -- the TrainJob itself --------------------------------------------------------------

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result = await self._call(
                self._custom.get_namespaced_custom_object,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
            )
        except k8s_exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise _classify(exc, f"reading TrainJob {namespace}/{name}") from exc
        if not isinstance(result, dict):
            raise TransientError(f"reading TrainJob {namespace}/{name}: unexpected reply")
        return result

    async def patch_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch the status subresource: fields we do not write (status.progress) stay.
        Returns the TrainJob as the patch left it (None if it is gone)."""
        try:
            result = await self._call(
                self._custom.patch_namespaced_custom_object_status,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
                {"status": status},
            )
        except k8s_exceptions.ApiException as exc:
            if exc.status == 404:
                return None  # deleted meanwhile: nothing left to report on
            raise _classify(exc, f"patching status of TrainJob {namespace}/{name}") from exc
        return result if isinstance(result, dict) else None

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None:
        """TTL deletion; children go with it through the garbage collector."""
        body = k8s.V1DeleteOptions(
            preconditions=k8s.V1Preconditions(uid=uid), propagation_policy="Background"
        )
        try:
            await self._call_unread(
                self._custom.delete_namespaced_custom_object,
                constants.GROUP,
                constants.VERSION,
                namespace,
                constants.PLURAL,
                name,
                body=body,
            )
        except k8s_exceptions.ApiException as exc:
            if exc.status in (404, 409):
                return
            raise _classify(exc, f"deleting TrainJob {namespace}/{name}") from exc
        logger.info("Deleted TrainJob %s/%s", namespace, name)

    # -- events ---------------------------------------------------------------------------

    async def post_event(
        self,
        job: dict[str, Any],
        event_type: str,
        reason: str,
        message: str,
        now: datetime.datetime,
    ) -> None:
        """A core/v1 Event on the TrainJob, so `kubectl describe tj` tells the story.
        Best effort: an Event that cannot be written is logged, never retried."""
        metadata = job.get("metadata") or {}
        namespace = str(metadata.get("namespace"))
        name = str(metadata.get("name"))
        stamp = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        micro = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
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
            await self._call_unread(self._core.create_namespaced_event, namespace, body)
        except (k8s_exceptions.ApiException, TransientError) as exc:
            logger.warning(
                "Could not post Event %s on TrainJob %s/%s: %s", reason, namespace, name, exc
            )

    # -- gang scheduling ------------------------------------------------------------------

    async def create_pod_group(self, manifest: dict[str, Any]) -> bool:
        group, version = manifest["apiVersion"].split("/", 1)
        namespace = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        try:
            await self._call_unread(
                self._custom.create_namespaced_custom_object,
                group,
                version,
                namespace,
                PODGROUP_PLURAL,
                manifest,
            )
        except k8s_exceptions.ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status == 404:
                raise TransientError(
                    f"creating PodGroup {namespace}/{name}: the {group} API is not installed"
                ) from exc
            raise _classify(exc, f"creating PodGroup {namespace}/{name}") from exc
        logger.info("Created PodGroup %s/%s", namespace, name)
        return True
