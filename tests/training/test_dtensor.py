"""Multi-client DTensor on 2 processes (TF 2.21, CPU): one data-parallel mesh over both."""

from __future__ import annotations

from pathlib import Path

import pytest
import training_harness as harness

from trainjob.core import constants

pytestmark = [pytest.mark.training, pytest.mark.timeout(240)]

STEPS = 60


def test_two_clients_train_one_mesh(tmp_path: Path, mnist_data_dir: Path) -> None:
    cluster = harness.cluster_spec({"worker": 2})
    progress = tmp_path / "progress.jsonl"
    config = {
        "steps": STEPS,
        "batch_size": 64,
        "progress_every_steps": 20,
        "data_dir": str(mnist_data_dir),
    }
    replicas = []
    for i in range(2):
        env = harness.replica_env(
            cluster,
            "worker",
            i,
            entrypoint="trainjob.samples.mnist_dtensor:build",
            config=config,
            checkpoint_dir=tmp_path / "ckpt",
            progress_file=progress,
            strategy="DTensor",
        )
        # What the executors render for DTensor, from the same cluster as TF_CONFIG.
        env.update(
            {
                constants.ENV_DTENSOR_CLIENT_ID: str(i),
                constants.ENV_DTENSOR_NUM_CLIENTS: "2",
                constants.ENV_DTENSOR_JOB_NAME: "worker",
                constants.ENV_DTENSOR_JOBS: ",".join(cluster["worker"]),
            }
        )
        replicas.append(harness.start(f"worker-{i}", env, tmp_path))
    try:
        codes = harness.wait_exit(replicas, 180)
    finally:
        harness.stop_all(replicas)
    print("dtensor:", harness.report(replicas))
    assert codes == {"worker-0": 0, "worker-1": 0}, harness.dump_logs(replicas)
    events = harness.read_events(progress)
    for name in ("worker-0", "worker-1"):
        (start,) = harness.events_of(events, name, "start")
        assert start["mesh_devices"] == 2, "the mesh must span both clients"
    ends = {name: harness.events_of(events, name, "end")[0] for name in ("worker-0", "worker-1")}
    assert ends["worker-0"]["step"] == STEPS and ends["worker-0"]["chief"]
    assert not ends["worker-1"]["chief"]
    # The loss is a mean over the global (sharded) batch: both clients see the same value.
    assert ends["worker-0"]["loss"] == pytest.approx(ends["worker-1"]["loss"], rel=1e-6)
    first = harness.events_of(events, "worker-0", "step")[0]["loss"]
    assert ends["worker-0"]["loss"] < first
