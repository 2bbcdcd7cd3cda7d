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
import functools
import json
import os
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

from tests.controlplane.pki import Pki
from tests.controlplane.tools import HERE, Tools
from tests.support import ports, processes, waits

KWOK_CONFIG: Final = HERE / "kwok" / "kwok.yaml"
KWOK_NODES: Final = HERE / "kwok" / "nodes.yaml"

SERVICE_CLUSTER_IP_RANGE: Final = "10.0.0.0/24"
ADMIN_USER: Final = "trainjob-admin"


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become healthy in time."""


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
    address: str = ports.LOOPBACK
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
            extra_ips = [self.address] if self.address != ports.LOOPBACK else []
            self._pki = Pki.generate(self.root / "pki", SERVICE_CLUSTER_IP_RANGE, extra_ips)
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

    def spawn(
        self, name: str, argv: Sequence[str | Path], *, stopped_with_plane: bool = True
    ) -> Component:
        """Start a process beside the control plane (Kueue, a scheduler, a node's parts),
        logging to `<root>/logs/<name>.log`. `stopped_with_plane`: `stop()` stops it too;
        otherwise the caller owns it."""
        log = self.root / "logs" / f"{name}.log"
        process = processes.spawn_logged(argv, log, cwd=self.root, die_with_parent=True)
        component = Component(process=process, log=log, name=name, argv=tuple(map(str, argv)))
        if stopped_with_plane:
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
        revived = self.spawn(name, component.argv, stopped_with_plane=False)
        self.components[index] = revived
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: waits.http_ok(f"{self.etcd_url}/health"),
            "kube-apiserver": lambda: self.https_ok(f"{self.apiserver_url}/readyz"),
        }
        self.wait_healthy(revived, checks.get(name, revived.running))

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

    def wait_healthy(
        self,
        component: Component,
        check: Callable[[], bool],
        *,
        what: str | None = None,
        timeout: float | None = None,
        interval: float = 0.2,
    ) -> None:
        """Wait until `check` passes (`what`: by default the component healthy); fail with
        the component's log if it exits first or `timeout` (by default the control plane's
        start timeout) passes, as a ControlPlaneError."""

        def ready() -> bool:
            if not component.running():
                raise ControlPlaneError(f"{component.name} exited{component.describe_failure()}")
            return check()

        waits.wait_until(
            ready,
            timeout=self.start_timeout if timeout is None else timeout,
            what=what or f"{component.name} to become healthy",
            interval=interval,
            on_timeout=component.describe_failure,
            error=ControlPlaneError,
        )

    # -- etcd ----------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        shutil.rmtree(self.root / "etcd", ignore_errors=True)
        client, peer = ports.free_port(), ports.free_port()
        self.etcd_url = f"http://{ports.LOOPBACK}:{client}"
        peer_url = f"http://{ports.LOOPBACK}:{peer}"
        etcd = self.spawn(
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

        self.wait_healthy(etcd, healthy)

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
        apiserver = self.spawn(
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
                "--endpoint-reconciler-type="
                + ("none" if self.address == ports.LOOPBACK else "lease"),
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_flags,
            ],
        )
        self.wait_healthy(apiserver, lambda: self.https_ok(f"{self.apiserver_url}/readyz"))

    @property
    def pki(self) -> Pki:
        """The throw-away PKI (CA, serving and client certificates) of the running plane."""
        return self._require_pki()

    def _require_pki(self) -> Pki:
        if self._pki is None:
            raise ControlPlaneError("PKI not generated")
        return self._pki

    def https_ok(self, url: str, *, verify_ca: bool = True) -> bool:
        """Whether an HTTPS endpoint answers 200 to the admin token right now; `verify_ca`
        False for the self-signed serving certificates of the controllers and schedulers."""
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
        return self.write_kubeconfig_as(path, user, {"token": token}, namespace)

    def write_kubeconfig_as(
        self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default"
    ) -> Path:
        """Write a kubeconfig for this API server (CA embedded) in which `user` authenticates
        with `credentials` (a token; or client-certificate and client-key files, a node's)."""
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
            "users": [{"name": user, "user": credentials}],
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
            f"--bind-address={ports.LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.root / (name + '-certs')}",
            "--leader-elect=false",
            "--v=1",
        ]

    def _start_controller_manager(self) -> None:
        pki = self._require_pki()
        flags = self._component_flags("kube-controller-manager")
        kcm = self.spawn(
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
        self.wait_healthy(
            kcm, lambda: self.https_ok(f"https://{ports.LOOPBACK}:{port}/healthz", verify_ca=False)
        )

    def _start_scheduler(self) -> None:
        flags = self._component_flags("kube-scheduler")
        scheduler = self.spawn("kube-scheduler", [self.tools.kube_scheduler, *flags])
        port = _flag_value(flags, "--secure-port")
        self.wait_healthy(
            scheduler,
            lambda: self.https_ok(f"https://{ports.LOOPBACK}:{port}/healthz", verify_ca=False),
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
        kwok = self.spawn(
            "kwok",
            [
                self.tools.kwok,
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                f"--server-address={ports.LOOPBACK}:{port}",
                "--v=WARN",
            ],
        )
        self.wait_healthy(kwok, lambda: waits.http_ok(f"http://{ports.LOOPBACK}:{port}/healthz"))
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
