"""Pods as the API server returns them, turned into what the policy engine reads."""

from __future__ import annotations

import datetime

from trainjob.core import observe


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
