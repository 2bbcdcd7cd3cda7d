"""Rule: what one replica's end means for the job, answered in one function as the Job
controller's podFailurePolicy answers it (`matchPodFailurePolicy`): :func:`failure_fate` says
whether an ended replica is done, runs again counted toward backoffLimit, runs again as a
disruption, or fails the job. Beside it, the words that tell a failure: what ended and how, the
Failed condition's reason, the replica's last words.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from trainjob.core import constants, policy_disruption, policy_success, spec
from trainjob.core.policy_terms import (
    DELETED,
    REASON_CHECKPOINT_STORAGE,
    REASON_FAILED,
    REASON_NON_FINITE_LOSS,
    REASON_PREEMPTED,
    REASON_STORAGE_UNREACHABLE,
    Failure,
)

# Exit codes 1-127 are the program's own verdict; >= 128 means killed by a signal (128 + n).
FIRST_SIGNAL_EXIT_CODE: Final = 128
# The runtime's exit code for a training loss that became NaN or +/-Inf (permanent: 1-127).
EXIT_CODE_NON_FINITE_LOSS: Final = constants.EXIT_CODE_NON_FINITE_LOSS
# The runtime's verdicts on the checkpoint store: refused (permanent) and unreachable (>= 128,
# retried under ExitCode).
EXIT_CODE_CHECKPOINT_STORAGE: Final = constants.EXIT_CODE_CHECKPOINT_STORAGE
EXIT_CODE_STORAGE_UNREACHABLE: Final = constants.EXIT_CODE_STORAGE_UNREACHABLE

# The exit codes by which the runtime names why it gave up: the Failed condition's reason.
VERDICT_REASONS: Final[Mapping[int, str]] = {
    EXIT_CODE_NON_FINITE_LOSS: REASON_NON_FINITE_LOSS,
    EXIT_CODE_CHECKPOINT_STORAGE: REASON_CHECKPOINT_STORAGE,
    EXIT_CODE_STORAGE_UNREACHABLE: REASON_STORAGE_UNREACHABLE,
}
# What a user checks when a replica exits with one of these codes, said beside the code in the
# condition and the Event. The replica's own line (``; cause: ...``) names the bucket and the
# store's answer; this says where in the job to look, since the code alone says nothing.
EXIT_CODE_ADVICE: Final[Mapping[int, str]] = {
    EXIT_CODE_CHECKPOINT_STORAGE: (
        "the checkpoint store refused it: check that the bucket of spec.checkpoint.path "
        "exists and that the job's credentials (spec.checkpoint.credentialsSecret, else the "
        "Pods' workload identity) may read and write there"
    ),
    EXIT_CODE_STORAGE_UNREACHABLE: (
        "the checkpoint store could not be reached: check the store's endpoint "
        "(AWS_ENDPOINT_URL_S3 for an S3-compatible store) and that the Pods' network reaches it"
    ),
}


class Fate(enum.Enum):
    """What becomes of a replica that ended (the Job controller's podFailurePolicy actions)."""

    COMPLETED = "Completed"  # its work is done: recorded Succeeded, never run again
    RESTART = "Restart"  # its restart group runs again; counts toward backoffLimit (Count)
    DISRUPTED = "Disrupted"  # runs again; counts toward disruptionLimit instead (Ignore)
    FAIL_JOB = "FailJob"  # no restart policy retries it: the job fails (FailJob)


def failure_fate(job: spec.TrainJob, failure: Failure) -> Fate:
    """The fate of a replica's end, by its replica type's restartPolicy. Of a restart group
    that failed, its root cause's fate is the group's (policy_restart.root_cause)."""
    restart_policy = job.replica_specs[failure.key[0]].restart_policy
    if failure.succeeded:
        # Under Always a replica that decides no success (a ps, an evaluator, the workers
        # beside a chief) is meant to run until the job ends: exiting 0 is a failure.
        if restart_policy == "Always" and failure.key not in policy_success.success_deciders(job):
            return Fate.RESTART
        return Fate.COMPLETED
    if failure.disrupted:
        # Preempted or evicted: the replica did nothing wrong; it runs again (uncounted).
        return Fate.DISRUPTED
    if failure.reason == DELETED:
        # A Pod deleted under us (kubectl delete pod, node drain) is recreated under any
        # policy, as a Kubernetes controller would; it still counts toward backoffLimit.
        return Fate.RESTART
    if restart_policy in ("OnFailure", "Always"):
        return Fate.RESTART
    if restart_policy == "ExitCode" and retryable_exit_code(failure.exit_code):
        return Fate.RESTART
    return Fate.FAIL_JOB


def retryable_exit_code(code: int | None) -> bool:
    """The ExitCode restart policy's rule: 1-127, the program gave up, are permanent; >= 128
    or no code (killed, evicted, OOM-killed) are retried. The runtime's own exit codes are
    chosen by it (:mod:`trainjob.runtime.exitcodes`)."""
    return code is None or code == 0 or code >= FIRST_SIGNAL_EXIT_CODE


def failed_reason(failure: Failure) -> str:
    """The Failed condition's reason for a replica failure no policy retries: the runtime's
    own verdict where its exit code names one (a diverged loss, a checkpoint store that refused
    or could not be reached), else ReplicaFailed."""
    if failure.disrupted or failure.exit_code is None:
        return REASON_FAILED
    return VERDICT_REASONS.get(failure.exit_code, REASON_FAILED)


def describe(failure: Failure) -> str:
    rtype, index = failure.key
    if failure.disruption_reason is not None:
        kind = policy_disruption.disruption_kind(failure.disruption_reason)
        verb = "preempted" if kind == REASON_PREEMPTED else "evicted"
        detail = failure.disruption_reason
        if failure.disruption_message:
            detail += f": {failure.disruption_message}"
        return f"{rtype} {index} was {verb} ({detail})"
    if failure.reason == DELETED:
        return f"{rtype} {index} was deleted"
    if failure.exit_code is None:
        return f"{rtype} {index} failed ({failure.reason or 'no exit code'})"
    detail = f", {failure.reason}" if failure.reason else ""
    advice = EXIT_CODE_ADVICE.get(failure.exit_code)
    if advice is not None:
        detail += f" ({advice})"
    return f"{rtype} {index} exited with code {failure.exit_code}{detail}"


def last_words(cause: Failure, failures: list[Failure]) -> str:
    """`; cause: worker-0: ValueError: ...`: the replica's last words, the root cause's when
    it left any, else the first of its peers' (one exit 1 often just follows a lost peer)."""
    candidates = [cause, *sorted(failures, key=lambda f: f.key)]
    for failure in candidates:
        if failure.cause:
            return f"; cause: {failure.key[0]}-{failure.key[1]}: {failure.cause}"
    return ""
