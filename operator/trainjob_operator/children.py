"""The in-memory index of every TrainJob's Pods and Services, kept by informer.py from a
list and then a watch of the objects labelled trainjob.dev/job-name.

A job's reconcile reads its children from here (no list call per reconcile). Only what the
policy engine needs of each object is kept (a few small fields), never the object itself:
at 1,000 jobs x 8 replicas that is 16,000 small records instead of 16,000 bodies.

Pure bookkeeping, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Generic, NamedTuple, TypeVar

from trainjob.core import constants, observe, policy, tfjob

JobKey = tuple[str, str]  # (namespace, TrainJob name)

PODS: Final = "pods"
SERVICES: Final = "services"
WORKLOADS: Final = "workloads"  # Kueue's, with the Kueue integration on
PODGROUPS: Final = "podgroups"  # the gang scheduler's, with gang scheduling on
# With --tfjob: the Pods and Services training-operator made (informer.KUBEFLOW_KINDS).
KUBEFLOW_PODS: Final = "kubeflow-pods"
KUBEFLOW_SERVICES: Final = "kubeflow-services"

# Pod phases in which every container has stopped: such a Pod holds no node resources and
# no quota, whether or not the object is still there.
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclasses.dataclass(frozen=True, slots=True)
class ChildPod:
    """A Pod of some TrainJob, as kept in the index."""

    key: policy.ReplicaKey
    observed: policy.ObservedReplica
    uid: str
    owner_uid: str | None
    # spec.nodeName: where it is bound ("" before the scheduler binds it). A Pod on a node
    # that is not Ready is shown as lost (nodes.py); the Pod itself says nothing useful then.
    node_name: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ChildService:
    key: policy.ReplicaKey
    uid: str
    owner_uid: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ChildWorkload:
    """A Kueue Workload of some TrainJob: what the Kueue protocol reads of it (conditions,
    admission, the podSets' stash of template fields), without the podSets' Pod specs."""

    name: str
    uid: str
    owner_uid: str | None
    body: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class ChildPodGroup:
    """A job's PodGroup: whether it exists, and how far its scheduler got with it."""

    name: str
    uid: str
    owner_uid: str | None
    # Pending, Inqueue (Volcano), Scheduling (scheduler-plugins), Running, ...; "" until the
    # scheduler's controller first writes status.
    phase: str
    min_member: int | None
    # The scheduler's own words of why the group does not run (Volcano's conditions).
    message: str = ""
    deleting: bool = False


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class Identity:
    """A job as its loop knows it (controller.py), ordered by what decides which of two
    same-named jobs of two kinds keeps the name: the one created first; within the same
    second, the one that has started (its children may exist); then by kind."""

    # metadata.creationTimestamp as the API server writes it (RFC 3339 in UTC, to the
    # second): ordered as text.
    created: str
    # No status.startTime yet (both kinds' status has one once its Pods may be created).
    pending: bool
    kind: str
    uid: str

    @classmethod
    def of(cls, kind: str, raw: Mapping[str, Any]) -> Identity:
        metadata = raw.get("metadata") or {}
        status = raw.get("status")
        started = isinstance(status, Mapping) and bool(status.get("startTime"))
        created = str(metadata.get("creationTimestamp") or "")
        return cls(created, not started, kind, str(metadata.get("uid") or ""))


def name_holder(me: Identity, namesakes: Iterable[Identity]) -> Identity | None:
    """The job of another kind, same namespace and name, that holds the name before `me`;
    None: `me` keeps it. Their children would have the same names (<name>-<type>-<index>,
    which a TFJob keeps as training-operator names them), so only the first is run."""
    first = min((n for n in namesakes if n.kind != me.kind), default=None)
    return first if first is not None and first < me else None


def controller_uid(metadata: Mapping[str, Any]) -> str | None:
    for ref in metadata.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def job_of(body: Mapping[str, Any]) -> tuple[JobKey, str] | None:
    """(the job's key, the object's name) for an object labelled with a job name."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    # Ours; else training-operator's, on a TFJob's children it made before a takeover.
    job = labels.get(constants.LABEL_JOB_NAME) or labels.get(tfjob.LABEL_JOB_NAME)
    name = metadata.get("name")
    if not job or not name:
        return None
    return (str(metadata.get("namespace") or ""), str(job)), str(name)


def index_pod(body: Mapping[str, Any]) -> ChildPod | None:
    """What the policy engine needs of a Pod; None for a Pod without replica labels (ours,
    or training-operator's on a TFJob's children it made)."""
    found = observe.observe_pod(body, tfjob.replica_key)
    if found is None:
        return None
    metadata = body.get("metadata") or {}
    key, observed = found
    node_name = str((body.get("spec") or {}).get("nodeName") or "")
    return ChildPod(
        key, observed, str(metadata.get("uid") or ""), controller_uid(metadata), node_name
    )


def holds_resources(pod: ChildPod) -> bool:
    """Whether the Pod may still run a container: not in a terminal phase. A Pod being
    deleted still does until its containers stop (up to its grace period)."""
    return pod.observed.phase not in TERMINAL_PHASES


def index_service(body: Mapping[str, Any]) -> ChildService | None:
    metadata = body.get("metadata") or {}
    key = tfjob.replica_key(metadata.get("labels") or {})
    if key is None:
        return None
    return ChildService(key, str(metadata.get("uid") or ""), controller_uid(metadata))


def _trimmed_pod_set(pod_set: Mapping[str, Any]) -> dict[str, Any]:
    template = pod_set.get("template") or {}
    meta = template.get("metadata") or {}
    pod_spec = template.get("spec") or {}
    return {
        "name": pod_set.get("name"),
        "count": pod_set.get("count"),
        "template": {
            "metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
            "spec": {
                k: pod_spec[k]
                for k in ("nodeSelector", "tolerations", "schedulingGates")
                if k in pod_spec
            },
        },
    }


def index_workload(body: Mapping[str, Any]) -> ChildWorkload | None:
    """What the Kueue protocol needs of a Workload: everything but the podSets' Pod specs
    (the bulk of it), which only its creation and the equivalence hash ever used."""
    metadata = body.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        return None
    spec = dict(body.get("spec") or {})
    spec["podSets"] = [
        _trimmed_pod_set(ps) for ps in spec.get("podSets") or [] if isinstance(ps, Mapping)
    ]
    kept_meta = {
        k: metadata[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "generation",
            "labels",
            "annotations",
            "finalizers",
            "ownerReferences",
            "deletionTimestamp",
        )
        if k in metadata
    }
    trimmed = {"metadata": kept_meta, "spec": spec, "status": body.get("status") or {}}
    return ChildWorkload(
        str(name), str(metadata.get("uid") or ""), controller_uid(metadata), trimmed
    )


def index_pod_group(body: Mapping[str, Any]) -> ChildPodGroup | None:
    metadata = body.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        return None
    status = body.get("status") or {}
    min_member = (body.get("spec") or {}).get("minMember")
    message = ""
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("status") == "True"
            and condition.get("type") == "Unschedulable"
        ):
            message = str(condition.get("message") or "")
    return ChildPodGroup(
        str(name),
        str(metadata.get("uid") or ""),
        controller_uid(metadata),
        str(status.get("phase") or ""),
        min_member if isinstance(min_member, int) else None,
        message,
        bool(metadata.get("deletionTimestamp")),
    )


C = TypeVar("C", ChildPod, ChildService, ChildWorkload, ChildPodGroup)


def carry_pod_cause(before: ChildPod, now: ChildPod) -> ChildPod:
    """Every event of a Pod is seen here, while a reconcile reads only the latest: the words
    a gang's echo replaces within a second are kept from the event that had them."""
    if before.uid != now.uid:
        return now
    observed = observe.keep_cause(before.observed, now.observed)
    return now if observed is now.observed else dataclasses.replace(now, observed=observed)


class Listed(NamedTuple):
    """What a list keeps of one object: its job and name, the index's entry, and the body
    only where a listener needs it (Workloads)."""

    job: JobKey | None
    name: str
    child: Any
    body: Mapping[str, Any] | None


class _Kind(Generic[C]):
    """The children of one kind, by job and then by object name. ``carry`` (old, new) -> kept
    lets an entry keep something of its previous version that the object itself forgot."""

    def __init__(
        self,
        index: Callable[[Mapping[str, Any]], C | None],
        carry: Callable[[C, C], C] | None = None,
    ) -> None:
        self.by_job: dict[JobKey, dict[str, C]] = {}
        self._index: Callable[[Mapping[str, Any]], C | None] = index
        self._carry: Callable[[C, C], C] | None = carry

    def apply(self, body: Mapping[str, Any], deleted: bool) -> JobKey | None:
        """A watch event; returns the job it concerns (None: not a child of any job)."""
        found = job_of(body)
        if found is None:
            return None
        job, name = found
        child = None if deleted else self._index(body)
        children = self.by_job.get(job)
        if child is None:
            if children is not None:
                children.pop(name, None)
                if not children:
                    del self.by_job[job]
            return job
        kept = self.by_job.setdefault(job, {})
        previous = kept.get(name)
        kept[name] = (
            child if previous is None or self._carry is None else self._carry(previous, child)
        )
        return job

    @property
    def index(self) -> Callable[[Mapping[str, Any]], C | None]:
        return self._index

    def replace_listed(self, namespace: str | None, entries: Iterable[Listed]) -> set[JobKey]:
        """A fresh list of `namespace` (None: every namespace) replaces what the index had
        there; returns every job whose children were or are now there."""
        touched = {job for job in self.by_job if namespace is None or job[0] == namespace}
        for job in touched:
            del self.by_job[job]
        for entry in entries:
            if entry.job is None:
                continue
            touched.add(entry.job)
            if entry.child is not None:
                self.by_job.setdefault(entry.job, {})[entry.name] = entry.child
        return touched


class ChildIndex:
    """Pods and Services of every TrainJob, keyed by (namespace, job name)."""

    def __init__(self) -> None:
        self._kinds: dict[str, _Kind[Any]] = {
            PODS: _Kind(index_pod, carry_pod_cause),
            SERVICES: _Kind(index_service),
            WORKLOADS: _Kind(index_workload),
            PODGROUPS: _Kind(index_pod_group),
            KUBEFLOW_PODS: _Kind(index_pod, carry_pod_cause),
            KUBEFLOW_SERVICES: _Kind(index_service),
        }
        # Called with every Pod watch event's job and body (progress_status reads final
        # progress from termination messages here, so it needs no watch of its own).
        self.pod_listeners: list[Callable[[JobKey, Mapping[str, Any]], None]] = []
        # Called with every Workload listed or changed (the Kueue integration releases the
        # Workloads of jobs that are gone).
        self.workload_listeners: list[Callable[[JobKey, Mapping[str, Any]], None]] = []

    def event(self, plural: str, body: Mapping[str, Any], deleted: bool = False) -> JobKey | None:
        """A watch event of a Pod or Service (`plural`); returns the job to wake, if any."""
        job = self._kinds[plural].apply(body, deleted)
        if job is not None and not deleted:
            self._tell(plural, job, body)
        return job

    def _tell(self, plural: str, job: JobKey, body: Mapping[str, Any]) -> None:
        listeners = {PODS: self.pod_listeners, WORKLOADS: self.workload_listeners}.get(plural, [])
        for listener in listeners:
            listener(job, body)

    def listed(self, plural: str) -> Callable[[Mapping[str, Any]], Listed]:
        """What a list keeps of each listed object of `plural` (kube.Kube's `keep`): the
        index's entry, and the body itself only for the kinds whose listeners read it."""
        kind = self._kinds[plural]
        keeps_body = plural == WORKLOADS

        def keep(body: Mapping[str, Any]) -> Listed:
            found = job_of(body)
            if found is None:
                return Listed(None, "", None, None)
            return Listed(found[0], found[1], kind.index(body), body if keeps_body else None)

        return keep

    def replace(
        self, plural: str, namespace: str | None, bodies: Iterable[Mapping[str, Any]]
    ) -> set[JobKey]:
        """A list of `plural` in `namespace` (None: all) replaces the index's content there;
        returns the jobs to wake."""
        keep = self.listed(plural)
        return self.replace_listed(plural, namespace, [keep(body) for body in bodies])

    def replace_listed(
        self, plural: str, namespace: str | None, entries: Iterable[Listed]
    ) -> set[JobKey]:
        """`replace`, from what a list kept of each object (`listed`)."""
        entries = list(entries)
        touched = self._kinds[plural].replace_listed(namespace, entries)
        for entry in entries:
            if entry.job is not None and entry.body is not None:
                self._tell(plural, entry.job, entry.body)
        return touched

    def forget_namespace(self, namespace: str) -> None:
        """Nobody watches `namespace` any more: drop what the index had there."""
        for kind in self._kinds.values():
            kind.replace_listed(namespace, ())

    def has_children(self, job: JobKey) -> bool:
        """Whether the index holds anything of `job` (Pod, Service, Workload, PodGroup)."""
        return any(job in kind.by_job and kind.by_job[job] for kind in self._kinds.values())

    def pods(self, job: JobKey) -> list[ChildPod]:
        children: dict[str, ChildPod] = {
            **self._kinds[KUBEFLOW_PODS].by_job.get(job, {}),
            **self._kinds[PODS].by_job.get(job, {}),
        }
        return list(children.values())

    def jobs_on_nodes(self, nodes: set[str]) -> set[JobKey]:
        """The jobs with a Pod bound to one of `nodes` (one pass over every Pod: only a node
        readiness change asks, which is rare next to Pod events)."""
        by_job: dict[JobKey, dict[str, ChildPod]] = {
            **self._kinds[KUBEFLOW_PODS].by_job,
            **self._kinds[PODS].by_job,
        }
        return {
            job
            for job, pods in by_job.items()
            if any(pod.node_name in nodes for pod in pods.values())
        }

    def services(self, job: JobKey) -> list[ChildService]:
        children: dict[str, ChildService] = {
            **self._kinds[KUBEFLOW_SERVICES].by_job.get(job, {}),
            **self._kinds[SERVICES].by_job.get(job, {}),
        }
        return list(children.values())

    def pod_group(self, job: JobKey, name: str) -> ChildPodGroup | None:
        children: dict[str, ChildPodGroup] = self._kinds[PODGROUPS].by_job.get(job, {})
        return children.get(name)

    def workloads(self, job: JobKey) -> list[ChildWorkload]:
        children: dict[str, ChildWorkload] = self._kinds[WORKLOADS].by_job.get(job, {})
        return list(children.values())

    def all_workloads(self) -> list[tuple[JobKey, Mapping[str, Any]]]:
        """Every Workload indexed, with its job."""
        by_job: dict[JobKey, dict[str, ChildWorkload]] = self._kinds[WORKLOADS].by_job
        return [(job, w.body) for job, kept in by_job.items() for w in kept.values()]
