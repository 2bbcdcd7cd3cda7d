"""The one place that says how long a single test may take, and which tests may take longer.

``bash tests/run`` ends with a table of where the time went (tests/support/timing.py) and
fails when a test took longer than ``TEST_BUDGET_SECONDS`` without being listed below with
the reason it needs the time. The budget is for the slowest machine CI has run on (about 1.75
times this project's usual machine), with the tiers running side by side: a test that needs
more is either made cheaper or listed here, so that CI's length is a decision, not a drift.

Keys are pytest node ids without parameters (``path::function``): every parameter of a listed
test is covered. tests/unit/test_budgets.py checks that each key names a test that exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

TEST_BUDGET_SECONDS: Final = 180.0

# The budget above is in this project's usual machine's seconds. A slower machine gets it
# scaled by how much slower it ran a fixed piece of Python (`timing.reference_workload`),
# measured at the start of the run, before anything else loads the CPUs: CI has run on a
# machine that compiled Go 2.1 times and ran mypy 1.75 times slower, where every test takes
# longer for the same work. Never scaled below 1: a faster machine keeps the budget.
REFERENCE_WORKLOAD_SECONDS: Final = 0.30  # the fastest of 5 rounds, 0.301 s (2026-11-29)

SLOW_TESTS: Final[Mapping[str, str]] = {
    "tests/e2e/test_multinode.py"
    "::test_lost_node_names_the_cause_and_the_job_resumes_on_the_other_node": (
        "a node is stopped for real: the node controller's grace period (40 s) and the Pods' "
        "eviction pass before the replica is recreated elsewhere and resumes"
    ),
    "tests/training/test_gpu_check_smoke.py"
    "::test_allow_cpu_runs_the_whole_flow_and_writes_its_figures": (
        "bench/gpu_check.py's whole flow: six groups of TensorFlow processes one after another "
        "(preflight, fallback, the runtime and plain tf-keras on 1 and 2 workers); 148 s on 2 "
        "loaded cores"
    ),
    "tests/training/test_bench_checkpoint_store_smoke.py"
    "::test_checkpoint_store_benchmark_runs_all_three_targets_and_prints_ratios": (
        "bench/checkpoint_store.py at its smallest size: three 2-worker TensorFlow jobs one "
        "after another (a directory, s3://, gs://) and both stores' servers; 114-147 s on 2 "
        "cores at load 6-13 (49 CPU-s)"
    ),
    "tests/integration/test_kueue_storm.py"
    "::test_kueue_storm_with_operator_kills_keeps_quota_and_admission": (
        "50 TrainJobs through the real Kueue while the operator is SIGKILLed 5 times, every job "
        "waited to its end; 97-121 s in three full runs, 275 s in one (2026-11-29) during "
        "which kind loaded its images beside the tiers (a suspect, not measured apart)"
    ),
    "tests/integration/test_kueue_cohort_storm.py"
    "::test_kueue_cohort_storm_never_runs_pods_without_admission_nor_over_commits": (
        "40 TrainJobs through two ClusterQueues of one Cohort under the real Kueue, borrowing "
        "and reclaiming while the operator is SIGKILLed 4 times, every job waited to its end; "
        "sized for about 3 minutes (its docstring): 113-135 s in full runs, 182 s in one "
        "(2026-11-29)"
    ),
    "tests/integration/test_bench_smoke.py"
    "::test_benchmark_smoke_size_completes_and_prints_figures": (
        "bench/operator_scale.py at its smallest size: 3 jobs x 8 replicas as TrainJobs and as "
        "TFJobs, then 2 timed one by one, on the benchmark's own control plane; 73 s in one "
        "full run, 201 s in another (2026-11-29), the kueue storm's run above"
    ),
    "tests/local/test_custom_loop_examples.py"
    "::test_killed_worker_costs_at_most_one_checkpoint_interval": (
        "a 2-worker custom loop to 40 steps, worker 1 SIGKILLed mid-run and the group started "
        "again: four TensorFlow start-ups; 60 s, 112 s and 155 s in three full runs "
        "(2026-11-29), near the budget on a slow day"
    ),
    "tests/training/test_estimator_legacy.py::test_two_workers_restart_resume_and_evaluate": (
        "Estimator on TF 2.15: a chief and a worker trained to a checkpoint at step 100, the "
        "group killed and started again, resumed, and an evaluator beside it: five TensorFlow "
        "start-ups on the legacy venv; 197 s and 220 s in two full runs on slower machines "
        "(2026-11-29/30, 77-115 CPU-s), the budget there 322 s and 217 s"
    ),
    "tests/training/test_custom_loop.py"
    "::test_a_process_killed_during_checkpoint_saves_resumes_from_the_last_complete_one": (
        "10 seeded SIGKILLs, each during a save, and a TensorFlow start-up after each: eleven "
        "start-ups one after another (68-69 CPU-s); 129 s, 158 s, 171 s and 244 s in four full "
        "runs (2026-11-29/30), the last over that run's scaled budget of 217 s"
    ),
    "tests/local/test_custom_loop_examples.py::test_sigtermed_worker_costs_no_step": (
        "the same 2-worker custom loop with worker 1 SIGTERMed: four TensorFlow start-ups and "
        "a save at the step; 143 s in the slower of this stop's two full runs (2026-11-29)"
    ),
}


def listed_reason(nodeid: str, listed: Mapping[str, str]) -> str | None:
    """The reason `listed` gives for the test `nodeid` (its parameters ignored), or None."""
    return listed.get(nodeid.partition("[")[0])
