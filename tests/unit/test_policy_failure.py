"""One replica's end and its fate (policy_failure.failure_fate), as a table: restartPolicy x how
the replica ended. The engine's behaviour around it is specified in test_policy.py."""

from __future__ import annotations

import pytest

from tests.unit.test_policy import at, make_job
from trainjob.core import policy_failure, policy_terms
from trainjob.core.policy_failure import Fate
from trainjob.core.policy_terms import Failure

WORKER_1 = ("worker", 1)
EXITED_1 = Failure(WORKER_1, 1, "Error", at(10))
KILLED = Failure(WORKER_1, 137, "OOMKilled", at(10))
NO_CODE = Failure(WORKER_1, None, None, at(10))
DELETED = Failure.deleted(WORKER_1, at(10), None, None)
PREEMPTED = Failure(WORKER_1, 137, None, at(10), "PreemptionByScheduler", "m")
ON_LOST_NODE = Failure.deleted(WORKER_1, at(10), policy_terms.REASON_NODE_UNREACHABLE, "n3")
EXITED_0 = Failure(WORKER_1, 0, "Completed", at(10), succeeded=True)
CHIEF_EXITED_0 = Failure(("chief", 0), 0, "Completed", at(10), succeeded=True)


@pytest.mark.parametrize(
    ("restart_policy", "failure", "fate"),
    [
        ("Never", EXITED_1, Fate.FAIL_JOB),
        ("Never", KILLED, Fate.FAIL_JOB),
        ("ExitCode", EXITED_1, Fate.FAIL_JOB),
        ("ExitCode", KILLED, Fate.RESTART),
        ("ExitCode", NO_CODE, Fate.RESTART),
        ("OnFailure", EXITED_1, Fate.RESTART),
        ("Always", EXITED_1, Fate.RESTART),
        # A Pod deleted under us is recreated under any policy, and counted.
        ("Never", DELETED, Fate.RESTART),
        # A disruption is never the replica's fault: restarted under any policy, uncounted.
        ("Never", PREEMPTED, Fate.DISRUPTED),
        ("Never", ON_LOST_NODE, Fate.DISRUPTED),
        # Exit 0 is done, except under Always for a replica whose success decides nothing.
        ("Never", EXITED_0, Fate.COMPLETED),
        ("Always", EXITED_0, Fate.RESTART),
        ("Always", CHIEF_EXITED_0, Fate.COMPLETED),
    ],
)
def test_a_replica_end_has_one_fate(restart_policy: str, failure: Failure, fate: Fate) -> None:
    job = make_job({"chief": 1, "worker": 2}, restart_policy)
    assert policy_failure.failure_fate(job, failure) is fate
