"""The `trainjob` cluster commands and `trainjob.client` against the real test control plane:
one operator for the module (namespaces `test-cli-*`), Pods played by patching their status,
progress written into `.status.progress` as the operator's endpoint would. Pod logs need a
kubelet, which this control plane has none of: here `logs` must say so clearly; the
formatting and filtering of log lines are unit-tested (tests/unit/test_cluster_show.py)."""

from __future__ import annotations

import datetime
import io
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import REPO_ROOT
from tests.integration.operator_harness import (
    GROUP,
    Cluster,
    attempt,
    meta,
    pod_spec,
    running_operator,
    trainjob,
)
from tests.support import kubelet, operator_process, tmux, waits
from trainjob import cli, client
from trainjob.core import spec

pytestmark = pytest.mark.integration

T = 30.0  # per-step deadline on a 2-core machine; steps take well under a second


@pytest.fixture(scope="module")
def operator(
    kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[operator_process.Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kubeconfig, log, "--namespace=test-cli-*") as op:
        yield op.wait_serving(T)


@pytest.fixture
def cluster(
    operator: operator_process.Operator, api_client: k8s.ApiClient, namespace: str
) -> Iterator[Cluster]:
    assert namespace.startswith("test-cli-"), namespace
    yield Cluster(api_client, namespace)
    print(f"operator log, last lines:\n{operator.log_tail(25)}")


def run(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    """`trainjob ARGV --kubeconfig KUBECONFIG` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*argv, "--kubeconfig", str(kubeconfig)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def write(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def set_progress(cluster: Cluster, name: str, **fields: Any) -> None:
    """What the operator writes after a progress report (core.progress.status_progress)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    progress = {"state": "Running", "lastUpdateTime": now, **fields}
    cluster.custom.patch_namespaced_custom_object_status(
        GROUP, "v1alpha1", cluster.namespace, "trainjobs", name, {"status": {"progress": progress}}
    )


def printer_columns() -> list[str]:
    """NAME and the CRD's additionalPrinterColumns, upper-case: the header of kubectl get tj."""
    crd = yaml.safe_load((REPO_ROOT / "crds" / "trainjobs.trainjob.dev.yaml").read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    return ["NAME", *(column["name"].upper() for column in columns)]


PROGRESS = {
    "summary": "50% (1/2)",
    "replica": "chief-0",
    "epoch": 1,
    "totalEpochs": 2,
    "step": 60,
    "totalSteps": 120,
    "percent": 50.0,
    "loss": 0.4321,
    "etaSeconds": 30,
    "eta": "30s",
}


def test_cli_submit_get_describe_wait_delete(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    ns = cluster.namespace
    path = write(tmp_path / "job.yaml", trainjob("mnist", chief=1, workers=1))
    code, out, err = run(kubeconfig, "submit", "-f", str(path), "-n", ns)
    assert (code, out, err) == (0, "trainjob.trainjob.dev/mnist created\n", "")
    pods = {"mnist-chief-0", "mnist-worker-0"}
    cluster.wait_pods("mnist", pods)
    code, out, _ = run(kubeconfig, "submit", "-f", str(path), "-n", ns)
    assert (code, out) == (0, "trainjob.trainjob.dev/mnist unchanged\n")
    changed = trainjob("mnist", chief=1, workers=1, run_policy={"backoffLimit": 2})
    code, out, _ = run(kubeconfig, "submit", "-f", str(write(path, changed)), "-n", ns)
    assert (code, out) == (0, "trainjob.trainjob.dev/mnist configured\n")
    assert (cluster.job("mnist") or {})["spec"]["runPolicy"]["backoffLimit"] == 2

    cluster.run_all("mnist", pods)
    cluster.wait_condition("mnist", "Running")
    set_progress(cluster, "mnist", **PROGRESS)
    code, out, _ = run(kubeconfig, "get", "-n", ns)
    header, row = out.splitlines()
    assert header.split() == printer_columns()  # what `kubectl get tj` prints
    assert row.split()[:9] == [
        "mnist",
        "Running",
        "2/2",
        "0",
        "AllReplicasRunning",
        "50%",
        "(1/2)",
        "30s",
        "0.4321",
    ]
    code, out, _ = run(kubeconfig, "get", "-A", "-o", "wide")
    mine = [line for line in out.splitlines() if line.startswith(ns)]
    assert out.split()[0] == "NAMESPACE" and "STEP" in out.splitlines()[0]
    assert len(mine) == 1 and "60/120" in mine[0]
    code, out, _ = run(kubeconfig, "get", "mnist", "-n", ns, "-o", "yaml")
    assert code == 0 and yaml.safe_load(out)["status"]["progress"]["step"] == 60
    saved = tmp_path / "saved.yaml"
    saved.write_text(out)  # resubmitted below, after the job is deleted

    code, out, _ = run(kubeconfig, "describe", "mnist", "-n", ns)
    assert code == 0
    assert "State:        Running" in out
    assert "Progress:     50% (1/2)  step 60/120  loss 0.4321" in out
    assert "chief-0" in out and "mnist-worker-0" in out
    assert "Events:" in out and "Created" in out

    cluster.set_exited("mnist-chief-0", 0)
    code, out, _ = run(kubeconfig, "wait", "mnist", "-n", ns, "--timeout", "30s")
    assert code == 0 and out.startswith("TrainJob mnist Succeeded"), out

    code, out, _ = run(kubeconfig, "delete", "mnist", "-n", ns)
    assert (code, out) == (0, 'trainjob.trainjob.dev "mnist" deleted\n')
    waits.wait_until(lambda: cluster.job("mnist") is None, timeout=T, what="the job deleted")
    code, out, err = run(kubeconfig, "get", "mnist", "-n", ns)
    assert code == 1 and err == f"trainjob get: TrainJob mnist not found in namespace {ns}\n"
    # What `get -o yaml` saved (uid, resourceVersion, status...) submits as a new job.
    code, out, err = run(kubeconfig, "submit", "-f", str(saved), "-o", "json")
    assert code == 0, err
    created = json.loads(out)
    # None of the saved status: the new job's is the CRD's default until the operator writes.
    assert created["metadata"]["namespace"] == ns and created["status"] == {"state": "Pending"}


def test_cli_submit_code_ships_the_directory_and_it_goes_with_the_job(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    ns = cluster.namespace
    package = tmp_path / "my_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("def main():\n    return 1\n")
    path = write(tmp_path / "job.yaml", trainjob("shipped", chief=1, workers=1))
    code, out, err = run(kubeconfig, "submit", "-f", str(path), "-n", ns, "--code", str(package))
    assert (code, out, err) == (0, "trainjob.trainjob.dev/shipped created\n", "")
    job = cluster.job("shipped") or {}
    config_map = cluster.core.read_namespaced_config_map("shipped-code", ns)
    assert [(o.kind, o.uid) for o in meta(config_map).owner_references or []] == [
        ("TrainJob", job["metadata"]["uid"])
    ]
    assert sorted((config_map.data or {}).values()) == ["", "def main():\n    return 1\n"]
    pods = cluster.wait_pods("shipped", {"shipped-chief-0", "shipped-worker-0"})
    for pod in pods.values():
        spec = pod_spec(pod)
        (volume,) = [v for v in spec.volumes or [] if v.name == "trainjob-code"]
        assert volume.config_map is not None
        assert volume.config_map.name == "shipped-code"
        assert sorted(i.path for i in volume.config_map.items or []) == [
            "my_pkg/__init__.py",
            "my_pkg/train.py",
        ]
        (tf,) = [c for c in spec.containers if c.name == "tensorflow"]
        mounts = {m.name: (m.mount_path, m.read_only) for m in tf.volume_mounts or []}
        assert mounts["trainjob-code"] == ("/opt/trainjob/code", True)
        assert {e.name: e.value for e in tf.env or []}["PYTHONPATH"] == "/opt/trainjob/code"

    # Submitted again with a change: the ConfigMap follows, the job's spec is the same.
    (package / "train.py").write_text("def main():\n    return 2\n")
    code, out, _ = run(kubeconfig, "submit", "-f", str(path), "-n", ns, "--code", str(package))
    assert (code, out) == (0, "trainjob.trainjob.dev/shipped unchanged\n")
    config_map = cluster.core.read_namespaced_config_map("shipped-code", ns)
    assert "def main():\n    return 2\n" in (config_map.data or {}).values()

    # Too much to ship: refused in one line before anything is sent.
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "data.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    other = write(tmp_path / "other.yaml", trainjob("toobig", chief=1, workers=0))
    code, out, err = run(
        kubeconfig, "submit", "-f", str(other), "-n", ns, "--code", str(tmp_path / "big")
    )
    assert code != 0 and len(err.splitlines()) == 1, err
    assert "more than a ConfigMap holds (1 MiB)" in err and "FROM the trainjob image" in err
    assert cluster.job("toobig") is None

    # Deleted with its job (the garbage collector follows the ownerReference).
    cluster.delete_job("shipped")

    def code_gone() -> bool:
        names = [meta(c).name for c in cluster.core.list_namespaced_config_map(ns).items]
        return "shipped-code" not in names

    waits.wait_until(code_gone, timeout=60, what="the code's ConfigMap to go with its job")


def test_cli_wait_timeout_failed_and_describe_cause(cluster: Cluster, kubeconfig: Path) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("bad", chief=1, workers=1))
    code, _, err = run(kubeconfig, "wait", "bad", "-n", ns, "--timeout", "1s")
    assert code == 124 and "timed out after 1s waiting for TrainJob bad to be succeeded" in err
    pods = {"bad-chief-0", "bad-worker-0"}
    cluster.run_all("bad", pods)
    cluster.set_exited("bad-worker-0", 3)
    code, out, _ = run(kubeconfig, "wait", "bad", "-n", ns, "--timeout", "30s")
    assert code == 1 and out.startswith("TrainJob bad Failed ("), out
    code, out, _ = run(kubeconfig, "wait", "bad", "-n", ns, "--for", "finished")
    assert code == 0
    code, out, _ = run(kubeconfig, "describe", "bad", "-n", ns)
    assert "Cause:        " in out and "State:        Failed" in out
    worker = next(line for line in out.splitlines() if line.strip().startswith("worker-0"))
    assert worker.split()[:4] == ["worker-0", "Failed", "0", "3"], worker
    # The summary attach prints for a job that ended already, with its cause.
    code, out, _ = run(kubeconfig, "attach", "bad", "-n", ns, "--no-tty")
    assert code == 1
    assert "TrainJob bad Failed after" in out
    assert "cause:      worker-0: exit code 3" in out
    assert f"trainjob logs bad worker-0 -n {ns} --cluster" in out


def test_cli_logs_say_why_there_is_none(cluster: Cluster, kubeconfig: Path) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("quiet", chief=1, workers=0))
    cluster.run_all("quiet", {"quiet-chief-0"})
    code, out, err = run(kubeconfig, "logs", "quiet", "-n", ns)
    assert code == 1 and out == ""
    assert err == (
        "trainjob logs: no log for chief-0: Pod quiet-chief-0 is on no node yet (Running, not "
        "scheduled), so it has no log\n"
    )
    code, _, err = run(kubeconfig, "logs", "quiet", "worker-3", "--cluster", "-n", ns)
    assert code == 1 and "has no Pod for replica worker-3" in err
    code, _, err = run(kubeconfig, "logs", "nope", "-n", ns)
    assert code == 1 and err == f"trainjob logs: TrainJob nope not found in namespace {ns}\n"


def test_cli_kubeconfig_context_and_namespace_as_kubectl(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("ctx", chief=1, workers=0))
    config = yaml.safe_load(kubeconfig.read_text())
    current = config["current-context"]
    for context in config["contexts"]:
        if context["name"] == current:
            context["context"]["namespace"] = ns
    scoped = tmp_path / "scoped.yaml"
    scoped.write_text(yaml.safe_dump(config))
    code, out, _ = run(scoped, "get")  # no -n: the context's namespace
    assert code == 0 and out.splitlines()[1].split()[0] == "ctx"
    code, _, err = run(scoped, "get", "--context", "nope")
    assert code == 1 and f"has no context 'nope' (contexts: {current})" in err
    # $KUBECONFIG as a list of files, merged as kubectl merges them: the credentials in one,
    # the context (with its namespace) in the other.
    first, second = tmp_path / "credentials.yaml", tmp_path / "context.yaml"
    first.write_text(yaml.safe_dump({**config, "contexts": [], "current-context": ""}))
    second.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [],
                                      "users": [], "contexts": config["contexts"],
                                      "current-context": current}))  # fmt: skip
    stdout = io.StringIO()
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    assert cli.main(["get"], out=stdout, err=io.StringIO()) == 0
    assert stdout.getvalue().splitlines()[1].split()[0] == "ctx"
    code, _, err = run(tmp_path / "missing.yaml", "get")
    assert code == 1 and "no kubeconfig" in err and "missing.yaml does not exist" in err


def _attach(kubeconfig: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainjob", "attach", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _first_line(process: subprocess.Popen[str]) -> str:
    """The first line a process prints, within T seconds (so Ctrl-C reaches a running loop)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], T)
    assert ready, "attach printed nothing"
    return process.stdout.readline()


def _read_until(process: subprocess.Popen[str], text: str) -> str:
    """What a process prints until `text`, within T seconds, read from its pipe unbuffered (a
    line-buffered reader would hold lines that select() then no longer sees)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + T
    seen = b""
    while text.encode() not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"{text!r} not printed within {T}s: {seen.decode()}"
        chunk = os.read(fd, 65536)
        assert chunk, f"it ended before printing {text!r}: {seen.decode()}"
        seen += chunk
    return seen.decode()


def test_cli_attach_follows_to_the_summary_and_detaches(cluster: Cluster, kubeconfig: Path) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("live", chief=1, workers=1))
    cluster.wait_pods("live", {"live-chief-0", "live-worker-0"})
    following = _attach(kubeconfig, "live", "-n", ns, "--no-tty")
    detaching = _attach(kubeconfig, "live", "-n", ns, "--no-tty")
    try:
        first = _first_line(following)
        _first_line(detaching)
        detaching.send_signal(signal.SIGINT)
        out, _ = detaching.communicate(timeout=T)
        assert detaching.returncode == 130, out
        assert "Detached: TrainJob live keeps running" in out
        assert f"trainjob attach live -n {ns}" in out
        assert cluster.job("live") is not None

        cluster.run_all("live", {"live-chief-0", "live-worker-0"})
        cluster.wait_condition("live", "Running")
        set_progress(cluster, "live", **PROGRESS)
        waits.wait_until(
            lambda: (cluster.job("live") or {}).get("status", {}).get("progress"),
            timeout=T,
            what="progress in status",
        )
        cluster.set_exited("live-chief-0", 0)
        rest, _ = following.communicate(timeout=T)
    finally:
        for process in (following, detaching):
            if process.poll() is None:
                process.kill()
                process.wait()
    out = first + rest
    assert following.returncode == 0, out
    assert first.startswith("* "), out  # the job's Events, as trainjob run prints its own
    assert "progress: 50% (1/2)  step 60/120  loss 0.4321" in out
    assert "TrainJob live Succeeded after" in out
    assert "  progress:   50% (1/2)  step 60/120  loss 0.4321" in out
    assert "last exit:  chief-0=0 (Succeeded, attempt 0)" in out
    assert f"logs:       trainjob logs live -n {ns} --cluster" in out


def test_cli_a_job_created_suspended_is_shown_waiting_not_starting(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """A job created suspended, through the real operator: its Event does not claim Pods were
    deleted, `describe` and `attach` say it waits and has nothing yet (not "Starting attempt
    1", not "keeps running") and how to resume it; resumed that way, its Pods are attempt 0."""
    ns = cluster.namespace
    cluster.create_job(trainjob("held", chief=1, workers=1, run_policy={"suspend": True}))
    cluster.wait_condition("held", "Suspended")

    def described() -> str | None:
        code, out, err = run(kubeconfig, "describe", "held", "-n", ns)
        assert code == 0, err
        return out if "Suspended TrainJob before it started" in out else None

    out = waits.wait_until(described, timeout=T, what="the Suspended Event in describe")
    assert "State:        Suspended\n" in out
    assert "Not started: no Pod or Service is created until it starts\n" in out
    resume = f"kubectl patch tj held -n {ns} --type merge -p "
    assert resume in out
    replicas = out.split("Replicas:\n")[1].split("Events:")[0].splitlines()[1:]
    assert [row.split()[:3] for row in replicas] == [
        ["chief-0", "Suspended", "0"],
        ["worker-0", "Suspended", "0"],
    ]
    assert "Starting" not in out and "deleted its Pods" not in out

    detaching = _attach(kubeconfig, "held", "-n", ns, "--no-tty")
    try:
        first = _read_until(detaching, "not started")  # what it waits for, in its first poll
        detaching.send_signal(signal.SIGINT)
        rest, _ = detaching.communicate(timeout=T)
    finally:
        if detaching.poll() is None:
            detaching.kill()
            detaching.wait()
    told = first + rest
    assert detaching.returncode == 130, told
    assert "Suspended, not started: no Pod or Service is created until it starts." in told
    assert "Detached: TrainJob held stays Suspended on the cluster (not started" in told
    assert resume in told and "keeps running" not in told and "Starting" not in told

    cluster.patch_job("held", {"spec": {"runPolicy": {"suspend": False}}})
    pods = cluster.wait_pods("held", {"held-chief-0", "held-worker-0"})
    assert [attempt(p) for p in pods.values()] == [0, 0]


def test_cli_client_create_get_list_progress_wait_delete(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    ns = cluster.namespace
    with client.TrainJobClient(ns, kubeconfig=str(kubeconfig)) as tj:
        assert tj.create(trainjob("nb", chief=1, workers=1)) == "nb"
        path = write(tmp_path / "two.yaml", trainjob("nb2", chief=1, workers=0))
        assert tj.create(str(path)) == "nb2"
        with pytest.raises(client.TrainJobError, match="already exists"):
            tj.create(str(path))
        assert tj.create(str(path), apply=True) == "nb2"
        assert sorted(j["metadata"]["name"] for j in tj.list()) == ["nb", "nb2"]
        assert tj.progress("nb") is None
        cluster.run_all("nb", {"nb-chief-0", "nb-worker-0"})
        cluster.wait_condition("nb", "Running")
        set_progress(cluster, "nb", **PROGRESS)
        report = tj.progress("nb")
        assert report is not None and (report.step, report.loss) == (60, 0.4321)
        running = tj.wait("nb", timeout=T, until="running")
        assert (running.state, running.timed_out) == ("Running", False)
        early = tj.wait("nb", timeout=0.5)
        assert early.timed_out and not early.succeeded
        cluster.set_exited("nb-worker-0", 2)
        result = tj.wait("nb", timeout=T)
        assert (result.state, result.succeeded, result.timed_out) == ("Failed", False, False)
        assert result.exit_codes["worker-0"] == 2 and "worker" in result.message
        assert tj.get("nb")["status"]["state"] == "Failed"
        with pytest.raises(
            client.TrainJobError, match=r"^no log for worker-0: Pod nb-worker-0 is on no node yet"
        ):
            list(tj.logs("nb"))
        tj.delete("nb")
        with pytest.raises(
            client.TrainJobError, match=f"TrainJob nope not found in namespace {ns}"
        ):
            tj.get("nope")
        parsed = spec.parse(trainjob("nb3", chief=1, workers=0), require_images=False)
        assert tj.create(parsed) == "nb3"
        assert tj.get("nb3")["spec"]["replicaSpecs"]["chief"]["replicas"] == 1
        with pytest.raises(client.TrainJobError, match=r"spec\.replicaSpecs"):
            tj.create({"apiVersion": "trainjob.dev/v1alpha1", "kind": "TrainJob",
                       "metadata": {"name": "x"}, "spec": {}})  # fmt: skip

        # With code, as `submit --code`: a second create is refused and leaves the code be.
        package = tmp_path / "nb_pkg"
        package.mkdir()
        (package / "model.py").write_text("UNITS = 8\n")
        assert tj.create(trainjob("nb4", chief=1, workers=0), code=package) == "nb4"
        with pytest.raises(client.TrainJobError, match="nb4 already exists"):
            tj.create(trainjob("nb4", chief=1, workers=0), code=package)
        shipped = cluster.core.read_namespaced_config_map("nb4-code", ns)
        assert list((shipped.data or {}).values()) == ["UNITS = 8\n"]
        assert (meta(shipped).owner_references or [])[0].name == "nb4"
        with pytest.raises(client.TrainJobError, match="not a directory"):
            tj.create(trainjob("nb5", chief=1, workers=0), code=package / "model.py")


def test_cli_client_local_run_create_wait_logs(tmp_path: Path) -> None:
    """The same calls for a run on this machine (no cluster needed)."""
    code = (
        "print('hello from the chief', flush=True)\n"
        "print('2026-11-24 12:00:00.123456: I tensorflow/core/x.cc:1] noise', flush=True)"
    )
    container = {"name": "tensorflow", "image": "none", "command": ["python", "-c", code]}
    chief = {
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {"spec": {"containers": [container]}},
    }
    manifest = {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "here"},
        "spec": {"replicaSpecs": {"chief": chief}},
    }
    local = client.run_local(manifest, run_dir=str(tmp_path / "run"))
    result = local.wait(timeout=60)
    assert (result.state, result.succeeded) == ("Succeeded", True), local.status()
    assert result.exit_codes == {"chief-0": 0}
    assert any("hello from the chief" in line for line in local.logs())
    assert not any("noise" in line for line in local.logs())
    assert any("noise" in line for line in local.logs(verbose=True))
    assert all(line.startswith("chief-0  | ") for line in local.logs(follow=True))


def test_cli_logs_follow_ends_with_the_job_and_says_why_a_log_is_missing(
    cluster: Cluster, kubeconfig: Path
) -> None:
    ns = cluster.namespace
    cluster.create_job(trainjob("ended", chief=1, workers=0))
    cluster.run_all("ended", {"ended-chief-0"})
    cluster.set_exited("ended-chief-0", 0)
    cluster.wait_condition("ended", "Succeeded")
    code, out, err = run(kubeconfig, "logs", "ended", "-n", ns, "-f")
    assert (code, out) == (0, "")
    assert err == (
        "trainjob logs: chief-0: Pod ended-chief-0 is on no node yet (Succeeded, not "
        "scheduled), so it has no log\n"
    )


def test_cli_submit_follow_prints_the_summary(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    ns = cluster.namespace
    path = write(tmp_path / "job.yaml", trainjob("sub", chief=1, workers=1))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    argv = ["submit", "-f", str(path), "-n", ns, "--follow", "--no-tty"]
    process = subprocess.Popen(
        [sys.executable, "-m", "trainjob", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _first_line(process) == "trainjob.trainjob.dev/sub created\n"
        cluster.run_all("sub", {"sub-chief-0", "sub-worker-0"})
        cluster.set_exited("sub-worker-0", 137, reason="OOMKilled")
        out, _ = process.communicate(timeout=T)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, out
    assert "TrainJob sub Failed after" in out
    assert "worker-0=137 (Failed, attempt 0)" in out


def test_cli_attach_on_a_terminal_draws_the_live_table(cluster: Cluster, kubeconfig: Path) -> None:
    """On a pseudo-terminal: the table of `trainjob run` (job line, a row per replica) while
    the job runs, then the summary in its place."""
    ns = cluster.namespace
    cluster.create_job(trainjob("tty", chief=1, workers=1))
    cluster.run_all("tty", {"tty-chief-0", "tty-worker-0"})
    cluster.wait_condition("tty", "Running")
    set_progress(cluster, "tty", **PROGRESS)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    env.update(TERM="xterm", NO_COLOR="1")
    screen = pyte.Screen(100, 30)
    stream = pyte.ByteStream(screen)
    child = pexpect.spawn(
        sys.executable, ["-m", "trainjob", "attach", "tty", "-n", ns], env=env,
        dimensions=(30, 100),
    )  # fmt: skip
    try:
        child.expect("restarts 0/", timeout=T)
        stream.feed(child.before + child.after)
        child.expect(r"\n", timeout=T)  # the rest of the table's first draw
        stream.feed(child.before + child.after)
        child.expect(r"worker-0.*\n", timeout=T)
        stream.feed(child.before + child.after)
        shown = [line.rstrip() for line in screen.display]
        job_line = next(line for line in shown if line.startswith("TrainJob tty  "))
        assert "Running" in job_line and "step 60/120 (50%)" in job_line and "ETA 30.0s" in job_line
        rows = [line.split() for line in shown if line.startswith("  ")]
        assert rows[0][:2] == ["chief-0", "Running"] and "step" in rows[0]
        assert rows[1][:2] == ["worker-0", "Running"]
        cluster.set_exited("tty-chief-0", 0)
        child.expect(pexpect.EOF, timeout=T)
        stream.feed(child.before)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    shown = [line.rstrip() for line in screen.display]
    assert any(line.startswith("TrainJob tty Succeeded after") for line in shown), shown
    assert not any(line.startswith("TrainJob tty  ") for line in shown), "the table was not erased"


ATTACH_RESIZES = [(60, 30), (200, 40), (60, 30), (120, 30), (60, 20), (100, 30)]


def test_cli_attach_in_tmux_fits_every_resize_and_leaves_no_table_behind(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    """`trainjob attach` in a real tmux window, made narrower and wider: after each resize the
    table is redrawn to fit (every line within the window), in place (one table on the
    window), and nothing of it is in tmux's scrollback. Before, a resize from 120 to 60
    columns left the top of the 120-column table there: tmux re-wraps the window and makes
    room by moving rows from its top into the scrollback, and the table started there."""
    ns = cluster.namespace
    cluster.create_job(trainjob("narrow", chief=1, workers=1))
    cluster.run_all("narrow", {"narrow-chief-0", "narrow-worker-0"})
    cluster.wait_condition("narrow", "Running")
    set_progress(cluster, "narrow", **PROGRESS, examplesPerSecond=12345.6)
    env = {"PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "trainjob", "attach", "narrow", "-n", ns]
    job_line = "TrainJob narrow  "

    def table(lines: list[str]) -> list[str]:
        return [line for line in lines if line.startswith((job_line, "  chief-0", "  worker-0"))]

    try:
        server = tmux.Tmux(tmp_path, 120, 30, command, cwd=REPO_ROOT, env=env)
    except tmux.TmuxMissingError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        first = waits.wait_until(
            lambda: table(server.screen()), timeout=T, what="attach to draw its table"
        )
        assert max(len(line) for line in first) > 60, first  # it re-wraps at 60 columns
        for step, (columns, rows) in enumerate(ATTACH_RESIZES, start=61):
            server.resize(columns, rows)
            # A new step after the resize: the table showing it was drawn at this size.
            set_progress(cluster, "narrow", **{**PROGRESS, "step": step})

            def redrawn(columns: int = columns, step: int = step) -> list[str] | None:
                shown = table(server.screen())
                drawn = len(shown) == 3 and f"step {step}/" in shown[0]
                return shown if drawn and all(len(line) <= columns - 1 for line in shown) else None

            waits.wait_until(
                redrawn,
                timeout=T,
                what=f"step {step} in a table that fits {columns}",
                on_timeout=lambda: "\n".join(server.screen()),
            )
            screen = server.screen()
            assert len(table(screen)) == 3, "\n".join(screen)
            assert all(len(line) <= columns for line in screen), "\n".join(screen)
            history = server.history()
            assert table(history) == [], (
                f"the table in tmux's scrollback after the resize to {columns}x{rows}:\n"
                + "\n".join(history)
            )
    finally:
        server.close()


def _readme_commands(section: str) -> list[list[str]]:
    """The `trainjob` commands of a section's sh block in the docs' "On a cluster" page, one
    argv each."""
    text = (REPO_ROOT / "docs" / "content" / "getting-started" / "cluster.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = body.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        command = line.split("  #", 1)[0].split(" && ", 1)[0]
        argv = shlex.split(command)
        if argv and argv[0] == "trainjob":
            commands.append(argv[1:])
    return commands


def test_cli_the_readme_commands_work(cluster: Cluster, kubeconfig: Path) -> None:
    """The docs' "From your laptop" (getting-started/cluster.md), in its order, with the
    kubelet played meanwhile: the example's two workers run, report progress, and worker 0
    finishes while submit follows."""
    ns = cluster.namespace
    commands = [[ns if arg == "team-a" else arg for arg in argv] for argv in _readme_commands(
        "From your laptop")]  # fmt: skip
    assert [argv[0] for argv in commands] == [
        "submit", "get", "get", "describe", "logs", "logs", "wait", "attach", "delete",
    ]  # fmt: skip
    name = "mnist-multiworker"

    def kubelet() -> None:
        cluster.run_all(name, {f"{name}-worker-0", f"{name}-worker-1"})
        cluster.wait_condition(name, "Running")
        set_progress(cluster, name, **{**PROGRESS, "replica": "worker-0"})
        cluster.set_exited(f"{name}-worker-0", 0)

    player = threading.Thread(target=kubelet, daemon=True)
    player.start()
    outputs = {}
    for argv in commands:
        code, out, err = run(kubeconfig, *argv)
        outputs[" ".join(argv)] = (code, out, err)
        if argv[0] == "logs":  # no kubelet, so no log: the answer must say why, not fail
            assert code in (0, 1) and ("no log" in err or "has no Pod" in err), (argv, err)
        else:
            assert code == 0, (argv, out, err)
    player.join(timeout=T)
    submit = outputs[" ".join(commands[0])]
    assert submit[1].startswith(f"trainjob.trainjob.dev/{name} created\n")
    assert f"TrainJob {name} Succeeded after" in submit[1]
    assert outputs[" ".join(commands[6])][1].startswith(f"TrainJob {name} Succeeded")


def test_cli_forbidden_and_refused_credentials_are_one_line(
    cluster: Cluster, control_plane: ControlPlane, tmp_path: Path
) -> None:
    ns = cluster.namespace
    # The namespace's default service account: authenticated, but no RBAC for TrainJobs.
    account = control_plane.service_account_kubeconfig(ns, "default", tmp_path / "sa.yaml")
    code, _, err = run(account, "get")
    assert code == 1
    assert err.startswith(
        f"trainjob get: list TrainJobs in namespace {ns}: trainjobs.trainjob.dev is forbidden: "
        f'User "system:serviceaccount:{ns}:default" cannot list resource "trainjobs"'
    ), err
    assert err.count("\n") == 1
    with pytest.raises(client.TrainJobError, match="is forbidden"):
        client.TrainJobClient(kubeconfig=str(account)).list()
    stranger = control_plane.write_kubeconfig(tmp_path / "bad.yaml", "nobody", "no-token", ns)
    code, _, err = run(stranger, "describe", "x")
    assert code == 1
    assert err == (
        f"trainjob describe: get TrainJob {ns}/x: Unauthorized (the kubeconfig's credentials "
        "were refused)\n"
    )


def test_cli_completion_offers_the_clusters_job_names(
    cluster: Cluster, kubeconfig: Path, tmp_path: Path
) -> None:
    """`trainjob describe -n NS <TAB>` in a real bash with the completion script loaded:
    the names come from the cluster (`trainjob get -o name`), in the namespace typed."""
    ns = cluster.namespace
    for name in ("alpha", "beta"):
        cluster.create_job(trainjob(name, chief=1, workers=0))
    code, out, _ = run(kubeconfig, "get", "-n", ns, "-o", "name")
    assert (code, out) == (0, "trainjob.trainjob.dev/alpha\ntrainjob.trainjob.dev/beta\n")
    script = tmp_path / "completion.bash"
    script.write_text(cli.completion_script(cli.build_parser(), "bash"))
    probe = (
        f"source {shlex.quote(str(script))}\n"
        f"COMP_WORDS=(trainjob describe -n {ns} a); COMP_CWORD=4; _trainjob\n"
        'echo "${COMPREPLY[*]}"\n'
        f"COMP_WORDS=(trainjob delete -n {ns} ''); COMP_CWORD=4; _trainjob\n"
        'echo "${COMPREPLY[*]}"\n'
    )
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["alpha", "alpha beta"], result.stdout


def _tensorboard(kubeconfig: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainjob", "tensorboard", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tensorboard_pod(cluster: Cluster, job: str) -> Any:
    pods = cluster.core.list_namespaced_pod(
        cluster.namespace, label_selector=f"trainjob.dev/tensorboard-for={job}"
    ).items
    return pods[0] if pods else None


def test_cli_tensorboard_pod_is_admitted_as_restricted_says_why_it_cannot_start_and_goes(
    cluster: Cluster, kubeconfig: Path
) -> None:
    """The TensorBoard Pod on the real API server: admitted in a namespace enforcing Pod
    Security "restricted"; an image the kubelet cannot pull ends the command with the kubelet's
    words; SIGTERM while it waits ends it too; the Pod is deleted every time."""
    ns = cluster.namespace
    cluster.core.patch_namespace(
        ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    bare = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="bare"),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="x")]),
    )
    with pytest.raises(ApiException, match="violates PodSecurity"):  # enforced here
        cluster.core.create_namespaced_pod(ns, bare)
    body = trainjob("board", chief=0, workers=1)
    body["spec"]["checkpoint"] = {"claimName": "ckpt", "path": "/checkpoints", "subPath": "board"}
    cluster.create_job(body)

    process = _tensorboard(kubeconfig, "board", "-n", ns)
    try:
        pod = waits.wait_until(
            lambda: _tensorboard_pod(cluster, "board"), timeout=T, what="the TensorBoard Pod"
        )
        assert pod.metadata.owner_references[0].name == "board"
        name = pod.metadata.name
        waiting = {"reason": "ErrImagePull", "message": "trainjob/trainjob:0.1.0: not found"}
        container = kubelet.container_status(
            {"waiting": waiting}, image="trainjob/trainjob:0.1.0", ready=False, name="tensorboard"
        )
        cluster.core.patch_namespaced_pod_status(name, ns, kubelet.pod_status("Pending", container))
        out, err = process.communicate(timeout=T)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (process.returncode, out) == (1, ""), err
    assert err == (
        f"trainjob tensorboard: TensorBoard Pod {name} cannot start: ErrImagePull: "
        "trainjob/trainjob:0.1.0: not found\n"
    )
    waits.wait_until(
        lambda: _tensorboard_pod(cluster, "board") is None, timeout=T, what="the Pod deleted"
    )

    process = _tensorboard(kubeconfig, "board", "-n", ns)
    try:
        waits.wait_until(lambda: _tensorboard_pod(cluster, "board"), timeout=T, what="a second Pod")
        process.send_signal(signal.SIGTERM)  # as a closed terminal or `kill` would
        out, err = process.communicate(timeout=T)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out.startswith("Stopped TensorBoard; deleted Pod board-tensorboard-"), out
    waits.wait_until(
        lambda: _tensorboard_pod(cluster, "board") is None, timeout=T, what="the Pod deleted"
    )
