"""Every write of a Kueue storm to Pods and Workloads, in the order etcd made them, and the
quota invariants checked after each one.

Why not sample (as test_kueue_storm.py's watcher does): the windows of issue #35 last a few
hundred milliseconds (a job's Pods still live after its Workload's admission was cleared, and
Kueue already gave that quota to another job), so a poll every 300 ms misses most of them, and
a read of Pods followed by a read of Workloads is not one instant of the cluster. A watch
stream delivers every write with its resourceVersion, and with one etcd behind the API server
that is etcd's global revision: merging the Pod and Workload streams by resourceVersion (as
integers) rebuilds the one order in which etcd applied the writes, so the state after each
event is exactly a state the cluster was in.

Two halves:

- `Recorder` (I/O): one thread per stream (Pods labelled ``trainjob.dev/job-name``, Workloads;
  per namespace), bookmarks on, each resuming from the last resourceVersion it saw when the
  server ends a stream; a resourceVersion too old to resume from (410 Gone) is relisted and
  recorded as a *gap*, since the writes in between were not seen (a test should fail on it).
- `replay` / `Timeline` (pure): applies the events in resourceVersion order and after every
  event checks, for one Cohort of ClusterQueues:

  1. no job has a live Pod while none of its Workloads holds an admission
     (``status.admission``: what Kueue counts against the quota);
  2. no ClusterQueue's live Pods request more CPU than its nominal quota plus what it may
     borrow, and the Cohort's live Pods no more than the Cohort's nominal total.

  *Live* means the Pod exists and its phase is neither Succeeded nor Failed: a terminating Pod
  (deletionTimestamp set) still runs its containers and still holds its node's resources.

  Pods of a job whose Workload is *Finished* are a separate, clearly named finding
  (`AFTER_FINISH`, and the over-commits they cause, `*_OVER_FINISHED`), not a violation of
  (1) or (2): Kueue released that quota because the job told it the job had finished, which
  is right for Pods the user keeps on purpose (cleanPodPolicy None: they run outside Kueue's
  account, as under Kueue's own TFJob integration) and wrong for Pods the job's clean-up is
  still stopping. Only the caller knows which applies, so they are reported beside the
  violations, never folded into them nor silently dropped (the storm fails on both: its
  jobs keep the default cleanPodPolicy Running).

Each condition that holds over a run of consecutive events is one `Window`: the write that
opened it and the one that closed it (resourceVersions, and the wall-clock times the recorder
received them), the Pods involved and the peak CPU. The resourceVersion span counts etcd's
global revisions, so it includes writes of other objects (Events, Leases) made meanwhile.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as k8s_watch

from tests.support import waits

JOB_LABEL: Final = "trainjob.dev/job-name"
KUEUE: Final = "kueue.x-k8s.io"
KV: Final = "v1beta2"

POD: Final = "Pod"
WORKLOAD: Final = "Workload"
ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"

# The violations (a test fails on any).
UNADMITTED: Final = "live Pods without admission"
QUEUE_OVER: Final = "ClusterQueue over-committed"
COHORT_OVER: Final = "Cohort over-committed"
# The second finding: Pods still live after Kueue released their Workload's quota on purpose.
AFTER_FINISH: Final = "live Pods of a Finished Workload"
QUEUE_OVER_FINISHED: Final = "ClusterQueue over-committed counting Pods of Finished Workloads"
COHORT_OVER_FINISHED: Final = "Cohort over-committed counting Pods of Finished Workloads"
VIOLATIONS: Final = (UNADMITTED, QUEUE_OVER, COHORT_OVER)

# An eviction this soon after the Workload's admission counts as "right after admission":
# the job's Pods are typically still being created then (the case of issue #35).
SOON_AFTER_ADMISSION: Final = 2.0
# How long one watch request lasts before the server ends it (the stream then resumes).
STREAM_SECONDS: Final = 30

Obj = dict[str, Any]


# -- what one event says ---------------------------------------------------------------------


def cpu_millis(quantity: str | int | float | None) -> int:
    """A CPU quantity ("500m", "1", "1.5", 2) in millicores, rounded up as Kubernetes does."""
    if quantity is None:
        return 0
    text = str(quantity).strip()
    if text.endswith("m"):
        return int(decimal.Decimal(text[:-1]).to_integral_value(decimal.ROUND_CEILING))
    value = decimal.Decimal(text) * 1000
    return int(value.to_integral_value(decimal.ROUND_CEILING))


def pod_cpu(spec: Mapping[str, Any]) -> int:
    """What Kueue counts for a Pod: the sum over its containers, or the largest init container
    if that is more (requests; limits where a container has no request)."""

    def one(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        return cpu_millis(requests.get("cpu", limits.get("cpu")))

    main = sum(one(c) for c in spec.get("containers") or [])
    init = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def _meta(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = raw.get("metadata") or {}
    return meta


def _job_key(raw: Mapping[str, Any]) -> str | None:
    meta = _meta(raw)
    job = (meta.get("labels") or {}).get(JOB_LABEL)
    return f"{meta.get('namespace')}/{job}" if job else None


@dataclasses.dataclass(frozen=True)
class PodView:
    """What the checks need of a Pod."""

    uid: str
    name: str
    job: str  # "namespace/job-name"
    cpu_m: int
    phase: str
    terminating: bool

    @property
    def live(self) -> bool:
        """Exists and has not ended: a terminating Pod still runs (and holds its node)."""
        return self.phase not in ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class WorkloadView:
    """What the checks need of a Workload."""

    uid: str
    name: str
    job: str  # "namespace/job-name"
    admitted: bool  # status.admission is set: Kueue counts the quota as used
    cluster_queue: str | None  # of the admission
    finished: bool
    # (reason, lastTransitionTime) of an Evicted=True condition: one eviction
    evicted: tuple[str, str] | None


def pod_view(raw: Mapping[str, Any]) -> PodView | None:
    job = _job_key(raw)
    if job is None:
        return None
    meta = _meta(raw)
    return PodView(
        uid=str(meta.get("uid")),
        name=str(meta.get("name")),
        job=job,
        cpu_m=pod_cpu(raw.get("spec") or {}),
        phase=str((raw.get("status") or {}).get("phase") or "Pending"),
        terminating=meta.get("deletionTimestamp") is not None,
    )


def workload_view(raw: Mapping[str, Any]) -> WorkloadView | None:
    job = _job_key(raw)
    if job is None:
        return None
    meta = _meta(raw)
    status = raw.get("status") or {}
    conditions = {
        c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
    }
    admission = status.get("admission")
    evicted = conditions.get("Evicted")
    return WorkloadView(
        uid=str(meta.get("uid")),
        name=str(meta.get("name")),
        job=job,
        admitted=bool(admission),
        cluster_queue=(admission or {}).get("clusterQueue"),
        finished="Finished" in conditions,
        evicted=(
            (str(evicted.get("reason")), str(evicted.get("lastTransitionTime")))
            if evicted
            else None
        ),
    )


@dataclasses.dataclass(frozen=True)
class Event:
    """One write as a watch delivered it: its resourceVersion (etcd's revision), the type
    (ADDED, MODIFIED, DELETED), the object after it (before it, for DELETED), and when the
    recorder received it (time.time(), to put wall-clock lengths on windows)."""

    rv: int
    type: str
    view: PodView | WorkloadView
    seen: float

    @property
    def kind(self) -> str:
        return POD if isinstance(self.view, PodView) else WORKLOAD


def event(kind: str, etype: str, raw: Mapping[str, Any], seen: float) -> Event | None:
    """The Event of one watch event's object; None for an object of no job."""
    view = pod_view(raw) if kind == POD else workload_view(raw)
    if view is None:
        return None
    return Event(int(_meta(raw).get("resourceVersion") or 0), etype, view, seen)


def ordered(events: Iterable[Event]) -> list[Event]:
    """The events in etcd's order; a write delivered twice (a relist) counts once."""
    unique = {(e.kind, e.view.uid, e.rv, e.type): e for e in events}
    return sorted(unique.values(), key=lambda e: (e.rv, e.type == DELETED))


# -- the quota ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QueueQuota:
    nominal_m: int
    borrowing_limit_m: int | None  # None: it may borrow whatever the Cohort has


@dataclasses.dataclass(frozen=True)
class CohortQuota:
    """One Cohort's ClusterQueues (one flavor, CPU only: what the storm uses)."""

    name: str
    queues: Mapping[str, QueueQuota]

    @property
    def total_m(self) -> int:
        return sum(q.nominal_m for q in self.queues.values())

    def limit_m(self, queue: str) -> int:
        """The most CPU `queue` may use: its nominal quota plus what it may borrow."""
        quota = self.queues[queue]
        lendable = self.total_m - quota.nominal_m
        borrow = lendable if quota.borrowing_limit_m is None else quota.borrowing_limit_m
        return quota.nominal_m + min(borrow, lendable)


# -- the replay -----------------------------------------------------------------------------


@dataclasses.dataclass
class Window:
    """One condition held over consecutive events: from the write at `start_rv` to the first
    write after which it no longer held (`end_rv`; None when it still held at the end)."""

    kind: str
    subject: str  # the job ("namespace/name"), the ClusterQueue or the Cohort
    start_rv: int
    start_seen: float
    limit_m: int | None = None
    end_rv: int | None = None
    end_seen: float | None = None
    pods: set[str] = dataclasses.field(default_factory=set)
    peak_m: int = 0
    events: int = 0  # events after which it held

    @property
    def revisions(self) -> int | None:
        return None if self.end_rv is None else self.end_rv - self.start_rv

    @property
    def seconds(self) -> float | None:
        return None if self.end_seen is None else self.end_seen - self.start_seen

    def describe(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.start_seen))
        millis = int((self.start_seen % 1) * 1000)
        if self.end_rv is None:
            span = f"from resourceVersion {self.start_rv} ({clock}.{millis:03d}) to the end"
        else:
            span = (
                f"resourceVersions {self.start_rv}..{self.end_rv} ({self.revisions} revisions), "
                f"{self.seconds or 0.0:.3f} s from {clock}.{millis:03d}"
            )
        cpu = f"{self.peak_m}m CPU" + (f" against {self.limit_m}m" if self.limit_m else "")
        pods = ", ".join(sorted(self.pods)[:8]) + (" ..." if len(self.pods) > 8 else "")
        return f"{self.kind}: {self.subject}, {span}, {self.events} writes, {cpu}; Pods {pods}"


@dataclasses.dataclass
class Report:
    events: int = 0
    violations: list[Window] = dataclasses.field(default_factory=list)
    findings: list[Window] = dataclasses.field(default_factory=list)  # AFTER_FINISH & co
    jobs: set[str] = dataclasses.field(default_factory=set)
    admissions: int = 0
    evictions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    evicted_soon_after_admission: int = 0
    unplaced: set[str] = dataclasses.field(default_factory=set)  # jobs of no known queue
    peak_cohort_m: int = 0

    @staticmethod
    def longest(windows: Sequence[Window]) -> Window | None:
        ended = [w for w in windows if w.end_rv is not None]
        if len(ended) < len(windows):
            return next(w for w in windows if w.end_rv is None)
        return max(ended, key=lambda w: w.seconds or 0.0, default=None)

    def summary(self) -> str:
        longest = self.longest(self.violations)
        longest_finding = self.longest(self.findings)
        evictions = ", ".join(f"{n} {reason}" for reason, n in sorted(self.evictions.items()))
        lines = [
            f"{self.events} events checked (every write, in resourceVersion order); "
            f"{len(self.jobs)} jobs; {self.admissions} admissions; evictions: "
            f"{evictions or 'none'} ({self.evicted_soon_after_admission} within "
            f"{SOON_AFTER_ADMISSION:.0f} s of their admission); peak cohort CPU of live Pods "
            f"{self.peak_cohort_m}m",
            f"violations: {len(self.violations)} windows"
            + (f", longest: {longest.describe()}" if longest else ""),
            f"second finding ({AFTER_FINISH}: Kueue freed the quota as told): "
            f"{len(self.findings)} windows"
            + (f", longest: {longest_finding.describe()}" if longest_finding else ""),
        ]
        lines += [f"  {w.describe()}" for w in self.violations[:20]]
        if self.unplaced:
            lines.append(f"jobs of no known ClusterQueue: {sorted(self.unplaced)}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class _Held:
    pods: frozenset[str]
    cpu_m: int
    limit_m: int | None


class Timeline:
    """The cluster's Pods and Workloads as the events build them, checked after every event.

    `queue_of` names each job's ClusterQueue ("namespace/job" -> queue); a job it does not
    name takes the queue of its Workload's admission once one is seen."""

    def __init__(self, cohort: CohortQuota, queue_of: Mapping[str, str]) -> None:
        self.cohort = cohort
        self.queue_of = dict(queue_of)
        self.pods: dict[str, PodView] = {}
        self.workloads: dict[str, WorkloadView] = {}
        self.admitted_at: dict[str, float] = {}  # Workload uid -> when its admission appeared
        self.evictions_seen: set[tuple[str, tuple[str, str]]] = set()
        self.open: dict[tuple[str, str], Window] = {}
        self.report = Report()

    def apply(self, ev: Event) -> None:
        self.report.events += 1
        view = ev.view
        if isinstance(view, PodView):
            self.report.jobs.add(view.job)
            if ev.type == DELETED:
                self.pods.pop(view.uid, None)
            else:
                self.pods[view.uid] = view
        else:
            self.report.jobs.add(view.job)
            self._note_workload(ev, view)
            if ev.type == DELETED:
                self.workloads.pop(view.uid, None)
            else:
                self.workloads[view.uid] = view
        self._check(ev)

    def _note_workload(self, ev: Event, view: WorkloadView) -> None:
        before = self.workloads.get(view.uid)
        if view.cluster_queue and view.job not in self.queue_of:
            self.queue_of[view.job] = view.cluster_queue
        if view.admitted and not (before and before.admitted):
            self.report.admissions += 1
            self.admitted_at[view.uid] = ev.seen
        if view.evicted and (view.uid, view.evicted) not in self.evictions_seen:
            self.evictions_seen.add((view.uid, view.evicted))
            self.report.evictions[view.evicted[0]] += 1
            admitted = self.admitted_at.get(view.uid)
            if admitted is not None and ev.seen - admitted <= SOON_AFTER_ADMISSION:
                self.report.evicted_soon_after_admission += 1

    def held(self) -> dict[tuple[str, str], _Held]:
        """Every condition that holds now: (kind, subject) -> the Pods, CPU and limit."""
        live: dict[str, list[PodView]] = collections.defaultdict(list)
        for pod in self.pods.values():
            if pod.live:
                live[pod.job].append(pod)
        by_job: dict[str, list[WorkloadView]] = collections.defaultdict(list)
        for wl in self.workloads.values():
            by_job[wl.job].append(wl)

        found: dict[tuple[str, str], _Held] = {}
        counted: dict[str, list[PodView]] = collections.defaultdict(list)  # quota held
        everything: dict[str, list[PodView]] = collections.defaultdict(list)
        for job, pods in live.items():
            workloads = by_job.get(job, [])
            admitted = any(w.admitted and not w.finished for w in workloads)
            finished = not admitted and any(w.finished for w in workloads)
            names = frozenset(p.name for p in pods)
            cpu = sum(p.cpu_m for p in pods)
            if finished:
                found[AFTER_FINISH, job] = _Held(names, cpu, None)
            elif not admitted:
                found[UNADMITTED, job] = _Held(names, cpu, None)
            queue = self.queue_of.get(job)
            if queue not in self.cohort.queues:
                self.report.unplaced.add(job)
                continue
            everything[str(queue)] += pods
            if not finished:
                counted[str(queue)] += pods

        def over(pods: Sequence[PodView], limit: int) -> _Held | None:
            cpu = sum(p.cpu_m for p in pods)
            return _Held(frozenset(p.name for p in pods), cpu, limit) if cpu > limit else None

        for queue in self.cohort.queues:
            limit = self.cohort.limit_m(queue)
            held = over(counted[queue], limit)
            if held:
                found[QUEUE_OVER, queue] = held
            elif held := over(everything[queue], limit):
                found[QUEUE_OVER_FINISHED, queue] = held
        total = self.cohort.total_m
        in_cohort = [p for pods in counted.values() for p in pods]
        all_in_cohort = [p for pods in everything.values() for p in pods]
        self.report.peak_cohort_m = max(self.report.peak_cohort_m, sum(p.cpu_m for p in in_cohort))
        if held := over(in_cohort, total):
            found[COHORT_OVER, self.cohort.name] = held
        elif held := over(all_in_cohort, total):
            found[COHORT_OVER_FINISHED, self.cohort.name] = held
        return found

    def _check(self, ev: Event) -> None:
        found = self.held()
        for key, held in found.items():
            window = self.open.get(key)
            if window is None:
                window = Window(key[0], key[1], ev.rv, ev.seen, held.limit_m)
                self.open[key] = window
            window.pods |= held.pods
            window.peak_m = max(window.peak_m, held.cpu_m)
            window.events += 1
        for key in [k for k in self.open if k not in found]:
            window = self.open.pop(key)
            window.end_rv, window.end_seen = ev.rv, ev.seen
            self._keep(window)

    def _keep(self, window: Window) -> None:
        (self.report.violations if window.kind in VIOLATIONS else self.report.findings).append(
            window
        )

    def finish(self) -> Report:
        """The report; windows still open at the last event are kept with no end."""
        for window in self.open.values():
            self._keep(window)
        self.open = {}
        for windows in (self.report.violations, self.report.findings):
            windows.sort(key=lambda w: w.start_rv)
        return self.report


def replay(events: Iterable[Event], cohort: CohortQuota, queue_of: Mapping[str, str]) -> Report:
    """Apply `events` in resourceVersion order, checking after each one."""
    timeline = Timeline(cohort, queue_of)
    for ev in ordered(events):
        timeline.apply(ev)
    return timeline.finish()


# -- the recorder ---------------------------------------------------------------------------


class Stream(threading.Thread):
    """One watch (one kind, one namespace), resumed from its last resourceVersion whenever
    the server ends it; every event goes to `sink`."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[..., Any],
        args: Sequence[str],
        namespace: str,
        sink: Callable[[Event], None],
        stopped: threading.Event,
    ) -> None:
        super().__init__(daemon=True, name=f"watch-{kind}-{namespace}")
        self.kind = kind
        self.list_call = list_call
        self.args = tuple(args)
        self.sink = sink
        self.stopped = stopped
        self.lock = threading.Lock()
        self.known: dict[str, tuple[int, Event]] = {}  # uid -> (resourceVersion, last event)
        self.resource_version = 0
        self.gaps: list[str] = []
        self.errors: list[str] = []
        self.response: Any = None

    def listing(self) -> tuple[int, list[Obj]]:
        """A fresh list: its resourceVersion and its items (raw JSON)."""
        response = self.list_call(
            *self.args, label_selector=JOB_LABEL, _preload_content=False, _request_timeout=30
        )
        body: Obj = json.loads(response.data)
        return int(body["metadata"]["resourceVersion"]), list(body.get("items") or [])

    def _emit(self, etype: str, raw: Mapping[str, Any]) -> None:
        ev = event(self.kind, etype, raw, time.time())
        if ev is None:
            return
        with self.lock:
            if etype == DELETED:
                self.known.pop(ev.view.uid, None)
            else:
                self.known[ev.view.uid] = (ev.rv, ev)
        self.sink(ev)

    def relist(self, initial: bool) -> None:
        """Start (or restart after 410 Gone) from a list. On a restart, what changed since
        is recorded with each object's own resourceVersion, objects gone as DELETED at the
        list's, and the gap is noted: the writes in between were not seen one by one."""
        rv, items = self.listing()
        listed = {str(_meta(i).get("uid")): i for i in items}
        with self.lock:
            known = dict(self.known)
        if not initial:
            self.gaps.append(
                f"{self.name}: resourceVersion {self.resource_version} expired; relisted at {rv}"
            )
        for uid, item in sorted(
            listed.items(), key=lambda kv: int(_meta(kv[1])["resourceVersion"])
        ):
            item_rv = int(_meta(item)["resourceVersion"])
            if uid not in known:
                self._emit(ADDED, item)
            elif known[uid][0] != item_rv:
                self._emit(MODIFIED, item)
        for uid, (_, last) in known.items():
            if uid not in listed:
                gone = Event(rv, DELETED, last.view, time.time())
                with self.lock:
                    self.known.pop(uid, None)
                self.sink(gone)
        self.resource_version = rv

    def watch_once(self) -> None:
        """One watch request, from self.resource_version until the server ends it."""
        response = self.list_call(
            *self.args,
            label_selector=JOB_LABEL,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=str(self.resource_version),
            timeout_seconds=STREAM_SECONDS,
            _preload_content=False,
            _request_timeout=(10, STREAM_SECONDS + 15),
        )
        self.response = response
        try:
            for line in k8s_watch.iter_resp_lines(response):
                if not line:
                    continue
                data = json.loads(line)
                etype, obj = data.get("type"), data.get("object") or {}
                if etype == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                rv = int(_meta(obj).get("resourceVersion") or 0)
                if etype != "BOOKMARK":
                    self._emit(str(etype), obj)
                self.resource_version = max(self.resource_version, rv)
                if self.stopped.is_set():
                    return
        finally:
            response.release_conn()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.watch_once()
            except ApiException as exc:
                if self.stopped.is_set():
                    return
                if exc.status == 410:
                    self._relist_with_retries()
                else:
                    self.errors.append(f"{self.name}: {exc.status} {exc.reason}")
                    self.stopped.wait(0.5)  # a backoff before watching again, not a pacing
            except Exception as exc:  # a dropped connection: resume from the last rv
                if self.stopped.is_set():
                    return
                self.errors.append(f"{self.name}: {exc!r}")
                self.stopped.wait(0.5)

    def _relist_with_retries(self) -> None:
        while not self.stopped.is_set():
            try:
                self.relist(initial=False)
                return
            except Exception as exc:
                self.errors.append(f"{self.name}: relist: {exc!r}")
                self.stopped.wait(0.5)

    def stop(self) -> None:
        """End a watch blocked on a quiet stream (urllib3's shutdown wakes the reader)."""
        shutdown = getattr(self.response, "shutdown", None)
        self.response = None  # a second shutdown of one response raises
        if shutdown is not None:
            try:
                shutdown()
            except Exception as exc:
                self.errors.append(f"{self.name}: shutdown: {exc!r}")

    def caught_up(self) -> bool:
        """Whether this stream has seen every write a fresh list reflects (same objects at
        the same resourceVersions)."""
        _, items = self.listing()
        listed = {str(_meta(i).get("uid")): int(_meta(i)["resourceVersion"]) for i in items}
        with self.lock:
            known = {uid: rv for uid, (rv, _) in self.known.items()}
        return listed == known


class Recorder:
    """Records every write to the Pods and Workloads of jobs in `namespaces`, from before the
    storm starts until `stop`, for `replay`."""

    def __init__(self, api: k8s.ApiClient, namespaces: Sequence[str]) -> None:
        core = k8s.CoreV1Api(api)
        custom = k8s.CustomObjectsApi(api)
        self.stopped = threading.Event()
        self.events: list[Event] = []  # list.append is atomic: the threads share it
        self.streams: list[Stream] = []
        for ns in namespaces:
            self.streams.append(
                Stream(POD, core.list_namespaced_pod, [ns], ns, self.events.append, self.stopped)
            )
            self.streams.append(
                Stream(
                    WORKLOAD,
                    custom.list_namespaced_custom_object,
                    [KUEUE, KV, ns, "workloads"],
                    ns,
                    self.events.append,
                    self.stopped,
                )
            )

    def start(self) -> Recorder:
        """List, then watch from the list's resourceVersion: nothing written after the list
        is missed, whatever the threads' start-up takes."""
        for stream in self.streams:
            stream.relist(initial=True)
        for stream in self.streams:
            stream.start()
        return self

    def wait_caught_up(self, timeout: float) -> None:
        """Wait until every stream has seen the state a fresh list shows (the cluster should
        be quiet by then), so the replay ends no earlier than now."""
        waits.wait_until(
            lambda: all(s.caught_up() for s in self.streams),
            timeout=timeout,
            what="the watch streams to catch up with a fresh list",
            interval=0.2,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """End every stream (again: a no-op)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        for stream in self.streams:
            stream.stop()
        for stream in self.streams:
            if stream.ident is not None:  # started
                stream.join(timeout)

    @property
    def gaps(self) -> list[str]:
        return [g for s in self.streams for g in s.gaps]

    @property
    def errors(self) -> list[str]:
        return [e for s in self.streams for e in s.errors]

    def snapshot(self) -> list[Event]:
        return list(self.events)
