"""Parse and validate what the executors hand a replica (env vars) into :class:`RuntimeSettings`.

Pure: every function takes a mapping (``os.environ`` at the edge) and returns plain data or
raises :class:`~trainjob.runtime.exitcodes.ConfigError` with a message naming the variable.
Decisions about the cluster (who is chief, which strategy ``Auto`` means, what a task does) are
small functions of that data so that they are unit-tested without TensorFlow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from trainjob.core import constants
from trainjob.runtime import devices
from trainjob.runtime.exitcodes import ConfigError

# Canonical strategy names (TRAINJOB_STRATEGY is matched case-insensitively).
AUTO: Final = "Auto"
MULTI_WORKER_MIRRORED: Final = "MultiWorkerMirrored"
PARAMETER_SERVER: Final = "ParameterServer"
MIRRORED: Final = "Mirrored"
ONE_DEVICE: Final = "OneDevice"
DTENSOR: Final = "DTensor"
STRATEGIES: Final = (AUTO, MULTI_WORKER_MIRRORED, PARAMETER_SERVER, MIRRORED, ONE_DEVICE, DTENSOR)
# What Auto can resolve to besides the above: TPUStrategy, or TF's default (no-op) strategy.
TPU: Final = "TPU"
DEFAULT: Final = "Default"

KERAS: Final = "Keras"
ESTIMATOR: Final = "Estimator"
FRAMEWORKS: Final = (KERAS, ESTIMATOR)

# What a task does: run training (chief/worker of all-reduce jobs, PS coordinator), serve
# variables/steps for a PS coordinator until stopped, or evaluate checkpoints.
ROLE_TRAIN: Final = "train"
ROLE_SERVE: Final = "serve"
ROLE_EVALUATE: Final = "evaluate"

ENV_DATA_DIR: Final = constants.ENV_DATA_DIR
# Config key (spec.runtime.config) that turns off stopping at a NaN/Inf training loss.
STOP_ON_NONFINITE_LOSS: Final = "stop_on_nonfinite_loss"


@dataclass(frozen=True)
class DTensorSettings:
    client_id: int
    num_clients: int
    job_name: str
    jobs: tuple[str, ...]


@dataclass(frozen=True)
class RuntimeSettings:
    entrypoint: str
    strategy: str
    framework: str
    config: Mapping[str, Any]
    task_type: str
    task_index: int
    cluster: Mapping[str, tuple[str, ...]]
    checkpoint_dir: str | None = None
    progress_file: str | None = None
    job_name: str = ""
    namespace: str = ""
    data_dir: str | None = None
    dtensor: DTensorSettings | None = None

    @property
    def replica(self) -> str:
        return f"{self.task_type}-{self.task_index}"

    @property
    def is_chief(self) -> bool:
        return is_chief(self.cluster, self.task_type, self.task_index)

    @property
    def num_workers(self) -> int:
        return num_training_workers(self.cluster)


def canonical_choice(value: str, choices: tuple[str, ...], variable: str) -> str:
    for choice in choices:
        if choice.lower() == value.strip().lower():
            return choice
    raise ConfigError(f"{variable}={value!r} is not one of {', '.join(choices)}")


def parse_json_object(text: str, variable: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{variable} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{variable} must be a JSON object, got {type(value).__name__}")
    return value


def parse_cluster(tf_config: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    cluster = tf_config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError("TF_CONFIG.cluster must be a non-empty object of role -> [host:port]")
    parsed: dict[str, tuple[str, ...]] = {}
    for role, hosts in cluster.items():
        if role not in constants.REPLICA_TYPES:
            raise ConfigError(f"TF_CONFIG.cluster has unknown role {role!r}")
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            raise ConfigError(f"TF_CONFIG.cluster.{role} must be a list of host:port strings")
        parsed[role] = tuple(hosts)
    return parsed


def parse_task(
    tf_config: Mapping[str, Any], cluster: Mapping[str, tuple[str, ...]]
) -> tuple[str, int]:
    task = tf_config.get("task")
    if not isinstance(task, dict):
        raise ConfigError("TF_CONFIG.task must be an object with type and index")
    task_type, index = task.get("type"), task.get("index", 0)
    if not isinstance(task_type, str) or task_type not in cluster:
        raise ConfigError(f"TF_CONFIG.task.type {task_type!r} is not a role of TF_CONFIG.cluster")
    if (
        not isinstance(index, int)
        or isinstance(index, bool)
        or not (0 <= index < len(cluster[task_type]))
    ):
        raise ConfigError(
            f"TF_CONFIG.task.index {index!r} is out of range for {len(cluster[task_type])} "
            f"{task_type} task(s)"
        )
    return task_type, index


def parse_dtensor(env: Mapping[str, str]) -> DTensorSettings:
    missing = [
        name
        for name in (
            constants.ENV_DTENSOR_CLIENT_ID,
            constants.ENV_DTENSOR_NUM_CLIENTS,
            constants.ENV_DTENSOR_JOB_NAME,
            constants.ENV_DTENSOR_JOBS,
        )
        if not env.get(name)
    ]
    if missing:
        raise ConfigError(f"strategy DTensor needs {', '.join(missing)}")
    try:
        client_id = int(env[constants.ENV_DTENSOR_CLIENT_ID])
        num_clients = int(env[constants.ENV_DTENSOR_NUM_CLIENTS])
    except ValueError as exc:
        raise ConfigError(f"DTENSOR_CLIENT_ID/DTENSOR_NUM_CLIENTS must be integers: {exc}") from exc
    jobs = tuple(j for j in env[constants.ENV_DTENSOR_JOBS].split(",") if j)
    if len(jobs) != num_clients or not 0 <= client_id < num_clients:
        raise ConfigError(
            f"DTENSOR_JOBS lists {len(jobs)} host(s) for DTENSOR_NUM_CLIENTS={num_clients} and "
            f"DTENSOR_CLIENT_ID={client_id}"
        )
    return DTensorSettings(client_id, num_clients, env[constants.ENV_DTENSOR_JOB_NAME], jobs)


def from_env(env: Mapping[str, str]) -> RuntimeSettings:
    """Read the runtime's settings from the executor's env (pure; ``env`` is passed in)."""
    entrypoint = env.get(constants.ENV_ENTRYPOINT, "").strip()
    if not entrypoint:
        raise ConfigError(f"{constants.ENV_ENTRYPOINT} is not set (expected 'pkg.module:function')")
    validate_entrypoint(entrypoint)
    strategy = canonical_choice(
        env.get(constants.ENV_STRATEGY, AUTO) or AUTO, STRATEGIES, constants.ENV_STRATEGY
    )
    framework = canonical_choice(
        env.get(constants.ENV_FRAMEWORK, KERAS) or KERAS, FRAMEWORKS, constants.ENV_FRAMEWORK
    )
    config = parse_json_object(env.get(constants.ENV_CONFIG) or "{}", constants.ENV_CONFIG)

    raw_tf_config = env.get(constants.ENV_TF_CONFIG, "").strip()
    if raw_tf_config:
        tf_config = parse_json_object(raw_tf_config, constants.ENV_TF_CONFIG)
        cluster = parse_cluster(tf_config)
        task_type, task_index = parse_task(tf_config, cluster)
    else:
        # Kubeflow sets no TF_CONFIG for a one-replica job: it is a lone worker.
        cluster, task_type, task_index = {}, constants.WORKER, 0
    validate_replica_env(env, task_type, task_index)

    dtensor = parse_dtensor(env) if strategy == DTENSOR else None
    data_dir = config.get("data_dir") or env.get(ENV_DATA_DIR) or None
    if data_dir is not None and not isinstance(data_dir, str):
        raise ConfigError("config key data_dir must be a string")
    stop_on_nonfinite_loss(config)  # a typo'd value fails here, before TensorFlow starts
    devices.validate(config)
    settings = RuntimeSettings(
        entrypoint=entrypoint,
        strategy=strategy,
        framework=framework,
        config=config,
        task_type=task_type,
        task_index=task_index,
        cluster=cluster,
        checkpoint_dir=env.get(constants.ENV_CHECKPOINT_DIR) or None,
        progress_file=env.get(constants.ENV_PROGRESS_FILE) or None,
        job_name=env.get(constants.ENV_JOB_NAME, ""),
        namespace=env.get(constants.ENV_NAMESPACE, ""),
        data_dir=data_dir,
        dtensor=dtensor,
    )
    validate_strategy(settings)
    return settings


def stop_on_nonfinite_loss(config: Mapping[str, Any]) -> bool:
    """Whether a NaN/Inf training loss stops the replica (exit code 6); on unless the config
    says ``stop_on_nonfinite_loss: false`` (a model that recovers by itself, e.g. with loss
    scaling that skips such steps)."""
    value = config.get(STOP_ON_NONFINITE_LOSS, True)
    if not isinstance(value, bool):
        raise ConfigError(
            f"config key {STOP_ON_NONFINITE_LOSS} must be true or false, got {value!r}"
        )
    return value


def validate_entrypoint(entrypoint: str) -> None:
    module, sep, function = entrypoint.partition(":")
    if (
        not sep
        or not module
        or not function
        or not all(part.isidentifier() for part in [*module.split("."), *function.split(".")])
    ):
        raise ConfigError(
            f"{constants.ENV_ENTRYPOINT}={entrypoint!r} must look like 'pkg.module:function'"
        )


def validate_replica_env(env: Mapping[str, str], task_type: str, task_index: int) -> None:
    """TRAINJOB_REPLICA_TYPE/INDEX are informative but must not contradict TF_CONFIG."""
    declared_type = env.get(constants.ENV_REPLICA_TYPE)
    declared_index = env.get(constants.ENV_REPLICA_INDEX)
    if declared_type and declared_type.lower() != task_type:
        raise ConfigError(
            f"{constants.ENV_REPLICA_TYPE}={declared_type!r} contradicts TF_CONFIG task "
            f"{task_type!r}"
        )
    if declared_index and declared_index != str(task_index):
        raise ConfigError(
            f"{constants.ENV_REPLICA_INDEX}={declared_index!r} contradicts TF_CONFIG index "
            f"{task_index}"
        )


def is_chief(cluster: Mapping[str, tuple[str, ...]], task_type: str, task_index: int) -> bool:
    """The chief, or worker 0 when the cluster has no chief (TF's and Kubeflow's rule)."""
    if task_type == constants.CHIEF:
        return True
    return task_type == constants.WORKER and task_index == 0 and not cluster.get(constants.CHIEF)


def num_training_workers(cluster: Mapping[str, tuple[str, ...]]) -> int:
    """Tasks holding a model replica in an all-reduce job (chief + workers); 1 with no cluster."""
    return max(1, len(cluster.get(constants.CHIEF, ())) + len(cluster.get(constants.WORKER, ())))


def resolve_strategy(
    requested: str,
    cluster: Mapping[str, tuple[str, ...]],
    *,
    num_gpus: int,
    has_tpu: bool,
) -> str:
    """What ``Auto`` means here: TPU > a TF_CONFIG cluster > several GPUs > one GPU > default."""
    if requested != AUTO:
        return requested
    if has_tpu:
        return TPU
    if cluster.get(constants.PS):
        return PARAMETER_SERVER
    if num_training_workers(cluster) > 1:
        return MULTI_WORKER_MIRRORED
    if num_gpus > 1:
        return MIRRORED
    if num_gpus == 1:
        return ONE_DEVICE
    return DEFAULT


def validate_strategy(settings: RuntimeSettings) -> None:
    """Combinations of strategy, framework and cluster that can never work."""
    cluster, strategy = settings.cluster, settings.strategy
    if strategy == PARAMETER_SERVER:
        if not cluster.get(constants.PS) or not cluster.get(constants.CHIEF):
            raise ConfigError("strategy ParameterServer needs a chief and at least one ps task")
        if not cluster.get(constants.WORKER):
            raise ConfigError("strategy ParameterServer needs at least one worker task")
    if strategy in (MULTI_WORKER_MIRRORED, MIRRORED, ONE_DEVICE) and cluster.get(constants.PS):
        raise ConfigError(f"strategy {strategy} cannot use ps tasks; use ParameterServer")
    if strategy in (MIRRORED, ONE_DEVICE) and num_training_workers(cluster) > 1:
        raise ConfigError(
            f"strategy {strategy} runs on one machine; use MultiWorkerMirrored for "
            f"{num_training_workers(cluster)} workers"
        )
    if settings.framework == ESTIMATOR and strategy in (PARAMETER_SERVER, DTENSOR):
        raise ConfigError(f"framework Estimator does not support strategy {strategy} here")


def task_role(strategy: str, task_type: str) -> str:
    """What a task does under a (resolved) strategy (pure)."""
    if task_type == constants.EVALUATOR:
        return ROLE_EVALUATE
    if strategy == PARAMETER_SERVER and task_type in (constants.WORKER, constants.PS):
        return ROLE_SERVE
    if task_type == constants.PS:
        # A ps task in a job whose strategy does not use it still only serves variables.
        return ROLE_SERVE
    return ROLE_TRAIN
