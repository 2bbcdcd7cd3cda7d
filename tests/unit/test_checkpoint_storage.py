"""Checkpoints on object storage, the pure parts: the URL rules, the snapshot keys and markers,
and which snapshot a restarted replica restores (never a half-uploaded one)."""

from __future__ import annotations

import pytest

from trainjob.core import spec, storage
from trainjob.runtime import objectstore, snapshots
from trainjob.runtime.exitcodes import (
    CheckpointStorageError,
    FailureKind,
    StorageUnreachableError,
    classify_exception,
    exit_code,
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("s3://ckpt/team-a/mnist", storage.StoreURL("s3", "ckpt", "team-a/mnist")),
        ("s3://ckpt", storage.StoreURL("s3", "ckpt", "")),
        ("s3://ckpt/", storage.StoreURL("s3", "ckpt", "")),
        ("gs://my_bucket/a/b/", storage.StoreURL("gs", "my_bucket", "a/b")),
    ],
)
def test_urls_parse_into_bucket_and_prefix(path: str, expected: storage.StoreURL) -> None:
    assert storage.parse(path) == expected


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("hdfs://nn/ckpt", "scheme 'hdfs' is not supported"),
        ("az://c/ckpt", "scheme 'az' is not supported"),
        ("s3:///prefix", "names no bucket"),
        ("s3://My_Bucket/x", "not a valid s3:// bucket name"),
        ("s3://ab/x", "not a valid s3:// bucket name"),
        ("gs://b-1/x//y", "empty, '.' or '..' segment"),
        ("s3://bucket/../x", "empty, '.' or '..' segment"),
    ],
)
def test_urls_the_runtime_cannot_write_are_refused_saying_why(path: str, words: str) -> None:
    with pytest.raises(storage.InvalidStoreURL, match=words.replace(".", r"\.")):
        storage.parse(path)
    assert words in (storage.problem(path) or "")


def test_paths_are_not_urls() -> None:
    assert storage.problem("/checkpoints") is None
    assert not storage.is_url("/checkpoints")
    assert storage.is_url("s3://b/x")


def test_keys_and_urls_under_the_prefix() -> None:
    url = storage.parse("s3://ckpt/jobs/mnist/")
    assert url.key("backup") == "jobs/mnist/backup"
    assert url.url("export") == "s3://ckpt/jobs/mnist/export"
    assert url.url() == "s3://ckpt/jobs/mnist"
    assert storage.parse("s3://ckpt").key("backup") == "backup"


def _job(path: str, claim: str | None = None) -> dict[str, object]:
    checkpoint: dict[str, str] = {"path": path}
    if claim:
        checkpoint["claimName"] = claim
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "m"},
        "spec": {
            "image": "trainjob:dev",
            "runtime": {"entrypoint": "trainjob.samples.mnist:build"},
            "replicaSpecs": {"worker": {"replicas": 2}},
            "checkpoint": checkpoint,
        },
    }


def test_the_spec_accepts_store_urls_and_names_the_field_of_a_bad_one() -> None:
    assert spec.parse(_job("s3://ckpt/mnist")).checkpoint is not None
    with pytest.raises(spec.SpecError) as bad:
        spec.parse(_job("hdfs://nn/ckpt"))
    assert "spec.checkpoint.path" in str(bad.value)
    assert "scheme 'hdfs' is not supported" in str(bad.value)
    with pytest.raises(spec.SpecError, match="absolute path when claimName"):
        spec.parse(_job("s3://ckpt/mnist", claim="shared"))


def test_estimator_is_refused_s3_with_a_message_naming_the_field() -> None:
    """Estimator's evaluator reads new checkpoints while training runs: a staging dir
    downloaded once at start cannot give them (storage.framework_problem)."""
    manifest = _job("s3://ckpt/mnist")
    manifest["spec"]["runtime"]["framework"] = "Estimator"  # type: ignore[index]
    with pytest.raises(spec.SpecError) as bad:
        spec.parse(manifest)
    assert str(bad.value).count("spec.checkpoint.path") == 1
    assert "s3:// does not work with framework Estimator" in str(bad.value)
    assert "claimName" in str(bad.value)
    on_volume = _job("/checkpoints", claim="shared")
    on_volume["spec"]["runtime"]["framework"] = "Estimator"  # type: ignore[index]
    assert spec.parse(on_volume).checkpoint is not None
    assert storage.framework_problem("s3://ckpt/x", "Keras") is None
    assert storage.framework_problem("gs://ckpt/x", "Estimator") is None
    assert storage.framework_problem("/checkpoints", "Estimator") is None


AREA = "jobs/m/backup"


def _objects(*snapshots_: tuple[int, dict[str, int], bool]) -> list[tuple[str, int]]:
    """Objects of snapshots given as (number, files, marker written)."""
    found: list[tuple[str, int]] = [("jobs/m/backup-other/x", 1), ("jobs/m/export/model", 9)]
    for number, files, marked in snapshots_:
        found += [(snapshots.data_key(AREA, number, p), s) for p, s in files.items()]
        if marked:
            found.append((snapshots.marker_key(AREA, number), 120))
    return found


FILES = {"chief/checkpoint": 97, "chief/ckpt-3.index": 300, "chief/ckpt-3.data-00000-of-00001": 9}


def _manifests(*numbers: int) -> dict[int, snapshots.Manifest | None]:
    return {n: snapshots.Manifest(number=n, files=FILES, step=n * 100) for n in numbers}


def test_the_newest_complete_snapshot_is_restored() -> None:
    listing = snapshots.read_listing(AREA, _objects((6, FILES, True), (7, FILES, True)))
    assert snapshots.newest_complete(listing, _manifests(6, 7)) == 7
    assert snapshots.next_number(listing) == 8


def test_a_half_uploaded_snapshot_is_never_restored() -> None:
    # Killed during the upload of 8: two of its files are there, its marker is not.
    half = dict(list(FILES.items())[:2])
    listing = snapshots.read_listing(AREA, _objects((7, FILES, True), (8, half, False)))
    assert snapshots.candidates(listing) == [7]
    assert snapshots.newest_complete(listing, _manifests(7)) == 7
    # ... and the next snapshot never reuses its number.
    assert snapshots.next_number(listing) == 9


def test_a_marker_whose_files_are_missing_or_differ_is_not_complete() -> None:
    shorter = {**FILES, "chief/ckpt-3.data-00000-of-00001": 8}
    listing = snapshots.read_listing(AREA, _objects((6, FILES, True), (7, shorter, True)))
    assert snapshots.newest_complete(listing, _manifests(6, 7)) == 6
    # A marker naming another snapshot, or one that is not a manifest, is not trusted.
    wrong = {6: snapshots.Manifest(number=5, files=FILES), 7: None}
    assert snapshots.newest_complete(listing, wrong) is None


def test_no_snapshot_means_a_fresh_start() -> None:
    listing = snapshots.read_listing(AREA, _objects())
    assert snapshots.newest_complete(listing, {}) is None
    assert snapshots.next_number(listing) == 1


def test_manifests_round_trip_and_garbage_is_rejected() -> None:
    manifest = snapshots.Manifest(number=4, files=FILES, step=400)
    assert snapshots.decode(snapshots.encode(manifest)) == manifest
    for raw in (
        b"",
        b"{",
        b"[]",
        b'{"format": 2, "number": 1, "files": {"a": 1}}',
        b'{"format": 1, "number": 1, "files": {}}',
        b'{"format": 1, "number": 1, "files": {"a": -1}}',
    ):
        assert snapshots.decode(raw) is None


def test_old_and_half_snapshots_are_pruned_but_never_newer_ones() -> None:
    listing = snapshots.read_listing(
        AREA,
        _objects(
            (3, FILES, True),
            (4, FILES, False),
            (5, FILES, True),
            (6, FILES, True),
            (9, FILES, False),
        ),
    )
    assert snapshots.stale(listing, 6) == [3, 4]
    assert snapshots.stale(listing, 6, keep=1) == [3, 4, 5]


def test_the_data_is_uploaded_after_the_index_files() -> None:
    files = {**FILES, "chief/ckpt-3.data-00000-of-00001": 64 << 20}
    order = snapshots.upload_order(files)
    assert order[-1] == "chief/ckpt-3.data-00000-of-00001"
    assert set(order) == set(files)


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        ("NoSuchBucket", 404, "the bucket does not exist"),
        ("AccessDenied", 403, "access denied"),
        ("InvalidAccessKeyId", 403, "wrong credentials"),
        ("SignatureDoesNotMatch", 403, "wrong credentials"),
        ("Weird", 403, "access denied (Weird)"),
        ("Weird", 500, "Weird (HTTP 500)"),
    ],
)
def test_store_errors_read_as_causes(code: str, status: int, words: str) -> None:
    assert words in objectstore.s3_cause(code, status)


def test_store_failures_have_their_own_exit_codes() -> None:
    refused = CheckpointStorageError("cannot write s3://b/x: access denied (AccessDenied)")
    gone = StorageUnreachableError("cannot list s3://b/x: the endpoint is unreachable")
    assert classify_exception(refused, default=FailureKind.USER_CODE_ERROR) is (
        FailureKind.CHECKPOINT_STORAGE
    )
    assert exit_code(FailureKind.CHECKPOINT_STORAGE) == 7  # permanent: not retried
    assert classify_exception(gone, default=FailureKind.USER_CODE_ERROR) is (
        FailureKind.STORAGE_UNREACHABLE
    )
    assert exit_code(FailureKind.STORAGE_UNREACHABLE) == 192  # retryable under ExitCode


def _with_secret(path: str, secret: str) -> dict[str, object]:
    job = _job(path)
    checkpoint = job["spec"]["checkpoint"]  # type: ignore[index]
    checkpoint["credentialsSecret"] = secret
    return job


def test_the_credentials_secret_is_mounted_never_copied() -> None:
    from trainjob.core import constants, render

    job = spec.parse(_with_secret("s3://ckpt/mnist", "store-keys"))
    options = render.RenderOptions(namespace="team-a")
    pod = render.render_pod(job, "worker", 1, 0, options, None)
    (volume,) = [v for v in pod["spec"]["volumes"] if v["secret"]["secretName"] == "store-keys"]
    (container,) = pod["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount == {
        "name": constants.CHECKPOINT_CREDENTIALS_VOLUME_NAME,
        "mountPath": constants.CHECKPOINT_CREDENTIALS_MOUNT_PATH,
        "readOnly": True,
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[constants.ENV_CHECKPOINT_CREDENTIALS_DIR] == mount["mountPath"]
    assert env[constants.ENV_CHECKPOINT_DIR] == "s3://ckpt/mnist"
    assert not [e for e in container["env"] if "valueFrom" in e or e["name"].startswith("AWS_")]


@pytest.mark.parametrize(
    ("path", "secret", "words"),
    [
        ("/checkpoints", "store-keys", "is only for an s3:// or gs:// path"),
        ("s3://ckpt/x", "Store_Keys", "is not a valid Secret name"),
    ],
)
def test_a_credentials_secret_where_none_can_be_used_is_refused(
    path: str, secret: str, words: str
) -> None:
    with pytest.raises(spec.SpecError) as bad:
        spec.parse(_with_secret(path, secret))
    assert "spec.checkpoint.credentialsSecret" in str(bad.value)
    assert words in str(bad.value)


def test_the_runtime_reads_keys_from_the_mounted_secret(tmp_path: object) -> None:
    from pathlib import Path

    directory = Path(str(tmp_path))
    (directory / "AWS_ACCESS_KEY_ID").write_text("AKIDEXAMPLE\n")
    (directory / "AWS_SECRET_ACCESS_KEY").write_text("s3cr3t\n")
    (directory / "credentials.json").write_text("{}")
    assert objectstore.read_credentials_dir(str(directory)) == {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    }
    env = {objectstore.ENV_CREDENTIALS_DIR: str(directory)}
    assert objectstore.google_credentials(env) == str(directory / "credentials.json")
    assert objectstore.read_credentials_dir(str(directory / "missing")) == {}
    assert objectstore.google_credentials({}) is None
