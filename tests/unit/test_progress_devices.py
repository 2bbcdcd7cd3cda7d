"""The devices each replica trains on, from the runtime's start event to `kubectl get tj`, as
data: the report's `devices` field and its validation, the per-replica fold and the one-line
summary, `status.progress`, the runtime's tracker and the other replicas' one report, the
operator's status writer (a devices-only report never replaces the job's progress; what
status already holds is folded back in), describe, local mode's view, and the CRD."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from tests.support import progress_endpoint
from trainjob.cluster import describe
from trainjob.console import replica_progress, view
from trainjob.core import constants, progress_events, spec, termination, tfjob_status
from trainjob.core import progress as p
from trainjob.core import status as st
from trainjob.runtime import devices as runtime_devices
from trainjob.runtime import progress as events
from trainjob.runtime import reporter
from trainjob_operator import kube, progress_status

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.timezone.utc)
REPO = Path(__file__).resolve().parents[2]
JOB = ("team-a", "mnist")
Obj = dict[str, Any]

TWO_GPUS = p.Devices(2, ("GPU:0", "GPU:1"), True, "12.5")
ONE_GPU = p.Devices(1, ("GPU:0",), True, "12.5")
CPU_CUDA = p.Devices(0, (), True, "12.5")
CPU_ONLY = p.Devices(0, (), False)


# -- the report's field -----------------------------------------------------------------------


def test_devices_round_trip_on_the_wire_and_in_the_termination_message() -> None:
    wire = {
        "replica": "chief-0",
        "state": "Running",
        "step": 3,
        "devices": {
            "gpus": 2,
            "names": ["GPU:0", "GPU:1"],
            "cudaBuild": True,
            "cudaVersion": "12.5",
        },
    }
    report = p.parse_report(wire)
    assert report.devices == TWO_GPUS
    assert p.to_wire(report) == wire
    # Only the count is needed (a script of one's own knows little more).
    assert p.parse_report({"devices": {"gpus": 0}}).devices == p.Devices(0)
    assert p.to_wire(p.Report(devices=p.Devices(0)))["devices"] == {"gpus": 0}
    final = p.Report(state="Succeeded", step=9, devices=TWO_GPUS)
    assert termination.read(termination.with_report(final)).report == final


def test_the_largest_devices_keep_a_report_small() -> None:
    names = tuple(f"GPU:{i}".ljust(p.MAX_NAME, "x") for i in range(p.MAX_DEVICE_NAMES))
    biggest = p.Devices(p.MAX_GPUS, names, True, "v" * p.MAX_VERSION)
    long = p.Report(
        state="Failed",
        last_checkpoint="x" * p.MAX_TEXT,
        metrics={"m" * 60 + str(i): 1.0 for i in range(p.MAX_METRICS)},
        devices=biggest,
    )
    message = termination.with_report(long)
    assert len(message) < 4096
    assert termination.read(message).report == long


@pytest.mark.parametrize(
    ("devices", "field"),
    [
        (1, "devices"),
        ("2 GPU", "devices"),
        ({}, "devices.gpus"),  # the count is required
        ({"gpus": -1}, "devices.gpus"),
        ({"gpus": True}, "devices.gpus"),
        ({"gpus": 1.5}, "devices.gpus"),
        ({"gpus": p.MAX_GPUS + 1}, "devices.gpus"),
        ({"gpus": 1, "names": "GPU:0"}, "devices.names"),
        ({"gpus": 1, "names": ["GPU:0", "GPU:1"]}, "devices.names"),  # more names than GPUs
        ({"gpus": 0, "names": ["GPU:0"]}, "devices.names"),
        ({"gpus": 1, "names": [""]}, "devices.names"),
        ({"gpus": 1, "names": [{"a": 1}]}, "devices.names"),
        ({"gpus": 1, "names": ["x" * (p.MAX_NAME + 1)]}, "devices.names"),
        ({"gpus": 99, "names": [f"GPU:{i}" for i in range(17)]}, "devices.names"),
        ({"gpus": 0, "cudaBuild": "yes"}, "devices.cudaBuild"),
        ({"gpus": 0, "cudaVersion": 12.5}, "devices.cudaVersion"),
        ({"gpus": 0, "cudaVersion": "1" * 33}, "devices.cudaVersion"),
        ({"gpus": 0, "cuda_build": True}, "devices.cuda_build"),  # the event's spelling
    ],
)
def test_bad_devices_are_refused_naming_the_field(devices: object, field: str) -> None:
    with pytest.raises(p.ReportError, match=f"^{field}:"):
        p.parse_report({"devices": devices})
    # Over HTTP too: one error line (the endpoint answers 400 with it), never a traceback.
    with pytest.raises(p.ReportError, match=f"^{field}:"):
        p.decode(json.dumps({"step": 1, "devices": devices}).encode())


def test_a_report_of_only_devices_says_no_progress() -> None:
    assert not p.says_progress(p.Report(replica="worker-1", devices=ONE_GPU, time=5.0))
    assert not p.says_progress(p.Report())
    assert p.says_progress(p.Report(step=0))
    assert p.says_progress(p.Report(total_steps=100))
    assert p.says_progress(p.Report(metrics={"acc": 0.5}))
    assert p.says_progress(p.Report(state="Failed"))


# -- per replica, and the job's line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "text", "detail"),
    [
        (TWO_GPUS, "2 GPU", "2 GPU (GPU:0, GPU:1; CUDA 12.5)"),
        (p.Devices(1, ("GPU:0",)), "1 GPU", "1 GPU (GPU:0)"),
        (p.Devices(1), "1 GPU", "1 GPU"),
        (p.Devices(20, ("GPU:0", "GPU:1")), "20 GPU", "20 GPU (GPU:0, GPU:1, +18 more)"),
        (CPU_CUDA, "CPU", "CPU (CUDA 12.5 build, no GPU visible)"),
        (p.Devices(0, (), True), "CPU", "CPU (CUDA build, no GPU visible)"),
        (CPU_ONLY, "CPU", "CPU (TensorFlow without CUDA)"),
        (p.Devices(0), "CPU", "CPU"),
    ],
)
def test_one_replicas_devices_in_words(devices: p.Devices, text: str, detail: str) -> None:
    assert p.devices_text(devices) == text
    assert p.devices_detail(devices) == detail


@pytest.mark.parametrize(
    ("by_replica", "line"),
    [
        ({}, ""),
        ({"worker-0": ONE_GPU}, "1 GPU"),
        ({"chief-0": TWO_GPUS, "worker-0": TWO_GPUS}, "4 GPU"),
        ({"worker-0": CPU_ONLY, "worker-1": CPU_CUDA}, "CPU"),
        # A CPU fallback (or parameter servers on their CPUs) beside GPUs is said.
        ({"chief-0": TWO_GPUS, "worker-0": ONE_GPU, "ps-0": CPU_ONLY}, "3 GPU + CPU"),
    ],
)
def test_the_jobs_devices_in_one_line(by_replica: dict[str, p.Devices], line: str) -> None:
    assert p.devices_summary(by_replica) == line


def test_fold_devices_replaces_a_replicas_entry_and_is_bounded() -> None:
    known = p.fold_devices({}, p.Report(replica="chief-0", devices=TWO_GPUS))
    known = p.fold_devices(known, p.Report(replica="worker-0", devices=ONE_GPU))
    assert known == {"chief-0": TWO_GPUS, "worker-0": ONE_GPU}
    # A restarted replica that landed on a node without a GPU says so again.
    moved = p.fold_devices(known, p.Report(replica="worker-0", devices=CPU_CUDA))
    assert moved == {"chief-0": TWO_GPUS, "worker-0": CPU_CUDA}
    assert known["worker-0"] == ONE_GPU  # the input is left alone
    assert p.fold_devices(known, p.Report(replica="worker-0", step=4)) == known
    assert p.fold_devices({}, p.Report(devices=CPU_ONLY)) == {p.UNKNOWN_REPLICA: CPU_ONLY}
    full = {f"worker-{i}": ONE_GPU for i in range(p.MAX_DEVICE_REPLICAS)}
    assert p.fold_devices(full, p.Report(replica="ps-0", devices=CPU_ONLY)) == full
    replaced = p.fold_devices(full, p.Report(replica="worker-3", devices=CPU_ONLY))
    assert replaced["worker-3"] == CPU_ONLY and len(replaced) == p.MAX_DEVICE_REPLICAS


def test_status_progress_has_the_line_and_every_replicas_devices() -> None:
    report = p.Report(replica="chief-0", step=5, devices=TWO_GPUS)
    own = p.status_progress(report, NOW)
    assert own[p.DEVICE_SUMMARY] == "2 GPU"
    assert own[p.REPLICA_DEVICES] == {
        "chief-0": {
            "gpus": 2,
            "names": ["GPU:0", "GPU:1"],
            "cudaBuild": True,
            "cudaVersion": "12.5",
        }
    }
    folded = p.status_progress(report, NOW, {"chief-0": TWO_GPUS, "ps-0": CPU_ONLY})
    assert folded[p.DEVICE_SUMMARY] == "2 GPU + CPU"
    assert folded[p.REPLICA_DEVICES]["ps-0"] == {"gpus": 0, "cudaBuild": False}
    # No replica said (a script of one's own): no such keys at all.
    bare = p.status_progress(p.Report(step=5), NOW)
    assert p.DEVICE_SUMMARY not in bare and p.REPLICA_DEVICES not in bare
    # What status holds reads back; entries that are not valid are left out.
    stored = {**folded[p.REPLICA_DEVICES], "worker-9": {"gpus": "many"}, "worker-8": 3}
    assert p.devices_of_status({p.REPLICA_DEVICES: stored}) == {
        "chief-0": TWO_GPUS,
        "ps-0": CPU_ONLY,
    }
    assert p.devices_of_status(None) == {} and p.devices_of_status({p.REPLICA_DEVICES: []}) == {}


# -- the runtime side -------------------------------------------------------------------------


def test_the_start_events_devices_become_the_reports() -> None:
    seen = runtime_devices.Devices(
        ("/physical_device:GPU:0", "/physical_device:GPU:1"), cuda_build=True, cuda_version="12.5"
    )
    start = {"event": "start", "devices": seen.event_fields()}
    assert progress_events.devices_of(start) == TWO_GPUS
    cpu = runtime_devices.Devices((), cuda_build=False)
    assert progress_events.devices_of({"devices": cpu.event_fields()}) == CPU_ONLY
    # Damaged or foreign: none, or what is usable, cut to the report's bounds.
    assert progress_events.devices_of({}) is None
    assert progress_events.devices_of({"devices": {"gpus": "2"}}) is None
    assert progress_events.devices_of({"devices": {"gpus": -1}}) is None
    many = {"gpus": 40, "names": [f"/physical_device:GPU:{i}" for i in range(40)] + [3]}
    cut = progress_events.devices_of({"devices": {**many, "cuda_version": "x" * 99}})
    assert cut is not None and len(cut.names) == p.MAX_DEVICE_NAMES and cut.gpus == 40
    assert cut.cuda_version == "x" * p.MAX_VERSION and cut.cuda_build is None
    # Whatever it cut is a valid report field.
    assert p.parse_report(p.to_wire(p.Report(devices=cut))).devices == cut


def test_the_chiefs_reports_carry_its_devices_from_the_start_event() -> None:
    tracker = reporter.Tracker("chief-0", total_steps=10)
    out = io.StringIO()
    emitter = events.Emitter(
        "chief-0", True, stream=out, reporter=reporter.ProgressReporter(tracker, {})
    )
    emitter.start_fields["devices"] = runtime_devices.Devices(
        ("/physical_device:GPU:0",), cuda_build=True, cuda_version="12.5"
    ).event_fields()
    assert tracker.report().devices is None
    emitter.emit("start", step=0, initial_step=0)
    emitter.emit("step", step=5)
    line = progress_events.parse_line(out.getvalue().splitlines()[-1])
    assert line is not None
    assert line["progress"]["devices"] == {
        "gpus": 1,
        "names": ["GPU:0"],
        "cudaBuild": True,
        "cudaVersion": "12.5",
    }
    assert tracker.report().devices == ONE_GPU


def test_another_replica_announces_its_devices_once_and_reports_nothing_else() -> None:
    sent: list[p.Report] = []
    out = io.StringIO()
    emitter = events.Emitter("worker-1", False, stream=out, announce=sent.append)
    emitter.start_fields["devices"] = runtime_devices.Devices((), cuda_build=True).event_fields()
    emitter.emit("start", step=0, initial_step=0)
    emitter.emit("epoch", epoch=0, step=10, logs={"loss": 0.5})
    emitter.emit("end", status="succeeded", exit_code=0)
    assert len(sent) == 1
    assert sent[0].replica == "worker-1" and sent[0].devices == p.Devices(0, (), True)
    assert not p.says_progress(sent[0]) and sent[0].time is not None
    # Its lines carry no report: local mode reads the job's progress from the chief only.
    lines = [progress_events.parse_line(text) for text in out.getvalue().splitlines()]
    assert all(line is not None and "progress" not in line for line in lines)
    # A start event that says no devices announces nothing.
    quiet: list[p.Report] = []
    events.Emitter("worker-2", False, stream=io.StringIO(), announce=quiet.append).emit("start")
    assert quiet == []


@pytest.fixture
def server() -> Iterator[progress_endpoint.Endpoint]:
    with progress_endpoint.serving() as endpoint:
        yield endpoint


def test_announce_sends_one_report_in_the_background_retrying_a_busy_operator(
    server: progress_endpoint.Endpoint, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    env = {constants.ENV_PROGRESS_URL: server.url, constants.ENV_PROGRESS_TOKEN_FILE: str(token)}
    server.answers = [503]  # a standby replica of the operator, or one still starting
    report = p.Report(replica="worker-1", devices=CPU_CUDA, time=3.0)
    thread = reporter.announce(env, report)
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    assert [r["devices"] for r in server.received] == [
        {"gpus": 0, "cudaBuild": True, "cudaVersion": "12.5"}
    ] * 2
    assert server.received[-1]["auth"] == "Bearer abc"
    assert server.received[-1]["replica"] == "worker-1"
    assert reporter.announce({}, report) is None  # outside a TrainJob Pod: nothing to send


# -- the operator -----------------------------------------------------------------------------


def test_another_replicas_devices_never_replace_the_jobs_progress() -> None:
    chief = p.Report(replica="chief-0", step=50, time=10.0, devices=TWO_GPUS)
    worker = p.Report(replica="worker-0", time=11.0, devices=CPU_CUDA)
    assert not progress_status.supersedes(chief, worker)
    assert progress_status.supersedes(chief, p.Report(replica="chief-0", step=51, time=12.0))
    # A replica of its own that does report numbers is a report like any other.
    assert progress_status.supersedes(chief, p.Report(replica="worker-0", step=60, time=12.0))

    status = progress_status.ProgressStatus(cast(kube.Kube, None), 20.0)
    assert status.offer(JOB, chief)
    assert status.offer(JOB, worker)  # its devices are taken
    latest = status.latest(JOB)
    assert latest is not None and latest.report is chief
    assert dict(latest.devices) == {"chief-0": TWO_GPUS, "worker-0": CPU_CUDA}
    assert not status.offer(JOB, worker)  # the same again changes nothing
    # The chief's next report keeps what the others said.
    assert status.offer(JOB, p.Report(replica="chief-0", step=60, time=13.0, devices=TWO_GPUS))
    latest = status.latest(JOB)
    assert latest is not None and set(latest.devices) == {"chief-0", "worker-0"}


def test_a_deleted_jobs_devices_do_not_greet_a_new_job_of_its_name() -> None:
    status = progress_status.ProgressStatus(cast(kube.Kube, None), 20.0)
    status.offer(JOB, p.Report(replica="chief-0", step=50, time=10.0, devices=TWO_GPUS))
    status.offer(JOB, p.Report(replica="worker-3", time=11.0, devices=CPU_CUDA))
    status.forget(JOB)  # the job was deleted
    assert status.latest(JOB) is None and status.pending() == 0
    status.offer(JOB, p.Report(replica="chief-0", step=1, time=20.0, devices=CPU_CUDA))
    latest = status.latest(JOB)
    assert latest is not None and dict(latest.devices) == {"chief-0": CPU_CUDA}


def test_the_status_patch_sets_devices_and_never_removes_them() -> None:
    report = p.Report(replica="chief-0", step=1)
    patch = progress_status.status_patch(report, NOW, frozenset(), {"chief-0": ONE_GPU})
    assert patch["progress"][p.DEVICE_SUMMARY] == "1 GPU"
    assert patch["progress"][p.REPLICA_DEVICES] == {
        "chief-0": {"gpus": 1, "names": ["GPU:0"], "cudaBuild": True, "cudaVersion": "12.5"}
    }
    # None known (a script that never says, or an operator that just restarted): the keys
    # are left out, so what status holds stays.
    unknown = progress_status.status_patch(report, NOW, frozenset(), {})["progress"]
    assert p.DEVICE_SUMMARY not in unknown and p.REPLICA_DEVICES not in unknown
    assert set(unknown) == {*p.STATUS_FIELDS, "metrics"}


def test_devices_status_already_holds_are_folded_back_in() -> None:
    known = {"chief-0": TWO_GPUS}
    written = {
        "status": {
            "progress": {
                p.DEVICE_SUMMARY: "2 GPU",
                p.REPLICA_DEVICES: {
                    "chief-0": {"gpus": 2},  # this operator knows newer
                    "worker-0": {
                        "gpus": 1,
                        "names": ["GPU:0"],
                        "cudaBuild": True,
                        "cudaVersion": "12.5",
                    },
                },
            }
        }
    }
    assert progress_status.resync_devices(known, written) == {
        "chief-0": TWO_GPUS,
        "worker-0": ONE_GPU,
    }
    assert progress_status.resync_devices({**known, "worker-0": ONE_GPU}, written) is None
    assert progress_status.resync_devices(known, None) is None
    assert progress_status.resync_devices(known, {"status": {}}) is None


class _FakeKube:
    """patch_status as the API server applies a merge patch to status.progress."""

    def __init__(self, progress: dict[str, Any]) -> None:
        self.progress = progress
        self.patches: list[dict[str, Any]] = []

    async def patch_status(self, namespace: str, name: str, status: Obj) -> Obj:
        self.patches.append(status)
        merged = dict(self.progress)
        for key, value in status["progress"].items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            elif value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        self.progress = merged
        return {"status": {"progress": merged}}


def test_after_an_operator_restart_the_line_counts_what_status_held() -> None:
    """Worker 0 said its devices to the operator before this one; the chief's next report
    is written, and the line is written again with worker 0 counted."""
    held = {
        p.DEVICE_SUMMARY: "3 GPU",
        p.REPLICA_DEVICES: {"chief-0": {"gpus": 2}, "worker-0": {"gpus": 1}},
    }
    api = _FakeKube(held)

    async def scenario() -> None:
        status = progress_status.ProgressStatus(cast(kube.Kube, api), 1000.0)
        status.start()
        try:
            status.offer(JOB, p.Report(replica="chief-0", step=7, time=1.0, devices=TWO_GPUS))
            for _ in range(200):
                if len(api.patches) >= 2 and not status.pending():
                    break
                await asyncio.sleep(0.01)
        finally:
            await status.close()

    asyncio.run(scenario())
    first, second = (patch["progress"] for patch in api.patches[:2])
    assert first[p.DEVICE_SUMMARY] == "2 GPU"  # only what this operator knew
    assert second[p.DEVICE_SUMMARY] == "3 GPU"
    assert api.progress[p.DEVICE_SUMMARY] == "3 GPU" and api.progress["step"] == 7
    assert len(api.patches) == 2  # and then it rests


# -- what people read -------------------------------------------------------------------------


def _job(replicas: dict[str, int]) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "tensorflow", "image": "img"}]}}
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "mnist", "namespace": "team-a"},
        "spec": {
            "replicaSpecs": {
                rtype: {"replicas": n, "template": template} for rtype, n in replicas.items()
            }
        },
    }


def test_describe_shows_the_line_and_each_replicas_devices() -> None:
    obj = _job({"chief": 1, "worker": 2})
    job = spec.parse(obj, require_images=False)
    records = {key: st.ReplicaRecord(0, "Running") for key in job.replica_keys()}
    obj["status"] = st.to_dict(job, st.JobStatus(replicas=records))
    devices = {"chief-0": TWO_GPUS, "worker-0": CPU_ONLY}  # worker 1 has not said yet
    obj["status"]["progress"] = p.status_progress(p.Report(replica="chief-0", step=5), NOW, devices)
    text = describe.describe_text(obj, [], [], NOW)
    assert "Devices:      2 GPU + CPU\n" in text
    replicas = text.split("Replicas:\n")[1].split("Events:")[0].splitlines()
    assert replicas[0].split()[-1] == "Devices"
    assert replicas[1].endswith("2 GPU (GPU:0, GPU:1; CUDA 12.5)")
    assert replicas[2].endswith("CPU (TensorFlow without CUDA)")
    assert replicas[3].endswith("<none>")
    # No replica said (a script of one's own, a TFJob): no Devices line, no column.
    del obj["status"]["progress"]
    bare = describe.describe_text(obj, [], [], NOW)
    assert "Devices" not in bare


def test_local_mode_shows_each_replicas_devices() -> None:
    job = spec.parse(_job({"worker": 2}), require_images=False)
    seen = runtime_devices.Devices(("/physical_device:GPU:0",), cuda_build=True).event_fields()
    start = {"event": "start", "initial_step": 0, "devices": seen}
    assert view.event_line(("worker", 0), start, job) == (
        "[worker-0] progress: started training on 1 GPU (GPU:0)"
    )
    cpu = {**start, "devices": runtime_devices.Devices((), cuda_build=False).event_fields()}
    assert view.event_line(("worker", 1), cpu, job) == (
        "[worker-1] progress: started training on CPU (TensorFlow without CUDA)"
    )
    assert view.event_line(("worker", 1), {"event": "start"}, job) == (
        "[worker-1] progress: started training"
    )
    progress = {
        ("worker", 0): replica_progress.fold(None, {**start, "step": 0}),
        ("worker", 1): replica_progress.fold(None, cpu),
    }
    rows = [view.ReplicaRow(key, "Running", 0, None, None) for key in progress]
    snapshot = view.Snapshot(job, st.JobStatus(), rows, progress, 5.0)
    lines = [view.plain(line) for line in view.table_segments(snapshot, width=100)]
    assert lines[1].split() == ["worker-0", "Running", "step", "0", "1", "GPU", "attempt", "0"]
    assert lines[2].split() == ["worker-1", "Running", "CPU", "attempt", "0"]
    # A later event keeps what the replica said at its start.
    later = replica_progress.fold(progress[("worker", 0)], {"event": "step", "step": 9})
    assert later.devices == p.Devices(1, ("GPU:0",), True)


def test_a_tfjobs_status_never_gets_devices() -> None:
    """TFJob status is training-operator's (no progress field): a status the operator made
    before holds none, and whatever it held is not carried over."""
    previous = {"progress": {p.DEVICE_SUMMARY: "2 GPU"}, "conditions": []}
    shown = tfjob_status.view(previous, st.JobStatus(), {"worker": "Worker"}, [], "ns", "n", NOW)
    assert "progress" not in shown
    assert p.DEVICE_SUMMARY not in json.dumps(shown)


# -- the CRD ----------------------------------------------------------------------------------


def test_the_crd_has_the_devices_column_and_schema() -> None:
    crd = yaml.safe_load((REPO / "crds" / "trainjobs.trainjob.dev.yaml").read_text())
    version = crd["spec"]["versions"][0]
    column = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Devices")
    assert column == {
        **column,
        "type": "string",
        "jsonPath": f".status.progress.{p.DEVICE_SUMMARY}",
    }
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    properties = schema["progress"]["properties"]
    written = p.status_progress(
        p.Report(replica="chief-0", step=1, devices=TWO_GPUS), NOW, {"chief-0": TWO_GPUS}
    )
    assert set(written) <= set(properties)
    entry = properties[p.REPLICA_DEVICES]["additionalProperties"]["properties"]
    assert set(entry) == set(p.DEVICE_FIELDS)
