"""A Python client for notebooks: submit a TrainJob to a cluster (or run it on this machine),
wait for it, read its progress and logs, delete it. Every failure is one `TrainJobError`
naming the cause (the API server's words, the field of a bad manifest), never a traceback
from the kubernetes package.

    from trainjob.client import TrainJobClient
    client = TrainJobClient(namespace="team-a")        # kubeconfig and context as kubectl
    name = client.create("examples/mnist-multiworker.yaml")
    result = client.wait(name, timeout=1800)           # Result: state, reason, message
    for line in client.logs(name, follow=True): print(line)

    from trainjob.client import run_local
    run = run_local("examples/mnist-multiworker.yaml", run_dir="/tmp/run1")
    result = run.wait(timeout=600)

The cluster side goes through `trainjob.cluster.api` (the only module that calls the API
server); the local side starts `trainjob run` as a child process, so a notebook's kernel is
never the parent of TensorFlow replicas and never blocks while they train.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from trainjob import cliutil
from trainjob.cluster import describe, objects, show
from trainjob.cluster.cli import common as cluster_common
from trainjob.cluster.cli import jobs as cluster_jobs
from trainjob.cluster.cli import logs as cluster_logs
from trainjob.cluster.cli import submit as cluster_submit
from trainjob.cluster.errors import DEFAULT_REQUEST_TIMEOUT, ClusterError
from trainjob.console import view
from trainjob.core import progress as core_progress
from trainjob.core import spec
from trainjob.core import status as st
from trainjob.local import plan, rundir

if TYPE_CHECKING:  # imported by TrainJobClient: run_local needs no kubernetes package
    from trainjob.cluster import api

Manifest = str | Path | Mapping[str, Any]
LOCAL_POLL_SECONDS: Final = 0.2


class TrainJobError(Exception):
    """Anything that went wrong; the message names the cause."""


@dataclasses.dataclass(frozen=True)
class Result:
    """How a job stands when `wait` returned: its state (Succeeded, Failed, or the state it
    was in at the timeout), whether it succeeded, the reason and message of the condition
    that decided (the cause of a failure), the exit code of each replica, and the raw status."""

    name: str
    state: str
    succeeded: bool
    timed_out: bool
    reason: str
    message: str
    exit_codes: Mapping[str, int | None]
    status: Mapping[str, Any]


def _result(name: str, raw_status: Mapping[str, Any], timed_out: bool) -> Result:
    status = st.from_dict(raw_status)
    reason, _, message = show.state_message(status).partition(": ")
    codes: dict[str, int | None] = {}
    for key, record in sorted(status.replicas.items()):
        codes[f"{key[0]}-{key[1]}"] = record.exit_code
    return Result(
        name=name,
        state=str(raw_status.get("state") or st.state_of(status)),
        succeeded=status.is_true(st.SUCCEEDED),
        timed_out=timed_out,
        reason=reason,
        message=message,
        exit_codes=codes,
        status=raw_status,
    )


def load_manifest(job: Manifest | spec.TrainJob) -> dict[str, Any]:
    """A TrainJob manifest from a YAML file path, a dict or a parsed TrainJob, checked by the
    core's rules."""
    if isinstance(job, spec.TrainJob):
        return objects.manifest_of(job)
    if isinstance(job, Mapping):
        document: Any = dict(job)
        name = "the manifest"
    else:
        name = str(job)
        try:
            documents = cliutil.load_documents(name, io.StringIO())
        except cliutil.CliError as error:
            raise TrainJobError(error.message) from error
        if len(documents) != 1:
            raise TrainJobError(f"{name} must hold one TrainJob, found {len(documents)}")
        document = documents[0]
    try:
        cliutil.parse_job(document, name, require_images=False)
    except cliutil.CliError as error:
        raise TrainJobError(error.message) from error
    if not isinstance(document, dict):
        raise TrainJobError(f"{name}: expected a TrainJob object")
    return objects.submittable(document)


class TrainJobClient:
    """TrainJobs in one namespace of a cluster (kubeconfig, context and namespace as kubectl
    resolves them; inside a Pod, its service account). Each request to the API server waits
    at most `request_timeout` seconds (0: for ever), so a stuck server ends a call with a
    TrainJobError saying so, instead of hanging the notebook."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        context: str | None = None,
        kubeconfig: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        try:
            cluster_api = cluster_common.load_api()
            self._cluster: api.Cluster = cluster_api.Cluster(
                cluster_api.connect(kubeconfig, context, namespace, request_timeout=request_timeout)
            )
        except ClusterError as error:
            raise TrainJobError(error.message) from error
        self.namespace = self._cluster.namespace

    def __enter__(self) -> TrainJobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._cluster.close()

    def _do(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except (ClusterError, objects.ShowError, cliutil.CliError) as error:
            raise TrainJobError(str(error)) from error

    def create(
        self,
        job: Manifest | spec.TrainJob,
        *,
        apply: bool = False,
        code: str | os.PathLike[str] | None = None,
    ) -> str:
        """Create the job (from a YAML path, a dict or a parsed TrainJob); with `apply`, an
        existing job gets this spec instead of an error; with `code`, that directory ships
        with it, as `trainjob submit --code` (on the replicas' PYTHONPATH). Returns its name."""
        body = load_manifest(job)
        if code is not None:
            files = self._do(cluster_submit.read_code, os.fspath(code), os.getcwd())
            result, _ = self._do(
                cluster_submit.apply_with_code,
                self._cluster,
                body,
                os.fspath(code),
                files,
                apply=apply,
            )
        elif apply:
            result, _ = self._do(self._cluster.apply_job, body)
        else:
            result = self._do(self._cluster.create_job, body)
        return objects.name_of(result)

    def get(self, name: str) -> dict[str, Any]:
        """The TrainJob object as the API server has it (status included)."""
        job: dict[str, Any] = self._do(self._cluster.get_job, name)
        return job

    def list(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self._do(self._cluster.list_jobs)
        return jobs

    def progress(self, name: str) -> core_progress.Report | None:
        """The chief's latest progress report (epoch, step, loss, ETA...), None before one."""
        return objects.report_of(self.get(name).get("status"))

    def wait(self, name: str, timeout: float | None = None, *, until: str = "succeeded") -> Result:
        """Wait until the job succeeded or failed (`until="running"`: until it runs), at most
        `timeout` seconds; the Result says how it stands, with the cause of a failure."""
        if until not in show.WAIT_FOR:
            raise TrainJobError(f"until: expected one of {', '.join(show.WAIT_FOR)}, got {until!r}")
        code, job = self._do(
            cluster_jobs.wait_for, lambda: self._cluster.get_job(name), until, timeout
        )
        return _result(name, job.get("status") or {}, code == cliutil.EXIT_TIMEOUT)

    def logs(
        self,
        name: str,
        replica: str | None = None,
        *,
        follow: bool = False,
        verbose: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> Iterator[str]:
        """Every replica's log lines, prefixed `worker-0 | `, TensorFlow's routine messages left
        out unless `verbose`; `follow` goes on across restarts until the job ends."""
        request = describe.LogRequest(name, replica)
        self.get(name)
        if follow:
            yield from self._follow(request, verbose, tail)
            return
        pods = [
            p for p in describe.order_pods(self._do(self._cluster.pods, name)) if request.wants(p)
        ]
        if not pods:
            raise TrainJobError(f"TrainJob {name} has no Pod for {replica or 'any replica'} now")
        width = max(len(objects.pod_label(p)) for p in pods)
        missing = []
        for pod in pods:
            replica = objects.pod_label(pod)
            unavailable = None if previous else describe.log_unavailable(pod)
            if unavailable is not None:
                missing.append(f"no log for {replica}: {unavailable}")
                continue
            text = self._do(
                self._cluster.pod_log, objects.name_of(pod), previous=previous, tail=tail
            )
            for line in cluster_logs.filtered(text.splitlines(), verbose):
                yield view.log_line(replica, line, width)
        if len(missing) == len(pods):
            raise TrainJobError("; ".join(missing))
        for note in missing:  # some replicas have logs: say which have none, after them
            yield f"(trainjob: {note})"

    def _follow(
        self, request: describe.LogRequest, verbose: bool, tail: int | None
    ) -> Iterator[str]:
        labels: dict[str, str] = {}
        try:
            for pod_name, line in self._cluster.follow_logs(request.job, tail):
                if pod_name not in labels:
                    pods = {objects.name_of(p): p for p in self._cluster.pods(request.job)}
                    labels[pod_name] = objects.pod_label(pods.get(pod_name, {"metadata": {}}))
                replica = labels[pod_name] or pod_name
                if request.replica is not None and replica != request.replica:
                    continue
                shown: str | None = next(cluster_logs.filtered([line], verbose), None)
                if line.startswith(describe.NOTE_PREFIX):
                    shown = f"(trainjob: {line[len(describe.NOTE_PREFIX) :]})"
                if shown is None:
                    continue
                yield view.log_line(replica, shown, len("worker-0"))
        except (ClusterError, objects.ShowError) as error:
            raise TrainJobError(str(error)) from error

    def delete(self, name: str) -> None:
        self._do(self._cluster.delete_job, name)


# ----- local runs -----
class LocalRun:
    """A TrainJob running on this machine under `trainjob run` (a child process)."""

    def __init__(self, name: str, run_dir: str, process: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.run_dir = run_dir
        self._process = process

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def status(self) -> dict[str, Any]:
        """status.json of the run (what `trainjob status` shows); {} before the first write."""
        return rundir.read_status_file(os.path.join(self.run_dir, plan.STATUS_FILE)) or {}

    def wait(self, timeout: float | None = None) -> Result:
        """Wait for `trainjob run` to end (at most `timeout` seconds); the Result says how the
        job ended, with the cause. A run that could not start raises TrainJobError."""
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return _result(self.name, self.status(), timed_out=True)
        data = self.status()
        if not data and code != cliutil.EXIT_OK:
            error = self._error_text()
            raise TrainJobError(f"trainjob run of {self.name} ended with {code}: {error}")
        return _result(self.name, data, timed_out=False)

    def _error_text(self) -> str:
        try:
            return Path(self.run_dir, "trainjob-run.err").read_text().strip() or "(no message)"
        except OSError as error:
            return str(error)

    def stop(self) -> Result:
        """Stop every replica (as Ctrl-C would); the checkpoint stays, a later run resumes."""
        if self.running:
            self._process.terminate()
        return self.wait()

    def logs(
        self, replica: str | None = None, *, follow: bool = False, verbose: bool = False
    ) -> Iterator[str]:
        """The replicas' log lines prefixed `worker-0 | `, TensorFlow's routine messages left
        out unless `verbose` (as for a cluster job; the files keep everything); `follow` goes
        on until the run ends."""
        log_dir = os.path.join(self.run_dir, plan.LOGS_DIR)
        offsets: dict[str, int] = {}
        while True:
            ended = not self.running
            names = [n for n in rundir.log_names(log_dir) if replica in (None, n[: -len(".log")])]
            for name in names:
                text, offsets[name] = rundir.read_from(
                    os.path.join(log_dir, name), offsets.get(name, 0), final=ended or not follow
                )
                for line in cluster_logs.filtered(text.splitlines(), verbose):
                    yield view.log_line(name[: -len(".log")], line, len("worker-0"))
            if not follow or ended:
                return
            time.sleep(LOCAL_POLL_SECONDS)


def run_local(
    job: Manifest | spec.TrainJob, *, run_dir: str | None = None, data_dir: str | None = None
) -> LocalRun:
    """Start `trainjob run` for the job (a YAML path, a dict or a parsed TrainJob) in the
    background; its checkpoints, logs and status go to `run_dir` (default
    ./trainjob-runs/<name>)."""
    body = load_manifest(job)
    name = objects.name_of(body)
    directory = os.path.abspath(run_dir or plan.default_run_dir(os.getcwd(), name))
    os.makedirs(directory, exist_ok=True)
    manifest = os.path.join(directory, "trainjob.yaml")
    with open(manifest, "w", encoding="utf-8") as handle:
        yaml.safe_dump(body, handle, sort_keys=False)
    argv = [sys.executable, "-m", "trainjob", "run", "-f", manifest, "--run-dir", directory]
    argv += ["--no-tty", "--quiet"] + (["--data-dir", data_dir] if data_dir else [])
    with open(os.path.join(directory, "trainjob-run.err"), "wb") as errors:
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=errors, stdin=subprocess.DEVNULL
        )
    return LocalRun(name, directory, process)
