"""What configures the trainjob runtime: the keys of ``spec.runtime.config`` it reads itself
(the rest are the entrypoint's own), and the environment variables it reads or sets.

The names are the constants the runtime reads them by where it has one (``devices``,
``settings``, ``constants.ENV_*``); this registry says what each means. The reference page
docs/content/reference/runtime.md is generated from it, and tests/unit/test_docs_reference.py
fails when the runtime reads a config key or an environment variable that is not listed here.
Pure data: importing it imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Final, Literal

from trainjob.core import constants
from trainjob.runtime import devices, settings

# spec.runtime.config keys that are read by their literal name in the runtime's modules.
BATCH_SIZE: Final = "batch_size"
DATA_DIR: Final = "data_dir"
PROGRESS_EVERY_STEPS: Final = "progress_every_steps"
TENSORBOARD: Final = "tensorboard"
SERVER_STOP_DELAY_SECONDS: Final = "server_stop_delay_seconds"
PREEMPTION_GRACE_SECONDS: Final = "preemption_grace_seconds"
STEPS_PER_EPOCH: Final = "steps_per_epoch"
COLLECTIVE_TIMEOUT_SECONDS: Final = "collective_timeout_seconds"


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    name: str
    kind: str  # as a user writes it in YAML: integer, number, boolean, string, one of ...
    default: str  # as the runtime applies it, in words ("" when unset means "not used")
    meaning: str


CONFIG_KEYS: Final[tuple[ConfigKey, ...]] = (
    ConfigKey(
        BATCH_SIZE,
        "integer",
        "64",
        "The global batch (over all replicas in sync); `ctx.global_batch_size` and "
        "`ctx.per_replica_batch_size()` of the build context.",
    ),
    ConfigKey(
        STEPS_PER_EPOCH,
        "integer",
        "unset",
        "Steps of an epoch, for progress totals until the runner learns them (required by "
        "Keras under ParameterServer).",
    ),
    ConfigKey(
        DATA_DIR,
        "string",
        f"${constants.ENV_DATA_DIR}",
        "tensorflow-datasets' data_dir (set as TFDS_DATA_DIR before TensorFlow is imported), "
        "so an unchanged `tfds.load(name)` reads offline data.",
    ),
    ConfigKey(
        PROGRESS_EVERY_STEPS,
        "integer",
        "100 (Keras), 50 (Estimator), the loop's own default (custom loops)",
        "Steps between two progress reports (plus one at each epoch's end and at the end).",
    ),
    ConfigKey(
        TENSORBOARD,
        "boolean",
        "true",
        "The chief writes TensorBoard logs under the checkpoint directory; false: none.",
    ),
    ConfigKey(
        settings.STOP_ON_NONFINITE_LOSS,
        "boolean",
        "true",
        "A training loss that becomes NaN or Inf stops the replica with exit code 6; false "
        "for a model that recovers by itself (e.g. loss scaling that skips such steps).",
    ),
    ConfigKey(
        devices.LOSS_CHECK,
        f"one of {', '.join(devices.LOSS_CHECKS)}",
        devices.AUTO,
        "When the loss is checked for NaN/Inf: every step, or only at progress reports (a "
        "check every step costs a device-to-host copy on GPUs); auto picks.",
    ),
    ConfigKey(
        COLLECTIVE_TIMEOUT_SECONDS,
        "number",
        "unset",
        "MultiWorkerMirrored: a bound on each collective, so a hung peer becomes a retryable "
        "timeout (exit code 191) instead of a silent wait.",
    ),
    ConfigKey(
        devices.COLLECTIVE_IMPLEMENTATION,
        f"one of {', '.join(devices.COLLECTIVES)}",
        devices.AUTO,
        "MultiWorkerMirrored's all-reduce: NCCL when every worker has its own GPU, else ring; "
        "or forced.",
    ),
    ConfigKey(
        devices.GPU_MEMORY_GROWTH,
        "one of auto, true, false",
        devices.AUTO,
        "TensorFlow's GPU memory growth (TF_FORCE_GPU_ALLOW_GROWTH); auto: on when replicas "
        "share a GPU (local mode).",
    ),
    ConfigKey(
        devices.ALLOW_CPU_FALLBACK,
        "boolean",
        "false",
        "A replica that asked for GPUs but sees none trains on its CPU instead of failing "
        "(exit code 4).",
    ),
    ConfigKey(
        PREEMPTION_GRACE_SECONDS,
        "number",
        "20",
        "After SIGTERM, how long the replica may take to save a checkpoint before it exits 143.",
    ),
    ConfigKey(
        SERVER_STOP_DELAY_SECONDS,
        "number",
        "3",
        "Keras: how long a ps or worker that only serves waits, once told to stop, before it "
        "exits.",
    ),
)

Direction = Literal["read", "set"]


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    direction: Direction  # read by the runtime, or set by it (for TensorFlow and libraries)
    meaning: str


ENVIRONMENT: Final[tuple[Variable, ...]] = (
    Variable(
        constants.ENV_TF_CONFIG,
        "read",
        "The cluster and this task, as Kubeflow renders it; unset for a one-replica job (a "
        "lone worker).",
    ),
    Variable(constants.ENV_ENTRYPOINT, "read", "spec.runtime.entrypoint: pkg.module:function."),
    Variable(constants.ENV_STRATEGY, "read", "spec.runtime.strategy (default Auto)."),
    Variable(constants.ENV_FRAMEWORK, "read", "spec.runtime.framework (default Keras)."),
    Variable(constants.ENV_CONFIG, "read", "spec.runtime.config as a JSON object."),
    Variable(constants.ENV_JOB_NAME, "read", "The TrainJob's name."),
    Variable(constants.ENV_NAMESPACE, "read", "The TrainJob's namespace."),
    Variable(constants.ENV_REPLICA_TYPE, "read", "This replica's type; checked against TF_CONFIG."),
    Variable(
        constants.ENV_REPLICA_INDEX, "read", "This replica's index; checked against TF_CONFIG."
    ),
    Variable(
        constants.ENV_CHECKPOINT_DIR,
        "read",
        "spec.checkpoint.path: a directory, s3://bucket/prefix or gs://bucket/prefix.",
    ),
    Variable(
        constants.ENV_CHECKPOINT_CREDENTIALS_DIR,
        "read",
        "Where spec.checkpoint.credentialsSecret is mounted: AWS keys or credentials.json.",
    ),
    Variable(
        constants.ENV_PROGRESS_FILE,
        "read",
        "Local mode: the file progress events are appended to.",
    ),
    Variable(
        constants.ENV_DATA_DIR, "read", "tensorflow-datasets' data_dir (config data_dir wins)."
    ),
    Variable(
        constants.ENV_WORKER_GPUS,
        "read",
        "The fewest GPUs any chief or worker has, when each has its own (picks NCCL).",
    ),
    Variable(constants.ENV_GPU_SHARED, "read", "true when replicas share a GPU (local mode)."),
    Variable(constants.ENV_DTENSOR_CLIENT_ID, "read", "DTensor: this client's index."),
    Variable(constants.ENV_DTENSOR_NUM_CLIENTS, "read", "DTensor: the number of clients."),
    Variable(constants.ENV_DTENSOR_JOB_NAME, "read", "DTensor: the job name of the clients."),
    Variable(constants.ENV_DTENSOR_JOBS, "read", "DTensor: every client's host:port."),
    Variable(constants.ENV_PROGRESS_URL, "read", "The operator's progress endpoint (HTTPS)."),
    Variable(
        constants.ENV_PROGRESS_TOKEN_FILE, "read", "The projected token progress reports carry."
    ),
    Variable(
        constants.ENV_PROGRESS_CA_FILE, "read", "The operator's CA for the progress endpoint."
    ),
    Variable(constants.ENV_PROGRESS_INTERVAL, "read", "Seconds between progress reports, at most."),
    Variable(
        constants.ENV_TERMINATION_MESSAGE_PATH,
        "read",
        "Where the replica's last words go (default /dev/termination-log).",
    ),
    Variable("TRAINJOB_S3_CONNECT_TIMEOUT", "read", "s3://: seconds to connect to the store (10)."),
    Variable("AWS_REGION", "read", "s3://: the bucket's region (else AWS_DEFAULT_REGION)."),
    Variable("AWS_DEFAULT_REGION", "read", "s3://: the region when AWS_REGION is unset."),
    Variable("TPU_NAME", "read", "Strategy Auto: a TPU is attached (TPUStrategy is built)."),
    Variable(
        "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
        "read",
        "Strategy Auto: a TPU is attached (set by GKE).",
    ),
    Variable(devices.CUDA_VISIBLE_DEVICES, "read", "The GPUs this process may use."),
    Variable(
        devices.NVIDIA_VISIBLE_DEVICES,
        "read",
        "The GPUs the NVIDIA device plugin gave the container.",
    ),
    Variable("TF_USE_LEGACY_KERAS", "set", "1 for framework Keras (tf-keras is `tf.keras`)."),
    Variable("TF_CPP_MIN_LOG_LEVEL", "set", "2: TensorFlow's routine C++ logs are quiet."),
    Variable(
        "GOOGLE_APPLICATION_CREDENTIALS",
        "set",
        "gs://: the credentials.json of spec.checkpoint.credentialsSecret.",
    ),
    Variable("TFDS_DATA_DIR", "set", "The data_dir (config data_dir or TRAINJOB_DATA_DIR)."),
    Variable(
        "GRPC_FAIL_FAST",
        "set",
        "use_caller in ParameterServer jobs: a lost worker or ps is an error, not a retry forever.",
    ),
    Variable(devices.TF_FORCE_GPU_ALLOW_GROWTH, "set", "true when gpu_memory_growth is on."),
)
