"""A real Kubernetes node on this machine, joined to the test control plane.

Parts (all run as child processes of the test, as root):

- **containerd** (Debian's package) with **runc** and the CRI plugin; its own socket, config,
  state and root (the root, with its imported images, persists in the tools cache so a warm
  start does not import again);
- **CNI**: Debian's containernetworking-plugins ``bridge`` + ``host-local`` + ``loopback`` on a
  bridge of our own (``tj-cni0``, pods ``10.244.0.0/24``) whose only routes lead to the node's
  address and the Service range: pods get no route or NAT beyond this machine, and a FORWARD
  rule drops anything from or to the pod range that is not pod-to-pod;
- **kubelet** and **kube-proxy** (iptables mode) built from the control plane's Kubernetes
  module (install.sh), cgroupfs driver on the v1 hierarchy, image garbage collection off;
- **CoreDNS** (kubernetes plugin only, no upstream) on the node's address, the pods'
  nameserver; cluster domain ``cluster.local``;
- **kube-network-policies** (SIG Network's NetworkPolicy enforcement, built by install.sh):
  the bridge CNI enforces no NetworkPolicy. It gives a verdict on the first packet of each
  new connection to or from a pod, which an iptables NFQUEUE rule sends it (see
  ``_start_network_policies`` for why iptables rather than its own nftables rules);
- the **pause** image built here, and the images of ``images/build.sh`` imported into
  containerd (no registry);
- storage: a default StorageClass ``standard`` with local PersistentVolumes in the work dir
  (root-owned, like a fresh disk: pods write there through ``fsGroup``).

The node's address ``10.243.0.1`` lives on an interface of its own (``tj-node0``); the API
server binds there (``ControlPlane(address=NODE_IP)``) so that pods reach it through the
``kubernetes`` Service. ``Node.stop()`` removes every process, mount, network namespace,
interface, cgroup and iptables rule the node made.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from tests.controlplane.cluster import (
    SERVICE_CLUSTER_IP_RANGE,
    Component,
    ControlPlane,
    ControlPlaneError,
)
from tests.controlplane.tools import HERE, REPO_ROOT, ToolsMissingError, go_mod_version, tools_dir
from tests.support import ports, waits

NODE_NAME: Final = "trainjob-node"
NODE_IP: Final = "10.243.0.1"
NODE_LINK: Final = "tj-node0"
BRIDGE: Final = "tj-cni0"
POD_CIDR: Final = "10.244.0.0/24"
CLUSTER_DOMAIN: Final = "cluster.local"
FORWARD_CHAIN: Final = "TRAINJOB-NODE"
# mangle POSTROUTING: the first packet of each pod connection, to kube-network-policies.
NETPOL_CHAIN: Final = "TRAINJOB-NETPOL"
NETPOL_QUEUE: Final = 100
NFQUEUES: Final = Path("/proc/net/netfilter/nfnetlink_queue")
PAUSE_IMAGE: Final = "localhost/trainjob/pause:3.10"
CRI_NAMESPACE: Final = "k8s.io"
IMPORTED_FROM_LABEL: Final = "trainjob.dev/buildah-image-id"
STORAGE_CLASS: Final = "standard"
LOCAL_VOLUMES: Final = 24
CNI_BIN_DIR: Final = Path("/usr/lib/cni")
STATE_DIR: Final = Path("/run/trainjob-node")
IPTABLES_TABLES: Final = ("filter", "nat", "mangle", "raw")
IPTABLES_TOOLS: Final = ("iptables", "ip6tables")
NODE_INSTALL_COMMAND: Final = "bash tests/controlplane/install.sh --node"
# images/build.sh names them so ({version}: pyproject.toml's); the examples and the chart's
# defaults use these references.
PRODUCT_IMAGES: Final = (
    "docker.io/trainjob/trainjob-operator:{version}",
    "docker.io/trainjob/trainjob:{version}",
    "docker.io/trainjob/trainjob:{version}-gpu",
    "docker.io/trainjob/trainjob-legacy:{version}",
)
# Built by images/build.sh for tests only, imported under exactly these references: the image
# Kubeflow's own TFJob e2e test (kubeflow-training's test/e2e/test_e2e_tfjob.py) runs.
TEST_IMAGES: Final = ("gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0",)


def coredns_version() -> str:
    return go_mod_version(HERE / "coredns" / "go.mod", "github.com/coredns/coredns")


def kubernetes_version() -> str:
    return go_mod_version(HERE / "k8s" / "go.mod", "k8s.io/kubernetes")


def network_policies_version() -> str:
    return go_mod_version(HERE / "network-policies" / "go.mod", "sigs.k8s.io/kube-network-policies")


@dataclass(frozen=True)
class NodeTools:
    """Binaries of the node: built ones from install.sh --node, the rest from Debian."""

    kubelet: Path
    kube_proxy: Path
    coredns: Path
    pause: Path
    network_policies: Path
    containerd: Path = Path("/usr/bin/containerd")
    ctr: Path = Path("/usr/bin/ctr")
    runc: Path = Path("/usr/sbin/runc")
    buildah: Path = Path("/usr/bin/buildah")

    @classmethod
    def locate(cls, root: Path | None = None) -> NodeTools:
        base = root if root is not None else tools_dir()
        built = base / f"node-{kubernetes_version()}-coredns-{coredns_version()}"
        return cls(
            kubelet=built / "kubelet",
            kube_proxy=built / "kube-proxy",
            coredns=built / "coredns",
            pause=built / "pause",
            network_policies=base
            / f"network-policies-{network_policies_version()}"
            / "kube-network-policies",
        )

    def require(self) -> NodeTools:
        paths = [
            self.kubelet,
            self.kube_proxy,
            self.coredns,
            self.pause,
            self.network_policies,
            self.containerd,
            self.ctr,
            self.runc,
            self.buildah,
            *(CNI_BIN_DIR / p for p in ("bridge", "host-local", "loopback")),
        ]
        missing = [p for p in paths if not os.access(p, os.X_OK)]
        for tool in ("ip", "iptables", "ip6tables", "iptables-save", "mount", "umount"):
            if shutil.which(tool) is None:
                missing.append(Path(tool))
        if missing:
            listed = "\n  ".join(map(str, missing))
            raise ToolsMissingError(
                f"node parts are missing:\n  {listed}\nInstall them (Debian packages + "
                f"kubelet, kube-proxy, CoreDNS built from Go modules, cached) with:\n"
                f"  {NODE_INSTALL_COMMAND}"
            )
        if os.geteuid() != 0:
            raise ToolsMissingError("a real node needs root (containerd, CNI, iptables)")
        return self


# --------------------------------------------------------------------------- host helpers


def _run(argv: Sequence[str | Path], *, check: bool = True, timeout: float = 120.0) -> str:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise ControlPlaneError(
            f"{' '.join(map(str, argv))} failed ({result.returncode}):\n"
            f"{result.stdout}{result.stderr}"
        )
    return result.stdout


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def mounts_under(prefixes: Sequence[Path]) -> list[str]:
    """Mount points below any of ``prefixes``, deepest first (the order to unmount in)."""
    points: list[str] = []
    roots = [str(p).rstrip("/") + "/" for p in prefixes]
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].replace("\\040", " ")
            if any((point + "/").startswith(root) for root in roots):
                points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def unmount_all(prefixes: Sequence[Path]) -> list[str]:
    """Unmount everything mounted below ``prefixes``; returns what stays mounted."""
    for _ in range(3):
        points = mounts_under(prefixes)
        if not points:
            return []
        for point in points:
            _run(["umount", point], check=False)
    for point in mounts_under(prefixes):  # busy after three passes: detach lazily
        _run(["umount", "-l", point], check=False)
    return mounts_under(prefixes)


@dataclass
class IptablesSnapshot:
    """The chains of each table before the node started, to remove what it added."""

    chains: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    @classmethod
    def take(cls) -> IptablesSnapshot:
        snap = cls()
        for tool in IPTABLES_TOOLS:
            for table in IPTABLES_TABLES:
                snap.chains[(tool, table)] = set(_chains(tool, table))
        return snap

    def restore(self) -> list[str]:
        """Delete every rule jumping to a chain created since the snapshot, then the chains.
        Returns the chains that could not be removed."""
        left: list[str] = []
        for (tool, table), before in self.chains.items():
            new = [c for c in _chains(tool, table) if c not in before]
            if not new:
                continue
            rules = _run([tool, "-w", "-t", table, "-S"], check=False).splitlines()
            for rule in rules:
                parts = rule.split()
                if len(parts) < 2 or parts[0] != "-A" or parts[1] in new:
                    continue
                if any(f"-j {c}" in rule or f"-g {c}" in rule for c in new):
                    _run([tool, "-w", "-t", table, "-D", *parts[1:]], check=False)
            for chain in new:
                _run([tool, "-w", "-t", table, "-F", chain], check=False)
            for chain in new:
                _run([tool, "-w", "-t", table, "-X", chain], check=False)
            left += [f"{tool} {table} {c}" for c in _chains(tool, table) if c in new]
        return left


def _chains(tool: str, table: str) -> list[str]:
    out = _run([tool, "-w", "-t", table, "-S"], check=False)
    return [line.split()[1] for line in out.splitlines() if line.startswith("-N ")]


# --------------------------------------------------------------------------- images


@dataclass
class NodeImages:
    """The node's images in containerd (namespace k8s.io), imported from buildah's store:
    the pause image and the product images, each only when containerd does not hold that very
    image already (the node's containerd root persists, so a warm start imports nothing)."""

    tools: NodeTools
    socket: Path  # the containerd to import into
    work_dir: Path  # an image's archive lies here for the moment of its import
    images: Sequence[str] = PRODUCT_IMAGES

    def ctr(self, *args: str | Path, check: bool = True, timeout: float = 600.0) -> str | None:
        argv = [self.tools.ctr, f"--address={self.socket}", "-n", CRI_NAMESPACE, *args]
        result = subprocess.run(
            [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            if check:
                raise ControlPlaneError(
                    f"ctr {' '.join(map(str, args))} failed:\n{result.stdout}{result.stderr}"
                )
            return None
        return result.stdout

    def buildah(self, *args: str | Path, timeout: float = 900.0) -> str:
        return image_store_buildah(*args, timeout=timeout, buildah=self.tools.buildah)

    def import_all(self) -> None:
        self.build_pause_image()
        have = self.imported()
        for ref in [PAUSE_IMAGE, *self.product_refs()]:
            image_id = self.buildah("images", "--no-trunc", "--format", "{{.ID}}", ref)
            image_id = image_id.split()[0].removeprefix("sha256:")
            if have.get(ref) == image_id:
                continue
            archive = self.work_dir / "image.tar"
            self.buildah("push", "--quiet", ref, f"docker-archive:{archive}:{ref}")
            self.ctr("images", "import", "--no-unpack=false", archive, timeout=900)
            archive.unlink()
            # Pinned: kubelet never garbage-collects it (it cannot be pulled again).
            self.ctr(
                "images",
                "label",
                ref,
                "io.cri-containerd.pinned=pinned",
                f"{IMPORTED_FROM_LABEL}={image_id}",
            )

    def imported(self) -> dict[str, str]:
        """Image reference -> the buildah image ID it was imported from (an image label: the
        docker-archive conversion changes the config digest, so digests cannot be compared)."""
        found: dict[str, str] = {}
        out = self.ctr("images", "list", check=False) or ""
        for line in out.splitlines()[1:]:
            fields = line.split()
            match = re.search(rf"{IMPORTED_FROM_LABEL}=([0-9a-f]+)", line)
            if fields and match:
                found[fields[0]] = match.group(1)
        return found

    def product_refs(self) -> list[str]:
        refs = image_refs(self.images) + list(TEST_IMAGES)
        listed = self.buildah("images", "--format", "{{.Name}}:{{.Tag}}")
        missing = [r for r in refs if r not in listed.split()]
        if missing:
            raise ToolsMissingError(
                f"images not built: {missing}; build them with `bash images/build.sh`"
            )
        return refs

    def build_pause_image(self) -> None:
        listed = self.buildah("images", "--format", "{{.Name}}:{{.Tag}}").split()
        if PAUSE_IMAGE in listed:
            return
        container = self.buildah("from", "scratch").strip()
        try:
            self.buildah("copy", container, self.tools.pause, "/pause")
            self.buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
            self.buildah("commit", "--quiet", container, PAUSE_IMAGE)
        finally:
            self.buildah("rm", container)


def image_store_flags() -> list[str]:
    """buildah's flags for the store images/build.sh builds into."""
    return _run(["bash", REPO_ROOT / "images" / "build.sh", "--storage-flags"]).split()


def image_store_buildah(
    *args: str | Path, timeout: float = 900.0, buildah: Path = Path("/usr/bin/buildah")
) -> str:
    """buildah on the store images/build.sh builds into."""
    return _run([buildah, *image_store_flags(), *args], timeout=timeout)


def image_refs(images: Sequence[str]) -> list[str]:
    """Image references with this version ({version}: pyproject.toml's)."""
    version = pyproject_version()
    return [image.format(version=version) for image in images]


# Plugins the node's containerd never needs (snapshotters this kernel or machine lacks).
UNUSED_CONTAINERD_PLUGINS: Final = (
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
)


def containerd_config_head(
    root: Path, state: Path, socket: Path, ttrpc: Path, disabled: Sequence[str] = ()
) -> str:
    """The start of a containerd config on the node's root: where it keeps state, where it
    listens, and no debug or metrics listener."""
    plugins = ", ".join(f'"{name}"' for name in (*disabled, *UNUSED_CONTAINERD_PLUGINS))
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{plugins}]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{ttrpc}"
[debug]
  address = ""
[metrics]
  address = ""
"""


PREIMPORT_DIR: Final = Path("/run/trainjob-node-preimport")


def preimport_images(images: Sequence[str] = PRODUCT_IMAGES, timeout: float = 60.0) -> None:
    """Import the images into the node's persistent containerd root before the node starts,
    with a containerd of its own (no CRI, its own socket), stopped after: `bash tests/run`
    does this while the tiers before e2e run, so the node's start imports nothing (a cold
    import of every image takes about 5 minutes). Nothing is done while the node runs: its
    containerd owns the root then, and imports itself."""
    tools = NodeTools.locate().require()
    node_socket = STATE_DIR / "containerd.sock"
    if node_socket.exists() and NodeImages(tools, node_socket, PREIMPORT_DIR).ctr(
        "version", check=False, timeout=10
    ):
        return
    root = tools_dir() / "node-state" / "containerd"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(PREIMPORT_DIR, ignore_errors=True)
    PREIMPORT_DIR.mkdir(parents=True)
    socket = PREIMPORT_DIR / "containerd.sock"
    config = PREIMPORT_DIR / "containerd.toml"
    config.write_text(
        containerd_config_head(
            root,
            PREIMPORT_DIR / "state",
            socket,
            PREIMPORT_DIR / "containerd-ttrpc.sock",
            disabled=("io.containerd.grpc.v1.cri",),
        ),
        encoding="utf-8",
    )
    # The archives go next to the root, on disk (/run is memory).
    store = NodeImages(tools, socket, root.parent, images)
    with (PREIMPORT_DIR / "containerd.log").open("wb") as log:
        containerd = subprocess.Popen(
            [str(tools.containerd), f"--config={config}", "--log-level=warn"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        waits.wait_until(
            lambda: containerd.poll() is not None or store.ctr("version", check=False),
            timeout=timeout,
            what="the pre-import containerd",
            error=ControlPlaneError,
        )
        if containerd.poll() is not None:
            log_text = (PREIMPORT_DIR / "containerd.log").read_text(errors="replace")
            raise ControlPlaneError(f"the pre-import containerd exited:\n{log_text[-2000:]}")
        store.import_all()
    finally:
        containerd.terminate()
        try:
            containerd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            containerd.kill()
            containerd.wait()
        unmount_all([PREIMPORT_DIR, root])
        shutil.rmtree(PREIMPORT_DIR, ignore_errors=True)


# --------------------------------------------------------------------------- the node


@dataclass
class Node:
    """containerd + CNI + kubelet + kube-proxy + CoreDNS, joined to ``plane``.

    The control plane must run with ``address=NODE_IP`` (see ``host_network_up``)."""

    plane: ControlPlane
    tools: NodeTools = field(default_factory=NodeTools.locate)
    images: Sequence[str] = PRODUCT_IMAGES
    start_timeout: float = 180.0
    components: list[Component] = field(default_factory=list)
    _iptables: IptablesSnapshot | None = None
    _ip_forward: str | None = None

    # -- paths ---------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.plane.root / "node"

    @property
    def containerd_socket(self) -> Path:
        return STATE_DIR / "containerd.sock"

    @property
    def containerd_root(self) -> Path:
        """Persistent across runs: imported images stay, so a warm start imports nothing."""
        return tools_dir() / "node-state" / "containerd"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def volumes_dir(self) -> Path:
        return self.root / "volumes"

    # -- host network (before the control plane starts) ----------------------------------

    @staticmethod
    def host_network_up() -> None:
        """The node's address on an interface of its own: the API server binds there."""
        if not link_exists(NODE_LINK):
            # A bridge without ports: this kernel has no dummy driver, and an address on any
            # interface that is up is a local address of the host.
            _run(["ip", "link", "add", NODE_LINK, "type", "bridge"])
        _run(["ip", "addr", "replace", f"{NODE_IP}/32", "dev", NODE_LINK])
        _run(["ip", "link", "set", NODE_LINK, "up"])

    @staticmethod
    def host_network_down() -> None:
        for link in (BRIDGE, NODE_LINK):
            if link_exists(link):
                _run(["ip", "link", "delete", link], check=False)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Node:
        self.tools.require()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._clean_after_crash()
            self._iptables = IptablesSnapshot.take()
            self._isolate_pods()
            self._start_containerd()
            self._import_images()
            self._start_coredns()
            self._start_kube_proxy()
            self._start_network_policies()
            self._start_kubelet()
            self._create_storage()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the node and remove everything it made (see the module docstring)."""
        errors: list[str] = []
        kubelet = self._component("kubelet")
        if kubelet is not None and kubelet.running() and self.plane.components:
            with contextlib.suppress(ControlPlaneError, subprocess.TimeoutExpired):
                self._drain()
        for name in ("kubelet", "kube-network-policies", "kube-proxy", "coredns"):
            component = self._component(name)
            if component is not None:
                try:
                    component.stop()
                except ControlPlaneError as exc:
                    errors.append(str(exc))
                self.components.remove(component)
        containerd = self._component("containerd")
        netns: list[str] = []
        if containerd is not None and containerd.running():
            netns = self._remove_cri_containers()
        if containerd is not None:
            try:
                containerd.stop()
            except ControlPlaneError as exc:
                errors.append(str(exc))
            self.components.remove(containerd)
        self._kill_shims()
        for path in netns:
            _run(["umount", path], check=False)
            with contextlib.suppress(OSError):
                Path(path).unlink()
        left = unmount_all([STATE_DIR, self.root, self.containerd_root])
        if left:
            errors.append(f"still mounted: {left}")
        if self.tools.kube_proxy.exists():
            _run([self.tools.kube_proxy, "--cleanup"], check=False)
        if self.tools.network_policies.exists():
            # Its own stop removes its table; this covers a process that died before.
            _run([self.tools.network_policies, "--cleanup"], check=False)
        if self._iptables is not None:  # NETPOL_CHAIN and FORWARD_CHAIN go with the rest
            left_chains = self._iptables.restore()
            if left_chains:
                errors.append(f"iptables chains left: {left_chains}")
            self._iptables = None
        self._remove_cgroups()
        if self._ip_forward is not None:
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self._ip_forward)
            self._ip_forward = None
        if link_exists(BRIDGE):
            _run(["ip", "link", "delete", BRIDGE], check=False)
        shutil.rmtree(STATE_DIR, ignore_errors=True)
        if errors:
            raise ControlPlaneError("; ".join(errors))

    def _clean_after_crash(self) -> None:
        """What a node killed without its stop left behind (kubelet pods' shims, kube-proxy's
        rules, kube-network-policies' table, our FORWARD and POSTROUTING chains, mounts, the
        bridge), so this start begins from nothing. A queue rule left without its controller
        would drop every new pod connection."""
        # tj-node0 is there already: host_network_up made it for the control plane.
        if not [found for found in leftovers() if NODE_LINK not in found]:
            return
        self._kill_shims()
        _run([self.tools.kube_proxy, "--cleanup"], check=False)
        _run([self.tools.network_policies, "--cleanup"], check=False)
        for table, hook, chain in (
            ("filter", "FORWARD", FORWARD_CHAIN),
            ("mangle", "POSTROUTING", NETPOL_CHAIN),
        ):
            if chain in _chains("iptables", table):
                _run(["iptables", "-w", "-t", table, "-D", hook, "-j", chain], check=False)
                _run(["iptables", "-w", "-t", table, "-F", chain], check=False)
                _run(["iptables", "-w", "-t", table, "-X", chain], check=False)
        unmount_all([STATE_DIR])
        self._remove_cgroups()
        if link_exists(BRIDGE):
            _run(["ip", "link", "delete", BRIDGE], check=False)
        shutil.rmtree(STATE_DIR, ignore_errors=True)

    def _component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    def _spawn(self, name: str, argv: Sequence[str | Path]) -> Component:
        # Logs next to the control plane's; the node stops its own processes.
        component = self.plane.spawn(name, argv, stopped_with_plane=False)
        self.components.append(component)
        return component

    # -- network isolation ---------------------------------------------------------------

    def _isolate_pods(self) -> None:
        """Pods talk to each other, the node's address and Services, nothing else: the only
        FORWARD traffic allowed to or from the pod range is pod to pod. Forwarding is on
        while the node runs (kube-proxy's DNAT to a pod is routed), and restored after."""
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        self._ip_forward = forward.read_text().strip()
        forward.write_text("1")
        _run(["iptables", "-w", "-N", FORWARD_CHAIN])
        for rule in (
            ["-s", POD_CIDR, "-d", POD_CIDR, "-j", "ACCEPT"],
            ["-s", POD_CIDR, "-j", "DROP"],
            ["-d", POD_CIDR, "-j", "DROP"],
        ):
            _run(["iptables", "-w", "-A", FORWARD_CHAIN, *rule])
        _run(["iptables", "-w", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN])

    # -- containerd ----------------------------------------------------------------------

    def _write_cni_config(self) -> Path:
        conf_dir = self.root / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "cniVersion": "0.4.0",
            "name": "trainjob",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # No masquerade and no default route: nothing leaves the machine.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": SERVICE_CLUSTER_IP_RANGE}, {"dst": f"{NODE_IP}/32"}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                },
            ],
        }
        (conf_dir / "10-trainjob.conflist").write_text(json.dumps(config, indent=2))
        return conf_dir

    def _start_containerd(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        conf_dir = self._write_cni_config()
        config = self.root / "containerd.toml"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(
            containerd_config_head(
                self.containerd_root,
                STATE_DIR / "containerd",
                self.containerd_socket,
                STATE_DIR / "containerd-ttrpc.sock",
            )
            + f"""[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  # This machine withholds CAP_SYS_RESOURCE: no process may lower its OOM score below ours,
  # so the sandbox's -998 (and a Guaranteed pod's -997) are raised to containerd's own.
  restrict_oom_score_adj = true
  max_container_log_line_size = 16384
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{self.tools.runc}"
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{conf_dir}"
  max_conf_num = 1
""",
            encoding="utf-8",
        )
        containerd = self._spawn(
            "containerd", [self.tools.containerd, f"--config={config}", "--log-level=warn"]
        )
        self.plane.wait_healthy(
            containerd,
            lambda: self._ctr("version", check=False) is not None,
        )
        # Containers a crashed run left in the persistent root: kubelet would adopt them.
        self._remove_cri_containers()

    def _ctr(self, *args: str | Path, check: bool = True, timeout: float = 600.0) -> str | None:
        return self._images().ctr(*args, check=check, timeout=timeout)

    def _images(self) -> NodeImages:
        return NodeImages(self.tools, self.containerd_socket, self.root, self.images)

    def _remove_cri_containers(self) -> list[str]:
        """Kill and delete every container in the CRI namespace; returns the network
        namespaces of the pod sandboxes (to unmount once containerd is gone)."""
        netns: list[str] = []
        ids = (self._ctr("containers", "list", "-q", check=False) or "").split()
        for cid in ids:
            info = self._ctr("containers", "info", cid, check=False) or "{}"
            with contextlib.suppress(ValueError, KeyError, TypeError):
                spec = json.loads(info)["Spec"]
                for ns in spec["linux"]["namespaces"]:
                    if ns.get("type") == "network" and ns.get("path"):
                        netns.append(ns["path"])
            self._ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False, timeout=30)
            self._ctr("tasks", "delete", "-f", cid, check=False, timeout=30)
            self._ctr("containers", "delete", cid, check=False, timeout=30)
        return sorted(set(netns))

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd by design: end ours."""
        address = str(self.containerd_socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                cmdline
                and cmdline[0].endswith(b"containerd-shim-runc-v2")
                and any(arg.decode(errors="replace") == address for arg in cmdline)
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    # -- images --------------------------------------------------------------------------

    def _import_images(self) -> None:
        self._images().import_all()

    # -- CoreDNS, kube-proxy, kubelet ----------------------------------------------------

    def _start_coredns(self) -> None:
        ready_port = ports.free_port()
        corefile = self.root / "Corefile"
        # Only the cluster's names: no `forward`, so no query leaves the machine.
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    ready {ports.LOOPBACK}:{ready_port}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.plane.kubeconfig} trainjob-test
        pods insecure
        ttl 5
    }}
}}
""",
            encoding="utf-8",
        )
        coredns = self._spawn("coredns", [self.tools.coredns, "-conf", corefile])
        self.plane.wait_healthy(
            coredns, lambda: waits.http_ok(f"http://{ports.LOOPBACK}:{ready_port}/ready")
        )

    def _start_kube_proxy(self) -> None:
        config = self.root / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.plane.kubeconfig)},
                    "hostnameOverride": NODE_NAME,
                    "mode": "iptables",
                    "clusterCIDR": POD_CIDR,
                    "bindAddress": NODE_IP,
                    "healthzBindAddress": f"{ports.LOOPBACK}:{ports.free_port()}",
                    "metricsBindAddress": f"{ports.LOOPBACK}:{ports.free_port()}",
                    # The host's conntrack sysctls stay as they are.
                    "conntrack": {"maxPerCore": 0, "min": 0},
                    # NodePorts only on the node's address; no route_localnet sysctl.
                    "nodePortAddresses": [f"{NODE_IP}/32"],
                    "iptables": {"localhostNodePorts": False},
                }
            ),
            encoding="utf-8",
        )
        self._spawn("kube-proxy", [self.tools.kube_proxy, f"--config={config}", "--v=1"])

    def _start_network_policies(self) -> None:
        """kube-network-policies, and the rule that sends it the first packet of each new
        connection from or to a pod (the rest of a connection follows its conntrack entry).

        Why an iptables rule: the controller writes nftables rules whose ``queue`` statement
        needs the kernel's nft_queue (CONFIG_NFT_QUEUE), which this machine's kernel lacks
        (and loads no modules), so its table never loads and it would enforce nothing; the
        xt ``NFQUEUE`` target is built in. The rule mirrors the controller's own chain: at
        POSTROUTING (after kube-proxy's DNAT, so a Service's traffic is judged by its pod),
        root's own sockets pass (kubelet's probes: node traffic stays allowed, as Kubernetes
        says), established flows pass, the rest queues. It queues every pod connection, not
        only those of pods a policy selects (the controller keeps that set in its nftables
        table): the verdict for an unselected pod is accept, at the cost of one user-space
        round trip per connection. No ``--queue-bypass``: while the controller is down, new
        pod connections are refused, as the controller does by default (fail closed)."""
        if queue_bound(_nfqueues(), NETPOL_QUEUE):
            raise ControlPlaneError(
                f"NFQUEUE {NETPOL_QUEUE} is taken by another process ({NFQUEUES}); "
                "is another test node running?"
            )
        component = self._spawn(
            "kube-network-policies",
            [
                self.tools.network_policies,
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--nfqueue-id={NETPOL_QUEUE}",
                f"--metrics-bind-address={ports.LOOPBACK}:{ports.free_port()}",
                # V(2): one line per judged connection (its pods and verdict): what a test
                # that fails on a refused connection needs to read.
                "--v=2",
            ],
        )
        # The queue is bound once its informers have synced: from then on it judges.
        self.plane.wait_healthy(
            component,
            lambda: queue_bound(_nfqueues(), NETPOL_QUEUE),
            what=f"kube-network-policies to bind NFQUEUE {NETPOL_QUEUE}",
        )
        for rule in network_policy_rules(POD_CIDR, NETPOL_QUEUE):
            _run(["iptables", "-w", *rule])

    def _start_kubelet(self) -> None:
        pki_dir = self.root / "pki"
        pki_dir.mkdir(parents=True, exist_ok=True)
        cert, key = pki_dir / "kubelet-client.crt", pki_dir / "kubelet-client.key"
        self.plane.pki.client_cert(f"system:node:{NODE_NAME}", "system:nodes", cert, key)
        kubeconfig = self.plane.write_kubeconfig_as(
            self.root / "kubelet.kubeconfig",
            f"system:node:{NODE_NAME}",
            {"client-certificate": str(cert), "client-key": str(key)},
        )
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        config = self.root / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    # cgroup v1 controllers + an empty cgroup2 mount: v1 to kubelet. 1.35
                    # flips the default to true (refuse v1); say it explicitly.
                    "failCgroupV1": False,
                    "cgroupDriver": "cgroupfs",
                    "failSwapOn": False,
                    "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
                    "address": NODE_IP,
                    "port": 10250,
                    "readOnlyPort": 0,
                    "healthzBindAddress": ports.LOOPBACK,
                    "healthzPort": ports.free_port(),
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": True},
                        "x509": {"clientCAFile": str(self.plane.pki.ca_cert)},
                    },
                    "authorization": {"mode": "Webhook"},
                    "clusterDNS": [NODE_IP],
                    "clusterDomain": CLUSTER_DOMAIN,
                    # Not the host's resolver: pods resolve cluster names only.
                    "resolvConf": "",
                    # Images come from images/build.sh and cannot be pulled again: never
                    # garbage-collect them, and never evict for disk on a shared machine.
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "1%",
                        "nodefs.inodesFree": "1%",
                        "imagefs.available": "1%",
                        "imagefs.inodesFree": "1%",
                    },
                    "podLogsDir": str(self.root / "pod-logs"),
                    "maxPods": 110,
                    "serializeImagePulls": False,
                    "registerNode": True,
                    "syncFrequency": "10s",
                    "nodeStatusUpdateFrequency": "5s",
                    "fileCheckFrequency": "20s",
                    "shutdownGracePeriod": "0s",
                }
            ),
            encoding="utf-8",
        )
        kubelet = self._spawn(
            "kubelet",
            [
                self.tools.kubelet,
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={pki_dir}",
                "--v=1",
            ],
        )

        def ready() -> bool:
            out = self.plane.kubectl(
                "get",
                "node",
                NODE_NAME,
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                check=False,
            )
            return out.returncode == 0 and out.stdout.strip() == "True"

        self.plane.wait_healthy(
            kubelet,
            ready,
            what=f"node {NODE_NAME} Ready",
            timeout=self.start_timeout,
            interval=0.5,
        )

    # -- storage -------------------------------------------------------------------------

    def _create_storage(self) -> None:
        """A default StorageClass with local volumes, bound when a pod is scheduled. Each
        volume is a root-owned directory, like a fresh file system: pods write to it through
        their fsGroup, as on a cloud disk."""
        objects: list[dict[str, object]] = [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Retain",
            }
        ]
        for i in range(LOCAL_VOLUMES):
            path = self.volumes_dir / f"pv-{i:02d}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o755)
            only_here = {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [NODE_NAME],
                                }
                            ]
                        }
                    ]
                }
            }
            objects.append(
                persistent_volume(
                    f"{NODE_NAME}-pv-{i:02d}",
                    {"local": {"path": str(path)}, "nodeAffinity": only_here},
                    ["ReadWriteOnce"],
                )
            )
        manifest = "\n---\n".join(yaml.safe_dump(o) for o in objects)
        self.plane.kubectl("apply", "-f", "-", stdin=manifest)

    # -- stop ----------------------------------------------------------------------------

    def _drain(self, timeout: float = 90.0) -> None:
        """Delete every pod and wait until kubelet has stopped their containers and torn
        down their networks (CNI DEL, volume unmounts) the regular way."""
        # Cordoned first: pods that controllers recreate stay Pending, off the node.
        self.plane.kubectl("cordon", NODE_NAME, check=False)
        self.plane.kubectl(
            "delete",
            "pods",
            "--all",
            "--all-namespaces",
            "--grace-period=1",
            "--wait=false",
            check=False,
        )

        def quiet() -> bool:
            pods = self.plane.kubectl(
                "get",
                "pods",
                "-A",
                "-o",
                "name",
                "--field-selector",
                f"spec.nodeName={NODE_NAME}",
                check=False,
            )
            tasks = self._ctr("tasks", "list", "-q", check=False, timeout=30) or ""
            return pods.returncode == 0 and not pods.stdout.strip() and not tasks.strip()

        waits.wait_until(
            quiet,
            timeout=timeout,
            what="the node's pods to stop",
            interval=1.0,
            error=ControlPlaneError,
        )

    def _remove_cgroups(self) -> None:
        """kubelet's cgroups (cgroupfs driver): /kubepods in each v1 hierarchy."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for directory in sorted(_dirs(top), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()


def network_policy_rules(pod_cidr: str, queue: int) -> list[list[str]]:
    """The iptables rules (arguments after ``iptables -w``) that send kube-network-policies,
    bound to NFQUEUE `queue`, the first packet of each new connection from or to a pod of
    `pod_cidr` (why iptables and why these: NodeCluster._start_network_policies)."""
    to_queue = ["-j", "NFQUEUE", "--queue-num", str(queue)]
    chain = ["-t", "mangle", "-A", NETPOL_CHAIN]
    return [
        ["-t", "mangle", "-N", NETPOL_CHAIN],
        [*chain, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
        [*chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        [*chain, "-s", pod_cidr, *to_queue],
        [*chain, "-d", pod_cidr, *to_queue],
        ["-t", "mangle", "-I", "POSTROUTING", "1", "-j", NETPOL_CHAIN],
    ]


def queue_bound(nfnetlink_queue_lines: Sequence[str], queue: int) -> bool:
    """Whether a process is bound to NFQUEUE `queue`, from the lines of
    /proc/net/netfilter/nfnetlink_queue (the queue number first)."""
    return any(line.split()[:1] == [str(queue)] for line in nfnetlink_queue_lines)


def _nfqueues() -> list[str]:
    """The bound NFQUEUEs, one line each (the queue number first)."""
    try:
        return [line for line in NFQUEUES.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _dirs(top: Path) -> Iterator[Path]:
    yield top
    for dirpath, dirnames, _ in os.walk(top):
        for name in dirnames:
            yield Path(dirpath) / name


def persistent_volume(
    name: str, source: dict[str, object], access_modes: Sequence[str]
) -> dict[str, object]:
    """A 10Gi PersistentVolume of the default StorageClass, kept after its claim (Retain);
    `source` is its volume source (and node affinity)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": list(access_modes),
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            **source,
        },
    }


def pyproject_version() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise ToolsMissingError("no version in pyproject.toml")
    return match.group(1)


@contextlib.contextmanager
def running_node(
    workdir: Path | None = None, crds: Sequence[Path] = (), images: Sequence[str] = PRODUCT_IMAGES
) -> Iterator[Node]:
    """The control plane on the node's address plus the node, stopped and cleaned up on exit
    (also when starting fails half-way)."""
    NodeTools.locate().require()
    Node.host_network_up()
    plane = ControlPlane(workdir=workdir, crds=crds, address=NODE_IP)
    node: Node | None = None
    try:
        plane.start()
        node = Node(plane, images=images)
        node.start()
        yield node
    finally:
        errors: list[str] = []
        for stop in ((node.stop if node is not None else None), plane.stop):
            if stop is None:
                continue
            try:
                stop()
            except ControlPlaneError as exc:
                errors.append(str(exc))
        Node.host_network_down()
        errors += leftovers()
        if errors:
            raise ControlPlaneError("; ".join(errors))


def leftovers() -> list[str]:
    """What a stopped node must not leave behind: its interfaces, state mounts, kubelet
    cgroups, FORWARD and POSTROUTING rules, and processes of its containerd (shims included)."""
    found = [f"interface {link}" for link in (NODE_LINK, BRIDGE) if link_exists(link)]
    found += [f"mount {m}" for m in mounts_under([STATE_DIR])]
    found += [
        f"cgroup {h / 'kubepods'}"
        for h in Path("/sys/fs/cgroup").iterdir()
        if (h / "kubepods").is_dir()
    ]
    if FORWARD_CHAIN in _chains("iptables", "filter"):
        found.append(f"iptables chain {FORWARD_CHAIN}")
    if NETPOL_CHAIN in _chains("iptables", "mangle"):
        found.append(f"iptables chain mangle {NETPOL_CHAIN}")
    socket = str(STATE_DIR / "containerd.sock").encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if socket in cmdline or STATE_DIR.name.encode() + b"/containerd" in cmdline:
                found.append(f"process {proc.name}: {cmdline.replace(bytes(1), b' ')[:120]!r}")
    return found
