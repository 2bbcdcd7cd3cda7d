"""The cluster commands for Kubeflow TFJobs the TrainJob operator serves (`--tfjob`): a job
named `tfjob/NAME` is read as its view (the TrainJob it means, with the engine's status from
the TFJob's `trainjob.dev/status` annotation), so get, describe, logs, wait, attach, delete and
tensorboard work as for a TrainJob and name it as a TFJob; a TFJob another controller runs is
refused in words. The API objects are faked here (tests/integration/test_tfjob_cli.py has the
real API server and operator)."""

from __future__ import annotations

import copy
import datetime
import io
import json
import types
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from trainjob import cli
from trainjob.cluster import api, board, describe, objects, show
from trainjob.console import view
from trainjob.core import spec, tfjob
from trainjob.core import status as st

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 24, 12, 0, 0, tzinfo=datetime.timezone.utc)
START = NOW - datetime.timedelta(seconds=95)
REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def raw_tfjob(
    name: str = "mnist", *, run_policy: Obj | None = None, namespace: str = "team-a"
) -> Obj:
    """Kubeflow's mnist_with_summaries (tests/corpus/tfjob), as the API server returns it."""
    body: Obj = yaml.safe_load(
        (REPO / "tests/corpus/tfjob/kubeflow-mnist-with-summaries.yaml").read_text()
    )
    body["metadata"] = {
        "name": name,
        "namespace": namespace,
        "uid": "7f1e-uid",
        "creationTimestamp": "2026-11-24T11:58:00Z",
    }
    body["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 2
    body["spec"]["tfReplicaSpecs"]["PS"] = copy.deepcopy(body["spec"]["tfReplicaSpecs"]["Worker"])
    body["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = 1
    if run_policy is not None:
        body["spec"]["runPolicy"] = run_policy
    return body


def served(
    raw: Obj,
    records: dict[tuple[str, int], st.ReplicaRecord],
    conditions: list[tuple[str, bool, str, str]],
    tfjob_conditions: list[tuple[str, str, str, str]],
    *,
    done: bool = False,
) -> Obj:
    """The TFJob after the operator served it: the engine's status in its annotation (as the
    core writes a TrainJob's status), the TFJob's own status in TFJob's words."""
    job = spec.parse(tfjob.as_trainjob(raw), require_images=False)
    status = st.JobStatus(
        conditions=tuple(st.Condition(t, s, r, m, START) for t, s, r, m in conditions),
        replicas=records,
        start_time=START,
        completion_time=NOW - datetime.timedelta(seconds=5) if done else None,
    )
    result = copy.deepcopy(raw)
    result["metadata"]["annotations"] = {
        tfjob.ANNOTATION_ENGINE_STATUS: tfjob.encode_status(st.to_dict(job, status))
    }
    result["status"] = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "message": m,
             "lastTransitionTime": "2026-11-24T11:58:30Z", "lastUpdateTime": "2026-11-24T11:58:30Z"}
            for t, s, r, m in tfjob_conditions
        ],
        "replicaStatuses": {"Worker": {"failed": 1}, "PS": {}},
    }  # fmt: skip
    return result


FAILED_MESSAGE = "worker 1 exited with code 1: ValueError: bad shape (permanent)"
FAILED = served(
    raw_tfjob(),
    {
        ("worker", 0): st.ReplicaRecord(0, "Stopped", exit_code=143),
        ("worker", 1): st.ReplicaRecord(0, "Failed", exit_code=1, reason="Error"),
        ("ps", 0): st.ReplicaRecord(0, "Stopped", exit_code=143),
    },
    [("Failed", True, "ReplicaFailed", FAILED_MESSAGE)],
    [
        ("Created", "True", "TFJobCreated", "TFJob team-a/mnist is created."),
        ("Running", "False", "TFJobRunning", "TFJob team-a/mnist is running."),
        ("Failed", "True", "TFJobFailed", f"TFJob team-a/mnist has failed: {FAILED_MESSAGE}"),
    ],
    done=True,
)
RUNNING = served(
    raw_tfjob("live"),
    {k: st.ReplicaRecord(0, "Running") for k in (("worker", 0), ("worker", 1), ("ps", 0))},
    [("Created", True, "Created", "pods created"), ("Running", True, "Running", "all running")],
    [("Created", "True", "TFJobCreated", "created"), ("Running", "True", "TFJobRunning", "run")],
)


def pod(name: str, rtype: str, index: int) -> Obj:
    """A TFJob's Pod: Kubeflow's labels beside ours."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                "trainjob.dev/job-name": "mnist",
                "trainjob.dev/replica-type": rtype,
                "trainjob.dev/replica-index": str(index),
                tfjob.LABEL_JOB_NAME: "mnist",
                tfjob.LABEL_REPLICA_TYPE: rtype,
                tfjob.LABEL_REPLICA_INDEX: str(index),
            },
        },
        "spec": {"nodeName": "node-1"},
        "status": {"phase": "Running"},
    }


# ----- naming a job -----
@pytest.mark.parametrize(
    ("text", "kind", "name"),
    [
        ("mnist", "TrainJob", "mnist"),
        ("trainjob/mnist", "TrainJob", "mnist"),
        ("tj/mnist", "TrainJob", "mnist"),
        ("trainjob.trainjob.dev/mnist", "TrainJob", "mnist"),
        ("tfjob/mnist", "TFJob", "mnist"),
        ("tfjobs/mnist", "TFJob", "mnist"),
        ("TFJob/mnist", "TFJob", "mnist"),
        ("tfjob.kubeflow.org/mnist", "TFJob", "mnist"),
        ("tfjobs.v1.kubeflow.org/mnist", "TFJob", "mnist"),
    ],
)
def test_a_job_is_named_as_kubectl_names_it(text: str, kind: str, name: str) -> None:
    ref = objects.job_ref(text)
    assert (ref.kind, ref.name) == (kind, name)
    # What `get -o name` prints names the same job again (completion, scripts).
    assert objects.job_ref(f"{ref.resource}/{ref.name}") == ref


@pytest.mark.parametrize("text", ["pod/mnist", "tfjob/", "tfjob.example.com/x", "tfjob/a/b"])
def test_a_reference_to_no_kind_of_job_is_refused_in_words(text: str) -> None:
    with pytest.raises(objects.ShowError, match="or tfjob/NAME \\(a TFJob\\)"):
        objects.job_ref(text)


# ----- the view -----
def test_a_served_tfjob_reads_as_the_trainjob_it_means_and_keeps_the_tfjob() -> None:
    view_ = objects.tfjob_view(FAILED)
    assert str(objects.ref_of(view_)) == "tfjob/mnist"
    assert objects.source_of(view_) == FAILED  # `get -o yaml` prints the TFJob as it is
    assert objects.status_of(view_).is_true(st.FAILED)
    assert objects.parse_job(view_).replica_keys() == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert view_["metadata"]["creationTimestamp"] == "2026-11-24T11:58:00Z"  # AGE
    assert show.wait_outcome(view_, "succeeded") == 1


def test_wait_returns_for_a_tfjob_only_once_its_own_conditions_say_so_too() -> None:
    """The operator writes the engine's status (the annotation) before the TFJob's own: in
    between, `wait` keeps waiting, so that `kubectl describe tfjob` right after it shows
    what it reported (seen: Running in the annotation, only Created in the TFJob)."""
    records = {k: st.ReplicaRecord(0, "Running") for k in (("worker", 0), ("worker", 1), ("ps", 0))}
    engine = [("Created", True, "Created", "pods created"), ("Running", True, "Running", "run")]
    between = objects.tfjob_view(
        served(raw_tfjob("live"), records, engine, [("Created", "True", "TFJobCreated", "c")])
    )
    assert objects.status_of(between).is_true(st.RUNNING)
    assert show.wait_outcome(between, "running") is None
    assert show.wait_outcome(objects.tfjob_view(RUNNING), "running") == 0
    failed_between = objects.tfjob_view(
        served(
            raw_tfjob(),
            {},
            [("Failed", True, "ReplicaFailed", FAILED_MESSAGE)],
            [("Created", "True", "TFJobCreated", "c"), ("Running", "True", "TFJobRunning", "r")],
            done=True,
        )
    )
    assert show.wait_outcome(failed_between, "finished") is None
    assert show.wait_outcome(objects.tfjob_view(FAILED), "finished") == 0


def test_a_tfjob_another_controller_runs_is_refused_saying_who() -> None:
    multikueue = raw_tfjob(run_policy={"managedBy": tfjob.MULTIKUEUE})
    with pytest.raises(objects.ShowError) as raised:
        objects.tfjob_view(multikueue)
    assert str(raised.value) == (
        "tfjob/mnist is run by kueue.x-k8s.io/multikueue (spec.runPolicy.managedBy), not by the "
        "TrainJob operator: kubectl describe tfjob mnist -n team-a shows it"
    )
    # training-operator wrote its status (coexist mode leaves it those without our managedBy).
    theirs = {**raw_tfjob(), "status": {"conditions": [{"type": "Created", "status": "True"}]}}
    with pytest.raises(objects.ShowError) as raised:
        objects.tfjob_view(theirs)
    words = str(raised.value)
    assert words.startswith(
        "tfjob/mnist has no status from the TrainJob operator (no trainjob.dev/status "
        "annotation) but has one from another controller: is the operator running with --tfjob "
        "(chart tfjob.enabled)? Beside training-operator (--tfjob-mode coexist) it serves only "
        "the TFJobs with spec.runPolicy.managedBy: trainjob.dev/trainjob-operator."
    ), words
    assert objects.tfjob_views([FAILED, multikueue, theirs, raw_tfjob("new")]) == (
        [objects.tfjob_view(FAILED), objects.tfjob_view(raw_tfjob("new"))],
        ["team-a/mnist", "team-a/mnist"],
    )


def test_a_tfjob_nobody_has_served_yet_is_pending_and_says_what_serves_it() -> None:
    fresh = objects.tfjob_view(raw_tfjob())
    assert objects.no_status_yet(fresh) == (
        "no status from the TrainJob operator yet (it serves TFJobs when run with --tfjob, "
        "chart tfjob.enabled)"
    )
    assert objects.no_status_yet(objects.tfjob_view(FAILED)) is None
    text = describe.describe_text(fresh, [], [], NOW)
    assert "State:        Pending\nNote:         no status from the TrainJob operator yet" in text
    assert show.wait_outcome(fresh, "finished") is None


# ----- what the commands show -----
def test_get_names_a_tfjob_as_the_commands_take_it() -> None:
    lines = show.jobs_table([objects.tfjob_view(FAILED)], NOW, all_namespaces=False, wide=True)
    row = lines[1].split()
    assert row[:5] == ["tfjob/mnist", "Failed", "0/3", "0", "<none>"]
    assert lines[1].endswith(f"ReplicaFailed: {FAILED_MESSAGE}")


def test_describe_shows_the_tfjobs_own_conditions_and_the_engines_replicas() -> None:
    events = [
        {"type": "Warning", "reason": "TFJobFailed", "message": FAILED_MESSAGE,
         "lastTimestamp": "2026-11-24T11:59:50Z", "source": {"component": "trainjob-operator"},
         "involvedObject": {"kind": "TFJob", "name": "mnist"}},
    ]  # fmt: skip
    pods = describe.order_pods([pod("mnist-ps-0", "ps", 0), pod("mnist-worker-1", "worker", 1)])
    text = describe.describe_text(objects.tfjob_view(FAILED), pods, events, NOW)
    assert text.startswith(
        "Name:         mnist\nNamespace:    team-a\n"
        "Kind:         TFJob (kubeflow.org/v1), run by the TrainJob operator\n"
    )
    assert "State:        Failed\n" in text
    assert f"Cause:        ReplicaFailed: {FAILED_MESSAGE}\n" in text
    conditions = text.split("Conditions:\n")[1].split("Replicas:")[0].splitlines()
    assert [line.split()[:3] for line in conditions] == [
        ["Type", "Status", "Reason"],
        ["Created", "True", "TFJobCreated"],
        ["Running", "False", "TFJobRunning"],
        ["Failed", "True", "TFJobFailed"],
    ]
    replicas = text.split("Replicas:\n")[1].split("Events:")[0].splitlines()
    assert [line.split() for line in replicas[1:]] == [
        ["ps-0", "Stopped", "0", "143", "mnist-ps-0"],
        ["worker-0", "Stopped", "0", "143", "<none>"],
        ["worker-1", "Failed", "0", "1", "Error", "mnist-worker-1"],
    ]
    assert "TFJob/mnist" in text.split("Events:\n")[1]


def test_the_summary_and_hints_name_the_tfjob() -> None:
    failed = objects.tfjob_view(FAILED)
    text = view.summary_text(show.summary(failed, [], NOW))
    assert text.startswith("TFJob mnist Failed after 1m30s\n"), text
    assert "full log: trainjob logs tfjob/mnist worker-1 -n team-a --cluster" in text
    assert "  checkpoint: none named (a TFJob has no spec.checkpoint" in text
    assert "  logs:       trainjob logs tfjob/mnist -n team-a --cluster\n" in text
    live = objects.tfjob_view(RUNNING)
    table = [view.plain(line) for line in view.table_segments(show.snapshot(live, NOW), width=120)]
    assert table[0].startswith("TFJob live  Running  1m35s"), table
    assert show.attach_hint(live) == (
        "Detached: TFJob live keeps running on the cluster. Attach again with:\n"
        "  trainjob attach tfjob/live -n team-a\n"
    )


def test_a_suspended_tfjob_says_how_to_resume_it_as_a_tfjob() -> None:
    raw = raw_tfjob(run_policy={"suspend": True})
    held = served(raw, {}, [("Suspended", True, "Suspended", "suspended")], [])
    hold = objects.hold_of(objects.tfjob_view(held))
    assert hold is not None and hold.resume == (
        "It waits for spec.runPolicy.suspend to be false: kubectl patch tfjob mnist -n team-a "
        '--type merge -p \'{"spec":{"runPolicy":{"suspend":false}}}\''
    )


# ----- TensorBoard -----
def test_tensorboard_mounts_the_claims_the_tfjob_writes_to_and_goes_with_the_tfjob() -> None:
    pod_ = board.tensorboard_pod(objects.tfjob_view(FAILED), "a1b2c3")
    (container,) = pod_["spec"]["containers"]
    # Kubeflow's example mounts tfevent-volume at /train and logs to /train/logs.
    assert container["volumeMounts"] == [
        {"name": "logs-0", "mountPath": "/logs/train", "readOnly": True}
    ]
    assert pod_["spec"]["volumes"] == [
        {"name": "logs-0", "persistentVolumeClaim": {"claimName": "tfevent-volume"}}
    ]
    assert container["image"] == "ghcr.io/kubeflow/training-v1/tf-mnist-with-summaries:latest"
    # The garbage collector finds the owner by its kind: the TFJob's.
    assert pod_["metadata"]["ownerReferences"] == [
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "mnist", "uid": "7f1e-uid"}
    ]
    kubernetes_validate.validate(pod_, "1.34", strict=True)


def test_tensorboard_for_a_tfjob_without_a_volume_says_so() -> None:
    raw = raw_tfjob()
    for replica in raw["spec"]["tfReplicaSpecs"].values():
        replica["template"]["spec"].pop("volumes")
    with pytest.raises(board.BoardError) as raised:
        board.tensorboard_pod(objects.tfjob_view(raw), "x")
    assert str(raised.value).startswith(
        "TFJob mnist mounts no PersistentVolumeClaim in its tensorflow containers, so its "
        "TensorBoard logs were written inside its Pods and are not kept"
    )


# ----- the commands, against a faked API server -----
def not_found(message: str, name: str) -> ApiException:
    """The API server's 404 for a missing object: a Status naming it."""
    error = ApiException(status=404, reason="Not Found")
    error.body = json.dumps({"kind": "Status", "message": message, "details": {"name": name}})
    return error


class FakeCustom:
    """TrainJobs and TFJobs by plural; `crds` lists the kinds the cluster has."""

    def __init__(self, objects_: dict[str, list[Obj]], crds: tuple[str, ...]) -> None:
        self.objects = objects_
        self.crds = crds
        self.deleted: list[tuple[str, str]] = []

    def _items(self, plural: str) -> list[Obj]:
        if plural not in self.crds:  # a group the API server does not serve: no Status
            error = ApiException(status=404, reason="Not Found")
            error.body = "404 page not found\n"
            raise error
        return self.objects.get(plural, [])

    def get_namespaced_custom_object(self, *args: Any, **_kwargs: Any) -> Obj:
        _group, _version, _namespace, plural, name = args
        for item in self._items(plural):
            if item["metadata"]["name"] == name:
                return item
        raise not_found(f'{plural} "{name}" not found', name)

    def list_namespaced_custom_object(self, *args: Any, **_kwargs: Any) -> Obj:
        return {"items": self._items(args[3])}

    def list_cluster_custom_object(self, *args: Any, **_kwargs: Any) -> Obj:
        return {"items": self._items(args[2])}

    def delete_namespaced_custom_object(self, *args: Any, **_kwargs: Any) -> None:
        self.get_namespaced_custom_object(*args)
        self.deleted.append((args[3], args[4]))


class Event(dict[str, Any]):
    @property
    def involved_object(self) -> Any:
        return types.SimpleNamespace(name=self["involvedObject"]["name"])


class FakeCore:
    def __init__(self, pods: list[Obj], events: list[Obj]) -> None:
        self.pods = pods
        self.events = [Event(e) for e in events]
        self.selectors: list[str] = []

    def list_namespaced_pod(self, _namespace: str, **kwargs: Any) -> Any:
        self.selectors.append(kwargs["label_selector"])
        key, _, value = kwargs["label_selector"].partition("=")
        return types.SimpleNamespace(
            items=[p for p in self.pods if p["metadata"]["labels"].get(key) == value]
        )

    def list_namespaced_event(self, _namespace: str, **_kwargs: Any) -> Any:
        return types.SimpleNamespace(items=self.events)


TRAINJOB: Obj = {
    "apiVersion": "trainjob.dev/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "plain", "namespace": "team-a"},
    "spec": {"replicaSpecs": {"chief": {"replicas": 1}}},
    "status": {"state": "Running"},
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """The cluster the commands talk to: TrainJob `plain`, TFJob `mnist` (failed, ours) and
    `theirs` (MultiKueue's), the Pods of mnist, an Event of mnist."""
    theirs = raw_tfjob("theirs", run_policy={"managedBy": tfjob.MULTIKUEUE})
    custom = FakeCustom(
        {"trainjobs": [TRAINJOB], "tfjobs": [FAILED, theirs]}, ("trainjobs", "tfjobs")
    )
    event = {
        "type": "Warning", "reason": "TFJobFailed", "message": FAILED_MESSAGE,
        "involvedObject": {"kind": "TFJob", "name": "mnist"},
        "lastTimestamp": "2026-11-24T11:59:50Z", "metadata": {"uid": "e1"},
    }  # fmt: skip
    core = FakeCore([pod("mnist-worker-1", "worker", 1)], [event])
    client = types.SimpleNamespace(
        sanitize_for_serialization=lambda x: x,
        close=lambda: None,
        configuration=types.SimpleNamespace(host="https://fake"),
    )
    monkeypatch.setattr(
        api, "connect", lambda *_a, **_k: api.Connection(client, "team-a", None, 1.0)
    )
    monkeypatch.setattr(
        api,
        "k8s",
        types.SimpleNamespace(CustomObjectsApi=lambda _: custom, CoreV1Api=lambda _: core),
    )
    return types.SimpleNamespace(custom=custom, core=core)


def trainjob(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_get_lists_tfjobs_beside_trainjobs_and_by_kind(fake: types.SimpleNamespace) -> None:
    code, out, err = trainjob("get")
    assert (code, err) == (0, "")
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["NAME", "STATE"],
        ["plain", "Running"],
        ["tfjob/mnist", "Failed"],
    ]
    code, out, err = trainjob("get", "tfjobs")
    assert [line.split()[0] for line in out.splitlines()] == ["NAME", "tfjob/mnist"]
    assert err == (
        "Not shown: 1 TFJob another controller runs (team-a/theirs); "
        "kubectl get tfjobs shows them\n"
    )
    code, out, _ = trainjob("get", "trainjobs", "-o", "name")
    assert out == "trainjob.trainjob.dev/plain\n"
    code, out, _ = trainjob("get", "-o", "name")
    assert out == "trainjob.trainjob.dev/plain\ntfjob.kubeflow.org/mnist\n"
    code, out, _ = trainjob("get", "tfjob", "mnist", "-o", "yaml")  # kubectl's `get KIND NAME`
    assert yaml.safe_load(out) == FAILED  # the TFJob as stored, not its view
    code, out, _ = trainjob("get", "tfjob/mnist", "plain", "-o", "json")
    assert [i["kind"] for i in json.loads(out)["items"]] == ["TFJob", "TrainJob"]


def test_cli_get_without_the_tfjob_crd_lists_trainjobs(fake: types.SimpleNamespace) -> None:
    fake.custom.crds = ("trainjobs",)
    assert trainjob("get", "-o", "name")[1] == "trainjob.trainjob.dev/plain\n"
    fake.custom.objects["trainjobs"] = []
    assert trainjob("get")[2] == "No TrainJobs found in team-a namespace.\n"
    code, _, err = trainjob("get", "tfjobs")
    assert (code, err) == (
        1,
        "trainjob get: list TFJobs in namespace team-a: 404 Not Found (is the TFJob CRD "
        "installed? kubectl get crd tfjobs.kubeflow.org)\n",
    )
    fake.custom.crds = ("trainjobs", "tfjobs")
    fake.custom.objects["tfjobs"] = []
    assert trainjob("get")[2] == "No TrainJobs or TFJobs found in team-a namespace.\n"


def test_cli_describe_wait_logs_delete_take_a_tfjob(fake: types.SimpleNamespace) -> None:
    code, out, _ = trainjob("describe", "tfjob/mnist")
    assert code == 0 and "Kind:         TFJob (kubeflow.org/v1)" in out
    assert "worker-1   Failed" in out and "mnist-worker-1" in out
    assert "TFJob/mnist" in out.split("Events:\n")[1]
    assert fake.core.selectors == ["trainjob.dev/job-name=mnist"]
    code, out, _ = trainjob("wait", "tfjob/mnist")
    assert (code, out) == (1, f"TFJob mnist Failed (ReplicaFailed: {FAILED_MESSAGE})\n")
    code, out, err = trainjob("logs", "tfjob/mnist", "ps-0")
    assert (code, err) == (
        1,
        "trainjob logs: TFJob mnist has no Pod for replica ps-0 now (Pods are removed when the "
        "job is cleaned up, per runPolicy.cleanPodPolicy)\n",
    )
    code, out, _ = trainjob("attach", "tfjob/mnist", "--no-tty")
    assert code == 1 and "TFJob mnist Failed after" in out
    assert "trainjob logs tfjob/mnist worker-1 -n team-a --cluster" in out
    code, out, _ = trainjob("delete", "tfjob/mnist")
    assert (code, out) == (0, 'tfjob.kubeflow.org "mnist" deleted\n')
    assert fake.custom.deleted == [("tfjobs", "mnist")]


def test_cli_a_tfjob_that_is_missing_or_not_ours_is_one_line(fake: types.SimpleNamespace) -> None:
    assert trainjob("describe", "tfjob/nope")[2] == (
        "trainjob describe: TFJob nope not found in namespace team-a\n"
    )
    code, _, err = trainjob("wait", "tfjob/theirs")
    assert code == 1 and err.startswith(
        "trainjob wait: tfjob/theirs is run by kueue.x-k8s.io/multikueue"
    )
    assert err.count("\n") == 1
    assert trainjob("get", "pod/x")[2] == (
        "trainjob get: pod/x: name a job as NAME or trainjob/NAME (a TrainJob), or tfjob/NAME "
        "(a TFJob)\n"
    )
    # A TrainJob named as kubectl would name it: the same job as by its name.
    assert trainjob("get", "trainjob/plain", "-o", "name")[1] == "trainjob.trainjob.dev/plain\n"
