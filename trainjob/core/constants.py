"""Names, labels, annotations and environment variable names shared by every part of TrainJob.

One module so that a newcomer finds every wire-level name in one place; the operator, the local
executor and the runtime all import from here.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "trainjob.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainJob"
PLURAL: Final = "trainjobs"

# Label and annotation keys carried by every child Pod and Service.
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_REPLICA_TYPE: Final = f"{GROUP}/replica-type"
LABEL_REPLICA_INDEX: Final = f"{GROUP}/replica-index"
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
LABEL_APP_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_APP_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_APP_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_APP_PART_OF: Final = "app.kubernetes.io/part-of"
APP_NAME: Final = "trainjob"
MANAGED_BY: Final = "trainjob-operator"
# The Kubernetes recommended labels: a child gets ours only when its template sets none of them
# (they describe one application together; a platform such as Polyaxon finds its Pods by them).
APP_LABEL_PREFIX: Final = "app.kubernetes.io/"

FINALIZER: Final = f"{GROUP}/finalizer"

# The container that runs TensorFlow and the port name that sets the TF_CONFIG port: the same
# names as Kubeflow's TFJob, so existing pod templates port unchanged.
DEFAULT_CONTAINER_NAME: Final = "tensorflow"
DEFAULT_PORT_NAME: Final = "tfjob-port"
DEFAULT_PORT: Final = 2222
DEFAULT_CLUSTER_DOMAIN: Final = ""  # empty: hosts end in ".svc", resolved by the search path

# Replica types, in the order TF_CONFIG lists them (sorted, as Go's encoding/json sorts map keys).
CHIEF: Final = "chief"
WORKER: Final = "worker"
PS: Final = "ps"
EVALUATOR: Final = "evaluator"
REPLICA_TYPES: Final = (CHIEF, EVALUATOR, PS, WORKER)

# Environment variables the executors set for the trainjob runtime.
ENV_TF_CONFIG: Final = "TF_CONFIG"
ENV_JOB_NAME: Final = "TRAINJOB_NAME"
ENV_NAMESPACE: Final = "TRAINJOB_NAMESPACE"
ENV_REPLICA_TYPE: Final = "TRAINJOB_REPLICA_TYPE"
ENV_REPLICA_INDEX: Final = "TRAINJOB_REPLICA_INDEX"
ENV_ENTRYPOINT: Final = "TRAINJOB_ENTRYPOINT"
ENV_STRATEGY: Final = "TRAINJOB_STRATEGY"
ENV_FRAMEWORK: Final = "TRAINJOB_FRAMEWORK"
ENV_CONFIG: Final = "TRAINJOB_CONFIG"
ENV_CHECKPOINT_DIR: Final = "TRAINJOB_CHECKPOINT_DIR"
ENV_PROGRESS_FILE: Final = "TRAINJOB_PROGRESS_FILE"
ENV_DATA_DIR: Final = "TRAINJOB_DATA_DIR"  # tfds data_dir (images bake MNIST into /data)
# Where a prepared offline MNIST leaves its tfds info, under a data dir (any version): how
# both `trainjob run` and `trainjob data` tell that it is there.
OFFLINE_MNIST_INFO: Final = ("mnist", "*", "dataset_info.json")
# How `trainjob data` starts the line that says why it failed: a local run quotes that line.
DATA_MESSAGE_PREFIX: Final = "trainjob data: "
# The fewest GPUs any chief/worker has, when every one has its own (the runtime picks NCCL).
ENV_WORKER_GPUS: Final = "TRAINJOB_WORKER_GPUS"
# "true" when replicas may share a GPU (local mode): the runtime turns on memory growth.
ENV_GPU_SHARED: Final = "TRAINJOB_GPU_SHARED"
GPU_RESOURCE: Final = "nvidia.com/gpu"
ENV_DTENSOR_CLIENT_ID: Final = "DTENSOR_CLIENT_ID"
ENV_DTENSOR_NUM_CLIENTS: Final = "DTENSOR_NUM_CLIENTS"
ENV_DTENSOR_JOB_NAME: Final = "DTENSOR_JOB_NAME"
ENV_DTENSOR_JOBS: Final = "DTENSOR_JOBS"
# Progress reporting to the operator (set in Pods when the operator serves progress reports).
ENV_PROGRESS_URL: Final = "TRAINJOB_PROGRESS_URL"
ENV_PROGRESS_TOKEN_FILE: Final = "TRAINJOB_PROGRESS_TOKEN_FILE"
ENV_PROGRESS_CA_FILE: Final = "TRAINJOB_PROGRESS_CA_FILE"
ENV_PROGRESS_INTERVAL: Final = "TRAINJOB_PROGRESS_INTERVAL"
ENV_TERMINATION_MESSAGE_PATH: Final = "TRAINJOB_TERMINATION_MESSAGE_PATH"

# The runtime's exit code for a training loss that became NaN or +/-Inf: permanent (1-127), and
# the policy names the job's failure by it (reason NonFiniteLoss). Here, not in the policy, so the
# runtime reads it without loading the policy engine.
EXIT_CODE_NON_FINITE_LOSS: Final = 6
# The runtime's exit codes for a checkpoint store that refused (no such bucket, access denied,
# credentials missing or wrong: permanent) and for one that could not be reached (>= 128:
# retryable). The policy names the job's failure by them, with what a user should check.
EXIT_CODE_CHECKPOINT_STORAGE: Final = 7
EXIT_CODE_STORAGE_UNREACHABLE: Final = 192

# Progress events the runtime prints on stdout, one JSON object per line after this prefix.
PROGRESS_LINE_PREFIX: Final = "TRAINJOB_PROGRESS "

CHECKPOINT_VOLUME_NAME: Final = "trainjob-checkpoint"
# spec.checkpoint.credentialsSecret, mounted read-only into every TensorFlow container: the
# runtime reads an object store's keys there (never in env, spec or status).
CHECKPOINT_CREDENTIALS_VOLUME_NAME: Final = "trainjob-checkpoint-credentials"
CHECKPOINT_CREDENTIALS_MOUNT_PATH: Final = "/var/run/secrets/trainjob.dev/checkpoint"
ENV_CHECKPOINT_CREDENTIALS_DIR: Final = "TRAINJOB_CHECKPOINT_CREDENTIALS_DIR"
# The projected volume with the progress token (audience: the job) and the operator's CA.
PROGRESS_VOLUME_NAME: Final = "trainjob-progress"
PROGRESS_MOUNT_PATH: Final = "/var/run/secrets/trainjob.dev/progress"
PROGRESS_TOKEN_FILE: Final = "token"
PROGRESS_CA_FILE: Final = "ca.crt"
# The CA bundle travels as a Pod annotation, projected into the volume by the downward API:
# no ConfigMap per namespace, so the operator needs no write access to ConfigMaps.
ANNOTATION_PROGRESS_CA: Final = f"{GROUP}/progress-ca"
# Token lifetime asked of the kubelet (it refreshes the file at 80% of it).
PROGRESS_TOKEN_SECONDS: Final = 3600
DEFAULT_TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
DEFAULT_CHECKPOINT_PATH: Final = "/checkpoints"
DEFAULT_RUNTIME_COMMAND: Final = ("python", "-m", "trainjob", "train")

# The attempt a Pod belongs to. The policy engine bumps a replica's attempt when it decides to
# restart it; a Pod of an older attempt is stale: deleted, and its exit never counted again.
ANNOTATION_ATTEMPT: Final = f"{GROUP}/attempt"

# What a replica template may not set: the labels every selector of ours selects by (Services,
# the NetworkPolicy, the operator's informer, the CLI) and the annotations the operator keeps
# its bookkeeping in. A template's other keys, under trainjob.dev/ too, are the user's.
RESERVED_TEMPLATE_LABELS: Final = (LABEL_JOB_NAME, LABEL_REPLICA_TYPE, LABEL_REPLICA_INDEX)
RESERVED_TEMPLATE_ANNOTATIONS: Final = (ANNOTATION_ATTEMPT, ANNOTATION_PROGRESS_CA)
