"""Every reason a TrainJob's (or a served TFJob's) conditions and Events can give, and when.

The reasons themselves are the policy engine's constants (:mod:`trainjob.core.policy_terms`,
:mod:`trainjob.core.status`) plus the reasons only Events and the TFJob door speak with, which
are defined here; this registry says, for each, which condition or Event carries it and when.
The reference page docs/content/reference/events.md is generated from it, and
tests/unit/test_docs_reference.py fails when a reason constant is missing here or an Event is
made with a literal reason: a new reason cannot go undocumented.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal

from trainjob.core import policy_terms as terms
from trainjob.core import status as st

EventType = Literal["Normal", "Warning"]

# Reasons that only Events give (a condition says the same with a policy_terms reason).
EVENT_CREATED: Final = "Created"
EVENT_RUNNING: Final = "Running"
EVENT_RESTARTING: Final = "Restarting"
EVENT_SUSPENDED: Final = "Suspended"
EVENT_RESUMED: Final = "Resumed"
EVENT_GANG_BYPASSED: Final = "GangBypassed"
# Kueue: the job's hold, and its admission (operator/trainjob_operator/kueue_patches.py).
EVENT_QUEUED: Final = "Queued"
EVENT_EVICTED_BY_KUEUE: Final = "Evicted"
EVENT_WORKLOAD_FINISHED: Final = "WorkloadFinished"
EVENT_ADMITTED: Final = "Admitted"

# The Suspended condition's reason when Kueue finished the job's Workload before it ran.
REASON_WORKLOAD_FINISHED: Final = "WorkloadFinished"

# A TFJob's conditions speak training-operator's words (trainjob/core/tfjob_status.py).
TFJOB_REASON_CREATED: Final = "TFJobCreated"
TFJOB_REASON_RUNNING: Final = "TFJobRunning"
TFJOB_REASON_RESTARTING: Final = "TFJobRestarting"
TFJOB_REASON_SUCCEEDED: Final = "TFJobSucceeded"
TFJOB_REASON_FAILED: Final = "TFJobFailed"
TFJOB_REASON_SUSPENDED: Final = "TFJobSuspended"
TFJOB_REASON_RESUMED: Final = "TFJobResumed"


@dataclasses.dataclass(frozen=True)
class Reason:
    """One reason: the conditions that carry it (e.g. ``Failed=True``), the type of the Event
    that gives it (None: no Event), and when."""

    name: str
    conditions: tuple[str, ...]
    event: EventType | None
    when: str


def _failed(name: str, when: str) -> Reason:
    """A reason the job fails with: Failed=True (Running=False), and a Warning Event."""
    return Reason(name, ("Failed=True", "Running=False"), "Warning", when)


def _waiting(name: str, event: EventType, when: str) -> Reason:
    """A reason a replica waits with: Running=False, and an Event when the cause is new."""
    return Reason(name, ("Running=False",), event, when)


TRAINJOB_REASONS: Final[tuple[Reason, ...]] = (
    Reason(
        terms.REASON_CREATED,
        ("Created=True",),
        None,
        "The operator (or `trainjob run`) accepted the job and creates its replicas.",
    ),
    _waiting(
        terms.REASON_STARTING,
        "Normal",
        "Replicas are created and not all running yet (no Event: starting is normal).",
    ),
    Reason(
        terms.REASON_RUNNING,
        ("Running=True", "Restarting=False"),
        None,
        "Every replica is running (or already succeeded); after a restart it also ends Restarting.",
    ),
    Reason(
        terms.REASON_RESTARTING,
        ("Restarting=True", "Running=False"),
        None,
        "A replica failed and its restart group is recreated, counted toward "
        "runPolicy.backoffLimit (the Event is `Restarting`).",
    ),
    Reason(
        terms.REASON_SUCCEEDED,
        ("Succeeded=True", "Running=False"),
        "Normal",
        "The chief succeeded (or worker 0 without a chief; every worker under successPolicy "
        "AllWorkers).",
    ),
    _failed(
        terms.REASON_FAILED,
        "A replica failed and no policy restarts it (restartPolicy Never, or an exit code "
        "1-127 under ExitCode); the message names the replica, its exit code and its last "
        "words.",
    ),
    _failed(terms.REASON_BACKOFF, "A failure needed a restart past runPolicy.backoffLimit."),
    _failed(terms.REASON_DEADLINE, "The job ran longer than runPolicy.activeDeadlineSeconds."),
    _failed(
        terms.REASON_STARTUP,
        "Not every replica was running within runPolicy.startupDeadlineSeconds of the start "
        "(or restart); the message names the replicas still waiting and why.",
    ),
    _failed(
        terms.REASON_INVALID,
        "The operator found the spec invalid where the CRD's schema could not (the message "
        "names the field).",
    ),
    _failed(
        terms.REASON_NAME_IN_USE,
        "A job of the other kind (a TFJob beside a TrainJob) with the same namespace and name "
        "was there first: this one's Pods and Services would take its names, so the operator "
        "refuses it.",
    ),
    _failed(
        terms.REASON_DISRUPTION_LIMIT,
        "Preemptions and evictions restarted replicas more than runPolicy.disruptionLimit times.",
    ),
    Reason(
        terms.REASON_STALLED,
        ("Failed=True", "Restarting=True", "Running=False"),
        "Warning",
        "The chief (worker 0 without one) reported no new step for "
        "runPolicy.progressDeadlineSeconds: with progressDeadlineAction Restart its restart "
        "group resumes from the checkpoint (Restarting, counted), with Fail the job fails.",
    ),
    _failed(
        terms.REASON_NON_FINITE_LOSS,
        "A replica exited with the runtime's code 6: the training loss became NaN or Inf.",
    ),
    _failed(
        terms.REASON_CHECKPOINT_STORAGE,
        "A replica exited with the runtime's code 7: the checkpoint store refused (no such "
        "bucket, access denied, credentials missing or wrong).",
    ),
    _failed(
        terms.REASON_STORAGE_UNREACHABLE,
        "A replica exited with the runtime's code 192 (the checkpoint store could not be "
        "reached) and no policy restarts it.",
    ),
    Reason(
        terms.REASON_PREEMPTED,
        ("Restarting=True", "Running=False"),
        "Warning",
        "A replica's Pod was preempted (DisruptionTarget PreemptionByScheduler): it restarts "
        "without counting toward backoffLimit (toward disruptionLimit).",
    ),
    Reason(
        terms.REASON_EVICTED,
        ("Restarting=True", "Running=False"),
        "Warning",
        "A replica's Pod was evicted (the DisruptionTarget condition: eviction API, node "
        "pressure or taint, Kueue): it restarts uncounted, toward disruptionLimit.",
    ),
    Reason(
        terms.REASON_SUSPENDED,
        ("Suspended=True", "Running=False", "Restarting=False"),
        None,
        "runPolicy.suspend is true: Pods and Services are deleted, status kept (the Event is "
        "`Suspended`).",
    ),
    Reason(
        terms.REASON_RESUMED,
        ("Suspended=False",),
        None,
        "runPolicy.suspend went back to false: replicas are recreated, resuming from "
        "checkpoints (the Event is `Resumed`).",
    ),
    _waiting(
        terms.REASON_UNSCHEDULABLE,
        "Warning",
        "The scheduler found no node for a replica's Pod; its words are quoted.",
    ),
    _waiting(
        terms.REASON_FAILED_CREATE,
        "Warning",
        "The API server refused to create a replica's Pod (Pod Security, ResourceQuota, "
        "LimitRange, an admission webhook); its message is quoted and the create retried.",
    ),
    _waiting(
        terms.REASON_GANG_PENDING,
        "Normal",
        "The gang scheduler has not admitted the job's PodGroup: no Pod is created until it does.",
    ),
    _waiting(
        terms.REASON_NODE_UNREACHABLE,
        "Warning",
        "A replica's node stopped reporting (Ready Unknown); Kubernetes decides the Pod's end, "
        "and its removal restarts the replica as a disruption.",
    ),
    _waiting(terms.REASON_NODE_NOT_READY, "Warning", "A replica's node is not Ready."),
    *(
        _waiting(
            name,
            "Warning",
            "The kubelet cannot start a replica's container and waiting will not help; its "
            "message is quoted.",
        )
        for name in sorted(terms.CONTAINER_STUCK_REASONS)
    ),
    Reason(
        st.REASON_QUEUED,
        ("Suspended=True",),
        None,
        "Kueue holds the job: its Workload waits for admission in its LocalQueue (the message "
        "quotes Kueue's reason; the Event is `Queued`). `kubectl get tj` says Queued.",
    ),
    Reason(
        st.REASON_EVICTED_BY_QUEUE,
        ("Suspended=True",),
        None,
        "Kueue evicted the job (preempted in its ClusterQueue, PodsReady timeout, ...): its "
        "Pods are deleted and its Workload waits to be admitted again (the Event is "
        "`Evicted`).",
    ),
    Reason(
        REASON_WORKLOAD_FINISHED,
        ("Suspended=True",),
        None,
        "Kueue finished the job's Workload before the job ran (the Event is `WorkloadFinished`).",
    ),
)

EVENT_REASONS: Final[tuple[Reason, ...]] = (
    Reason(EVENT_CREATED, (), "Normal", "The job was accepted (condition TrainJobCreated)."),
    Reason(EVENT_RUNNING, (), "Normal", "Every replica is running (AllReplicasRunning)."),
    Reason(
        EVENT_RESTARTING,
        (),
        "Warning",
        "Replicas are restarted after a failure or a stall: which ones, after what, and the "
        "restart's number of backoffLimit.",
    ),
    Reason(EVENT_SUSPENDED, (), "Normal", "The job was suspended (runPolicy.suspend)."),
    Reason(EVENT_RESUMED, (), "Normal", "The job was resumed: replicas are recreated."),
    Reason(
        EVENT_GANG_BYPASSED,
        (),
        "Warning",
        "With a gang scheduler, a replica template sets a schedulerName of its own: its Pods "
        "are not placed with the gang.",
    ),
    Reason(EVENT_QUEUED, (), "Normal", "Kueue holds the job (condition reason Queued)."),
    Reason(EVENT_EVICTED_BY_KUEUE, (), "Warning", "Kueue evicted the job (EvictedByKueue)."),
    Reason(
        EVENT_WORKLOAD_FINISHED,
        (),
        "Warning",
        "Kueue finished the job's Workload before it ran.",
    ),
    Reason(
        EVENT_ADMITTED,
        (),
        "Normal",
        "Kueue admitted the job's Workload (in which ClusterQueue): its replicas are created.",
    ),
)

TFJOB_CONDITION_REASONS: Final[tuple[Reason, ...]] = (
    Reason(TFJOB_REASON_CREATED, ("Created=True",), None, "The operator took the TFJob."),
    Reason(TFJOB_REASON_RUNNING, ("Running=True",), None, "Every replica is running."),
    Reason(
        TFJOB_REASON_RESTARTING,
        ("Restarting=True",),
        None,
        "Failed replicas are restarted (the message says which types, and the cause).",
    ),
    Reason(TFJOB_REASON_SUCCEEDED, ("Succeeded=True",), None, "The TFJob completed successfully."),
    Reason(
        TFJOB_REASON_FAILED,
        ("Failed=True",),
        None,
        "The TFJob failed; the message begins as training-operator's (deadline, backoff limit, "
        "failed replicas) and ends with the engine's cause (its TrainJob reason's words).",
    ),
    Reason(
        TFJOB_REASON_SUSPENDED,
        ("Suspended=True", "Running=False"),
        None,
        "runPolicy.suspend is true (or Kueue holds it).",
    ),
    Reason(TFJOB_REASON_RESUMED, ("Suspended=False",), None, "The TFJob was resumed."),
)

# Event reasons only a TFJob's Events give (tfjob_status.EVENT_REASONS maps the engine's to
# training-operator's; this one has no TrainJob namesake).
TFJOB_EVENT_REASONS: Final[tuple[Reason, ...]] = (
    Reason(
        "FailedCreatePod",
        (),
        "Warning",
        "The API server refused to create a replica's Pod (the engine's FailedCreate), in "
        "training-operator's word.",
    ),
)
