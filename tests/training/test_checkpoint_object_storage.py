"""Checkpoints on a real S3 server (versitygw, built from its Go module): a 2-worker
MultiWorkerMirrored ``fit`` uploads each checkpoint as a snapshot with its completion marker
last; the chief is killed while a snapshot uploads, and the restarted job resumes from the one
before it. A store that refuses ends the replica with one line and its own exit code."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import training_harness as harness

from tests.controlplane import objectstore
from trainjob.core import constants, policy
from trainjob.runtime import snapshots

pytestmark = [pytest.mark.training, pytest.mark.timeout(300)]

EPOCHS = 4
STEPS = 8
BALLAST_MB = 64


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.S3Server]:
    with objectstore.s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def _env(
    cluster: dict[str, list[str]],
    index: int,
    *,
    url: str,
    progress: Path,
    store: dict[str, str],
    data_dir: Path,
    ballast_mb: int,
    step_delay_ms: int,
) -> dict[str, str]:
    env = harness.replica_env(
        cluster,
        "worker",
        index,
        entrypoint="storage_entrypoints:with_ballast",
        config={
            "epochs": EPOCHS,
            "steps_per_epoch": STEPS,
            "batch_size": 32,
            "model": "mlp",
            "data_dir": str(data_dir),
            "progress_every_steps": 1,
            "ballast_mb": ballast_mb,
            "step_delay_ms": step_delay_ms,
        },
        checkpoint_dir=Path("unused"),
        progress_file=progress,
        strategy="MultiWorkerMirrored",
    )
    env[constants.ENV_CHECKPOINT_DIR] = url
    env["PYTHONPATH"] += f":{Path(__file__).resolve().parent}"
    return {**env, **store}


def _start(
    tmp: Path,
    run: str,
    url: str,
    store: dict[str, str],
    data_dir: Path,
    *,
    ballast_mb: int = BALLAST_MB,
    step_delay_ms: int = 0,
) -> tuple[list[harness.Replica], Path]:
    cluster = harness.cluster_spec({"worker": 2})
    progress = tmp / f"{run}.progress.jsonl"
    replicas = [
        harness.start(
            f"{run}-worker-{i}",
            _env(
                cluster,
                i,
                url=url,
                progress=progress,
                store=store,
                data_dir=data_dir,
                ballast_mb=ballast_mb,
                step_delay_ms=step_delay_ms,
            ),
            tmp,
        )
        for i in range(2)
    ]
    return replicas, progress


def _uploading(s3: objectstore.S3Server, bucket: str, area: str) -> int | None:
    """The number of a backup snapshot half uploaded right now, once an earlier one is
    complete: its index files are there (uploaded first), its data is not, nor its marker."""
    listing = snapshots.read_listing(area, s3.keys(bucket, area + "/").items())
    if not listing.markers:
        return None
    half = sorted(set(listing.files) - listing.markers)
    if not half or half[-1] < max(listing.markers):
        return None
    files = listing.files[half[-1]]
    has_index = any(p.endswith("/checkpoint") for p in files)
    return half[-1] if has_index and not any(".data-" in p for p in files) else None


def test_killed_during_an_upload_the_job_resumes_from_the_previous_complete_checkpoint(
    tmp_path: Path, mnist_data_dir: Path, s3: objectstore.S3Server
) -> None:
    bucket = s3.make_bucket("ckpt-kill")
    url = f"s3://{bucket}/jobs/mnist"
    area = "jobs/mnist/backup"
    first, progress1 = _start(tmp_path, "run1", url, s3.env(), mnist_data_dir)
    try:
        half = harness.wait_until(
            lambda: _uploading(s3, bucket, area), 150, "a snapshot half uploaded", first
        )
        first[0].kill()  # the chief, the one replica that uploads
        codes = harness.wait_exit(first, 60)
    finally:
        harness.stop_all(first)
    print("run1:", harness.report(first), "killed during snapshot", half)
    assert codes["run1-worker-0"] == -signal.SIGKILL
    assert policy.retryable_exit_code(codes["run1-worker-1"]), harness.dump_logs(first)
    listing = snapshots.read_listing(area, s3.keys(bucket, area + "/").items())
    # The killed upload never completed: its index is there, naming data that is not.
    assert half not in listing.markers
    assert any(p.endswith("/checkpoint") for p in listing.files[half])
    complete = max(listing.markers)
    assert complete < half
    marker = s3.client().get_object(Bucket=bucket, Key=snapshots.marker_key(area, complete))
    manifest = snapshots.decode(marker["Body"].read())
    assert manifest is not None and manifest.step is not None
    events1 = harness.read_events(progress1)
    uploaded = harness.events_of(events1, "worker-0", "checkpoint")
    assert uploaded and all(e["checkpoint"] == f"{url}/backup" for e in uploaded)

    second, progress2 = _start(tmp_path, "run2", url, s3.env(), mnist_data_dir)
    try:
        codes = harness.wait_exit(second, 150)
    finally:
        harness.stop_all(second)
    print("run2:", harness.report(second))
    assert codes == {"run2-worker-0": 0, "run2-worker-1": 0}, harness.dump_logs(second)
    events2 = harness.read_events(progress2)
    for replica in ("worker-0", "worker-1"):
        (start,) = harness.events_of(events2, replica, "start")
        # Both resumed where the last complete snapshot left off, not from the half one.
        assert start["initial_step"] == manifest.step, harness.dump_logs(second)
        assert start["initial_epoch"] == manifest.step // STEPS
    (end0,) = harness.events_of(events2, "worker-0", "end")
    assert end0["step"] == EPOCHS * STEPS
    assert end0["export"] == f"{url}/export"
    keys = s3.keys(bucket, "jobs/mnist/")
    assert "jobs/mnist/export/saved_model.pb" in keys
    assert "jobs/mnist/export.complete" in keys
    assert any(k.startswith("jobs/mnist/tensorboard/") for k in keys)
    # BackupAndRestore drops its backup once training completed: so does the store.
    assert not [k for k in keys if k.startswith(area + "/")]


def _one_replica(
    tmp: Path, name: str, url: str, store: dict[str, str], data_dir: Path
) -> tuple[int, str]:
    env = _env(
        {},
        0,
        url=url,
        progress=tmp / f"{name}.jsonl",
        store=store,
        data_dir=data_dir,
        ballast_mb=0,
        step_delay_ms=0,
    )
    env.pop(constants.ENV_TF_CONFIG, None)
    replica = harness.start(name, env, tmp)
    try:
        code = harness.wait_exit([replica], 150)[name]
    finally:
        harness.stop_all([replica])
    return code, replica.log


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("missing bucket", 7, "the bucket does not exist (NoSuchBucket)"),
        ("denied write", 7, "access denied"),
        ("wrong credentials", 7, "wrong credentials"),
        ("unreachable endpoint", 192, "is unreachable"),
        # The job's credentials Secret (its files) wins over the environment's keys.
        ("secret's reader keys", 7, "access denied"),
    ],
)
def test_a_store_that_refuses_ends_the_replica_with_one_line_and_its_exit_code(
    tmp_path: Path,
    mnist_data_dir: Path,
    s3: objectstore.S3Server,
    case: str,
    code: int,
    words: str,
) -> None:
    bucket = s3.make_bucket(f"ckpt-{case.split(maxsplit=1)[0].replace(chr(39), '')}")
    url = f"s3://{bucket}/job"
    store = s3.env()
    if case == "missing bucket":
        url = "s3://no-such-bucket/job"
    elif case == "denied write":
        store = s3.env(s3.reader)
    elif case == "secret's reader keys":
        mounted = tmp_path / "secret"
        mounted.mkdir()
        (mounted / "AWS_ACCESS_KEY_ID").write_text(s3.reader.access_key)
        (mounted / "AWS_SECRET_ACCESS_KEY").write_text(s3.reader.secret_key)
        store = {**store, constants.ENV_CHECKPOINT_CREDENTIALS_DIR: str(mounted)}
    elif case == "wrong credentials":
        store = {**store, "AWS_SECRET_ACCESS_KEY": "not-" + s3.admin.secret_key}
    else:
        from tests.support import ports

        store = {**store, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{ports.free_port()}"}
        store["TRAINJOB_S3_CONNECT_TIMEOUT"] = "2"
    exit_code, log = _one_replica(tmp_path, "worker-0", url, store, mnist_data_dir)
    assert exit_code == code, log
    lines = [line for line in log.splitlines() if line.strip()]
    assert words in lines[-1], log
    assert "Traceback" not in log
    for key in (s3.admin.secret_key, s3.reader.secret_key):
        assert key not in log
    assert "CheckpointStorageError" in lines[-1] or "StorageUnreachableError" in lines[-1]
    # Before TensorFlow was imported: nothing was trained, no progress was written.
    assert not (tmp_path / "worker-0.jsonl").exists() or "start" not in json.dumps(
        harness.read_events(tmp_path / "worker-0.jsonl")
    )


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.GcsServer]:
    with objectstore.fake_gcs(tmp_path_factory.mktemp("fake-gcs")) as server:
        yield server


def test_gs_checkpoints_through_tensorflows_own_gcs_filesystem_resume_after_a_kill(
    tmp_path: Path, mnist_data_dir: Path, gcs: objectstore.GcsServer
) -> None:
    """gs://: TensorFlow writes the backup, the logs and the export itself (no mirror)."""
    bucket = gcs.make_bucket("ckpt-gs")
    url = f"gs://{bucket}/jobs/mnist"
    store = gcs.env()
    first, progress1 = _start(
        tmp_path, "run1", url, store, mnist_data_dir, ballast_mb=0, step_delay_ms=150
    )
    try:
        harness.wait_until(
            lambda: [
                e
                for e in harness.events_of(harness.read_events(progress1), "worker-0", "epoch")
                if e["epoch"] >= 1
            ],
            150,
            "epoch 1 done",
            first,
        )
        first[1].kill()
        codes = harness.wait_exit(first, 60)
    finally:
        harness.stop_all(first)
    print("run1:", harness.report(first))
    assert policy.retryable_exit_code(codes["run1-worker-0"]), harness.dump_logs(first)
    backed_up = [
        e["epoch"]
        for e in harness.events_of(harness.read_events(progress1), "worker-0", "checkpoint")
    ]
    assert backed_up
    assert any(k.startswith("jobs/mnist/backup/") for k in gcs.keys(bucket))

    second, progress2 = _start(tmp_path, "run2", url, store, mnist_data_dir, ballast_mb=0)
    try:
        codes = harness.wait_exit(second, 150)
    finally:
        harness.stop_all(second)
    print("run2:", harness.report(second))
    assert codes == {"run2-worker-0": 0, "run2-worker-1": 0}, harness.dump_logs(second)
    events2 = harness.read_events(progress2)
    (start,) = harness.events_of(events2, "worker-0", "start")
    assert start["initial_epoch"] == max(backed_up) + 1
    (end0,) = harness.events_of(events2, "worker-0", "end")
    assert end0["export"] == f"{url}/export"
    keys = gcs.keys(bucket, "jobs/mnist/")
    assert "jobs/mnist/export/saved_model.pb" in keys
    assert any(k.startswith("jobs/mnist/tensorboard/") for k in keys)
    # Nothing written beside the store: the workers' scratch copies are gone from it too.
    assert not [k for k in keys if "/.tmp-" in k]


def test_gs_missing_bucket_ends_the_replica_with_one_line(
    tmp_path: Path, mnist_data_dir: Path, gcs: objectstore.GcsServer
) -> None:
    code, log = _one_replica(
        tmp_path, "worker-0", "gs://no-such-bucket/job", gcs.env(), mnist_data_dir
    )
    assert code == 7, log
    lines = [line for line in log.splitlines() if line.strip()]
    # The cause is the last line before the final progress event (stdout and stderr share it).
    causes = [line for line in lines if not line.startswith("TRAINJOB_PROGRESS ")]
    assert causes[-1] == (
        "CheckpointStorageError: cannot write gs://no-such-bucket/job: the bucket does not exist"
    ), log
    assert "Traceback" not in log
