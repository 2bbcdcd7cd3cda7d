"""Checkpoints on a real S3 server under the strategies that test_checkpoint_object_storage.py
leaves out (it covers MultiWorkerMirrored ``fit``): a custom training loop and ParameterServer
``fit``. Each is stopped by SIGTERM, saves at once, and the rerun resumes from the store alone
(a fresh staging dir: nothing local survives between the runs, as between two Pods).

DTensor: the runtime keeps no checkpoint of a DTensor job (its ``train_fn`` owns the loop, and
nothing is resumed), so with ``s3://`` it trains against the staging dir and what the runtime
writes there, the chief's TensorBoard scalars, reaches the store. Estimator refuses ``s3://``
(trainjob.core.storage.framework_problem; tested in test_estimator_legacy.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import training_harness as harness

from tests.controlplane import objectstore
from trainjob.core import constants
from trainjob.runtime import snapshots

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.S3Server]:
    with objectstore.s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def _start(
    tmp: Path,
    run: str,
    roles: dict[str, int],
    *,
    entrypoint: str,
    config: dict[str, Any],
    url: str,
    store: dict[str, str],
    strategy: str,
) -> tuple[dict[str, harness.Replica], Path]:
    cluster = harness.cluster_spec(roles) if sum(roles.values()) > 1 else {}
    progress = tmp / f"{run}.progress.jsonl"
    replicas = {}
    for role in ("ps", "worker", "chief"):  # servers first
        for i in range(roles.get(role, 0)):
            env = harness.replica_env(
                cluster,
                role,
                i,
                entrypoint=entrypoint,
                config=config,
                checkpoint_dir=Path("unused"),
                progress_file=progress,
                strategy=strategy,
            )
            env[constants.ENV_CHECKPOINT_DIR] = url
            if strategy == "DTensor":
                # What the executors render for DTensor, from the same cluster as TF_CONFIG.
                env[constants.ENV_DTENSOR_CLIENT_ID] = str(i)
                env[constants.ENV_DTENSOR_NUM_CLIENTS] = str(len(cluster[role]))
                env[constants.ENV_DTENSOR_JOB_NAME] = role
                env[constants.ENV_DTENSOR_JOBS] = ",".join(cluster[role])
            replicas[f"{role}-{i}"] = harness.start(f"{run}-{role}-{i}", {**env, **store}, tmp)
    return replicas, progress


def _steps(events: list[dict[str, Any]], replica: str) -> list[int]:
    return [e["step"] for e in harness.events_of(events, replica, "step")]


def _complete(s3: objectstore.S3Server, bucket: str, area: str) -> snapshots.Manifest:
    """The newest complete snapshot of ``area`` in the store, read from its marker."""
    listing = snapshots.read_listing(area, s3.keys(bucket, area + "/").items())
    assert listing.markers, f"no complete snapshot under {area}: {sorted(listing.files)}"
    newest = max(listing.markers)
    marker = s3.client().get_object(Bucket=bucket, Key=snapshots.marker_key(area, newest))
    manifest = snapshots.decode(marker["Body"].read())
    assert manifest is not None
    return manifest


def _sigterm_all(replicas: dict[str, harness.Replica], timeout: float) -> dict[str, int]:
    """Preemption of the whole job: every replica gets SIGTERM, as a node drain would do."""
    try:
        for replica in replicas.values():
            replica.signal(signal.SIGTERM)
        return harness.wait_exit(list(replicas.values()), timeout)
    finally:
        harness.stop_all(list(replicas.values()))


def test_a_custom_loop_saves_to_the_store_on_sigterm_and_resumes_at_that_step(
    tmp_path: Path, mnist_data_dir: Path, s3: objectstore.S3Server
) -> None:
    bucket = s3.make_bucket("ckpt-loop")
    url = f"s3://{bucket}/jobs/loop"
    config = {
        "epochs": 2,
        "steps_per_epoch": 10,
        "batch_size": 32,
        "data_dir": str(mnist_data_dir),
        "progress_every_steps": 1,
        "step_delay_ms": 20,
    }
    job: dict[str, Any] = {
        "entrypoint": "trainjob.samples.mnist_loop:build",
        "config": config,
        "url": url,
        "store": s3.env(),
        "strategy": "Auto",
    }
    first, progress1 = _start(tmp_path, "run1", {"worker": 1}, **job)
    harness.wait_until(
        lambda: any(s >= 13 for s in _steps(harness.read_events(progress1), "worker-0")),
        180,
        "worker-0 at step 13",
        list(first.values()),
    )
    codes = _sigterm_all(first, 60)
    assert codes == {"run1-worker-0": 143}, harness.dump_logs(list(first.values()))
    events1 = harness.read_events(progress1)
    (saved,) = [e for e in harness.events_of(events1, "worker-0", "checkpoint") if e.get("reason")]
    assert saved["step"] == max(_steps(events1, "worker-0")) >= 13
    assert saved["checkpoint"] == f"{url}/loop"
    # The save on SIGTERM reached the store, complete, before the replica exited.
    assert _complete(s3, bucket, "jobs/loop/loop").step == saved["step"]

    second, progress2 = _start(tmp_path, "run2", {"worker": 1}, **job)
    try:
        codes = harness.wait_exit(list(second.values()), 120)
    finally:
        harness.stop_all(list(second.values()))
    print("loop:", harness.report(list(first.values()) + list(second.values())))
    assert codes == {"run2-worker-0": 0}, harness.dump_logs(list(second.values()))
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "worker-0", "start")
    assert (start["initial_step"], start["initial_epoch"]) == (saved["step"], 1)
    assert _steps(events2, "worker-0") == list(range(saved["step"] + 1, 21))
    (end,) = harness.events_of(events2, "worker-0", "end")
    assert end["step"] == 20 and end["export"] == f"{url}/export"
    keys = s3.keys(bucket, "jobs/loop/")
    assert "jobs/loop/export/saved_model.pb" in keys and "jobs/loop/export.complete" in keys


def test_parameter_server_fit_saves_to_the_store_on_preemption_and_resumes(
    tmp_path: Path, mnist_data_dir: Path, s3: objectstore.S3Server
) -> None:
    bucket = s3.make_bucket("ckpt-ps")
    url = f"s3://{bucket}/jobs/ps"
    config = {
        "epochs": 3,
        "steps_per_epoch": 20,
        "batch_size": 64,
        "model": "mlp",
        "data_dir": str(mnist_data_dir),
        "progress_every_steps": 5,
        "step_delay_ms": 30,
    }
    roles = {"chief": 1, "ps": 1, "worker": 1}
    job: dict[str, Any] = {
        "entrypoint": "trainjob.samples.mnist:build",
        "config": config,
        "url": url,
        "store": s3.env(),
        "strategy": "ParameterServer",
    }
    first, progress1 = _start(tmp_path, "run1", roles, **job)
    harness.wait_until(
        lambda: [
            e
            for e in harness.events_of(harness.read_events(progress1), "chief-0", "step")
            if e["epoch"] >= 1
        ],
        180,
        "a step of epoch 1",
        list(first.values()),
    )
    codes = _sigterm_all(first, 40)
    print("ps run1:", harness.report(list(first.values())))
    assert set(codes.values()) == {143}, harness.dump_logs(list(first.values()))
    events1 = harness.read_events(progress1)
    saved = harness.events_of(events1, "chief-0", "checkpoint")
    assert saved and saved[-1].get("reason") == "preempted", saved
    assert saved[-1]["checkpoint"] == f"{url}/backup"
    done_epochs = [e["epoch"] for e in harness.events_of(events1, "chief-0", "epoch")]
    # Only the chief writes: ps and worker hold no checkpoint of their own.
    assert _complete(s3, bucket, "jobs/ps/backup").step == saved[-1]["step"]

    second, progress2 = _start(tmp_path, "run2", roles, **job)
    try:
        codes = harness.wait_exit([second["chief-0"]], 180)
    finally:
        harness.stop_all(list(second.values()))
    print("ps run2:", harness.report(list(second.values())))
    assert codes == {"run2-chief-0": 0}, harness.dump_logs(list(second.values()))
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "chief-0", "start")
    # The interrupted epoch is redone (its weights kept); completed epochs are not.
    assert start["initial_epoch"] == max(done_epochs) + 1
    assert start["initial_step"] > start["initial_epoch"] * 20, "the preemption save was lost"
    (end,) = harness.events_of(events2, "chief-0", "end")
    assert end["export"] == f"{url}/export"
    keys = s3.keys(bucket, "jobs/ps/")
    assert "jobs/ps/export/saved_model.pb" in keys
    assert any(k.startswith("jobs/ps/tensorboard/") for k in keys)


def test_dtensor_trains_with_an_s3_location_and_its_logs_reach_the_store(
    tmp_path: Path, mnist_data_dir: Path, s3: objectstore.S3Server
) -> None:
    bucket = s3.make_bucket("ckpt-dtensor")
    url = f"s3://{bucket}/jobs/dtensor"
    config = {
        "steps": 40,
        "batch_size": 64,
        "progress_every_steps": 10,
        "data_dir": str(mnist_data_dir),
    }
    replicas, progress = _start(
        tmp_path,
        "dt",
        {"worker": 2},
        entrypoint="trainjob.samples.mnist_dtensor:build",
        config=config,
        url=url,
        store=s3.env(),
        strategy="DTensor",
    )
    try:
        codes = harness.wait_exit(list(replicas.values()), 150)
    finally:
        harness.stop_all(list(replicas.values()))
    print("dtensor:", harness.report(list(replicas.values())))
    assert codes == {"dt-worker-0": 0, "dt-worker-1": 0}, harness.dump_logs(list(replicas.values()))
    (end,) = harness.events_of(harness.read_events(progress), "worker-0", "end")
    assert end["step"] == 40
    keys = s3.keys(bucket, "jobs/dtensor/")
    assert any(k.startswith("jobs/dtensor/tensorboard/") for k in keys), keys
    # No checkpoint of its own: nothing under the snapshot areas.
    assert not [k for k in keys if k.startswith(("jobs/dtensor/backup/", "jobs/dtensor/loop/"))]
