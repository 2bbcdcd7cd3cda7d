"""The operator reads a failed replica's log for its cause when the termination message names
none (issue 32): which Pods, how often (once per failed Pod, a few per reconcile), and the
fsGroup hint of a write a mounted volume refused. The API is a fake here; the real log
endpoint is exercised in tests/integration/test_log_causes.py."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from trainjob.core import policy, spec
from trainjob_operator import children, kube, log_causes

AT = datetime.datetime(2026, 11, 27, 1, 0, tzinfo=datetime.timezone.utc)
LOG = (
    "Epoch 1/3\n"
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 9, in <module>\n'
    "tensorflow.python.framework.errors_impl.PermissionDeniedError: /train/checkpoint; "
    "Permission denied\n"
    "\r69/70 [============================>.] - ETA: 0s - loss: 1.6131\b\b\b\b"
)
CAUSE = "PermissionDeniedError: /train/checkpoint; Permission denied"
Known = dict[str, str | None]  # writes.Seen.log_causes
BAR = "69/70 [============================>.] - ETA: 0s - loss: 1.6131"


def job(workers: int = 4, runtime: bool = False, command: bool = True) -> spec.TrainJob:
    container: dict[str, Any] = {
        "name": "tensorflow",
        "image": "tf:1",
        "volumeMounts": [{"name": "training", "mountPath": "/train"}],
    }
    if command:
        container["command"] = ["python", "/app/train.py"]
    manifest: dict[str, Any] = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "keras"},
        "spec": {
            "replicaSpecs": {
                "worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [container],
                            "volumes": [
                                {
                                    "name": "training",
                                    "persistentVolumeClaim": {"claimName": "strategy-volume"},
                                }
                            ],
                        }
                    },
                }
            }
        },
    }
    if runtime:
        manifest["spec"]["runtime"] = {"entrypoint": "m:f"}
    return spec.parse(manifest)


def failed(
    index: int, exit_code: int = 1, cause: str | None = None, seconds: int = 0
) -> children.ChildPod:
    observed = policy.ObservedReplica(
        phase=policy.PHASE_FAILED,
        exit_code=exit_code,
        reason="Error",
        finished_at=AT + datetime.timedelta(seconds=seconds),
        cause=cause,
    )
    return children.ChildPod(("worker", index), observed, f"uid-{index}", "job-uid")


def running(index: int) -> children.ChildPod:
    observed = policy.ObservedReplica(phase=policy.PHASE_RUNNING)
    return children.ChildPod(("worker", index), observed, f"uid-{index}", "job-uid")


class FakeKube:
    """Kube.read_log_tail only; every call is recorded."""

    def __init__(self, log: str | None = LOG, error: bool = False) -> None:
        self.log = log
        self.error = error
        self.calls: list[tuple[str, str, str, int, int]] = []

    async def read_log_tail(
        self,
        namespace: str,
        pod: str,
        container: str,
        tail_lines: int,
        limit_bytes: int,
        timeout: float,
    ) -> str | None:
        self.calls.append((namespace, pod, container, tail_lines, limit_bytes))
        if self.error:
            raise kube.TransientError("reading the log: HTTP 502")
        return self.log


def observe(
    api: FakeKube,
    pods: list[children.ChildPod],
    known: dict[str, str | None],
    the_job: spec.TrainJob | None = None,
    finished: bool = False,
) -> dict[policy.ReplicaKey, policy.ObservedReplica]:
    return asyncio.run(
        log_causes.observed_with_causes(
            api,  # type: ignore[arg-type]
            "team-a",
            the_job or job(),
            pods,
            finished,
            known,
        )
    )


def test_a_failed_scripts_cause_comes_from_its_log_once() -> None:
    api, known = FakeKube(), Known()
    pods = [failed(1, cause=None), running(0)]
    observed = observe(api, pods, known)
    assert api.calls == [
        ("team-a", "keras-worker-1", "tensorflow", log_causes.TAIL_LINES, log_causes.LIMIT_BYTES)
    ]
    cause = observed[("worker", 1)].cause
    assert cause is not None and cause.startswith(CAUSE + " (hint: /train is a volume")
    assert "securityContext.fsGroup" in cause
    assert observed[("worker", 0)].cause is None
    # Reconciled again (and again): the log is not read again.
    for _ in range(3):
        assert observe(api, pods, known)[("worker", 1)].cause == cause
    assert len(api.calls) == 1


def test_at_most_a_few_reads_per_reconcile_the_earliest_failures_first() -> None:
    api, known = FakeKube(), Known()
    pods = [failed(i, seconds=10 - i) for i in range(4)]  # worker 3 failed first
    observe(api, pods, known)
    assert [call[1] for call in api.calls] == [
        "keras-worker-3",
        "keras-worker-2",
        "keras-worker-1",
    ]
    observe(api, pods, known)
    assert [call[1] for call in api.calls][3:] == ["keras-worker-0"]
    observe(api, pods, known)
    assert len(api.calls) == 4


def test_no_read_where_the_cause_is_known_or_not_the_programs_own() -> None:
    api = FakeKube()
    pods = [
        failed(0, cause="ValueError: lr must be > 0"),  # the termination message named it
        failed(1, exit_code=137),  # killed (OOM, SIGKILL): no exception of its own
        failed(2, exit_code=143),
    ]
    observe(api, pods, {})
    observe(api, [failed(0)], {}, finished=True)  # the verdict is given already
    observe(api, [failed(0)], {}, the_job=job(runtime=True, command=False))  # its own message
    assert api.calls == []


def test_a_log_that_cannot_be_read_keeps_the_termination_message_and_is_not_retried() -> None:
    api, known = FakeKube(error=True), Known()
    pods = [failed(1, cause="starting epoch 2")]
    assert observe(api, pods, known)[("worker", 1)].cause == "starting epoch 2"
    assert observe(api, pods, known)[("worker", 1)].cause == "starting epoch 2"
    assert len(api.calls) == 1
    nothing = FakeKube(log="Epoch 1/3\n" + BAR)
    assert observe(nothing, [failed(1)], {})[("worker", 1)].cause is None


def test_a_pod_gone_is_forgotten_and_its_replacement_read_anew() -> None:
    api, known = FakeKube(), Known()
    observe(api, [failed(1)], known)
    assert set(known) == {"uid-1"}
    observe(api, [running(0)], known)
    assert known == {}
    replacement = children.ChildPod(("worker", 1), failed(1).observed, "uid-1b", "job-uid")
    observe(api, [replacement], known)
    assert len(api.calls) == 2


def test_a_termination_messages_own_refusal_gets_the_hint_too() -> None:
    observed = observe(FakeKube(), [failed(1, cause=CAUSE)], {})
    cause = observed[("worker", 1)].cause
    assert cause is not None and cause.startswith(CAUSE + " (hint: /train is a volume")
