"""`describe` and `logs` (pure): the text of `trainjob describe` (what kubectl describe would
say, with the replicas, exit codes, cause and progress of a TrainJob laid out; for a TFJob, its
own conditions, as its clients read them), Events in time order, and which Pods' logs can be
read, in replica order.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Final

from trainjob.cluster.objects import (
    NONE,
    Obj,
    age,
    align,
    hold_of,
    name_of,
    namespace_of,
    no_status_yet,
    pod_key,
    pod_label,
    ref_of,
    report_of,
    source_of,
    status_of,
)
from trainjob.console import view
from trainjob.core import constants, containers, tfjob, times
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import replica_label

# A line of `api.Cluster.follow_logs` that is a note about a stream, not a log line.
NOTE_PREFIX: Final = "\x00note: "


def log_instance(pod: Obj) -> str | None:
    """One container run of a Pod (its uid and restart count) whose log can be read: it has
    started (running or terminated). None while it waits to start."""
    container = containers.named(pod, constants.DEFAULT_CONTAINER_NAME)
    if container is not None and container.started:
        uid = (pod.get("metadata") or {}).get("uid")
        return f"{uid}/{container.restart_count}"
    return None


def log_unavailable(pod: Obj) -> str | None:
    """Why a Pod can have no log yet (the kubelet of its node keeps logs), else None."""
    if not (pod.get("spec") or {}).get("nodeName"):
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        return f"Pod {name_of(pod)} is on no node yet ({phase}, not scheduled), so it has no log"
    container = containers.named(pod, constants.DEFAULT_CONTAINER_NAME)
    if container is not None and container.waiting:
        why = container.waiting.get("reason") or "waiting"
        return f"Pod {name_of(pod)}: its container has not started ({why}), so it has no log"
    return None


def order_pods(pods: Sequence[Obj]) -> list[Obj]:
    """Replica order (chief, worker, ps, evaluator; by index), foreign Pods last by name."""

    def rank(pod: Obj) -> tuple[int, int, str]:
        key = pod_key(pod)
        if key is None or key[0] not in constants.REPLICA_TYPES:
            return (len(constants.REPLICA_TYPES), 0, name_of(pod))
        return (constants.REPLICA_TYPES.index(key[0]), key[1], "")

    return sorted(pods, key=rank)


def describe_text(
    obj: Obj, pods: Sequence[Obj], events: Sequence[Obj], now: datetime.datetime
) -> str:
    """`trainjob describe`: what kubectl describe would say, with the replicas, exit codes,
    cause and progress of a TrainJob laid out."""
    raw = obj.get("status") or {}
    status = status_of(obj)
    metadata = obj.get("metadata") or {}
    lines = [f"Name:         {name_of(obj)}", f"Namespace:    {namespace_of(obj)}"]
    if ref_of(obj).is_tfjob:
        lines.append(
            f"Kind:         {tfjob.KIND} ({tfjob.API_VERSION}), run by the TrainJob operator"
        )
    lines += [
        f"Created:      {metadata.get('creationTimestamp') or NONE} ({age(obj, now)} ago)",
        f"State:        {raw.get('state') or st.state_of(status)}",
    ]
    waiting = no_status_yet(obj)  # a TFJob nobody has served yet
    if waiting is not None:
        lines.append(f"Note:         {waiting}")
    lines += [
        f"Ready:        {raw.get('ready') or NONE}",
        f"Restarts:     {status.restart_count}",
        f"Started:      {raw.get('startTime') or NONE}",
        f"Completed:    {raw.get('completionTime') or NONE}",
    ]
    for ctype in (st.FAILED, st.SUCCEEDED):
        condition = status.condition(ctype)
        if condition is not None and condition.status:
            lines.append(f"Cause:        {condition.reason}: {condition.message}")
    hold = hold_of(obj)
    if hold is not None:  # why it waits (Kueue's words), what exists of it, what starts it
        lines.append(f"Suspended:    {hold.reason}: {hold.message}")
        lines.append(f"              {hold.meanwhile[0].upper()}{hold.meanwhile[1:]}")
        lines.append(f"Next:         {hold.resume}")
    report = report_of(raw)
    if report is not None:
        lines.append(f"Progress:     {view.progress_line(report)}")
        progress = raw.get("progress") or {}
        if progress.get("eta"):
            lines.append(f"ETA:          {progress['eta']}")
        if report.last_checkpoint:
            lines.append(f"Checkpoint:   {report.last_checkpoint}")
    else:
        lines.append(f"Progress:     {NONE}")
    # What TensorFlow sees in each replica, as each said when it started (none for a TFJob).
    devices = core_progress.devices_of_status(raw.get("progress"))
    if devices:
        lines.append(f"Devices:      {core_progress.devices_summary(devices)}")
    lines.append("Conditions:")
    conditions = _conditions(obj, status)
    if conditions:
        rows = [["Type", "Status", "Reason", "Last Transition", "Message"], *conditions]
        lines += ["  " + line for line in align(rows)]
    else:
        lines.append(f"  {NONE}")
    lines.append("Replicas:")
    replica_rows = [["Replica", "State", "Attempt", "Exit Code", "Reason", "Pod"]]
    if devices:
        replica_rows[0].append("Devices")
    pods_by_key = {pod_key(p): name_of(p) for p in pods}
    for rtype, type_status in (raw.get("replicaStatuses") or {}).items():
        for entry in (type_status or {}).get("indexes") or []:
            key = (str(rtype), int(entry.get("index") or 0))
            exit_code = entry.get("exitCode")
            row = [
                replica_label(key),
                # A replica with no Pod of its attempt: starting, unless the job waits.
                entry.get("state") or (hold.state if hold is not None else "Starting"),
                str(entry.get("attempt") or 0),
                NONE if exit_code is None else str(exit_code),
                entry.get("reason") or "",
                pods_by_key.get(key, NONE),
            ]
            if devices:
                said = devices.get(replica_label(key))
                row.append(NONE if said is None else core_progress.devices_detail(said))
            replica_rows.append(row)
    if len(replica_rows) > 1:
        lines += ["  " + line for line in align(replica_rows)]
    else:
        lines.append(f"  {NONE}")
    lines.append("Events:")
    if events:
        rows = [["Type", "Reason", "Age", "From", "Object", "Message"]]
        for event in events:
            when = times.parse_time(
                event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
            )
            involved = event.get("involvedObject") or {}
            source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
            rows.append(
                [
                    str(event.get("type") or ""),
                    str(event.get("reason") or ""),
                    NONE if when is None else times.format_age((now - when).total_seconds()),
                    str(source or ""),
                    f"{involved.get('kind', '')}/{involved.get('name', '')}",
                    str(event.get("message") or "").replace("\n", " "),
                ]
            )
        lines += ["  " + line for line in align(rows)]
    else:
        lines.append(f"  {NONE}")
    return "\n".join(lines) + "\n"


def _conditions(obj: Obj, status: st.JobStatus) -> list[list[str]]:
    """The conditions' rows: a TrainJob's; a TFJob's own, in its order and words (what
    `kubectl describe tfjob`, the SDK and Kueue read), not the engine's behind them."""
    if not ref_of(obj).is_tfjob:
        return [
            [c.type, str(c.status), c.reason, times.format_time(c.last_transition_time), c.message]
            for c in status.conditions
        ]
    rows = []
    for condition in (source_of(obj).get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping):
            rows.append(
                [
                    str(condition.get(field) or "").replace("\n", " ")
                    for field in ("type", "status", "reason", "lastTransitionTime", "message")
                ]
            )
    return rows


def sort_events(events: Sequence[Obj]) -> list[Obj]:
    def when(event: Obj) -> str:
        return str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
            or ""
        )

    return sorted(events, key=when)


@dataclasses.dataclass(frozen=True)
class LogRequest:
    """Which replicas `logs` prints: all of them, or one (`worker-0`)."""

    job: str
    replica: str | None = None

    def wants(self, pod: Obj) -> bool:
        return self.replica is None or pod_label(pod) == self.replica
