"""Plan a local run (pure): which process each replica is, with which environment and ports.

Local mode executes a TrainJob exactly as the operator would, with two substitutions: hosts are
``127.0.0.1:<free port>`` (ports chosen once per run by the executor and reused on every restart)
and the checkpoint volume is a directory under the run directory.

How a replica becomes a process:

- ``spec.runtime`` set (and the ``tensorflow`` container has no ``command``): the trainjob
  runtime, ``<python> -m trainjob train``, as in the runtime image.
- otherwise the ``tensorflow`` container's ``command`` followed by its ``args`` (Kubernetes
  semantics). There is no image locally, so a ``command`` is required; a first word ``python``
  or ``python3`` is replaced by the Python running ``trainjob`` (the virtualenv's), so scripts
  see the same packages. The process runs in the directory ``trainjob run`` was started from.
- the container's literal ``env`` entries (``name``/``value``) are passed; ``valueFrom`` entries
  cannot be resolved without a cluster and are reported as notes.
"""

from __future__ import annotations

import dataclasses
import os.path
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final

from trainjob.core import constants, naming, spec, storage, tfconfig
from trainjob.core.naming import ReplicaKey
from trainjob.local import gpus as gpus_mod
from trainjob.local import usernet

LOCAL_NAMESPACE: Final = "local"
LOGS_DIR: Final = "logs"
CHECKPOINTS_DIR: Final = "checkpoints"
PROGRESS_FILE: Final = "progress.jsonl"
STATUS_FILE: Final = "status.json"
DEFAULT_RUNS_DIR: Final = "trainjob-runs"
DEFAULT_GRACE_SECONDS: Final = 30.0
# Inherited variables that would confuse a replica about who it is.
_DROPPED_PREFIXES: Final = ("TRAINJOB_", "DTENSOR_")
_DROPPED: Final = frozenset({constants.ENV_TF_CONFIG})
# Quiet, CPU-friendly TensorFlow defaults; a user's own setting (environment or template) wins.
DEFAULT_TF_ENV: Final[Mapping[str, str]] = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "PYTHONUNBUFFERED": "1",
}
_PYTHON_NAMES: Final = frozenset({"python", "python3"})
# spec.networkIsolation's opt-out (trainjob.core.isolation.ISOLATION_NONE).
NETWORK_ISOLATION_NONE: Final = spec.NETWORK_ISOLATIONS[1]
# tensorflow-datasets' own variable for its default data_dir.
TFDS_DATA_DIR: Final = "TFDS_DATA_DIR"


class PlanError(ValueError):
    """A valid TrainJob that still cannot run locally (e.g. no command and no runtime)."""


@dataclasses.dataclass(frozen=True)
class ProcessPlan:
    key: ReplicaKey
    name: str  # <job>-<type>-<index>, the Pod name on a cluster
    argv: tuple[str, ...]
    # Only what the plan sets; the executor starts from the inherited environment minus
    # `dropped_env_names` and adds these.
    env: Mapping[str, str]
    port: int
    log_path: str
    grace_seconds: float

    @property
    def label(self) -> str:
        """`worker-0`: the runtime's replica name, used as the terminal prefix."""
        return naming.replica_label(self.key)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    job: spec.TrainJob
    run_dir: str
    checkpoint_dir: str
    log_dir: str
    progress_file: str
    status_file: str
    data_dir: str | None
    prepare_mnist: bool  # whether the offline MNIST must exist in data_dir (runtime jobs)
    processes: tuple[ProcessPlan, ...]
    notes: tuple[str, ...] = ()
    # Whether the replicas get a network of the run's own (trainjob.local.netns): a TensorFlow
    # server listens on every interface, and runs any graph it is sent.
    private_network: bool = True
    # This machine's loopback ports the replicas reach there (--expose-host-port, through pasta).
    exposed_host_ports: tuple[int, ...] = ()
    # GPUs shared out per process (trainjob.local.gpus); None: no GPU found, env untouched.
    gpus: gpus_mod.GpuPlan | None = None

    def process(self, key: ReplicaKey) -> ProcessPlan:
        for process in self.processes:
            if process.key == key:
                return process
        raise KeyError(key)


def default_run_dir(cwd: str, job_name: str) -> str:
    return os.path.join(cwd, DEFAULT_RUNS_DIR, job_name)


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment minus what would contradict a replica's identity."""
    return {
        key: value
        for key, value in environ.items()
        if key not in _DROPPED and not key.startswith(_DROPPED_PREFIXES)
    }


def uses_runtime(job: spec.TrainJob, replica_type: str) -> bool:
    container = spec.tf_container(job.replica_specs[replica_type].template)
    has_command = container is not None and bool(container.get("command"))
    return job.runtime is not None and not has_command


def replica_argv(job: spec.TrainJob, replica_type: str, python: str) -> tuple[str, ...]:
    """The command line of one replica type (see the module docstring)."""
    if uses_runtime(job, replica_type):
        return (python, "-m", "trainjob", "train")
    container = spec.tf_container(job.replica_specs[replica_type].template) or {}
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    if not command:
        raise PlanError(
            f"spec.replicaSpecs.{replica_type}: locally there is no image entrypoint to run; "
            "set spec.runtime or the tensorflow container's command"
        )
    if command[0] in _PYTHON_NAMES:
        command[0] = python
    return (*command, *args)


def container_env(job: spec.TrainJob, replica_type: str) -> tuple[dict[str, str], list[str]]:
    """Literal env entries of the tensorflow container, and notes about those skipped."""
    container = spec.tf_container(job.replica_specs[replica_type].template) or {}
    env: dict[str, str] = {}
    notes: list[str] = []
    for entry in container.get("env") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            notes.append(
                f"{replica_type}: env {entry['name']} uses valueFrom, which needs a cluster; "
                "not set locally"
            )
    return env, notes


def grace_seconds(job: spec.TrainJob, replica_type: str, default: float) -> float:
    pod_spec: Any = job.replica_specs[replica_type].template.get("spec") or {}
    value = pod_spec.get("terminationGracePeriodSeconds") if isinstance(pod_spec, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return default


def needs_mnist(job: spec.TrainJob) -> bool:
    """Local mode prepares the offline tfds `mnist` for every runtime entrypoint (the samples
    and a user's own `tfds.load("mnist")`, which would otherwise try to download for minutes)."""
    return job.runtime is not None and "data_dir" not in job.runtime.config


def make_plan(
    job: spec.TrainJob,
    *,
    ports: Mapping[ReplicaKey, int],
    run_dir: str,
    python: str,
    data_dir: str | None,
    python_path: str | None = None,
    default_grace_seconds: float = DEFAULT_GRACE_SECONDS,
    host_network: bool = False,
    expose_host_ports: Sequence[int] = (),
    gpu_plan: gpus_mod.GpuPlan | None = None,
) -> RunPlan:
    """Everything needed to start the job's processes; no process is started here.

    `ports` has one free port per replica (the executor finds them); `python_path` is prepended
    to PYTHONPATH so `-m trainjob` works without installing the package; `host_network`
    (`trainjob run --host-network`) runs the replicas on this machine's network, as
    `spec.networkIsolation: None` does; `expose_host_ports` (`--expose-host-port`) are this
    machine's loopback ports the replicas reach from the run's own network.
    """
    missing = [key for key in job.replica_keys() if key not in ports]
    if missing:
        raise PlanError(f"no port for {missing}")
    cluster = tfconfig.cluster_spec(job, tfconfig.local_host(ports))
    run_dir = os.path.abspath(run_dir)
    checkpoint_dir = os.path.join(run_dir, CHECKPOINTS_DIR)
    if job.checkpoint is not None and storage.is_url(job.checkpoint.path):
        # s3:// or gs://: the replicas write there themselves, with this shell's credentials
        # (the AWS and Google default chains read its environment and files).
        checkpoint_dir = job.checkpoint.path
    log_dir = os.path.join(run_dir, LOGS_DIR)
    progress_file = os.path.join(run_dir, PROGRESS_FILE)
    notes: list[str] = []
    if storage.is_url(checkpoint_dir) and not (
        host_network or job.network_isolation == NETWORK_ISOLATION_NONE
    ):
        notes.append(
            f"the replicas write their checkpoints to {checkpoint_dir} from the run's own "
            "network: a store they cannot reach from there fails the run at its start "
            "(--host-network runs them on this machine's)"
        )
    if job.checkpoint is not None and job.checkpoint.credentials_secret:
        notes.append(
            f"checkpoint credentialsSecret {job.checkpoint.credentials_secret} is a cluster's "
            "Secret: here the replicas use this shell's credentials"
        )
    if job.checkpoint is not None and job.checkpoint.claim_name:
        notes.append(
            f"checkpoint claim {job.checkpoint.claim_name} is replaced by {checkpoint_dir}"
        )
    private_network = not host_network and job.network_isolation != NETWORK_ISOLATION_NONE
    if not private_network:
        why = "--host-network" if host_network else "spec.networkIsolation: None"
        notes.append(
            f"the replicas use this machine's network ({why}): their TensorFlow ports listen "
            "on every interface, and whoever reaches one can run code as you"
        )
        if expose_host_ports:
            notes.append(
                f"--expose-host-port is not needed on this machine's network ({why}): every "
                "port of its loopback is reachable there"
            )
    taken = sorted(set(expose_host_ports) & set(ports.values()))
    if private_network and taken:
        raise PlanError(
            f"--expose-host-port {taken[0]} is also a replica's TensorFlow port; expose another"
        )
    processes: list[ProcessPlan] = []
    for rtype, index in job.replica_keys():
        env: dict[str, str] = dict(DEFAULT_TF_ENV)
        template_env, env_notes = container_env(job, rtype)
        if index == 0:
            notes.extend(env_notes)
        env.update(template_env)
        env.update(
            tfconfig.replica_env(job, cluster, rtype, index, LOCAL_NAMESPACE, checkpoint_dir)
        )
        env[constants.ENV_PROGRESS_FILE] = progress_file
        # The templates' nvidia.com/gpu mean nothing here: what counts is what this machine has.
        env.pop(constants.ENV_WORKER_GPUS, None)
        if gpu_plan is not None:
            # A CUDA_VISIBLE_DEVICES the template sets itself wins, as in its Pod.
            for key, value in gpu_plan.env((rtype, index)).items():
                if key not in template_env:
                    env[key] = value
        if data_dir is not None and job.runtime is not None:
            env[constants.ENV_DATA_DIR] = data_dir
        if data_dir is not None and TFDS_DATA_DIR not in template_env:
            # An unchanged tfds.load(...) in any replica (a script too) finds the offline data.
            env[TFDS_DATA_DIR] = data_dir
        if python_path:
            # The template's PYTHONPATH stays first, as in its Pod; ours makes -m trainjob work.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (template_env.get("PYTHONPATH"), python_path) if p
            )
        processes.append(
            ProcessPlan(
                key=(rtype, index),
                name=naming.child_name(job.name, rtype, index),
                argv=replica_argv(job, rtype, python),
                env=env,
                port=ports[(rtype, index)],
                log_path=os.path.join(log_dir, f"{rtype}-{index}.log"),
                grace_seconds=grace_seconds(job, rtype, default_grace_seconds),
            )
        )
    return RunPlan(
        job=job,
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        log_dir=log_dir,
        progress_file=progress_file,
        status_file=os.path.join(run_dir, STATUS_FILE),
        data_dir=data_dir,
        prepare_mnist=data_dir is not None and needs_mnist(job),
        processes=tuple(processes),
        notes=tuple(notes),
        private_network=private_network,
        exposed_host_ports=tuple(sorted(set(expose_host_ports))) if private_network else (),
        gpus=gpu_plan,
    )


def process_env(
    process: ProcessPlan, environ: Mapping[str, str], *, keep_python_path: bool = True
) -> dict[str, str]:
    """The full environment of one process: inherited, minus identity variables, plus the plan.

    Variables the user exported (e.g. TF_CPP_MIN_LOG_LEVEL) win over local-mode defaults, never
    over TF_CONFIG or TRAINJOB_* (those are dropped from the inherited environment)."""
    inherited = inherited_env(environ)
    env = dict(process.env)
    for key, value in inherited.items():
        if key in DEFAULT_TF_ENV:
            env[key] = value
    merged = {**inherited, **env}
    if keep_python_path and "PYTHONPATH" in process.env and environ.get("PYTHONPATH"):
        merged["PYTHONPATH"] = os.pathsep.join((process.env["PYTHONPATH"], environ["PYTHONPATH"]))
    return merged


def format_plan(plan: RunPlan) -> str:
    """What `trainjob run --dry-run` prints: processes, ports, environment (TF_CONFIG included)."""
    job = plan.job
    lines = [
        f"TrainJob {job.name}: {len(plan.processes)} process(es) on 127.0.0.1 (dry run: "
        "nothing started)",
        f"  run directory:  {plan.run_dir}",
        f"  checkpoints:    {plan.checkpoint_dir}  (TRAINJOB_CHECKPOINT_DIR)",
        f"  logs:           {plan.log_dir}/<type>-<index>.log",
        f"  progress:       {plan.progress_file}",
    ]
    if plan.data_dir is not None and job.runtime is not None:
        prepared = " (offline MNIST prepared there on first run)" if plan.prepare_mnist else ""
        lines.append(f"  data dir:       {plan.data_dir}{prepared}")
    policy = job.run_policy
    lines.append(
        f"  policy:         successPolicy={job.success_policy} backoffLimit={policy.backoff_limit}"
        f" cleanPodPolicy={policy.clean_pod_policy}"
        f" activeDeadlineSeconds={policy.active_deadline_seconds}"
        f" startupDeadlineSeconds={policy.startup_deadline_seconds}"
    )
    if plan.private_network:
        lines.append(f"  network:        {usernet.planned(plan.exposed_host_ports)}")
    if plan.gpus is not None:
        lines.append(
            f"  gpus:           from {plan.gpus.source}; processes that train share them "
            "round-robin, ps on the CPU (--gpus, --ps-on-gpu)"
        )
    lines.extend(f"  note: {note}" for note in plan.notes)
    for process in plan.processes:
        restart = job.replica_specs[process.key[0]].restart_policy
        lines.append("")
        lines.append(
            f"{process.label}  ({process.name})  port {process.port}  restartPolicy {restart}"
        )
        lines.append(f"  command: {shlex.join(process.argv)}")
        lines.append(f"  log:     {process.log_path}")
        if plan.gpus is not None:
            lines.append(f"  devices: {plan.gpus.describe(process.key)}")
        for key in sorted(process.env):
            lines.append(f"  {key}={process.env[key]}")
    return "\n".join(lines) + "\n"


def all_keys(plan: RunPlan) -> Sequence[ReplicaKey]:
    return [process.key for process in plan.processes]


# ----- checks made before a run starts -----
MAX_PROCESSES_PER_CORE: Final = 8
MIN_MAX_PROCESSES: Final = 16
TF_PROCESS_GB: Final = 0.6  # resident memory of one TensorFlow process, measured here


def too_many_processes(job: spec.TrainJob, limit: int | None, cpus: int) -> str | None:
    """Why a job has too many replicas for this machine, or None. Every replica is a process
    (a TensorFlow one takes ~0.6 GB and seconds of CPU to start), so 9,999 replicas on 2 cores
    would only thrash; `--max-processes` raises the limit for those who mean it."""
    count = job.total_replicas
    allowed = limit if limit is not None else max(MIN_MAX_PROCESSES, MAX_PROCESSES_PER_CORE * cpus)
    if count <= allowed:
        return None
    return (
        f"{count} replicas would be {count} local processes (~{count * TF_PROCESS_GB:,.0f} GB "
        f"for TensorFlow) on {cpus} CPU core(s); the limit here is {allowed}: lower the "
        f"replicas, or pass --max-processes {count} to run it anyway"
    )


def script_of(argv: Sequence[str], python: str) -> str | None:
    """The script file a command runs: `python [options] SCRIPT ...` or a path as the command;
    None for `python -c`, `python -m` and commands found on PATH."""
    if not argv:
        return None
    if argv[0] != python and os.path.basename(argv[0]) not in _PYTHON_NAMES:
        return argv[0] if "/" in argv[0] else None
    for arg in argv[1:]:
        if arg in ("-c", "-m") or arg.startswith(("-c", "-m")):
            return None
        if not arg.startswith("-"):
            return arg
    return None


def local_requirements(
    job: spec.TrainJob,
    *,
    python: str,
    modules: frozenset[str],
    tf_version: str | None,
    missing_scripts: Mapping[str, str],
) -> list[str]:
    """One line per thing this machine lacks to run the job, said before anything starts.

    `modules`: which of tensorflow / tensorflow_estimator the Python has (checked only when a
    replica runs the trainjob runtime); `missing_scripts`: replica type -> a script path its
    command runs that does not exist here."""
    problems: list[str] = []
    runtime_types = [rtype for rtype in job.replica_specs if uses_runtime(job, rtype)]
    if runtime_types and job.runtime is not None:
        if "tensorflow" not in modules:
            problems.append(
                f"spec.runtime needs TensorFlow, which {python} does not have; install it "
                "with: pip install 'trainjob[tf]' (or -e '.[tf]' in a checkout)"
            )
        elif job.runtime.framework == "Estimator" and "tensorflow_estimator" not in modules:
            problems.append(
                "spec.runtime.framework Estimator needs TensorFlow <= 2.15 with "
                f"tensorflow-estimator, and {python} has TensorFlow {tf_version or '?'} without "
                "it; build that environment once (in a checkout: bash "
                "tests/training/install_legacy.sh) and run ~/.cache/trainjob-tools/legacy-tf215/"
                "bin/trainjob run -f FILE"
            )
    by_script: dict[str, list[str]] = {}
    for rtype, script in missing_scripts.items():
        by_script.setdefault(script, []).append(rtype)
    for script, rtypes in by_script.items():
        container = spec.tf_container(job.replica_specs[rtypes[0]].template) or {}
        image = container.get("image") or job.image
        source = f" (it would come from the image {image})" if image else ""
        problems.append(
            f"spec.replicaSpecs.{'/'.join(rtypes)}: the command runs {script}, which does not "
            f"exist on this machine{source}; point the command at a local script to run it here"
        )
    return problems


def rerun_refusal(
    job: spec.TrainJob, previous: Mapping[str, Any] | None, run_dir: str
) -> str | None:
    """The word said before a Succeeded job is run again in the same run dir, or None."""
    if not previous or previous.get("state") != "Succeeded":
        return None
    when = previous.get("completionTime") or "earlier"
    return (
        f"TrainJob {job.name} already Succeeded in {run_dir} ({when}); running it again "
        "trains again from its last checkpoint and overwrites its exported model. "
        "Add --rerun to do that, or give another --run-dir"
    )
