"""How a decision is written, and which copy of a TrainJob it is made from: the write
protocol of reconciler.py (its module docstring says why this order).

- `current_trainjob`: the watched copy when it is known to be at least as new as anything
  this job's loop has read or written (`Seen`), else a GET.
- `record_decision`: the decision's Events (named after the job, the status decided
  from and each Event's type and reason, so the same transition decided again posts the
  same names, whatever its words), then its status,
  conditional on the version decided from; a conflict leaves the Events to withdraw
  (`Superseded`) and the reconcile is made again from a fresh read.
- `status_diff`: the merge patch from the status there is to the status wanted (our keys);
  `merge_patch` and `apply_merge_patch`, the operator's one JSON merge patch (RFC 7386).

Every API call goes through `JobWrites` (kube.Kube is one); tests/unit/test_write_protocol.py
records them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from trainjob.core import policy, times
from trainjob.core import status as st
from trainjob_operator import kube

# The keys of `status` this operator writes (`progress` belongs to progress reporting).
STATUS_KEYS: Final = (
    "state",
    "ready",
    "restartCount",
    "disruptionCount",
    "conditions",
    "replicaStatuses",
    "startTime",
    "attemptStartTime",
    "completionTime",
    "observedGeneration",
)


class JobWrites(Protocol):
    """The API calls one reconcile makes for its own job (kube.Kube is one; the unit tests'
    recorder is another): its write protocol is checked against this, in order, with no
    API server (tests/unit/test_write_protocol.py)."""

    async def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any] | None: ...

    async def post_event(
        self,
        job: dict[str, Any],
        event: policy.Event,
        now: datetime.datetime,
        event_id: str | None = None,
    ) -> str | None: ...

    async def withdraw_events(self, namespace: str, names: Iterable[str]) -> None: ...

    async def delete_trainjob(self, namespace: str, name: str, uid: str) -> None: ...


@dataclasses.dataclass
class Seen:
    """What one job's reconcile loop knows about its job between reconciles, so that it can
    work from the watched copy (kept current by the job informer: informer.JobInformer)
    instead of a GET per reconcile, without ever deciding from a copy older than what it
    already knows.

    The watched copy lags behind our own status writes until their watch events arrive, and
    it can lag for long (a job watch that is down while the Pod informer is live): deciding
    from it then decides again from an old status. So after every GET and every write of
    ours, the result is the newest known version (`known`), and the watched copy is trusted
    again only once it shows exactly that version (watch events come in order, so from then
    on it is at least as new). Until then each reconcile reads with a GET. resourceVersions
    are opaque: they are only compared for equality, never ordered."""

    # The newest copy of the job this loop has read or written, until the watched one shows it.
    known: dict[str, Any] | None = None
    # A conditional write of ours conflicted: the next reconcile reads afresh.
    stale: bool = False
    # The Events this loop posted for a decision whose status write conflicted.
    superseded: Superseded | None = None
    # Replicas whose Pod the API server refused at the last try, with its message: the next
    # decision says so (a waiting cause) until the Pod exists.
    refused: dict[policy.ReplicaKey, str] = dataclasses.field(default_factory=dict)
    # Consecutive reconciles that met a refusal: the retry backs off (2 s doubling to 60 s).
    refusals: int = 0
    # Causes read from failed Pods' logs, by Pod uid (None: read, none found): each log is
    # read once (log_causes.py), and forgotten with its Pod.
    log_causes: dict[str, str | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Superseded:
    """Events posted for a decision that was never recorded, and the status it was made
    from. Whether they told of something that did not happen is known only after a fresh
    read: if the status is still the same, nobody recorded a transition from it, and the
    Events the new decision does not post again are withdrawn; if the status moved on,
    another writer (a second operator) recorded a transition from it, most likely the same
    one, whose Events these are: they stay."""

    fingerprint: str
    names: tuple[str, ...]


def settled(seen: Seen) -> bool:
    """The watched copy shows everything this loop wrote, and nothing is being retried."""
    return seen.known is None and not seen.stale and not seen.refused and not seen.refusals


def version_of(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


async def current_trainjob(
    api: JobWrites,
    namespace: str,
    name: str,
    live: Mapping[str, Any] | None,
    seen: Seen,
) -> dict[str, Any] | None:
    """The job to reconcile from: the watched copy when it is known to be at least as new as
    anything this loop has read or written (see `Seen`), else a GET."""
    if live is not None and not seen.stale:
        # A shallow copy: the job loop swaps in a new event's dict instead of changing the old
        # one, so this snapshot stays as it is while the reconcile awaits.
        snapshot = dict(live)
        version = version_of(snapshot)
        if seen.known is None and version is not None:
            return snapshot
        if seen.known is not None and version is not None and version == version_of(seen.known):
            seen.known = None  # the watched copy has caught up: trust it from now on
            return snapshot
    raw = await api.get_trainjob(namespace, name)
    seen.stale = False
    seen.known = raw
    return raw


async def write_status(
    api: JobWrites,
    raw: Mapping[str, Any],
    patch: dict[str, Any],
    seen: Seen,
) -> dict[str, Any] | None:
    """Write `patch` only if the TrainJob is still the version `raw` was read at; returns the
    TrainJob as written (None: it is gone). kube.ConflictError: decide again from a fresh read."""
    metadata = raw.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    try:
        result = await api.patch_status(namespace, name, patch, version_of(raw))
    except kube.ConflictError:
        seen.stale = True
        raise
    if result is not None and version_of(result):
        seen.known = result
    return result


def status_fingerprint(status: Mapping[str, Any]) -> str:
    """The status a decision was made from, as far as decisions go: our own keys only (a
    progress report changes the resourceVersion and `status.progress`, not the transition)."""
    owned = {key: status[key] for key in STATUS_KEYS if key in status}
    return json.dumps(owned, sort_keys=True, separators=(",", ":"), default=str)


def event_id(uid: str, fingerprint: str, occurrence: int, event: policy.Event) -> str:
    """The name suffix of an Event of a decision made from TrainJob `uid` whose status was
    `fingerprint`; `occurrence` counts the Events of the same type and reason earlier in the
    same decision. The same transition decided again from the same recorded status gets the
    same name, whatever else changed in between (the resourceVersion moves with labels,
    annotations, progress), whatever other Events come with it (a second replica that ended
    meanwhile adds an Event before the terminal one, which a name by position in the list
    would count as another Succeeded) and whatever its words now say (the next decision may
    see more: worker 1 succeeded meanwhile, so "Restarting worker 0, worker 1" becomes
    "Restarting worker 0", the same restart): a decision whose status write never landed (a
    crash, a conflict) posts each of its Events once, and the words are the last decision's
    (kube.Kube.post_event rewords an Event already there). A later transition starts from
    another status (conditions carry their transition times), so it gets other names."""
    key = f"{uid}/{fingerprint}/{occurrence}/{event.type}/{event.reason}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


async def post_events(
    api: JobWrites,
    raw: Mapping[str, Any],
    fingerprint: str,
    events: Iterable[policy.Event],
    now: datetime.datetime,
) -> tuple[list[str], list[str]]:
    """Post the Events of a decision made from the status `fingerprint`; returns the names
    of all of them and of those this call created (the others were there already, or were
    refused)."""
    metadata = raw.get("metadata") or {}
    uid, job_name = str(metadata.get("uid") or ""), str(metadata.get("name"))
    names: list[str] = []
    created: list[str] = []
    seen_before: collections.Counter[tuple[str, str]] = collections.Counter()
    for event in events:
        kind = (event.type, event.reason)
        suffix = event_id(uid, fingerprint, seen_before[kind], event)
        seen_before[kind] += 1
        name = await api.post_event(dict(raw), event, now, suffix)
        names.append(kube.event_name(job_name, suffix))
        if name is not None:
            created.append(name)
    return names, created


def status_of(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    status = raw.get("status")
    return status if isinstance(status, Mapping) else {}


async def record_decision(
    api: JobWrites,
    raw: Mapping[str, Any],
    events: Iterable[policy.Event],
    patch: dict[str, Any] | None,
    now: datetime.datetime,
    seen: Seen,
) -> dict[str, Any] | None:
    """Record a decision: its Events, then its status (if it changes); returns the TrainJob
    as written, or `raw` when the status was already so (None: the job is gone).

    A conflicting status write means the decision was superseded (the job changed under it:
    a suspend, a delete, another writer); the caller decides again from a fresh read, and
    this loop remembers the Events it posted (see `Superseded`). A transition decided again
    from the same status posts the same names again."""
    fingerprint = status_fingerprint(status_of(raw))
    names, created = await post_events(api, raw, fingerprint, events, now)
    pending = seen.superseded
    keep: list[str] = []
    seen.superseded = None
    if pending is not None and pending.fingerprint == fingerprint:
        keep = [name for name in pending.names if name in names]
        stale = [name for name in pending.names if name not in names]
        namespace = str((raw.get("metadata") or {}).get("namespace"))
        await api.withdraw_events(namespace, stale)
    if patch is None:
        return dict(raw)
    try:
        return await write_status(api, raw, patch, seen)
    except kube.ConflictError:
        seen.superseded = Superseded(fingerprint, tuple(created + keep))
        raise


def conditions_of(status: st.JobStatus) -> list[dict[str, Any]]:
    return [
        {
            "type": c.type,
            "status": "True" if c.status else "False",
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": times.format_time(c.last_transition_time),
        }
        for c in status.conditions
    ]


def invalid_status_dict(status: st.JobStatus) -> dict[str, Any]:
    """Status of a TrainJob whose spec cannot be parsed (no TrainJob to render replicas)."""
    result: dict[str, Any] = {
        "state": st.state_of(status),
        "restartCount": status.restart_count,
        "conditions": conditions_of(status),
    }
    if status.completion_time is not None:
        result["completionTime"] = times.format_time(status.completion_time)
    if status.observed_generation is not None:
        result["observedGeneration"] = status.observed_generation
    return result


def status_diff(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch turning `current` into `wanted` for our keys; None when nothing changes.
    Keys we own but no longer write are nulled; keys we do not own are left alone."""
    owned_now = {key: current[key] for key in STATUS_KEYS if key in current}
    owned_wanted = {key: wanted[key] for key in STATUS_KEYS if key in wanted}
    return merge_patch(owned_now, owned_wanted) or None


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: keys gone are nulled,
    maps patched key by key, everything else replaced."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif before != value or key not in old:
            patch[key] = value
    return patch


def apply_merge_patch(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with the merge patch `patch` applied, as the API server applies it (RFC 7386):
    for a record kept where no API server applies it (a TFJob's engine status annotation)."""
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = apply_merge_patch(result[key], value)
        else:
            result[key] = value
    return result
