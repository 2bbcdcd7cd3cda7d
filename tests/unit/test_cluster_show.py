"""The pure side of the cluster commands (trainjob.cluster.show and the decisions of
trainjob.cluster.cli): the get table, describe text, the live view's Snapshot and the summary
built from a TrainJob's status as the operator writes it, log selection and filtering, wait."""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainjob import cli
from trainjob.cluster import describe, objects, show
from trainjob.cluster.cli import jobs as cluster_jobs
from trainjob.cluster.cli import logs as cluster_logs
from trainjob.console import outcome, view
from trainjob.core import progress as core_progress
from trainjob.core import spec, termination, times
from trainjob.core import status as st

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 24, 12, 0, 0, tzinfo=datetime.timezone.utc)
START = NOW - datetime.timedelta(seconds=95)
REPO = Path(__file__).resolve().parents[2]


def manifest(name: str = "mnist", workers: int = 2) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "tensorflow", "image": "img"}]}}
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "creationTimestamp": "2026-11-24T11:58:00Z",
        },
        "spec": {
            "replicaSpecs": {
                "chief": {"replicas": 1, "template": template},
                "worker": {"replicas": workers, "template": template},
            },
            "runPolicy": {"backoffLimit": 3},
        },
    }


def stored(
    records: dict[tuple[str, int], st.ReplicaRecord],
    conditions: list[tuple[str, bool, str, str]],
    *,
    progress: dict[str, Any] | None = None,
    restarts: int = 0,
    done: bool = False,
) -> dict[str, Any]:
    """A TrainJob as the API server returns it, its status written by the core's to_dict."""
    obj = manifest()
    job = spec.parse(obj, require_images=False)
    status = st.JobStatus(
        conditions=tuple(st.Condition(t, s, r, m, START) for t, s, r, m in conditions),
        replicas=records,
        restart_count=restarts,
        start_time=START,
        completion_time=NOW - datetime.timedelta(seconds=5) if done else None,
    )
    obj["status"] = st.to_dict(job, status)
    if progress is not None:
        obj["status"]["progress"] = progress
    return obj


REPORT = core_progress.Report(
    replica="chief-0", epoch=2, total_epochs=3, step=80, total_steps=120, loss=0.42101,
    examples_per_second=1234.0, eta_seconds=20.0,
)  # fmt: skip
RUNNING = stored(
    {
        ("chief", 0): st.ReplicaRecord(0, "Running"),
        ("worker", 0): st.ReplicaRecord(0, "Running"),
        ("worker", 1): st.ReplicaRecord(1, "Pending", exit_code=137, reason="OOMKilled"),
    },
    [("Created", True, "Created", "pods created"), ("Running", True, "Running", "all running")],
    progress=core_progress.status_progress(REPORT, NOW),
    restarts=1,
)
FAILED = stored(
    {
        ("chief", 0): st.ReplicaRecord(0, "Stopped", exit_code=143),
        ("worker", 0): st.ReplicaRecord(0, "Failed", exit_code=1, reason="Error"),
        ("worker", 1): st.ReplicaRecord(0, "Stopped", exit_code=143),
    },
    [("Failed", True, "ReplicaFailed", "worker 0 exited with code 1 (permanent)")],
    done=True,
)


def pod(name: str, rtype: str, index: int, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                "trainjob.dev/replica-type": rtype,
                "trainjob.dev/replica-index": str(index),
            },
        },
        "spec": {"nodeName": status.pop("node", "node-1")},
        "status": status,
    }


def container(state: dict[str, Any], restarts: int = 0) -> list[dict[str, Any]]:
    return [{"name": "tensorflow", "restartCount": restarts, "state": state}]


# ----- get -----
def test_human_duration_is_kubectls_age() -> None:
    cases = {
        5: "5s",
        119: "119s",
        200: "3m20s",
        600: "10m",
        3 * 3600 + 120: "3h2m",
        30 * 3600: "30h",
    }
    cases |= {3 * 86400 + 4 * 3600: "3d4h", 40 * 86400: "40d", 800 * 86400: "2y70d"}
    assert {s: times.format_age(s) for s in cases} == cases


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h30m", 5400)]
)
def test_durations_as_kubectl_timeout(text: str, seconds: float) -> None:
    assert times.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "-1s"])
def test_a_bad_duration_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration such as 30s, 5m or 1h30m"):
        times.parse_duration(text)


def test_get_has_the_printer_columns_of_kubectl_get_tj() -> None:
    fresh = manifest("fresh")
    lines = show.jobs_table([RUNNING, fresh], NOW, all_namespaces=False, wide=False)
    assert lines[0].split() == list(show.HEADERS)
    assert lines[1].split() == [
        "mnist",
        "Running",
        "2/3",
        "1",
        "Running",
        "66%",
        "(2/3)",
        "20s",
        "0.421",
        "<none>",  # DEVICES: no replica said yet
        "2m",
    ]
    # No status written yet (just created, the operator down): Pending, as kubectl get tj
    # says from the CRD's default, never an empty state.
    assert lines[2].split() == ["fresh", "Pending", *["<none>"] * 7, "2m"]
    wide = show.jobs_table([RUNNING, fresh], NOW, all_namespaces=True, wide=True)
    assert wide[0].split()[0] == "NAMESPACE" and wide[0].split()[-2:] == ["STEP", "MESSAGE"]
    assert wide[1].split()[:2] == ["team-a", "mnist"] and "80/120" in wide[1]
    assert wide[1].endswith("Running: all running")
    assert wide[2].split()[2] == "Pending" and wide[2].endswith(show.NO_STATUS_YET)
    defaulted = {**fresh, "status": {"state": "Pending"}}  # as the API server returns it
    assert show.job_state(defaulted) == "Pending"
    assert show.waiting_note(defaulted) == show.NO_STATUS_YET
    assert show.waiting_note(RUNNING) is None


# ----- the live view and the summary -----
def test_a_snapshot_from_status_draws_the_same_table_as_a_local_run() -> None:
    snapshot = show.snapshot(RUNNING, NOW)
    assert snapshot.elapsed_seconds == 95
    assert snapshot.report is not None and snapshot.report.step == 80
    lines = [view.plain(line) for line in view.table_segments(snapshot, width=120)]
    assert lines[0] == "TrainJob mnist  Running  1m35s  step 80/120 (66%)  ETA 20.0s  restarts 1/3"
    assert lines[1].split() == [
        "chief-0", "Running", "epoch", "2", "step", "80", "loss", "0.4210", "1,234", "ex/s",
        "attempt", "0",
    ]  # fmt: skip
    assert lines[3].split()[:4] == ["worker-1", "Pending", "exit", "137"]


def test_the_live_table_of_a_cluster_job_shows_every_replicas_devices() -> None:
    """status.progress.replicaDevices (each replica says its devices once) on each row, as a
    local run shows them; the chief's report keeps its numbers beside its own devices."""
    gpu = core_progress.Devices(gpus=1, names=("GPU:0",), cuda_build=True, cuda_version="12.5.1")
    cpu = core_progress.Devices(gpus=0, cuda_build=True, cuda_version="12.5.1")
    devices = {"chief-0": cpu, "worker-0": gpu, "worker-1": gpu}
    obj = stored(
        {
            ("chief", 0): st.ReplicaRecord(0, "Running"),
            ("worker", 0): st.ReplicaRecord(0, "Running"),
            ("worker", 1): st.ReplicaRecord(0, "Running"),
        },
        [("Running", True, "Running", "all running")],
        progress=core_progress.status_progress(REPORT, NOW, devices),
    )
    snapshot = show.snapshot(obj, NOW)
    assert {key: p.devices for key, p in snapshot.progress.items()} == {
        ("chief", 0): cpu,
        ("worker", 0): gpu,
        ("worker", 1): gpu,
    }
    assert snapshot.progress[("chief", 0)].step == 80
    rows = [view.plain(line) for line in view.table_segments(snapshot, width=160)][1:4]
    assert "CPU" in rows[0] and "1 GPU" in rows[1] and "1 GPU" in rows[2], rows


def test_the_summary_of_a_failed_cluster_job_names_cause_and_log_command() -> None:
    message = "Traceback...\nValueError: bad shape"
    terminated = {"terminated": {"exitCode": 1, "message": message}}
    pods = [pod("mnist-worker-0", "worker", 0, containerStatuses=container(terminated))]
    summary = show.summary(FAILED, pods, NOW)
    text = view.summary_text(summary)
    assert outcome.command_exit_code(summary) == 1
    assert text.startswith("TrainJob mnist Failed after 1m30s\n")
    assert "  reason:     ReplicaFailed: worker 0 exited with code 1 (permanent)\n" in text
    assert "  cause:      worker-0: ValueError: bad shape\n" in text
    assert "full log: trainjob logs mnist worker-0 -n team-a --cluster" in text
    assert "  checkpoint: none (spec.checkpoint is not set)\n" in text
    # Without a termination message, the exit code and reason stand in for the quote.
    bare = view.summary_text(show.summary(FAILED, [], NOW))
    assert "  cause:      worker-0: exit code 1 (Error)\n" in bare


def test_the_summary_quotes_the_operators_cause_never_a_progress_bar() -> None:
    """Issue 32: a Keras progress bar filled the termination message; the operator quotes the
    exception it read in the log (the replica's record), and the bar itself is no cause."""
    bar = "\r 69/70 [=====>.] - ETA: 0s - loss: 1.6131\b\b\b\b"
    pods = [pod("mnist-worker-0", "worker", 0, containerStatuses=container(
        {"terminated": {"exitCode": 1, "message": bar}}))]  # fmt: skip
    assert "worker-0: exit code 1 (Error)" in view.summary_text(show.summary(FAILED, pods, NOW))
    record = st.ReplicaRecord(0, "Failed", 1, "Error", message="PermissionDeniedError: /train; x")
    quoted = stored(
        {("worker", 0): record}, [("Failed", True, "ReplicaFailed", "worker 0 exited")], done=True
    )
    text = view.summary_text(show.summary(quoted, pods, NOW))
    assert "  cause:      worker-0: PermissionDeniedError: /train; x\n" in text


def test_a_final_progress_report_is_not_quoted_as_a_cause() -> None:
    final = termination.with_report(core_progress.Report(state="Failed", step=3))
    pods = [pod("mnist-worker-0", "worker", 0, containerStatuses=container(
        {"terminated": {"exitCode": 1, "message": final}}))]  # fmt: skip
    assert "worker-0: exit code 1 (Error)" in view.summary_text(show.summary(FAILED, pods, NOW))


def test_a_report_with_unknown_or_bad_fields_is_no_progress() -> None:
    assert objects.report_of({"progress": {"step": -1}}) is None
    assert objects.report_of({"progress": "50%"}) is None
    assert objects.report_of(None) is None
    report = objects.report_of({"progress": {"summary": "x", "eta": "1m", "step": 5, "extra": 1}})
    assert report is not None and report.step == 5


def test_an_unreadable_spec_is_named() -> None:
    broken = {**RUNNING, "spec": {"replicaSpecs": {"ps": {"replicas": 1}}}}
    with pytest.raises(objects.ShowError, match="TrainJob mnist cannot be read: "):
        show.snapshot(broken, NOW)


# ----- describe -----
def test_describe_lays_out_state_cause_progress_replicas_and_events() -> None:
    pods = [pod("mnist-worker-0", "worker", 0)]
    events = [
        {"type": "Warning", "reason": "ReplicaFailed", "message": "worker 0 exited with code 1",
         "lastTimestamp": "2026-11-24T11:59:50Z", "source": {"component": "trainjob-operator"},
         "involvedObject": {"kind": "TrainJob", "name": "mnist"}},
    ]  # fmt: skip
    text = describe.describe_text(FAILED, pods, events, NOW)
    assert "Name:         mnist\nNamespace:    team-a\n" in text
    assert "State:        Failed\n" in text
    assert "Cause:        ReplicaFailed: worker 0 exited with code 1 (permanent)\n" in text
    assert "Progress:     <none>\n" in text
    replicas = text.split("Replicas:\n")[1].split("Events:")[0].splitlines()
    assert replicas[0].split() == ["Replica", "State", "Attempt", "Exit", "Code", "Reason", "Pod"]
    assert replicas[2].split() == ["worker-0", "Failed", "0", "1", "Error", "mnist-worker-0"]
    assert replicas[1].split() == ["chief-0", "Stopped", "0", "143", "<none>"]
    event = text.split("Events:\n")[1].splitlines()[1].split()
    assert event[:5] == ["Warning", "ReplicaFailed", "10s", "trainjob-operator", "TrainJob/mnist"]
    running = describe.describe_text(RUNNING, [], [], NOW)
    assert "Progress:     66% (2/3)  step 80/120  loss 0.421\nETA:          20s\n" in running
    assert "Events:\n  <none>\n" in running


# ----- wait -----
@pytest.mark.parametrize(
    ("obj", "wait_for", "expected"),
    [
        (RUNNING, "succeeded", None),
        (RUNNING, "running", 0),
        (FAILED, "succeeded", 1),
        (FAILED, "running", 1),
        (FAILED, "finished", 0),
        (manifest(), "running", None),
    ],
)
def test_wait_decides_from_conditions(
    obj: dict[str, Any], wait_for: str, expected: int | None
) -> None:
    assert show.wait_outcome(obj, wait_for) == expected


def test_wait_gives_up_at_its_deadline_without_sleeping_past_it() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    code, _ = cluster_jobs.wait_for(lambda: RUNNING, "succeeded", 2.5, sleep, lambda: clock[0])
    assert code == 124 and slept == [1.0, 1.0, 0.5]


# ----- logs -----
def test_log_instances_follow_restarts_and_recreated_pods() -> None:
    waiting = pod(
        "p", "worker", 0, containerStatuses=container({"waiting": {"reason": "ImagePullBackOff"}})
    )
    running = pod("p", "worker", 0, containerStatuses=container({"running": {}}, restarts=2))
    assert describe.log_instance(waiting) is None
    assert describe.log_instance(running) == "uid-p/2"
    assert (
        describe.log_instance({**running, "metadata": {**running["metadata"], "uid": "new"}})
        == "new/2"
    )
    assert describe.log_unavailable(running) is None
    assert describe.log_unavailable(waiting) == (
        "Pod p: its container has not started (ImagePullBackOff), so it has no log"
    )
    unscheduled = pod("q", "chief", 0, node=None, phase="Pending")
    assert describe.log_unavailable(unscheduled) == (
        "Pod q is on no node yet (Pending, not scheduled), so it has no log"
    )


def test_pods_in_replica_order_and_labelled() -> None:
    pods = [pod("x-worker-10", "worker", 10), pod("other", "", 0), pod("x-worker-2", "worker", 2),
            pod("x-chief-0", "chief", 0)]  # fmt: skip
    ordered = describe.order_pods(pods)
    assert [objects.pod_label(p) for p in ordered] == ["chief-0", "worker-2", "worker-10", "other"]


def test_cluster_logs_drop_tensorflow_noise_unless_verbose() -> None:
    lines = [
        "2026-11-24 12:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:210] x",
        "Epoch 1/3",
        "W0000 00:00:1795439295.226345   18621 gpu_device.cc:31] cuInit",
        "ValueError: bad shape",
    ]
    assert list(cluster_logs.filtered(lines, verbose=False)) == [
        "Epoch 1/3",
        "ValueError: bad shape",
    ]
    assert list(cluster_logs.filtered(lines, verbose=True)) == lines
    assert view.log_line("worker-0", "Epoch 1/3", 9) == "worker-0  | Epoch 1/3"


def _logs_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["logs", *argv])


def test_logs_mean_the_cluster_only_when_asked_or_no_local_run_has_the_name(tmp_path: Path) -> None:
    (tmp_path / "trainjob-runs" / "here").mkdir(parents=True)
    runs = "trainjob-runs"
    assert not cluster_logs.wants_cluster(_logs_args(), str(tmp_path), runs)
    assert not cluster_logs.wants_cluster(_logs_args("here"), str(tmp_path), runs)
    assert not cluster_logs.wants_cluster(_logs_args("worker-1"), str(tmp_path), runs)
    assert cluster_logs.wants_cluster(_logs_args("here", "--cluster"), str(tmp_path), runs)
    assert cluster_logs.wants_cluster(_logs_args("here", "-n", "team-a"), str(tmp_path), runs)
    assert cluster_logs.wants_cluster(_logs_args("here", "--tail", "5"), str(tmp_path), runs)
    assert cluster_logs.wants_cluster(_logs_args("mnist"), str(tmp_path), runs)


# ----- apply, completion, imports -----
def test_apply_keeps_status_and_identity_and_takes_spec_and_labels() -> None:
    current = {**RUNNING, "metadata": {**RUNNING["metadata"], "uid": "u1", "resourceVersion": "7",
                                        "labels": {"keep": "1", "team": "a"}}}  # fmt: skip
    wanted = {**manifest(workers=3), "metadata": {"name": "mnist", "labels": {"team": "b"}}}
    result = objects.applied(current, wanted)
    assert result["status"] == RUNNING["status"]
    assert result["metadata"]["resourceVersion"] == "7" and result["metadata"]["uid"] == "u1"
    assert result["metadata"]["labels"] == {"keep": "1", "team": "b"}
    assert result["spec"]["replicaSpecs"]["worker"]["replicas"] == 3


def test_completion_covers_the_cluster_verbs_and_their_flags() -> None:
    script = cli.completion_script(cli.build_parser(), "bash")
    for verb in ("submit", "get", "describe", "wait", "delete", "attach"):
        assert f"    {verb}) opts=" in script, verb
    attach = next(line for line in script.splitlines() if line.startswith("    attach) opts="))
    assert "--context" in attach and "--namespace" in attach and "--kubeconfig" in attach
    get = next(line for line in script.splitlines() if line.startswith("    get) opts="))
    assert "--all-namespaces" in get
    logs = next(line for line in script.splitlines() if line.startswith("    logs) opts="))
    assert "--previous" in logs and "--tail" in logs and "--cluster" in logs
    assert 'compgen -W "succeeded finished running"' in script


def test_commands_that_do_not_talk_to_a_cluster_never_import_kubernetes() -> None:
    code = (
        "import sys, trainjob.cli, trainjob.client\n"
        "assert 'kubernetes' not in sys.modules, 'kubernetes imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_kubeconfig_files_in_kubectls_order() -> None:
    from trainjob.cluster import api

    assert api.kubeconfig_files("/a", {"KUBECONFIG": "/b:/c"}) == "/a"
    assert api.kubeconfig_files(None, {"KUBECONFIG": "/b:/c"}) == "/b:/c"
    assert api.kubeconfig_files(None, {}) == os.path.expanduser("~/.kube/config")


def _examples() -> list[Path]:
    return sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_a_parsed_trainjob_turns_back_into_the_same_manifest(path: Path) -> None:
    for document in spec.load_documents(path.read_text(), str(path)):
        if not isinstance(document, dict) or document.get("kind") != "TrainJob":
            continue
        job = spec.parse(document, require_images=False)
        assert spec.parse(objects.manifest_of(job), require_images=False) == job


def test_every_field_of_the_model_survives_the_manifest() -> None:
    rich = manifest()
    rich["metadata"]["labels"] = {"team": "a"}
    rich["spec"] |= {
        "image": "img:1",
        "managedBy": "kueue.x-k8s.io/multikueue",
        "runtime": {"entrypoint": "pkg.train:build", "strategy": "ParameterServer",
                    "config": {"epochs": 3}},
        "checkpoint": {"claimName": "ckpt", "path": "/ckpt", "subPath": "a"},
        "runPolicy": {"cleanPodPolicy": "All", "backoffLimit": 1, "activeDeadlineSeconds": 60,
                      "ttlSecondsAfterFinished": 5, "startupDeadlineSeconds": 30, "suspend": True,
                      "schedulingPolicy": {"minAvailable": 2, "queue": "q", "priorityClass": "hi",
                                           "scheduleTimeoutSeconds": 9}},
        "successPolicy": "AllWorkers",
    }  # fmt: skip
    rich["spec"]["replicaSpecs"]["ps"] = {
        "replicas": 1,
        "template": rich["spec"]["replicaSpecs"]["chief"]["template"],
    }
    job = spec.parse(rich)
    assert spec.parse(objects.manifest_of(job)) == job


def test_get_headers_are_the_crds_printer_columns() -> None:
    import yaml

    crd = yaml.safe_load((REPO / "crds" / "trainjobs.trainjob.dev.yaml").read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert list(show.HEADERS) == ["NAME", *(column["name"].upper() for column in columns)]


def test_a_saved_object_is_submitted_without_what_the_server_set() -> None:
    server_set = {"uid": "u", "resourceVersion": "9", "generation": 2, "managedFields": []}
    saved = {**RUNNING, "metadata": {**RUNNING["metadata"], **server_set, "labels": {"a": "b"}}}
    body = objects.submittable(saved)
    assert "status" not in body and body["spec"] == RUNNING["spec"]
    assert body["metadata"] == {"name": "mnist", "namespace": "team-a", "labels": {"a": "b"}}
    assert "status" in saved and saved["metadata"]["uid"] == "u"  # the input is left alone


@pytest.mark.parametrize("verb", ["submit", "get", "describe", "wait", "delete", "attach"])
def test_every_cluster_verb_has_help_with_examples_and_exit_codes(verb: str) -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    assert f"examples:\n  trainjob {verb}" in out.getvalue()
    assert "exit codes:\n  0 " in out.getvalue() and "--namespace" in out.getvalue()
