"""The kinds a job comes in by: a TrainJob, or Kubeflow's TFJob (`--tfjob`). One engine
serves both (reconciler.py); a door says only how its kind is read, written and shown.

- `current`: the object to decide from, as the engine reads it (a TrainJob manifest whose
  `status` is the engine's status). A TrainJob is that already. A TFJob is read through
  `trainjob.core.tfjob.as_trainjob` (its spec as training-operator v1.9.4 defaults it in
  memory; the engine's status from its annotation), with the TFJob itself kept beside it
  under `TFJOB_KEY` for the writes.
- `recorder`: where the engine's record of a decision goes (writes.JobWrites). A TrainJob's
  status subresource; a TFJob's annotation, written conditionally on the version decided
  from (the same optimistic concurrency), with its Events on the TFJob.
- `publish`: after the record, what clients read. Nothing more for a TrainJob; a TFJob's
  status in TFJob's vocabulary (trainjob.core.tfjob_status), as training-operator writes it.
- `accepts`: whether this operator runs the job at all (a TFJob's runPolicy.managedBy).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trainjob.core import constants, convert, policy, render, spec, tfjob, tfjob_status
from trainjob.core import status as st
from trainjob_operator import children, kube, writes

# Where a TFJob's view keeps the TFJob it was made from (left out before spec.parse).
TFJOB_KEY: Final = "tfjob"


class Door:
    """What the engine asks of a job's kind (each door is a frozen dataclass that says what
    its kind is); as is, the answers for a TrainJob, which a door of another kind overrides
    where its kind differs."""

    kind: str
    api_version: str
    # Whether the operator's own Kueue integration (our Workloads) applies: a TFJob's
    # Workloads are Kueue's own TFJob integration's, which needs only runPolicy.suspend.
    own_kueue: bool
    # Whether the job's Pods report progress to the operator (a TFJob's Pods are left as
    # training-operator makes them: no projected token, no extra volume).
    reports_progress: bool
    # A finalizer an earlier release put on this kind's jobs, which nothing needs: a job
    # keeping it could never be deleted (None: none).
    stale_finalizer: str | None

    def view(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The engine's reading of a job of this kind as watched or read."""
        return dict(raw)

    def accepts(self, raw: Mapping[str, Any]) -> bool:
        return True

    def owner(self, raw: Mapping[str, Any]) -> render.Owner:
        """The controller reference every child of the job carries: the job, of its kind."""
        metadata = raw.get("metadata") or {}
        name, uid = str(metadata.get("name") or ""), str(metadata.get("uid") or "")
        return render.Owner(name=name, uid=uid, api_version=self.api_version, kind=self.kind)

    async def current(
        self,
        api: kube.Kube,
        namespace: str,
        name: str,
        live: Mapping[str, Any] | None,
        seen: writes.Seen,
    ) -> dict[str, Any] | None:
        reader = self.recorder(api, {})
        watched = self.view(live) if live is not None else None
        return await writes.current_trainjob(reader, namespace, name, watched, seen)

    def parse(self, raw: Mapping[str, Any]) -> spec.TrainJob:
        return spec.parse(raw)

    def recorder(self, api: kube.Kube, raw: Mapping[str, Any]) -> writes.JobWrites:
        return api

    def kind_labels(self, raw: Mapping[str, Any]) -> render.KindLabels | None:
        """The kind's own labels on the job's children, beside ours (None: ours alone)."""
        return None

    async def publish(
        self,
        api: kube.Kube,
        raw: Mapping[str, Any],
        engine: st.JobStatus,
        pods: Iterable[children.ChildPod],
        now: datetime.datetime,
        seen: writes.Seen,
    ) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class TrainJobDoor(Door):
    kind: str = constants.KIND
    api_version: str = constants.API_VERSION
    own_kueue: bool = True
    reports_progress: bool = True
    stale_finalizer: str | None = constants.FINALIZER


TRAINJOB: Final = TrainJobDoor()


# -- TFJob ----------------------------------------------------------------------------------


def tfjob_view(tfjob_raw: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's reading of a TFJob, with the TFJob beside it."""
    try:
        view = tfjob.as_trainjob(tfjob_raw)
    except convert.ConvertError:
        # Refused by the webhook's checks (`TFJobDoor.parse`); what is left to read is the
        # metadata and the engine's status.
        metadata = tfjob_raw.get("metadata") or {}
        view = {
            "apiVersion": tfjob.API_VERSION,
            "kind": tfjob.KIND,
            "metadata": {
                k: metadata[k]
                for k in ("name", "namespace", "uid", "generation", "resourceVersion")
                if k in metadata
            },
            "spec": {},
            "status": tfjob.engine_status(tfjob_raw),
        }
    metadata = dict(view.get("metadata") or {})
    source = tfjob_raw.get("metadata") or {}
    for key in ("deletionTimestamp", "resourceVersion"):
        if key in source:
            metadata[key] = source[key]
    view["metadata"] = metadata
    view[TFJOB_KEY] = tfjob_raw
    return view


def tfjob_of(view: Mapping[str, Any]) -> Mapping[str, Any]:
    source = view.get(TFJOB_KEY)
    return source if isinstance(source, Mapping) else {}


class TFJobWrites:
    """writes.JobWrites for one reconcile of a TFJob: the engine's status goes into the
    TFJob's annotation (merge-patched onto the status decided from), Events are the TFJob's,
    and TTL deletes the TFJob."""

    def __init__(self, api: kube.Kube, view: Mapping[str, Any]) -> None:
        self.api = api
        self.view = view

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self.api.get_object(tfjob.GROUP, tfjob.VERSION, namespace, tfjob.PLURAL, name)
        return tfjob_view(found) if found is not None else None

    async def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        base = writes.status_of(self.view)
        merged = writes.apply_merge_patch(base, status)
        patch = {
            "metadata": {
                "annotations": {tfjob.ANNOTATION_ENGINE_STATUS: tfjob.encode_status(merged)}
            }
        }
        result = await self.api.patch_object(
            tfjob.GROUP, tfjob.VERSION, namespace, tfjob.PLURAL, name, patch, resource_version
        )
        return tfjob_view(result) if result is not None else None

    async def post_event(
        self,
        job: dict[str, Any],
        event: policy.Event,
        now: datetime.datetime,
        event_id: str | None = None,
    ) -> str | None:
        # On the TFJob, in training-operator's vocabulary (TFJobRestarting, TFJobSucceeded, ...).
        reason = tfjob_status.event_reason(event.reason)
        told = dataclasses.replace(event, reason=reason)
        return await self.api.post_event(dict(tfjob_of(job) or job), told, now, event_id)

    async def withdraw_events(self, namespace: str, names: Iterable[str]) -> None:
        await self.api.withdraw_events(namespace, names)

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None:
        await self.api.delete_object(tfjob.GROUP, tfjob.VERSION, namespace, tfjob.PLURAL, name, uid)


@dataclasses.dataclass(frozen=True)
class TFJobDoor(Door):
    # takeover or coexist (trainjob.core.tfjob.served)
    mode: str = tfjob.TAKEOVER
    kind: str = tfjob.KIND
    api_version: str = tfjob.API_VERSION
    own_kueue: bool = False
    reports_progress: bool = False
    stale_finalizer: str | None = None

    def view(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return tfjob_view(raw)

    def accepts(self, raw: Mapping[str, Any]) -> bool:
        return tfjob.served(tfjob.managed_by(tfjob_of(raw) or raw), self.mode)

    def parse(self, raw: Mapping[str, Any]) -> spec.TrainJob:
        source = tfjob_of(raw)
        problems = tfjob.webhook_problems(source) + tfjob.template_problems(source)
        if problems:
            raise spec.SpecError(problems)
        try:
            tfjob.as_trainjob(source)
        except convert.ConvertError as exc:
            # In the TFJob's own field names (the view left its spec empty).
            path, _, words = str(exc).partition(": ")
            raise spec.SpecError([spec.Problem(path, words or str(exc))]) from exc
        job = dataclasses.replace(
            spec.parse({k: v for k, v in raw.items() if k != TFJOB_KEY}), kind=self.kind
        )
        if tfjob.replica_types(source).get(constants.CHIEF) == "Master":
            # Its Pods are <job>-master-<i>, its TF_CONFIG task "master", as upstream.
            return dataclasses.replace(job, chief_name="master")
        return job

    def recorder(self, api: kube.Kube, raw: Mapping[str, Any]) -> writes.JobWrites:
        return TFJobWrites(api, raw)

    def kind_labels(self, raw: Mapping[str, Any]) -> render.KindLabels | None:
        return tfjob.KubeflowLabels(tfjob.replica_types(tfjob_of(raw)))

    async def publish(
        self,
        api: kube.Kube,
        raw: Mapping[str, Any],
        engine: st.JobStatus,
        pods: Iterable[children.ChildPod],
        now: datetime.datetime,
        seen: writes.Seen,
    ) -> None:
        """The TFJob's own status from the engine's verdict (only when it changes)."""
        source = tfjob_of(raw)
        metadata = source.get("metadata") or {}
        namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
        previous = source.get("status") if isinstance(source.get("status"), Mapping) else {}
        assert isinstance(previous, Mapping)
        phases = [
            tfjob_status.PodPhase(p.key[0], p.observed.phase, p.observed.deleting) for p in pods
        ]
        wanted = tfjob_status.view(
            previous,
            engine,
            tfjob.replica_types(source),
            phases,
            namespace,
            name,
            now,
            tfjob.restart_policies(source),
        )
        patch = writes.merge_patch(previous, {**previous, **wanted})
        if not patch:
            return
        result = await api.patch_object(
            tfjob.GROUP,
            tfjob.VERSION,
            namespace,
            tfjob.PLURAL,
            name,
            {"status": patch},
            subresource="status",
        )
        if result is not None and writes.version_of(result):
            seen.known = tfjob_view(result)
