"""A real Kubernetes control plane for the TrainJob tests, with no Docker and no kubelet.

etcd, kube-apiserver (RBAC + Node authorization, service-account signing keys, a static
admin token), kube-controller-manager (garbage collector, namespace, service-account and
the other default controllers) and kube-scheduler run as child processes on 127.0.0.1 with
free ports and a temporary directory. kwok can be added to fake nodes and drive pod phases.

The binaries come from ``bash tests/controlplane/install.sh`` (built from the Go modules and
cached in ``$TRAINJOB_TOOLS_DIR``, default ``~/.cache/trainjob-tools``).

Use from Python::

    with ControlPlane() as cp:
        cp.kubectl("get", "namespaces")
        os.environ["KUBECONFIG"] = str(cp.kubeconfig)

or from a shell: ``python -m tests.controlplane up [--kwok] [--crds]``.
"""

from __future__ import annotations

import base64
import datetime
import functools
import ipaddress
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support import ports, processes, waits

HERE: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = HERE.parent.parent
INSTALL_COMMAND: Final = "bash tests/controlplane/install.sh"
KWOK_CONFIG: Final = HERE / "kwok" / "kwok.yaml"
KWOK_NODES: Final = HERE / "kwok" / "nodes.yaml"

SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
LOOPBACK: Final = "127.0.0.1"
ADMIN_USER: Final = "trainjob-admin"


class ToolsMissingError(RuntimeError):
    """The control-plane binaries are not installed."""


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become healthy in time."""


# --------------------------------------------------------------------------- tools


def _go_mod_version(gomod: Path, module: str) -> str:
    """The version of ``module`` that a go.mod requires (single-line or block form)."""
    pattern = re.compile(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", re.MULTILINE)
    match = pattern.search(gomod.read_text(encoding="utf-8"))
    if match is None:
        raise ToolsMissingError(f"{gomod} does not require {module}")
    return match.group(1)


def _install_sh_version(name: str) -> str:
    """A ``NAME="vX"`` assignment in install.sh (the one place kwok/helm versions live)."""
    text = (HERE / "install.sh").read_text(encoding="utf-8")
    match = re.search(rf'^{name}="(v[^"]+)"', text, re.MULTILINE)
    if match is None:
        raise ToolsMissingError(f"{name} not found in {HERE / 'install.sh'}")
    return match.group(1)


def tools_dir() -> Path:
    """Where install.sh caches the binaries."""
    env = os.environ.get("TRAINJOB_TOOLS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "trainjob-tools"


@dataclass(frozen=True)
class Tools:
    """Paths of the binaries built by install.sh, keyed by the versions pinned in the repo."""

    kubernetes_version: str
    etcd_version: str
    kwok_version: str
    helm_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    helm: Path

    @classmethod
    def locate(cls, root: Path | None = None) -> Tools:
        base = root if root is not None else tools_dir()
        k8s = _go_mod_version(HERE / "k8s" / "go.mod", "k8s.io/kubernetes")
        etcd = _go_mod_version(HERE / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3")
        kwok = _install_sh_version("KWOK_VERSION")
        helm = _install_sh_version("HELM_VERSION")
        kdir = base / f"kubernetes-{k8s}"
        return cls(
            kubernetes_version=k8s,
            etcd_version=etcd,
            kwok_version=kwok,
            helm_version=helm,
            etcd=base / f"etcd-{etcd}" / "etcd",
            kube_apiserver=kdir / "kube-apiserver",
            kube_controller_manager=kdir / "kube-controller-manager",
            kube_scheduler=kdir / "kube-scheduler",
            kubectl=kdir / "kubectl",
            kwok=base / f"kwok-{kwok}" / "kwok",
            helm=base / f"helm-{helm}" / "helm",
        )

    def all_paths(self) -> list[Path]:
        return [
            self.etcd,
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kubectl,
            self.kwok,
            self.helm,
        ]

    def missing(self) -> list[Path]:
        return [p for p in self.all_paths() if not os.access(p, os.X_OK)]

    def require(self) -> Tools:
        """Raise ToolsMissingError, naming the install command, unless every binary exists."""
        missing = self.missing()
        if missing:
            listed = "\n  ".join(str(p) for p in missing)
            raise ToolsMissingError(
                f"control-plane binaries are missing:\n  {listed}\n"
                f"Build them once (10-20 min cold, cached afterwards) with:\n"
                f"  {INSTALL_COMMAND}\n"
                f"(set TRAINJOB_TOOLS_DIR to use another cache directory)"
            )
        return self


# --------------------------------------------------------------------------- PKI


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Pki:
    """Files of the throw-away PKI: a CA, the API server's serving cert, service-account keys."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    # The API server's client certificate towards kubelets (logs, exec, port-forward).
    kubelet_client_cert: Path
    kubelet_client_key: Path

    @classmethod
    def generate(cls, directory: Path, extra_ips: Sequence[str] = ()) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        start = now - datetime.timedelta(hours=1)
        end = now + datetime.timedelta(days=7)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob-test-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )

        serving_key = ec.generate_private_key(ec.SECP256R1())
        first_service_ip = next(ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE).hosts())
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
            x509.IPAddress(ipaddress.IPv4Address(LOOPBACK)),
            x509.IPAddress(first_service_ip),
            *(x509.IPAddress(ipaddress.IPv4Address(ip)) for ip in extra_ips),
        ]
        serving_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name)
            .public_key(serving_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        sa_key = ec.generate_private_key(ec.SECP256R1())
        sa_pub = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

        pki = cls(
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
            kubelet_client_key=directory / "apiserver-kubelet-client.key",
        )
        pki.ca_cert.write_bytes(_pem_cert(ca_cert))
        pki.ca_key.write_bytes(_pem_key(ca_key))
        pki.serving_cert.write_bytes(_pem_cert(serving_cert))
        pki.serving_key.write_bytes(_pem_key(serving_key))
        pki.sa_key.write_bytes(_pem_key(sa_key))
        pki.sa_pub.write_bytes(sa_pub)
        for key_file in (pki.ca_key, pki.serving_key, pki.sa_key):
            key_file.chmod(0o600)
        pki.client_cert(
            "kube-apiserver-kubelet-client",
            "system:masters",
            pki.kubelet_client_cert,
            pki.kubelet_client_key,
        )
        return pki

    def client_cert(self, common_name: str, organization: str, cert: Path, key: Path) -> None:
        """Write a client certificate signed by the CA: the API server maps CN to the user
        and O to the group (a kubelet is CN=system:node:<name>, O=system:nodes)."""
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ControlPlaneError(f"{self.ca_key} is not an EC key")
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        now = datetime.datetime.now(datetime.timezone.utc)
        client_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )
        signed = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(client_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert.write_bytes(_pem_cert(signed))
        key.write_bytes(_pem_key(client_key))
        key.chmod(0o600)


@dataclass
class Component(processes.LoggedProcess):
    """One child process of the test bed (etcd, kube-apiserver, kwok, ...), named, with the
    command line it started with (to start it again the same way)."""

    name: str
    argv: tuple[str, ...] = ()

    def describe_failure(self) -> str:
        state = "running" if self.running() else f"exited with {self.process.returncode}"
        return f"\n{self.name} is {state}; last lines of {self.log}:\n{self.log_tail()}"

    def stop(self, grace: float = 10.0) -> bool:
        """Stop the process group (see LoggedProcess.stop); raise if anything of it is left."""
        if not super().stop(grace):
            raise ControlPlaneError(f"{self.name} (process group {self.pid}) survived SIGKILL")
        return True


# --------------------------------------------------------------------------- control plane


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler (+ kwok) on loopback.

    ``crds`` are applied (and waited on until Established) before the controller manager
    starts, so its garbage collector watches those custom resources from its first sync.
    """

    tools: Tools = field(default_factory=Tools.locate)
    workdir: Path | None = None
    crds: Sequence[Path] = ()
    start_timeout: float = 90.0
    # The API server's address. A real node's pods reach the API server through the
    # `kubernetes` Service, whose endpoint is this address: it must not be loopback then
    # (tests/controlplane/node.py puts the node's address on an interface of its own).
    address: str = LOOPBACK
    # Extra kube-apiserver flags (e.g. --watch-cache=false to make watches read etcd).
    apiserver_flags: Sequence[str] = ()

    admin_token: str = field(default_factory=lambda: secrets.token_hex(24), repr=False)
    components: list[Component] = field(default_factory=list)
    apiserver_url: str = ""
    etcd_url: str = ""
    _own_workdir: bool = False
    _pki: Pki | None = None

    # -- paths ---------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        if self.workdir is None:
            raise ControlPlaneError("control plane not started")
        return self.workdir

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return self.tools.kubectl

    @property
    def ca_cert(self) -> Path:
        return self.root / "pki" / "ca.crt"

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG for this control plane, and PATH starting with the
        directory of the kubectl (and Kubernetes binaries) built by install.sh."""
        path = os.pathsep.join([str(self.tools.kubectl.parent), os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        self.tools.require()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="trainjob-cp-"))
            self._own_workdir = True
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            extra_ips = [self.address] if self.address != LOOPBACK else []
            self._pki = Pki.generate(self.root / "pki", extra_ips)
            self._with_port_retry(self._start_etcd)
            self._with_port_retry(self._start_apiserver)
            self._write_kubeconfig()
            if self.crds:
                self.apply_crds(self.crds)
            self._with_port_retry(self._start_controller_manager)
            self._with_port_retry(self._start_scheduler)
            self._wait_default_service_account("default")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (reverse start order) and remove an owned temp dir."""
        errors: list[str] = []
        for component in reversed(self.components):
            try:
                component.stop()
            except ControlPlaneError as exc:
                errors.append(str(exc))
        self.components.clear()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            self._own_workdir = False
        if errors:
            raise ControlPlaneError("; ".join(errors))

    def _with_port_retry(self, start: Callable[[], None], attempts: int = 3) -> None:
        """Run ``start``; if its component lost a race for its free port (another process
        bound it between free_port() and the bind), stop it and start again on new ports."""
        for attempt in range(1, attempts + 1):
            before = len(self.components)
            try:
                start()
                return
            except ControlPlaneError:
                started = self.components[before:]
                lost_race = any(
                    "address already in use" in c.log_tail(200).lower() for c in started
                )
                if not lost_race or attempt == attempts:
                    raise
                for component in started:
                    component.stop()
                    self.components.remove(component)
                    component.log.rename(component.log.with_suffix(f".attempt{attempt}.log"))

    def _spawn(self, name: str, argv: Sequence[str | Path]) -> Component:
        log = self.root / "logs" / f"{name}.log"
        process = processes.spawn_logged(argv, log, cwd=self.root, die_with_parent=True)
        component = Component(process=process, log=log, name=name, argv=tuple(map(str, argv)))
        self.components.append(component)
        return component

    # -- faults (reliability tests) -------------------------------------------------------

    def component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        raise ControlPlaneError(f"no component {name!r}")

    def kill(self, name: str) -> None:
        """SIGKILL one component (its data, ports and flags stay for `revive`)."""
        self.component(name).kill(timeout=30)

    def revive(self, name: str) -> None:
        """Start a killed component again with the same flags (same ports, same data) and
        wait until it is healthy, as after a node reboot."""
        component = self.component(name)
        if component.running():
            raise ControlPlaneError(f"{name} is still running")
        index = self.components.index(component)
        self.components.remove(component)
        revived = self._spawn(name, component.argv)
        self.components.remove(revived)
        self.components.insert(index, revived)
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: waits.http_ok(f"{self.etcd_url}/health"),
            "kube-apiserver": lambda: self._https_ok(f"{self.apiserver_url}/readyz"),
        }
        self._wait_healthy(revived, checks.get(name, revived.running))

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what etcd and the API server do
        every few minutes): a watch resuming from an older resourceVersion gets 410 Gone.
        Returns the revision compacted to."""
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/range",
            data=json.dumps({"key": "AA==", "limit": 1}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            revision = int(json.loads(resp.read())["header"]["revision"])
        request = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/compaction",
            data=json.dumps({"revision": revision, "physical": True}).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
        return revision

    def _wait_healthy(self, component: Component, check: Callable[[], bool]) -> None:
        def ready() -> bool:
            if not component.running():
                raise ControlPlaneError(f"{component.name} exited{component.describe_failure()}")
            return check()

        waits.wait_until(
            ready,
            timeout=self.start_timeout,
            what=f"{component.name} to become healthy",
            interval=0.2,
            on_timeout=component.describe_failure,
            error=ControlPlaneError,
        )

    # -- etcd ----------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        shutil.rmtree(self.root / "etcd", ignore_errors=True)
        client, peer = ports.free_port(), ports.free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        peer_url = f"http://{LOOPBACK}:{peer}"
        etcd = self._spawn(
            "etcd",
            [
                self.tools.etcd,
                "--name=trainjob-test",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=trainjob-test={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                    body = json.loads(resp.read())
            except (OSError, ValueError):
                return False
            return bool(body.get("health") == "true")

        self._wait_healthy(etcd, healthy)

    # -- kube-apiserver ------------------------------------------------------------------

    def _start_apiserver(self) -> None:
        pki = self._require_pki()
        port = ports.free_port()
        self.apiserver_url = f"https://{self.address}:{port}"
        tokens = self.root / "tokens.csv"
        # token,user,uid,"group1,group2"
        tokens.write_text(
            f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n', encoding="utf-8"
        )
        tokens.chmod(0o600)
        apiserver = self._spawn(
            "kube-apiserver",
            [
                self.tools.kube_apiserver,
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={port}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--kubelet-client-certificate={pki.kubelet_client_cert}",
                f"--kubelet-client-key={pki.kubelet_client_key}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # No kubelets: the default plugins stay on (ServiceAccount, NamespaceLifecycle,
                # ResourceQuota, webhooks, ValidatingAdmissionPolicy, PodSecurity, ...), plus
                # NodeRestriction; TaintNodesByCondition is off so fake (kwok) nodes take pods
                # without a node-lifecycle controller removing the not-ready taint.
                "--enable-admission-plugins=NodeRestriction",
                "--disable-admission-plugins=TaintNodesByCondition",
                # The 'kubernetes' Service endpoints cannot point at loopback: don't reconcile
                # unless the API server has a real address (a node's pods reach it there).
                "--endpoint-reconciler-type=" + ("none" if self.address == LOOPBACK else "lease"),
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_flags,
            ],
        )
        self._wait_healthy(apiserver, lambda: self._https_ok(f"{self.apiserver_url}/readyz"))

    @property
    def pki(self) -> Pki:
        """The throw-away PKI (CA, serving and client certificates) of the running plane."""
        return self._require_pki()

    def _require_pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("PKI not generated")
        return self._pki

    def _https_ok(self, url: str, *, verify_ca: bool = True) -> bool:
        if verify_ca:
            context = ssl.create_default_context(cafile=str(self._require_pki().ca_cert))
        else:  # self-signed serving certs of kube-controller-manager / kube-scheduler
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig, ADMIN_USER, self.admin_token)

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path | None = None, duration: str = "2h"
    ) -> Path:
        """A kubeconfig authenticating as ``system:serviceaccount:<namespace>:<name>`` with a
        bound token from the TokenRequest API, so a test can run the operator under its real
        RBAC. The service account must exist."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        target = path if path is not None else self.root / f"kubeconfig-{namespace}-{name}"
        return self.write_kubeconfig(
            target, f"system:serviceaccount:{namespace}:{name}", token, namespace
        )

    def write_kubeconfig(
        self, path: Path, user: str, token: str, namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this API server (CA embedded) with a bearer token."""
        ca = self._require_pki().ca_cert.read_bytes()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "trainjob-test",
                    "cluster": {
                        "server": self.apiserver_url,
                        "certificate-authority-data": base64.b64encode(ca).decode("ascii"),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "trainjob-test",
                    "context": {"cluster": "trainjob-test", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "trainjob-test",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)
        return path

    # -- controllers ---------------------------------------------------------------------

    def _component_flags(self, name: str) -> list[str | Path]:
        port = ports.free_port()
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.root / (name + '-certs')}",
            "--leader-elect=false",
            "--v=1",
        ]

    def _start_controller_manager(self) -> None:
        pki = self._require_pki()
        flags = self._component_flags("kube-controller-manager")
        kcm = self._spawn(
            "kube-controller-manager",
            [
                self.tools.kube_controller_manager,
                *flags,
                # Every default controller (garbage collector, namespace, serviceaccount,
                # serviceaccount-token, job, replicaset, ...) except node lifecycle: fake
                # nodes have no kubelet to keep the real one happy.
                "--controllers=*,-node-lifecycle-controller",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs=5",
            ],
        )
        port = _flag_value(flags, "--secure-port")
        self._wait_healthy(
            kcm, lambda: self._https_ok(f"https://{LOOPBACK}:{port}/healthz", verify_ca=False)
        )

    def _start_scheduler(self) -> None:
        flags = self._component_flags("kube-scheduler")
        scheduler = self._spawn("kube-scheduler", [self.tools.kube_scheduler, *flags])
        port = _flag_value(flags, "--secure-port")
        self._wait_healthy(
            scheduler,
            lambda: self._https_ok(f"https://{LOOPBACK}:{port}/healthz", verify_ca=False),
        )

    def _wait_default_service_account(self, namespace: str) -> None:
        self.wait_service_account(namespace, "default")

    def wait_service_account(self, namespace: str, name: str = "default") -> None:
        """Wait until the serviceaccount controller has created ``namespace/name``."""
        waits.wait_until(
            lambda: (
                self.kubectl("get", "serviceaccount", name, "-n", namespace, check=False).returncode
                == 0
            ),
            timeout=self.start_timeout,
            what=f"service account {namespace}/{name}",
            interval=0.2,
            error=ControlPlaneError,
        )

    # -- kubectl -------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str | Path,
        check: bool = True,
        stdin: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built by install.sh against this control plane."""
        argv = [str(self.tools.kubectl), f"--kubeconfig={self.kubeconfig}", *map(str, args)]
        result = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"{' '.join(argv[2:])!s} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def apply_crds(self, paths: Sequence[Path], timeout: float = 60.0) -> list[str]:
        """kubectl apply (server-side) the CRDs in ``paths``; wait until each is Established."""
        names: list[str] = []
        for path in paths:
            out = self.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", path, "-o", "name"
            ).stdout
            names += [line for line in out.split() if line.startswith("customresourcedefinition")]
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'

        def established(name: str) -> bool:
            # Polled rather than `kubectl wait`, which fails at once (instead of waiting) while
            # a fresh CRD has no status conditions yet: seen under load.
            result = self.kubectl("get", name, "-o", f"jsonpath={jsonpath}", check=False)
            return result.returncode == 0 and result.stdout.strip() == "True"

        for name in names:
            waits.wait_until(
                functools.partial(established, name),
                timeout=timeout,
                what=f"{name} to be Established",
                interval=0.2,
                error=ControlPlaneError,
            )
        return names

    # -- kwok ----------------------------------------------------------------------------

    def start_kwok(
        self,
        config: Path = KWOK_CONFIG,
        nodes: Path | None = KWOK_NODES,
        timeout: float = 60.0,
    ) -> Component:
        """Start kwok with ``config`` (stages) and create the fake ``nodes``; wait until Ready."""
        for existing in self.components:
            if existing.name == "kwok" and existing.running():
                return existing
        port = ports.free_port()
        kwok = self._spawn(
            "kwok",
            [
                self.tools.kwok,
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                f"--server-address={LOOPBACK}:{port}",
                "--v=WARN",
            ],
        )
        self._wait_healthy(kwok, lambda: waits.http_ok(f"http://{LOOPBACK}:{port}/healthz"))
        if nodes is not None:
            self.kubectl("apply", "-f", nodes)
            self.kubectl(
                "wait",
                "--for=condition=Ready",
                f"--timeout={int(timeout)}s",
                "-f",
                nodes,
                timeout=timeout + 10,
            )
        return kwok

    # -- misc ----------------------------------------------------------------------------

    def logs(self) -> Iterator[tuple[str, Path]]:
        for component in self.components:
            yield component.name, component.log

    def version(self) -> str:
        """The server's gitVersion, as reported by /version."""
        out = self.kubectl("version", "-o", "json").stdout
        server = json.loads(out).get("serverVersion", {})
        return str(server.get("gitVersion", ""))


def _flag_value(flags: Sequence[str | Path], name: str) -> str:
    prefix = f"{name}="
    for flag in flags:
        if isinstance(flag, str) and flag.startswith(prefix):
            return flag[len(prefix) :]
    raise KeyError(name)
