"""A TFJob user's script: Kubeflow's `kubeflow-training` SDK driving TFJobs.

Run by the SDK's own interpreter (tests/controlplane/kubeflow_sdk.py: the SDK pins an older
kubernetes client than the project's), never imported by the tests: it imports nothing of this
repository. Prints one line, `RESULT <json>`, with what the SDK returned; the tests assert.

    python kubeflow_sdk_driver.py train-func NAME NAMESPACE IMAGE CHIEFS PSES WORKERS
        create_job(train_func=report_tf_config, ...), wait_for_job_conditions(Succeeded),
        get_job_pods(is_master=True), get_job_pod_names, get_job_logs(verbose=True), delete
    python kubeflow_sdk_driver.py queued NAME NAMESPACE IMAGE QUEUE WORKERS
        create_job(train_func=..., queue_name=QUEUE), then is_job_created within 60 s
KUBECONFIG names the cluster.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARKER = "SDK-TRAIN-FUNC"


def report_tf_config() -> None:
    """The SDK's train_func: runs in every replica; TensorFlow's own resolver reads TF_CONFIG.

    The SDK pastes this source into an unquoted bash here-document: no dollar sign, backquote
    or backslash may appear in it.
    """
    import json

    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    jobs = sorted(resolver.cluster_spec().as_dict())
    total = int(tf.reduce_sum(tf.range(10)).numpy())
    line = {"task": [resolver.task_type, resolver.task_id], "jobs": jobs, "sum": total}
    print("SDK-TRAIN-FUNC", json.dumps(line), flush=True)


def client(namespace: str) -> Any:
    from kubeflow.training import TrainingClient

    return TrainingClient(
        config_file=os.environ.get("KUBECONFIG"), namespace=namespace, job_kind="TFJob"
    )


def train_func(name: str, namespace: str, image: str, chiefs: int, pses: int, workers: int) -> Any:
    sdk = client(namespace)
    sdk.create_job(
        name=name,
        train_func=report_tf_config,
        num_chief_replicas=chiefs or None,
        num_ps_replicas=pses or None,
        num_workers=workers,
        base_image=image,
    )
    job = sdk.wait_for_job_conditions(
        name, expected_conditions={"Succeeded"}, wait_timeout=300, polling_interval=2
    )
    logs, events = sdk.get_job_logs(name, verbose=True)
    result = {
        "created": sdk.is_job_created(job=job),
        "failed": sdk.is_job_failed(job=job),
        "master_pods": [p.metadata.name for p in sdk.get_job_pods(name, is_master=True)],
        "pods": sorted(sdk.get_job_pod_names(name)),
        "logs": dict(logs),
        "events": {key: len(value) for key, value in events.items()},
    }
    sdk.delete_job(name)
    return result


def queued(name: str, namespace: str, image: str, queue: str, workers: int) -> Any:
    sdk = client(namespace)
    sdk.create_job(
        name=name,
        namespace=namespace,
        train_func=report_tf_config,
        base_image=image,
        num_workers=workers,
        queue_name=queue,
    )
    deadline = time.monotonic() + 60
    while not sdk.is_job_created(name, namespace=namespace):
        if time.monotonic() > deadline:
            return {"created": False}
        time.sleep(1)
    return {"created": True}


def main(argv: list[str]) -> int:
    mode, name, namespace, image, *rest = argv
    if mode == "train-func":
        chiefs, pses, workers = (int(x) for x in rest)
        result = train_func(name, namespace, image, chiefs, pses, workers)
    elif mode == "queued":
        queue, workers_text = rest
        result = queued(name, namespace, image, queue, int(workers_text))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
