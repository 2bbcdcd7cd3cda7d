"""Checkpoints on object storage: the runtime's one module that talks to a store.

``gs://``: TensorFlow's own GCS filesystem writes there directly; this module only checks,
before training, that the location can be written (:func:`check_tensorflow_location`), so a
missing bucket or a refused write ends the replica with one line instead of a traceback at the
first checkpoint.

``s3://``: TensorFlow 2.21 has no S3 filesystem, so the replica trains against a local staging
directory and a :class:`Mirror` copies it to and from the bucket: at start it downloads the
newest *complete* snapshot of each checkpoint area (:mod:`trainjob.runtime.snapshots`), after
each checkpoint the chief uploads the area as a new snapshot (files first, marker last), and at
the end it uploads the exported model and the TensorBoard logs.

Credentials are the client's own default chain (boto3: environment, web identity for IRSA, EKS
Pod Identity, shared files, instance metadata) unless the job names a Secret, whose keys are
then read from its mounted files (:data:`CREDENTIALS_FILES`). The endpoint of an S3-compatible
store comes from the standard ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``. No credential
is ever logged, emitted or written into an error line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

from trainjob.core import constants, storage
from trainjob.runtime import layout, snapshots
from trainjob.runtime.exitcodes import CheckpointStorageError, StorageUnreachableError

log = logging.getLogger(__name__)

T = TypeVar("T")

# The checkpoint areas the runtime writes (layout), each mirrored as numbered snapshots.
AREAS: Final = (layout.BACKUP, layout.LOOP, layout.ESTIMATOR)
ENDPOINT_ENV: Final = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# Where the job's credentials Secret is mounted (the executors set it), and the keys read there.
ENV_CREDENTIALS_DIR: Final = constants.ENV_CHECKPOINT_CREDENTIALS_DIR
CREDENTIALS_FILES: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
GOOGLE_KEY_FILE: Final = "credentials.json"
PROBE: Final = ".trainjob-probe"
EXPORT_MARKER: Final = f"{layout.EXPORT}{snapshots.MARKER_SUFFIX}"

# S3 error codes -> what they mean for the job, in words a user acts on.
_S3_CAUSES: Final[Mapping[str, str]] = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "access denied (the credentials in use may not do this here)",
    "AllAccessDisabled": "access to the bucket is disabled",
    "InvalidAccessKeyId": "the access key ID is not known to the store (wrong credentials)",
    "SignatureDoesNotMatch": "the secret access key does not match the access key ID "
    "(wrong credentials)",
    "InvalidToken": "the session token is invalid (wrong credentials)",
    "ExpiredToken": "the session token has expired",
    "TokenRefreshRequired": "the session token has expired",
    "InvalidBucketName": "the bucket name is not valid for this store",
    "PermanentRedirect": "the bucket is in another region (set AWS_REGION to its region)",
    "AuthorizationHeaderMalformed": "the request's region is wrong for this bucket "
    "(set AWS_REGION to its region)",
}


# curl's words in TensorFlow's GCS errors for a store it could not reach.
_UNREACHABLE_MARKERS: Final = (
    "Could not connect",
    "Could not resolve",
    "Timeout was reached",
    "Connection refused",
)


def s3_cause(code: str, status: int | None) -> str:
    """The words for an S3 error code (pure); unknown codes keep their own name."""
    if code in _S3_CAUSES:
        return f"{_S3_CAUSES[code]} ({code})"
    if status == 403:
        return f"access denied ({code or 'HTTP 403'})"
    if status == 404:
        return f"not found ({code or 'HTTP 404'})"
    return f"{code or 'error'} (HTTP {status})" if status else code or "error"


def endpoint(env: Mapping[str, str]) -> str | None:
    """The S3-compatible store's endpoint override, if any (the standard variables)."""
    return next((env[name] for name in ENDPOINT_ENV if env.get(name)), None)


def read_credentials_dir(directory: str | None) -> dict[str, str]:
    """The AWS keys of a mounted credentials Secret (empty without one)."""
    found: dict[str, str] = {}
    if not directory or not os.path.isdir(directory):
        return found
    for name in CREDENTIALS_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                found[name] = handle.read().strip()
    return found


class S3Store:
    """The few S3 calls the mirror needs, each turning the client's errors into one line."""

    def __init__(self, url: storage.StoreURL, env: Mapping[str, str]) -> None:
        try:
            import boto3  # type: ignore[import-untyped]
            from botocore.config import Config  # type: ignore[import-untyped]
        except ImportError:
            raise CheckpointStorageError(
                f"cannot open {url.url()}: s3:// needs boto3 (pip install 'trainjob[s3]'; the "
                "trainjob image has it)"
            ) from None

        self.url = url
        self.endpoint = endpoint(env)
        keys = read_credentials_dir(env.get(ENV_CREDENTIALS_DIR))
        session = boto3.session.Session(
            aws_access_key_id=keys.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=keys.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=keys.get("AWS_SESSION_TOKEN"),
        )
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        config = Config(
            # Bounded: an unreachable endpoint fails in seconds, not after minutes of retries.
            connect_timeout=float(env.get("TRAINJOB_S3_CONNECT_TIMEOUT", "10")),
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            # S3-compatible stores (MinIO, Ceph, SeaweedFS) are addressed by path; AWS by host.
            s3={"addressing_style": "path" if self.endpoint else "auto"},
        )
        self.client: Any = session.client(
            "s3",
            region_name=region or ("us-east-1" if self.endpoint else None),
            endpoint_url=self.endpoint,
            config=config,
        )

    def _call(self, doing: str, key: str, call: Callable[[], T]) -> T:
        from botocore import exceptions as bexc  # type: ignore[import-untyped]

        where = f"s3://{self.url.bucket}/{key}".rstrip("/")
        try:
            return call()
        except bexc.NoCredentialsError:
            raise CheckpointStorageError(
                f"cannot {doing} {where}: no AWS credentials found (environment, web identity, "
                "shared files, instance metadata or the job's credentials Secret)"
            ) from None
        except (bexc.EndpointConnectionError, bexc.ConnectTimeoutError) as exc:
            raise StorageUnreachableError(
                f"cannot {doing} {where}: the endpoint {self.endpoint or 'of S3'} is unreachable "
                f"({type(exc).__name__})"
            ) from None
        except (bexc.ReadTimeoutError, bexc.ConnectionClosedError) as exc:
            raise StorageUnreachableError(
                f"cannot {doing} {where}: the endpoint stopped answering ({type(exc).__name__})"
            ) from None
        except bexc.ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(error.get("Code", ""))
            if code == "NoSuchBucket" or (code in ("404", "NotFound") and not key):
                text = s3_cause("NoSuchBucket", 404)
            else:
                text = s3_cause(code, status)
            raise CheckpointStorageError(f"cannot {doing} {where}: {text}") from None
        except bexc.BotoCoreError as exc:
            raise CheckpointStorageError(f"cannot {doing} {where}: {type(exc).__name__}") from None

    def list_keys(self, key_prefix: str) -> list[tuple[str, int]]:
        def run() -> list[tuple[str, int]]:
            found: list[tuple[str, int]] = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=f"{key_prefix}/" if key_prefix else ""
            )
            for page in pages:
                found.extend((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
            return found

        return self._call("list", key_prefix, run)

    def read(self, key: str) -> bytes:
        def run() -> bytes:
            body: bytes = self.client.get_object(Bucket=self.url.bucket, Key=key)["Body"].read()
            return body

        return self._call("read", key, run)

    def download(self, key: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._call("read", key, lambda: self.client.download_file(self.url.bucket, key, path))

    def upload(self, path: str, key: str) -> None:
        self._call("write", key, lambda: self.client.upload_file(path, self.url.bucket, key))

    def write(self, key: str, data: bytes) -> None:
        self._call(
            "write", key, lambda: self.client.put_object(Bucket=self.url.bucket, Key=key, Body=data)
        )

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self._call(
                "delete",
                keys[start],
                lambda batch=batch: self.client.delete_objects(  # type: ignore[misc]
                    Bucket=self.url.bucket, Delete={"Objects": batch, "Quiet": True}
                ),
            )

    def check_readable(self) -> None:
        """One listing call: a GET, whose error names its cause (a HEAD's has no body)."""
        self._call(
            "read",
            self.url.key(),
            lambda: self.client.list_objects_v2(
                Bucket=self.url.bucket, Prefix=self.url.key(), MaxKeys=1
            ),
        )


def _files(directory: str) -> dict[str, int]:
    """Every file under ``directory`` (relative path -> size)."""
    found: dict[str, int] = {}
    for root, _dirs, names in os.walk(directory):
        for file_name in names:
            path = os.path.join(root, file_name)
            found[os.path.relpath(path, directory).replace(os.sep, "/")] = os.path.getsize(path)
    return found


def _signature(directory: str) -> tuple[tuple[str, int, int], ...]:
    """What changes when TensorFlow writes a checkpoint into ``directory``."""
    rows = []
    for relative in _files(directory):
        stat = os.stat(os.path.join(directory, relative))
        rows.append((relative, stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(rows))


class Mirror:
    """A local staging directory mirrored to ``s3://bucket/prefix`` (see the module doc).

    ``writer``: the chief, the one replica that uploads (every replica restores)."""

    def __init__(self, store: S3Store, staging: str, *, writer: bool) -> None:
        self.store = store
        self.url = store.url
        self.staging = staging
        self.writer = writer
        self._next: dict[str, int] = {}
        self._published: dict[str, tuple[tuple[str, int, int], ...]] = {}
        self._remote_areas: set[str] = set()
        self._board: dict[str, tuple[int, int]] = {}

    def _area_key(self, area: str) -> str:
        return self.url.key(area)

    def restore(self) -> dict[str, int | None]:
        """Download the newest complete snapshot of every area into the staging directory;
        return which snapshot each area had (``None``: none complete)."""
        restored: dict[str, int | None] = {}
        for area in AREAS:
            area_key = self._area_key(area)
            listing = snapshots.read_listing(area_key, self.store.list_keys(area_key))
            self._next[area] = snapshots.next_number(listing)
            if not listing.numbers():
                continue
            self._remote_areas.add(area)
            manifests: dict[int, snapshots.Manifest | None] = {}
            chosen = None
            for number in snapshots.candidates(listing):
                raw = self.store.read(snapshots.marker_key(area_key, number))
                manifests[number] = snapshots.decode(raw)
                if snapshots.complete(listing, manifests[number], number):
                    chosen = number
                    break
            restored[area] = chosen
            if chosen is None:
                continue
            manifest = manifests[chosen]
            assert manifest is not None
            target = os.path.join(self.staging, area)
            for relative in manifest.files:
                self.store.download(
                    snapshots.data_key(area_key, chosen, relative),
                    os.path.join(target, *relative.split("/")),
                )
            self._published[area] = _signature(target)
            log.info(
                "Restored %s from snapshot %s (step %s)",
                self.url.url(area),
                snapshots.name(chosen),
                manifest.step,
            )
        return restored

    def check_writable(self) -> None:
        """List, then write and delete a small object: a missing bucket or a refused write
        ends the replica before training (some stores create a bucket on a first write)."""
        self.store.check_readable()
        key = self.url.key(PROBE)
        self.store.write(key, b"trainjob checks that it may write here\n")
        self.store.delete([key])

    def publish(self, step: int | None = None) -> str:
        """Upload every area that changed since its last snapshot as a new snapshot (the chief
        only; others return at once). Returns where the checkpoint now is."""
        where = self.url.url()
        if not self.writer:
            return where
        for area in AREAS:
            local = os.path.join(self.staging, area)
            if not os.path.isdir(local):
                continue
            signature = _signature(local)
            if not signature or signature == self._published.get(area):
                continue
            number = self._upload_snapshot(area, local, step)
            self._published[area] = signature
            where = self.url.url(area)
            log.info("Uploaded checkpoint %s/%s", where, snapshots.name(number))
        self.sync_tensorboard()
        return where

    def _upload_snapshot(self, area: str, local: str, step: int | None) -> int:
        area_key = self._area_key(area)
        number = self._next.get(area, 1)
        self._next[area] = number + 1
        # Hard links freeze this checkpoint's files: TensorFlow may replace them (its
        # `checkpoint` index is renamed into place) while they upload.
        with tempfile.TemporaryDirectory(dir=self.staging, prefix=".upload-") as frozen:
            files = _freeze(local, frozen)
            for relative in snapshots.upload_order(files):
                self.store.upload(
                    os.path.join(frozen, *relative.split("/")),
                    snapshots.data_key(area_key, number, relative),
                )
            manifest = snapshots.local_manifest(number, files, step)
            self.store.write(snapshots.marker_key(area_key, number), snapshots.encode(manifest))
        self._remote_areas.add(area)
        self._prune(area_key, number)
        return number

    def _prune(self, area_key: str, newest: int) -> None:
        listing = snapshots.read_listing(area_key, self.store.list_keys(area_key))
        old = snapshots.stale(listing, newest)
        if not old:
            return
        # Markers first: a snapshot half deleted is never taken for a complete one.
        self.store.delete([snapshots.marker_key(area_key, n) for n in old if n in listing.markers])
        self.store.delete(
            [
                snapshots.data_key(area_key, n, relative)
                for n in old
                for relative in listing.files.get(n, {})
            ]
        )

    def sync_tensorboard(self) -> None:
        """Upload TensorBoard files that grew (event files only ever grow; each upload replaces
        the object whole, so a reader sees one complete version or the other)."""
        local = os.path.join(self.staging, layout.TENSORBOARD)
        if not self.writer or not os.path.isdir(local):
            return
        for relative in sorted(_files(local)):
            stat = os.stat(os.path.join(local, relative))
            state = (stat.st_size, stat.st_mtime_ns)
            if self._board.get(relative) == state:
                continue
            self.store.upload(
                os.path.join(local, relative), self.url.key(layout.TENSORBOARD, relative)
            )
            self._board[relative] = state

    def finish(self) -> None:
        """Training ended well: upload the exported model and the logs; drop the snapshots of
        areas the runtime removed itself (tf-keras deletes its backup after ``fit``)."""
        if not self.writer:
            return
        self.publish()
        for area in AREAS:
            local = os.path.join(self.staging, area)
            if area in self._remote_areas and not (os.path.isdir(local) and _files(local)):
                area_key = self._area_key(area)
                listing = snapshots.read_listing(area_key, self.store.list_keys(area_key))
                self.store.delete(
                    [snapshots.marker_key(area_key, n) for n in sorted(listing.markers)]
                )
                self.store.delete([k for k, _ in self.store.list_keys(area_key)])
        export = os.path.join(self.staging, layout.EXPORT)
        if os.path.exists(export):
            self._upload_export(export)

    def _upload_export(self, export: str) -> None:
        marker = self.url.key(EXPORT_MARKER)
        export_key = self.url.key(layout.EXPORT)
        # The marker goes first and comes back last: a reader never takes a mix of two models.
        self.store.delete([marker])
        self.store.delete([k for k, _ in self.store.list_keys(export_key)])
        files = _files(export) if os.path.isdir(export) else {}
        for relative in sorted(files):
            self.store.upload(
                os.path.join(export, *relative.split("/")), f"{export_key}/{relative}"
            )
        if os.path.isfile(export):  # never: export/ is a directory; kept for a single file
            self.store.upload(export, export_key)
        self.store.write(marker, snapshots.encode(snapshots.local_manifest(0, files, None)))

    def remote(self, local_path: str | None) -> str | None:
        """The store's URL of a path under the staging directory (events name the store)."""
        if not local_path:
            return local_path
        relative = os.path.relpath(local_path, self.staging)
        if relative.startswith(".."):
            return local_path
        return self.url.url(*relative.split(os.sep)) if relative != "." else self.url.url()

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _freeze(local: str, frozen: str) -> dict[str, int]:
    files = _files(local)
    for relative in files:
        source = os.path.join(local, *relative.split("/"))
        target = os.path.join(frozen, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    return files


def open_mirror(url: storage.StoreURL, env: Mapping[str, str], *, writer: bool) -> Mirror:
    """Restore the newest complete checkpoint of ``url`` into a new staging directory and, for
    the chief, check that it may write there: every cause of failure is found before
    TensorFlow is even imported."""
    staging = tempfile.mkdtemp(prefix="trainjob-checkpoint-")
    mirror = Mirror(S3Store(url, env), staging, writer=writer)
    try:
        if writer:
            mirror.check_writable()
        else:
            mirror.store.check_readable()
        mirror.restore()
    except BaseException:
        mirror.close()
        raise
    return mirror


@contextlib.contextmanager
def _tf_errors(doing: str, where: str) -> Iterator[None]:
    import tensorflow as tf

    try:
        yield
    except tf.errors.NotFoundError:
        raise CheckpointStorageError(
            f"cannot {doing} {where}: not found (does the bucket exist?)"
        ) from None
    except tf.errors.PermissionDeniedError:
        raise CheckpointStorageError(
            f"cannot {doing} {where}: access denied (the credentials in use may not write here)"
        ) from None
    except tf.errors.UnauthenticatedError:
        raise CheckpointStorageError(
            f"cannot {doing} {where}: the credentials were refused (application default "
            "credentials, GOOGLE_APPLICATION_CREDENTIALS or the job's credentials Secret)"
        ) from None
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as exc:
        raise StorageUnreachableError(
            f"cannot {doing} {where}: the store is unreachable ({type(exc).__name__})"
        ) from None
    except tf.errors.OpError as exc:
        line = str(exc.message).splitlines()[0] if exc.message else type(exc).__name__
        if any(marker in line for marker in _UNREACHABLE_MARKERS):
            # TensorFlow's GCS client wraps curl's connection errors in AbortedError once its
            # retries are spent.
            raise StorageUnreachableError(
                f"cannot {doing} {where}: the store is unreachable ({line})"
            ) from None
        raise CheckpointStorageError(f"cannot {doing} {where}: {line}") from None


def check_tensorflow_location(tf: Any, location: str, *, writer: bool, replica: str) -> None:
    """A location TensorFlow writes itself (``gs://``): the chief writes and deletes a probe
    file, every other replica lists it, so a missing bucket or refused write ends the replica
    before training with one line."""
    doing = "write" if writer else "read"
    url = storage.parse(location)
    with _tf_errors(doing, location):
        # First: TensorFlow 2.21's makedirs under a missing GCS bucket asks for the bucket
        # again and again, for ever (measured against fake-gcs-server).
        if not tf.io.gfile.exists(f"{url.scheme}://{url.bucket}"):
            raise CheckpointStorageError(f"cannot {doing} {location}: the bucket does not exist")
        if writer:
            tf.io.gfile.makedirs(location)
            probe = f"{location.rstrip('/')}/{PROBE}-{replica}"
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("trainjob checks that it may write here\n")
            tf.io.gfile.remove(probe)
        else:
            tf.io.gfile.exists(location)


def google_credentials(env: Mapping[str, str]) -> str | None:
    """The service-account key of the job's credentials Secret, for
    ``GOOGLE_APPLICATION_CREDENTIALS`` (``None``: application default credentials)."""
    directory = env.get(ENV_CREDENTIALS_DIR)
    if not directory:
        return None
    path = os.path.join(directory, GOOGLE_KEY_FILE)
    return path if os.path.isfile(path) else None
