"""Pods as the API server returns them, turned into what the policy engine reads."""

from __future__ import annotations

import datetime

from trainjob.core import lastwords, observe, policy, termination


def pod(**status: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "job-worker-1",
            "labels": {"trainjob.dev/replica-type": "worker", "trainjob.dev/replica-index": "1"},
            "annotations": {"trainjob.dev/attempt": "3"},
        },
        "status": status,
    }


def test_failed_pod_gives_tensorflow_container_exit_code_and_finish_time() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Failed",
            containerStatuses=[
                {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "tensorflow",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "finishedAt": "2026-01-01T00:00:05Z",
                        }
                    },
                },
            ],
        )
    )
    assert observed is not None
    key, replica = observed
    assert key == ("worker", 1)
    assert (replica.phase, replica.attempt, replica.exit_code, replica.reason) == (
        "Failed",
        3,
        137,
        "OOMKilled",
    )
    assert replica.finished_at == datetime.datetime(2026, 1, 1, 0, 0, 5, tzinfo=datetime.UTC)


def test_evicted_pod_has_no_exit_code_but_a_reason() -> None:
    observed = observe.observe_pod(pod(phase="Failed", reason="Evicted"))
    assert observed is not None
    assert (observed[1].exit_code, observed[1].reason) == (None, "Evicted")


def test_deleting_pod_and_missing_phase() -> None:
    document = pod()
    document["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    observed = observe.observe_pod(document)
    assert observed is not None
    assert observed[1].deleting and observed[1].phase == "Pending"


def test_foreign_pods_are_ignored() -> None:
    assert observe.observe_pod({"metadata": {"labels": {"app": "x"}}}) is None
    assert (
        observe.observe_pod(
            {
                "metadata": {
                    "labels": {
                        "trainjob.dev/replica-type": "driver",
                        "trainjob.dev/replica-index": "0",
                    }
                }
            }
        )
        is None
    )


def test_image_pull_backoff_gives_the_kubelets_reason_and_words() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Pending",
            containerStatuses=[
                {
                    "name": "tensorflow",
                    "image": "nope:1",
                    "state": {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": 'Back-off pulling image "nope:1"',
                        }
                    },
                }
            ],
        )
    )
    assert observed is not None
    replica = observed[1]
    assert (replica.waiting_reason, replica.waiting_message) == (
        "ImagePullBackOff",
        'Back-off pulling image "nope:1"',
    )


def test_a_container_being_created_is_not_a_cause() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Pending",
            containerStatuses=[
                {"name": "tensorflow", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        )
    )
    assert observed is not None and observed[1].waiting_reason is None


def test_an_init_container_missing_its_secret_is_the_cause() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Pending",
            initContainerStatuses=[
                {
                    "name": "fetch",
                    "state": {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": 'secret "creds" not found',
                        }
                    },
                }
            ],
            containerStatuses=[
                {"name": "tensorflow", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        )
    )
    assert observed is not None
    assert (observed[1].waiting_reason, observed[1].waiting_message) == (
        "CreateContainerConfigError",
        'secret "creds" not found',
    )


def test_unschedulable_gives_the_schedulers_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    observed = observe.observe_pod(
        pod(
            phase="Pending",
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        )
    )
    assert observed is not None
    assert (observed[1].waiting_reason, observed[1].waiting_message) == ("Unschedulable", message)


def test_a_running_pod_has_no_waiting_cause_even_with_an_old_condition() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Running",
            containerStatuses=[
                {"name": "tensorflow", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
            ],
        )
    )
    assert observed is not None and observed[1].waiting_reason is None


def test_disruption_target_gives_its_reason_and_message() -> None:
    observed = observe.observe_pod(
        pod(
            phase="Running",
            conditions=[
                {"type": "Ready", "status": "True"},
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "PreemptionByScheduler",
                    "message": "Preempted in order to admit critical pod",
                },
            ],
        )
    )
    assert observed is not None
    assert (observed[1].disruption_reason, observed[1].disruption_message) == (
        "PreemptionByScheduler",
        "Preempted in order to admit critical pod",
    )
    false = observe.observe_pod(
        pod(conditions=[{"type": "DisruptionTarget", "status": "False", "reason": "X"}])
    )
    assert false is not None and false[1].disruption_reason is None


def terminated(message: str) -> dict[str, object]:
    return pod(
        phase="Failed",
        containerStatuses=[
            {"name": "tensorflow", "state": {"terminated": {"exitCode": 1, "message": message}}}
        ],
    )


def test_the_runtimes_error_line_in_its_termination_message_is_the_cause() -> None:
    message = '{"trainjobProgress":{"state":"Failed"},"trainjobError":"ValueError: lr must be > 0"}'
    observed = observe.observe_pod(terminated(message))
    assert observed is not None and observed[1].cause == "ValueError: lr must be > 0"


def test_a_progress_report_alone_is_no_cause() -> None:
    observed = observe.observe_pod(terminated('{"trainjobProgress":{"state":"Failed"}}'))
    assert observed is not None and observed[1].cause is None


def test_the_log_tail_of_a_script_gives_its_last_line() -> None:
    """FallbackToLogsOnError: a Python crash's log ends with its exception line."""
    tail = (
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 3, in <module>\n'
        "    raise KeyError('images')\n"
        "KeyError: 'images'\n\n"
    )
    observed = observe.observe_pod(terminated(tail))
    assert observed is not None and observed[1].cause == "KeyError: 'images'"
    long = termination.read("x" * 1000).cause
    assert long is not None and len(long) == lastwords.MAX_CAUSE_CHARS and long.endswith("...")


def unschedulable(message: str, attempt: int = 0) -> policy.ObservedReplica:
    return policy.ObservedReplica(
        phase="Pending", attempt=attempt, waiting_reason="Unschedulable", waiting_message=message
    )


NODES_SAY = "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) didn't match"
GANG_ECHO = '0/6 nodes are available: podGroup "team-a/greedy" failed recently.'


def test_a_gang_echo_keeps_the_schedulers_words_about_the_nodes() -> None:
    kept = observe.keep_cause(unschedulable(NODES_SAY), unschedulable(GANG_ECHO))
    assert kept.waiting_message == NODES_SAY
    later = unschedulable("rejected pod by Coscheduling: optimistic rejection in PostFilter")
    assert observe.keep_cause(kept, later).waiting_message == NODES_SAY


def test_new_words_about_the_nodes_a_new_attempt_or_a_start_replace_the_kept_ones() -> None:
    fewer = "0/6 nodes are available: 1 Insufficient memory"
    assert observe.keep_cause(unschedulable(NODES_SAY), unschedulable(fewer)).waiting_message == (
        fewer
    )
    # Another attempt is another Pod: its echo says nothing of what the last one lacked.
    assert (
        observe.keep_cause(
            unschedulable(NODES_SAY), unschedulable(GANG_ECHO, attempt=1)
        ).waiting_message
        == GANG_ECHO
    )
    # An echo never stands in for an echo, and a placed Pod waits for nothing.
    assert observe.keep_cause(
        unschedulable(GANG_ECHO), unschedulable(GANG_ECHO)
    ).waiting_message == (GANG_ECHO)
    running = policy.ObservedReplica(phase="Running")
    assert observe.keep_cause(unschedulable(NODES_SAY), running) == running
