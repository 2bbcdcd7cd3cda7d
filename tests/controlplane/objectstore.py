"""Real object stores on loopback for the checkpoint tests: versitygw's S3 API and
fake-gcs-server's GCS JSON API, both built from their Go modules by
tests/controlplane/install.sh.

versitygw (Versity's S3 gateway, Apache-2.0, released 2026-09) over a POSIX directory: one
process, ready in well under a second, and a cold build of 177 s on 2 loaded cores where
SeaweedFS's `weed` (the store used first) took 469 s on the same machine (1,688 s under heavier
load): CI's cold budget pays for it on every fresh machine. MinIO is not used: its repository
says it is no longer maintained. The gateway checks signatures against its root account (the
admin) and the accounts of its internal IAM (a reader that a bucket policy lets read and list
each bucket, and nothing more: the denied-write tests).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.controlplane import tools
from tests.support import ports, processes, waits

FAKE_GCS_MODULE: Final = "github.com/fsouza/fake-gcs-server"
VERSITYGW_MODULE: Final = "github.com/versity/versitygw"
START_TIMEOUT: Final = 90.0


class StoreMissingError(RuntimeError):
    """The store's binary is not installed."""


def binary(name: str, module: str, wrapper: str) -> Path:
    version = tools.go_mod_version(tools.HERE / wrapper / "go.mod", module)
    path = tools.tools_dir() / f"{wrapper}-{version}" / name
    if not path.is_file():
        raise StoreMissingError(f"{path} is missing: run {tools.INSTALL_COMMAND}")
    return path


@dataclass(frozen=True)
class Identity:
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


@dataclass
class S3Server:
    """An S3 server process whose API listens on ``endpoint``."""

    endpoint: str
    admin: Identity
    reader: Identity
    process: processes.LoggedProcess

    def env(self, identity: Identity | None = None) -> dict[str, str]:
        """What a replica needs to write here: the endpoint override and the credentials, as
        the AWS SDKs read them."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_REGION": "us-east-1",
            **(identity or self.admin).env(),
        }

    def client(self, identity: Identity | None = None) -> Any:
        import boto3  # type: ignore[import-untyped]

        who = identity or self.admin
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=who.access_key,
            aws_secret_access_key=who.secret_key,
        )

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        # The reader may read and list here, and nothing more (the denied-write tests).
        statement = {
            "Effect": "Allow",
            "Principal": {"AWS": [self.reader.access_key]},
            "Action": ["s3:GetObject", "s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"],
        }
        policy = {"Version": "2012-10-17", "Statement": [statement]}
        self.client().put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        found: dict[str, int] = {}
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        for page in pages:
            found.update((o["Key"], int(o["Size"])) for o in page.get("Contents", []))
        return found


def _ready(server: S3Server) -> bool:
    if not server.process.running():
        raise RuntimeError(f"the S3 server exited:\n{server.process.log_tail()}")
    try:
        server.client().list_buckets()
    except Exception:
        return False
    return True


@contextmanager
def versitygw(workdir: Path, address: str = ports.LOOPBACK) -> Iterator[S3Server]:
    """Versity's S3 gateway (versitygw) over a POSIX directory in ``workdir``, on a port of
    its own at ``address`` (loopback unless a test's pods must reach it: an address this
    machine made for them, tests/e2e/test_trainjob.py); stopped afterwards.

    The admin is the gateway's root account (``--access``/``--secret``); the reader is an
    account of its internal IAM (``--iam-dir``, written before the start) that a bucket policy
    lets read and list each bucket :meth:`S3Server.make_bucket` makes, and nothing more."""
    gateway = binary("versitygw", VERSITYGW_MODULE, "versitygw")
    workdir.mkdir(parents=True, exist_ok=True)
    admin = Identity("admin" + secrets.token_hex(4), secrets.token_hex(16))
    reader = Identity("reader" + secrets.token_hex(4), secrets.token_hex(16))
    iam = workdir / "iam"
    data = workdir / "data"
    iam.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    account: dict[str, object] = {
        "access": reader.access_key,
        "secret": reader.secret_key,
        "role": "user",
        "userID": 0,
        "groupID": 0,
        "projectID": 0,
    }
    (iam / "users.json").write_text(
        json.dumps({"accessAccounts": {reader.access_key: account}}), encoding="utf-8"
    )
    port = ports.free_port()
    argv: list[str | Path] = [
        gateway,
        f"--access={admin.access_key}",
        f"--secret={admin.secret_key}",
        f"--port={address}:{port}",
        f"--iam-dir={iam}",
        "--quiet",
        "posix",
        data,
    ]
    # versitygw reads its settings from ROOT_* and VGW_* too: only the command line counts.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ROOT_", "VGW_"))}
    process = processes.LoggedProcess(
        processes.spawn_logged(argv, workdir / "versitygw.log", env=env, die_with_parent=True),
        workdir / "versitygw.log",
    )
    server = S3Server(f"http://{address}:{port}", admin, reader, process)
    try:
        waits.wait_until(
            lambda: _ready(server),
            timeout=START_TIMEOUT,
            what="versitygw's S3 API",
            interval=0.2,
            on_timeout=lambda: "\n" + process.log_tail(),
        )
        yield server
    finally:
        process.stop(grace=5)


# The S3 server the tests use (a name of its own: the tests do not depend on which).
s3_server = versitygw


# TensorFlow's GCS filesystem has no endpoint setting (tsl's gcs_file_system.cc: the API's
# URLs are constants, https://www.googleapis.com/storage/v1/ and storage.googleapis.com; the
# GCS_* variables tune caches, retries and timeouts only). What it does have is libcurl, which
# honours HTTPS_PROXY, and CURL_CA_BUNDLE (read by curl_http_request.cc). So the test sends
# TensorFlow's requests to a CONNECT proxy on loopback that answers for Google's two host names
# with a certificate signed by a CA made for the test (TensorFlow trusts that CA only) and hands
# each request to fake-gcs-server. GOOGLE_AUTH_TOKEN_FOR_TESTING is
# TensorFlow's own way to skip Google's token service.
GOOGLE_HOSTS: Final = ("www.googleapis.com", "storage.googleapis.com")


def _certificates(workdir: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for Google's API hosts signed by it (PEM files)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (workdir / "ca.pem", workdir / "server.pem", workdir / "server-key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


class _GoogleProxy:
    """An HTTP CONNECT proxy on loopback standing in for Google's API hosts: it answers every
    CONNECT itself, speaks TLS with the test's certificate, and forwards each request to
    fake-gcs-server over plain HTTP, one connection per request.

    It reads the requests because of one header: TensorFlow sends ``Transfer-Encoding:
    identity`` with an empty body (curl_http_request.cc, SetPutEmptyBody), which GCS accepts
    and Go's HTTP server refuses (501 Unsupported transfer encoding). It drops that header,
    and nothing else is changed."""

    def __init__(self, upstream: tuple[str, int], cert: Path, key: Path) -> None:
        import socket
        import ssl
        import threading

        self.upstream = upstream
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(cert), str(key))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.connects: list[str] = []
        self.requests: list[str] = []
        threading.Thread(target=self._accept, daemon=True, name="google-proxy").start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, raw: Any) -> None:
        import contextlib

        with contextlib.suppress(OSError), raw:
            head, _ = _read_head(raw, b"")
            if head is None:
                return
            self.connects.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            raw.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            with self.context.wrap_socket(raw, server_side=True) as client:
                self._forward_one(client)

    def _forward_one(self, client: Any) -> None:
        import socket

        head, rest = _read_head(client, b"")
        if head is None:
            return
        lines = head.decode("latin-1").split("\r\n")
        self.requests.append(lines[0])
        kept = [lines[0]]
        length, chunked = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            lowered, value = name.strip().lower(), value.strip()
            if lowered == "transfer-encoding" and value.lower() == "identity":
                continue
            if lowered == "connection":
                continue
            if lowered == "content-length":
                length = int(value)
            if lowered == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            kept.append(line)
        kept.append("Connection: close")
        # As any TLS-terminating front end says: the server's upload URLs are then https.
        kept.append("X-Forwarded-Proto: https")
        body = _read_chunked(client, rest) if chunked else _read_exactly(client, rest, length)
        with socket.create_connection(self.upstream, timeout=60) as upstream:
            upstream.sendall(("\r\n".join(kept) + "\r\n\r\n").encode("latin-1") + body)
            # One request per connection (Connection: close): the response ends at EOF.
            while data := upstream.recv(65536):
                client.sendall(data)

    def close(self) -> None:
        self.server.close()


def _read_head(sock: Any, buffered: bytes) -> tuple[bytes | None, bytes]:
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _read_exactly(sock: Any, buffered: bytes, length: int) -> bytes:
    # A bytearray grows in place: `bytes += chunk` copied the whole body at every chunk, which
    # made a 16 MiB upload take 5-6 s here instead of 0.2-0.5 s (bench/checkpoint_store.py).
    data = bytearray(buffered)
    while len(data) < length:
        chunk = sock.recv(min(1 << 20, length - len(data)))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _read_chunked(sock: Any, buffered: bytes) -> bytes:
    """A chunked body, passed on as it came (chunked): read up to its last, empty chunk."""
    data = bytearray(buffered)
    while not data.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return bytes(data)


@dataclass
class GcsServer:
    """fake-gcs-server behind a CONNECT proxy, as TensorFlow's GCS filesystem reaches it."""

    port: int
    ca: Path
    proxy: _GoogleProxy
    process: processes.LoggedProcess

    def env(self) -> dict[str, str]:
        """What a replica's TensorFlow needs to reach this server as if it were GCS."""
        return {
            "HTTPS_PROXY": f"http://127.0.0.1:{self.proxy.port}",
            "CURL_CA_BUNDLE": str(self.ca),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "trainjob-test-token",
            "NO_GCE_CHECK": "true",
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            # gRPC honours the proxy variables too: the replicas' own channels stay direct.
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def request(self, method: str, path: str, body: bytes | None = None) -> Any:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Host": GOOGLE_HOSTS[0], "Content-Type": "application/json"}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {data[:300]!r}")
        return json.loads(data) if data else None

    def make_bucket(self, name: str) -> str:
        self.request("POST", "/storage/v1/b", json.dumps({"name": name}).encode())
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        import urllib.parse

        found: dict[str, int] = {}
        token = ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            page = self.request("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}")
            found.update((o["name"], int(o["size"])) for o in page.get("items", []))
            token = page.get("nextPageToken", "")
            if not token:
                return found


@contextmanager
def fake_gcs(workdir: Path) -> Iterator[GcsServer]:
    """fake-gcs-server (in memory, plain HTTP on loopback) and the TLS proxy in front of it;
    both stopped afterwards."""
    server_bin = binary("fake-gcs-server", FAKE_GCS_MODULE, "fake-gcs-server")
    workdir.mkdir(parents=True, exist_ok=True)
    ca, cert, key = _certificates(workdir)
    port = ports.free_port()
    argv: list[str | Path] = [
        server_bin,
        "-backend=memory",
        "-scheme=http",
        "-host=127.0.0.1",
        f"-port={port}",
        f"-public-host={GOOGLE_HOSTS[1]}",
        # Resumable uploads continue at the URL this names: through the proxy, as TF's are.
        f"-external-url=https://{GOOGLE_HOSTS[0]}",
        "-log-level=warn",
    ]
    process = processes.LoggedProcess(
        processes.spawn_logged(argv, workdir / "fake-gcs.log", die_with_parent=True),
        workdir / "fake-gcs.log",
    )
    proxy = _GoogleProxy(("127.0.0.1", port), cert, key)
    server = GcsServer(port, ca, proxy, process)

    def ready() -> bool:
        if not process.running():
            raise RuntimeError(f"fake-gcs-server exited:\n{process.log_tail()}")
        try:
            server.request("GET", "/storage/v1/b")
        except (OSError, RuntimeError):
            return False
        return True

    try:
        waits.wait_until(
            ready,
            timeout=START_TIMEOUT,
            what="fake-gcs-server",
            interval=0.2,
            on_timeout=lambda: "\n" + process.log_tail(),
        )
        yield server
    finally:
        proxy.close()
        process.stop(grace=5)
