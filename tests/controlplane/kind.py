"""A real kind cluster on this machine, without a registry: 1 control-plane + 2 workers.

kind (sigs.k8s.io/kind, built by ``install.sh --kind``) drives Docker; everything it needs
that a registry would give is made here (the why of each piece is below, from kind's own
sources, sigs.k8s.io/kind):

- **dockerd** (Debian's docker.io) runs in a network namespace of its own (``trainjob-kind``),
  so its bridges, NAT and FORWARD policy never touch the host's firewall, which the node tier
  snapshots and restores. Its default OCI runtime is a wrapper around runc that drops
  CAP_SYS_RESOURCE, which this machine's root does not hold (``kind/runc-nosysres``).
- the **node image** is assembled by ``kind/node-image.sh`` from Debian packages, kind's own
  base files and the test bed's Kubernetes binaries, its control-plane images preloaded.
- **the pod network**: kindnetd cannot be built here (its module is not served), so each node
  gets the ptp CNI plugin for its podCIDR and a route to every other node's podCIDR: pods on
  different nodes talk directly over the nodes' network, which is all kindnetd does without
  NetworkPolicy.
- **NetworkPolicy** is enforced by kube-network-policies (SIG Network's, what kindnetd embeds),
  installed from its module's install.yaml as a DaemonSet, with one addition in each node: the
  iptables rule that hands it each new pod connection, since its own nftables rules need the
  kernel's nft_queue, which this machine lacks (the node tier does the same, node.py).
- **storage**: the default StorageClass ``standard`` has PersistentVolumes on a directory
  shared by every node (a host folder mounted into each node container): a checkpoint written
  on one node is read on another after the first is lost, as on the network file system
  (NFS, Filestore, EFS) a multi-node training job keeps its checkpoints on. A node-local
  volume would pin the job to the node it lost.
- the API server is published on ``KIND_HOST_IP``'s peer address, the namespace's end of a
  veth pair, so kubectl, helm, the Python client and the CLI reach it from the host. Pods
  reach ``KIND_HOST_IP`` itself, where a test's S3 server listens, through a masquerade rule
  in each node (``host_masquerade_rule``): nothing beyond this machine.

The product images are imported into the workers' containerd as ``kind load image-archive``
does, from an archive in the shared folder (``write_image_archive``, written while the nodes
boot, then ``KindCluster.import_images``; the control-plane node is tainted, as in any
multi-node kind cluster). ``running_kind`` deletes the cluster and stops dockerd, and removes
the namespace, veth, data root and mounts, also when a test fails or the run is interrupted;
``leftovers`` lists what must not remain.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from tests.controlplane.cluster import ControlPlaneError
from tests.controlplane.gang import plugins_dir, plugins_version
from tests.controlplane.kueue import kueue_version
from tests.controlplane.node import (
    coredns_version,
    image_refs,
    image_store_buildah,
    kubernetes_version,
    link_exists,
    mounts_under,
    network_policies_version,
    network_policy_rules,
    persistent_volume,
    queue_bound,
    unmount_all,
)
from tests.controlplane.tools import (
    HERE,
    Tools,
    ToolsMissingError,
    go_mod_version,
    install_sh_version,
    tools_dir,
)
from tests.support import waits

CLUSTER_NAME: Final = "trainjob"
NETNS: Final = "trainjob-kind"
# The veth pair between the host and the namespace: the API server is published on the peer.
HOST_LINK: Final = "tj-kind0"
PEER_LINK: Final = "tj-kind1"
KIND_HOST_IP: Final = "10.242.0.1"
KIND_PEER_IP: Final = "10.242.0.2"
API_SERVER_PORT: Final = 6443
POD_SUBNET: Final = "10.245.0.0/16"
STATE_DIR: Final = Path("/run/trainjob-kind")
# An image's docker-archive for the moment of its import, in the folder every node mounts
# (SHARED_MOUNT): each worker's containerd reads it as a file. Streamed into each worker through
# `docker exec` (what `kind load image-archive` does) the import took 33 CPU-seconds for the 2 GB
# runtime image and one worker, against 24 from the file (2026-11-29).
IMAGE_ARCHIVE_NAME: Final = ".image-archive.tar"
# The snapshotter of the node image's containerd (what `kind load` passes too).
NODE_SNAPSHOTTER: Final = "overlayfs"
# dockerd's data root: the node containers and their images (several GB), on the big disk.
DATA_ROOT_ENV: Final = "TRAINJOB_KIND_DATA_ROOT"
LIB_MODULES: Final = Path("/lib/modules")
CREATED_LIB_MODULES: Final = "created-lib-modules"  # a marker in STATE_DIR
SHARED_VOLUMES: Final = 40  # one per claim of the tier, which keeps them (Retain)
SHARED_MOUNT: Final = "/shared"
WORKERS: Final = (f"{CLUSTER_NAME}-worker", f"{CLUSTER_NAME}-worker2")
CONTROL_PLANE: Final = f"{CLUSTER_NAME}-control-plane"
# The lines of each log a failed start prints (control_plane_report).
REPORT_LINES: Final = 15
INSTALL_COMMAND: Final = "bash tests/controlplane/install.sh --kind"
RUNTIME_WRAPPER: Final = HERE / "kind" / "runc-nosysres"
NETPOL_NAME: Final = "kube-network-policies"  # its install.yaml's DaemonSet, in kube-system


def data_root() -> Path:
    return Path(os.environ.get(DATA_ROOT_ENV, "/var/lib/trainjob-kind"))


@dataclass(frozen=True)
class KindTools:
    """kind, kubeadm (in the node image), the node image, Docker, and the test bed's
    kubectl and helm."""

    kind: Path
    node_image: Path
    kubectl: Path
    helm: Path
    charts: Path  # kueue/ and scheduler-plugins/, the charts from their Go modules
    plugins_crds: Path
    kueue_version: str
    plugins_version: str
    network_policies: Path  # kube-network-policies' install.yaml, from its Go module
    network_policies_version: str
    dockerd: Path = Path("/usr/sbin/dockerd")
    docker: Path = Path("/usr/bin/docker")

    @classmethod
    def locate(cls) -> KindTools:
        base = tools_dir()
        k8s = kubernetes_version()
        archives = sorted((base / "kind-node").glob(f"kind-node-{k8s}-*.tar"))
        kind_dir = (
            base / f"kind-{install_sh_version('KIND_VERSION')}-{k8s}-coredns-{coredns_version()}"
        )
        tools = Tools.locate()
        return cls(
            kind=kind_dir / "kind",
            charts=kind_dir / "charts",
            plugins_crds=plugins_dir() / "crds",
            kueue_version=kueue_version(),
            plugins_version=plugins_version(),
            network_policies=base
            / f"network-policies-{network_policies_version()}"
            / "install.yaml",
            network_policies_version=network_policies_version(),
            node_image=archives[-1] if archives else base / "kind-node" / "(not built)",
            kubectl=tools.kubectl,
            helm=tools.helm,
        )

    def require(self) -> KindTools:
        wanted = (self.kind, self.kubectl, self.helm, self.dockerd, self.docker)
        missing = [p for p in wanted if not os.access(p, os.X_OK)]
        missing += [p for p in (self.charts / "kueue", self.plugins_crds) if not p.is_dir()]
        missing += [p for p in (self.node_image, self.network_policies) if not p.is_file()]
        if missing:
            listed = "\n  ".join(map(str, missing))
            raise ToolsMissingError(f"kind's parts are missing:\n  {listed}\n  {INSTALL_COMMAND}")
        if os.geteuid() != 0:
            raise ToolsMissingError("a kind cluster here needs root (dockerd, netns)")
        return self


def _run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = 300.0,
    stdin: str | None = None,
) -> str:
    result = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
        input=stdin,
    )
    if check and result.returncode != 0:
        raise ControlPlaneError(
            f"{' '.join(map(str, argv))} failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result.stdout


def in_netns(*argv: str | Path) -> list[str]:
    """argv run in the cluster's network namespace. nsenter, not `ip netns exec`: that one
    remounts /sys, which hides the cgroup mounts dockerd needs."""
    return ["nsenter", f"--net=/run/netns/{NETNS}", *map(str, argv)]


# A lost node is called lost after NODE_MONITOR_GRACE_S without a lease renewal, not 50 s:
# the lost-node e2e test waits that long with the machine otherwise idle. Its kubelet renews
# every quarter of NODE_LEASE_S, so every 5 s: 6 renewals in a row must fail before a loaded
# but live node is called lost, against 5 with Kubernetes' defaults (every 10 s, 50 s grace).
NODE_MONITOR_GRACE_S: Final = 30
NODE_LEASE_S: Final = 20


def cluster_config(shared: Path) -> str:
    """kind's cluster config: 3 nodes, no default CNI (see the module docstring), the API
    server on the namespace's veth address, each node with the shared volumes folder, and
    kubeadm told the versions of the etcd and CoreDNS images inside the node image."""
    etcd = go_mod_version(HERE / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3").removeprefix("v")
    coredns = go_mod_version(HERE / "coredns" / "go.mod", "github.com/coredns/coredns")
    mounts = [{"hostPath": str(shared), "containerPath": SHARED_MOUNT}]
    config = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {
            "disableDefaultCNI": True,
            "apiServerAddress": KIND_PEER_IP,
            "apiServerPort": API_SERVER_PORT,
            "podSubnet": POD_SUBNET,
        },
        "kubeadmConfigPatches": [
            yaml.safe_dump(
                {
                    "kind": "ClusterConfiguration",
                    "etcd": {"local": {"imageTag": f"{etcd}-0"}},
                    "dns": {"imageTag": coredns},
                    # kubeadm v1beta3's map of arguments (kind's below Kubernetes 1.36),
                    # merged into kind's own
                    "controllerManager": {
                        "extraArgs": {"node-monitor-grace-period": f"{NODE_MONITOR_GRACE_S}s"}
                    },
                }
            ),
            yaml.safe_dump(
                {"kind": "KubeletConfiguration", "nodeLeaseDurationSeconds": NODE_LEASE_S}
            ),
        ],
        "nodes": [
            {"role": role, "extraMounts": mounts} for role in ("control-plane", "worker", "worker")
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def shared_volumes(count: int) -> list[dict[str, object]]:
    """PersistentVolumes of the default StorageClass on the folder every node mounts at
    SHARED_MOUNT, ``pv-00`` ... (see the module docstring for why shared)."""
    return [
        persistent_volume(
            f"shared-pv-{i:02d}",
            {"hostPath": {"path": f"{SHARED_MOUNT}/pv-{i:02d}", "type": "Directory"}},
            ["ReadWriteOnce", "ReadWriteMany"],
        )
        for i in range(count)
    ]


def set_network_policies_image(manifest: Sequence[dict[str, Any] | None], image: str) -> int:
    """Point install.yaml's DaemonSet at `image` (upstream's names an older release than its
    module's); return the NFQUEUE its arguments bind."""
    for doc in manifest:
        if doc and doc.get("kind") == "DaemonSet" and doc["metadata"]["name"] == NETPOL_NAME:
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["image"] = image
            for arg in container.get("args", []):
                if arg.startswith("--nfqueue-id="):
                    return int(arg.split("=", 1)[1])
            return 100  # the command's default
    raise ControlPlaneError(f"no DaemonSet {NETPOL_NAME} in kube-network-policies' install.yaml")


def image_digest(images_list: str, ref: str) -> str:
    """The target digest of `ref` in ``ctr images list`` output (REF TYPE DIGEST ...)."""
    for line in images_list.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[0] == ref:
            return fields[2]
    raise ControlPlaneError(f"{ref} is not in the node's containerd after its import")


def manifest_layers(content: Callable[[str], dict[str, Any]], digest: str) -> list[str]:
    """The layer digests under a manifest or an index (`content` reads a blob as JSON)."""
    blob = content(digest)
    if "manifests" in blob:
        return sorted({d for m in blob["manifests"] for d in manifest_layers(content, m["digest"])})
    return sorted({layer["digest"] for layer in blob.get("layers", [])})


ARCHIVE_MANIFEST: Final = "manifest.json"  # a docker-archive's list of its images
ARCHIVE_TRAILER: Final = (ARCHIVE_MANIFEST, "repositories")  # written last by buildah push


def append_docker_archive(archive: Path, other: Path) -> None:
    """Adds the images of the docker-archive `other` to the docker-archive `archive` (both as
    ``buildah push`` writes them: each layer and config a file named by its digest, the
    manifest and the legacy ``repositories`` file last): the files `archive` lacks, then
    one manifest listing the images of both. The layers they share are stored once, so a
    containerd that imports the result reads each once. `archive` is cut before its old
    manifest and written on, not copied."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        names = {m.name for m in members}
        trailer = trailer_offset(members)
        images = _archive_manifest(tar)
    with tarfile.open(other) as tar:
        images += _archive_manifest(tar)
        with archive.open("r+b") as out:
            out.seek(trailer)
            out.truncate()
            with tarfile.open(fileobj=out, mode="w") as into:  # writes on from there
                for member in tar:
                    if member.name in ARCHIVE_TRAILER or member.name in names:
                        continue
                    into.addfile(member, tar.extractfile(member) if member.isfile() else None)
                manifest = json.dumps(images).encode()
                info = tarfile.TarInfo(ARCHIVE_MANIFEST)
                info.size = len(manifest)
                info.mode = 0o444
                into.addfile(info, io.BytesIO(manifest))


def trailer_offset(members: Sequence[tarfile.TarInfo]) -> int:
    """Where a docker-archive's trailer (its manifest and ``repositories``) starts: the
    archive is cut there to take more images. An archive with anything after its manifest is
    not one ``buildah push`` wrote, and an error."""
    starts = [i for i, m in enumerate(members) if m.name == ARCHIVE_MANIFEST]
    if not starts or any(m.name not in ARCHIVE_TRAILER for m in members[starts[0] :]):
        order = ", ".join(m.name for m in members[-3:])
        raise ControlPlaneError(
            f"a docker-archive that does not end with its {ARCHIVE_MANIFEST} ({order}): "
            "not as buildah push writes one"
        )
    return members[starts[0]].offset


def _archive_manifest(tar: tarfile.TarFile) -> list[dict[str, Any]]:
    data = tar.extractfile(ARCHIVE_MANIFEST)
    if data is None:
        raise ControlPlaneError(f"a docker-archive without its {ARCHIVE_MANIFEST}")
    images: list[dict[str, Any]] = json.loads(data.read())
    return images


def write_image_archive(archive: Path, refs: Sequence[str]) -> None:
    """The images `refs` from buildah's store into one docker-archive at `archive`, each layer
    once: the first pushed there, each next one to a file of its own, appended
    (append_docker_archive), then removed. Nothing is left at `archive` if it fails.

    One archive, not one per image: containerd's import reads, hashes and stores every layer
    file an archive holds, even one it already has, and Kubeflow's MNIST image is the runtime
    image plus two small layers. Imported from an archive of its own, it cost each worker its
    2 GB again (39 CPU-seconds of containerd and ctr, against 49 for the runtime image itself,
    measured on this machine's containerd 1.6)."""
    if not refs:
        return
    started = time.monotonic()

    def push(ref: str, to: Path) -> None:
        image_store_buildah("push", "--quiet", ref, f"docker-archive:{to}:{ref}")

    first, *others = refs
    try:
        push(first, archive)
        for i, ref in enumerate(others, start=1):
            part = archive.with_suffix(f".{i}.tar")
            try:
                push(ref, part)
                append_docker_archive(archive, part)
            finally:
                part.unlink(missing_ok=True)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise
    print(f"image archive written in {time.monotonic() - started:.0f}s: {', '.join(refs)}")


def host_masquerade_rule() -> list[str]:
    """The node's rule for pods' connections to KIND_HOST_IP, this machine's end of the veth
    (where a test's S3 server listens, tests/e2e/test_trainjob.py): from the node's address,
    since the host has no route back to the pods' subnet (and must not get one beyond)."""
    where = ["-s", POD_SUBNET, "-d", f"{KIND_HOST_IP}/32"]
    return ["-t", "nat", "-A", "POSTROUTING", *where, "-j", "MASQUERADE"]


def ptp_conflist(pod_cidr: str) -> str:
    """The node's CNI config: a veth per pod into the node's network namespace, addresses from
    the node's podCIDR, no masquerade (nothing beyond the nodes is reachable anyway)."""
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "ptp-static",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "ranges": [[{"subnet": pod_cidr}]],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
    )


@dataclass
class KindCluster:
    tools: KindTools
    state: Path = STATE_DIR

    @property
    def docker_env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.state / 'docker.sock'}"}

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def env(self) -> dict[str, str]:
        return {**self.docker_env, "KUBECONFIG": str(self.kubeconfig)}

    @property
    def shared(self) -> Path:
        return data_root() / "shared"

    def docker(self, *args: str | Path, timeout: float = 300.0, check: bool = True) -> str:
        return _run([self.tools.docker, *args], env=self.docker_env, timeout=timeout, check=check)

    def kind(self, *args: str | Path, timeout: float = 600.0) -> str:
        return _run(
            in_netns(self.tools.kind, *args, "--name", CLUSTER_NAME),
            env=self.env,
            timeout=timeout,
        )

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 120.0) -> str:
        return _run([self.tools.kubectl, *args], env=self.env, stdin=stdin, timeout=timeout)

    # -- start ---------------------------------------------------------------------------

    def start(self) -> KindCluster:
        """Nodes, pod network and storage; start_kind has removed what a killed run left
        behind (clean_up) and made the shared folder first."""
        started = time.monotonic()
        self._network_up()
        self._start_dockerd()
        self.docker("load", "-i", self.tools.node_image, timeout=600)
        self.shared.mkdir(parents=True, exist_ok=True)
        config = self.state / "kind.yaml"
        config.write_text(cluster_config(self.shared), encoding="utf-8")
        image = self._node_image_ref()
        self.kind(
            "create",
            "cluster",
            "--image",
            image,
            "--config",
            config,
            "--kubeconfig",
            self.kubeconfig,
            "--retain",  # a failed creation leaves its nodes for the logs; clean_up removes them
        )
        self._pod_network()
        self._wait_nodes_ready()
        self._create_storage()
        print(f"kind cluster up in {time.monotonic() - started:.0f}s")
        return self

    def _network_up(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        if not LIB_MODULES.exists():
            (self.state / CREATED_LIB_MODULES).touch()
        _run(["ip", "netns", "add", NETNS])
        _run(["ip", "link", "add", HOST_LINK, "type", "veth", "peer", "name", PEER_LINK])
        _run(["ip", "link", "set", PEER_LINK, "netns", NETNS])
        _run(["ip", "addr", "add", f"{KIND_HOST_IP}/30", "dev", HOST_LINK])
        _run(["ip", "link", "set", HOST_LINK, "up"])
        for argv in (
            ["ip", "addr", "add", f"{KIND_PEER_IP}/30", "dev", PEER_LINK],
            ["ip", "link", "set", PEER_LINK, "up"],
            ["ip", "link", "set", "lo", "up"],
        ):
            _run(["ip", "-n", NETNS, *argv[1:]])

    def _start_dockerd(self) -> None:
        root = data_root()
        root.mkdir(parents=True, exist_ok=True)
        log = (self.state / "dockerd.log").open("w")
        argv = in_netns(
            self.tools.dockerd,
            f"--data-root={root / 'docker'}",
            f"--exec-root={self.state / 'exec'}",
            f"--pidfile={self.state / 'dockerd.pid'}",
            f"--host=unix://{self.state / 'docker.sock'}",
            "--storage-driver=overlay2",
            f"--add-runtime=nosysres={RUNTIME_WRAPPER}",
            "--default-runtime=nosysres",
        )
        subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def up() -> bool:
            probe = [str(self.tools.docker), "version", "--format", "{{.Server.Version}}"]
            answer = subprocess.run(
                probe, env=self.docker_env, capture_output=True, timeout=10, check=False
            )
            return answer.returncode == 0

        waits.wait_until(up, timeout=60, what="dockerd in the kind namespace", interval=0.5)

    def _node_image_ref(self) -> str:
        listed = self.docker("images", "--format", "{{.Repository}}:{{.Tag}}")
        refs = [r for r in listed.split() if "kind-node" in r]
        if not refs:
            raise ControlPlaneError(f"no kind node image after loading {self.tools.node_image}")
        return refs[0]

    def nodes(self) -> dict[str, dict[str, str]]:
        """node name -> its podCIDR and InternalIP."""
        found: dict[str, dict[str, str]] = {}
        for item in json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]:
            ips = [a["address"] for a in item["status"]["addresses"] if a["type"] == "InternalIP"]
            found[item["metadata"]["name"]] = {
                "cidr": item["spec"].get("podCIDR", ""),
                "ip": ips[0] if ips else "",
            }
        return found

    def _pod_network(self) -> None:
        nodes = self.nodes()
        for name, node in nodes.items():
            self.docker(
                "exec",
                name,
                "sh",
                "-c",
                f"mkdir -p /etc/cni/net.d && echo '{ptp_conflist(node['cidr'])}' "
                "> /etc/cni/net.d/10-ptp.conflist",
            )
            # Pods reach this machine's end of the veth (a test's S3 server listens there)
            # from their node's address, which dockerd's own masquerade then turns into the
            # peer's: the reply comes back the way it went, and nothing else is reachable.
            self.docker("exec", name, "iptables", "-w", *host_masquerade_rule())
            for other, peer in nodes.items():
                if other != name:
                    self.docker(
                        "exec", name, "ip", "route", "replace", peer["cidr"], "via", peer["ip"]
                    )

    def _wait_nodes_ready(self) -> None:
        def ready() -> bool:
            ready_of_each = '{.status.conditions[?(@.type=="Ready")].status}{" "}'
            out = self.kubectl(
                "get", "nodes", "-o", f"jsonpath={{range .items[*]}}{ready_of_each}{{end}}"
            )
            states = out.split()
            return len(states) == 3 and all(s == "True" for s in states)

        waits.wait_until(ready, timeout=180, what="the kind nodes to be Ready", interval=1)

    def _create_storage(self) -> None:
        """The shared folder's volumes (shared_volumes). A hostPath or NFS volume ignores
        the Pod's fsGroup, and the kubelet creates a claim's subPath as root with the mode of
        the volume's root: so each volume's folder is world-writable, as a shared scratch
        export is."""
        for i in range(SHARED_VOLUMES):
            path = self.shared / f"pv-{i:02d}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)
        objects = shared_volumes(SHARED_VOLUMES)
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))

    def install_network_policies(self) -> None:
        """kube-network-policies' install.yaml with the image the node image holds, then in
        each node, once the DaemonSet's pod there has bound its queue, the rules that send
        it the first packet of each new pod connection (node.network_policy_rules)."""
        manifest = list(yaml.safe_load_all(self.tools.network_policies.read_text()))
        version = self.tools.network_policies_version
        image = f"registry.k8s.io/networking/kube-network-policies:{version}"
        queue = set_network_policies_image(manifest, image)
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(d for d in manifest if d))
        self.kubectl(
            "rollout",
            "status",
            f"daemonset/{NETPOL_NAME}",
            "-n",
            "kube-system",
            "--timeout=120s",
            timeout=150,
        )
        for node in self.nodes():

            def bound(node: str = node) -> bool:
                lines = self.docker("exec", node, "cat", "/proc/net/netfilter/nfnetlink_queue")
                return queue_bound(lines.splitlines(), queue)

            waits.wait_until(
                bound, timeout=60, what=f"{NETPOL_NAME} to bind NFQUEUE {queue} on {node}"
            )
            for rule in network_policy_rules(POD_SUBNET, queue):
                self.docker("exec", node, "iptables", "-w", *rule)

    # -- Kueue and the gang scheduler, as their users install them -----------------------

    def helm_install(
        self, release: str, chart: str, namespace: str, values: dict[str, Any], *more: str
    ) -> None:
        """`helm install` of a chart from install.sh's copies, with `values`; waits until
        its workloads are ready."""
        path = self.state / f"{release}-values.yaml"
        path.write_text(yaml.safe_dump(values), encoding="utf-8")
        argv: list[str | Path] = [self.tools.helm, "install", release, self.tools.charts / chart]
        argv += [f"--namespace={namespace}", "--create-namespace", f"--values={path}", *more]
        _run([*argv, "--wait", "--timeout=5m"], env=self.env, timeout=600)

    def install_kueue(self) -> None:
        """Kueue's own Helm chart (from its Go module) with kind/kueue-values.yaml and the
        image the node image holds; returns once it is ready."""
        values = yaml.safe_load((HERE / "kind" / "kueue-values.yaml").read_text())
        values["controllerManager"]["manager"]["image"] = {
            "repository": "registry.k8s.io/kueue/kueue",
            "tag": self.tools.kueue_version,
            "pullPolicy": "IfNotPresent",
        }
        self.helm_install("kueue", "kueue", "kueue-system", values)

    def install_gang_scheduler(self) -> None:
        """scheduler-plugins' "as a second scheduler" chart (from its Go module): Coscheduling,
        the scheduler the chart names scheduler-plugins-scheduler, and the PodGroup
        controller. Its CRDs first (the chart links them from a folder the module zip leaves
        out; install.sh copied them)."""
        for crd in sorted(self.tools.plugins_crds.glob("*.yaml")):
            self.kubectl("apply", "--server-side", "-f", str(crd))
        version = self.tools.plugins_version
        values = yaml.safe_load((HERE / "kind" / "scheduler-plugins-values.yaml").read_text())
        values["scheduler"] = {
            "image": f"registry.k8s.io/scheduler-plugins/kube-scheduler:{version}"
        }
        values["controller"] = {"image": f"registry.k8s.io/scheduler-plugins/controller:{version}"}
        self.helm_install(
            "scheduler-plugins", "scheduler-plugins", "scheduler-plugins", values, "--skip-crds"
        )

    # -- images --------------------------------------------------------------------------

    def import_images(self, refs: Sequence[str], nodes: Sequence[str] = WORKERS) -> None:
        """The archive write_image_archive left in the shared folder into the containerd of
        `nodes`, side by side, then its layers dropped from their content stores (see
        discard_layers); the archive is removed either way."""
        if not refs:
            return
        started = time.monotonic()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
                list(pool.map(self.import_image, nodes))
        finally:
            (self.shared / IMAGE_ARCHIVE_NAME).unlink(missing_ok=True)
        for node in nodes:
            self.discard_layers(node, refs)
        print(f"images imported ({', '.join(nodes)}) in {time.monotonic() - started:.0f}s")

    def import_image(self, node: str) -> None:
        """The archive in the shared folder into `node`'s containerd, unpacked for the kubelet
        (the flags `kind load image-archive` gives ctr)."""
        self.ctr(
            node,
            "images",
            "import",
            "--all-platforms",
            "--digests",
            f"--snapshotter={NODE_SNAPSHOTTER}",
            f"{SHARED_MOUNT}/{IMAGE_ARCHIVE_NAME}",
            timeout=1200.0,  # every image at once: 5-8 minutes beside the tiers
        )

    def ctr(self, node: str, *args: str, timeout: float = 300.0) -> str:
        """containerd's ctr in `node`, on the kubelet's namespace of images."""
        return self.docker("exec", node, "ctr", "--namespace=k8s.io", *args, timeout=timeout)

    def discard_layers(self, node: str, refs: Sequence[str]) -> None:
        """What containerd's ``discard_unpacked_layers`` does for pulled images, for imported
        ones: once unpacked into snapshots, their layer blobs (uncompressed, from a
        docker-archive) are never read again, and each worker would otherwise hold every
        image twice (about 3.6 GB more a worker for the e2e tier's images). The manifests and
        configs stay: the images are listed and run as before. A layer two images share is
        removed once."""
        listed = self.ctr(node, "images", "list")
        layers: set[str] = set()
        for ref in refs:
            layers.update(
                manifest_layers(
                    lambda d: json.loads(self.ctr(node, "content", "get", d)),
                    image_digest(listed, ref),
                )
            )
        if layers:
            self.ctr(node, "content", "rm", *sorted(layers))

    # -- stop ----------------------------------------------------------------------------

    def control_plane_report(self) -> str:
        """What the control-plane node says of a start that failed, before it is removed: its
        kubelet's last lines and each control-plane Pod's (kubeadm's own error names only the
        request that waited out its minute)."""
        script = (
            f"journalctl -u kubelet --no-pager -n {REPORT_LINES}; "
            "for f in /var/log/pods/kube-system_*/*/*.log; do "
            f'echo "--- $f"; tail -n {REPORT_LINES} "$f"; done'
        )
        answer = subprocess.run(
            [str(self.tools.docker), "exec", CONTROL_PLANE, "sh", "-c", script],
            env=self.docker_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        heading = f"--- {CONTROL_PLANE}: kubelet and control-plane Pods"
        return f"{heading}\n{answer.stdout}{answer.stderr}"

    def stop(self) -> None:
        clean_up()
        found = leftovers()
        if found:
            raise ControlPlaneError("the kind cluster left behind: " + "; ".join(found))


def _dockerd_pid() -> int | None:
    try:
        return int((STATE_DIR / "dockerd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _netns_exists() -> bool:
    return Path(f"/run/netns/{NETNS}").exists()


def clean_up() -> None:
    """Delete the cluster and stop dockerd (its containers with it), then remove the namespace,
    the veth, the state and the data root. Safe to run at any point, twice, or after a kill."""
    docker_env = {**os.environ, "DOCKER_HOST": f"unix://{STATE_DIR / 'docker.sock'}"}
    pid = _dockerd_pid()
    if pid is not None and _alive(pid):
        # the node containers first (kind delete would also do it): their systemd stops cleanly
        names = _run(
            ["docker", "ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={CLUSTER_NAME}"],
            env=docker_env,
            check=False,
            timeout=30,
        ).split()
        if names:
            _run(["docker", "rm", "-f", "-v", *names], env=docker_env, check=False, timeout=180)
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(waits.WaitTimeoutError):
            waits.wait_until(lambda: not _alive(pid), timeout=60, what="dockerd to stop")
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    # dockerd's containerd and shims, if dockerd died without stopping them
    for child, _ in _state_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    unmount_all([STATE_DIR, data_root()])
    if link_exists(HOST_LINK):
        subprocess.run(["ip", "link", "del", HOST_LINK], capture_output=True, check=False)
    if _netns_exists():
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)
    # dockerd's cgroups (the kubelets' inside them, once every container has stopped)
    for top in _docker_cgroups():
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
    # Docker creates /lib/modules to mount it into the nodes, on a host that has none.
    if (STATE_DIR / CREATED_LIB_MODULES).exists():
        with contextlib.suppress(OSError):
            LIB_MODULES.rmdir()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    shutil.rmtree(data_root(), ignore_errors=True)


def _state_processes() -> list[tuple[int, bytes]]:
    """(pid, command line) of the processes that name STATE_DIR: dockerd, its containerd,
    the shims."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes()
                if str(STATE_DIR).encode() in cmdline:
                    found.append((int(proc.name), cmdline))
    return found


def _docker_cgroups() -> list[Path]:
    return [h / "docker" for h in Path("/sys/fs/cgroup").iterdir() if (h / "docker").is_dir()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def leftovers() -> list[str]:
    """What a stopped kind cluster must not leave: dockerd or its processes, the namespace,
    the veth, mounts, the state folder and the data root."""
    found = []
    if _netns_exists():
        found.append(f"network namespace {NETNS}")
    if link_exists(HOST_LINK):
        found.append(f"interface {HOST_LINK}")
    found += [f"mount {m}" for m in mounts_under([STATE_DIR, data_root()])]
    for path in (STATE_DIR, data_root()):
        if path.exists():
            found.append(f"file or folder {path}")
    found += [f"cgroup {c}" for c in _docker_cgroups()]
    found += [f"process {pid}: {cmdline[:100]!r}" for pid, cmdline in _state_processes()]
    return found


READY: Final = STATE_DIR / "ready"  # written last by start_kind: what the cluster holds


def ready_marker(images: Sequence[str]) -> str:
    """What a started cluster's READY file says: the images it was given, so that a run that
    adopts it knows it holds what that run needs."""
    return json.dumps({"images": list(images)})


def start_kind(images: Sequence[str] = ()) -> KindCluster:
    """A 3-node kind cluster with `images` loaded into both workers, Kueue and the gang
    scheduler installed; left running, with READY written last. Starting it removes what a
    killed run left; a failed start removes what it made."""
    cluster = KindCluster(KindTools.locate().require())
    refs = image_refs(images)
    clean_up()  # what a killed run left behind
    cluster.shared.mkdir(parents=True, exist_ok=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            # The images' archive (about 60 CPU-seconds for 90 s) is written while the nodes
            # boot, which leaves a quarter of the CPUs idle; after them it took 90 s more.
            archived = pool.submit(write_image_archive, cluster.shared / IMAGE_ARCHIVE_NAME, refs)
            try:
                cluster.start()
            except (ControlPlaneError, waits.WaitTimeoutError):
                log = STATE_DIR / "dockerd.log"
                if log.exists():
                    print("--- dockerd.log (last 40 lines)")
                    print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
                print(cluster.control_plane_report(), flush=True)
                raise
            cluster.install_network_policies()
            archived.result()
            # The images load (disk) while the charts install (mostly waiting for their Pods)
            loading = pool.submit(cluster.import_images, refs)
            cluster.install_gang_scheduler()
            cluster.install_kueue()
            loading.result()
    except BaseException:
        cluster.stop()
        raise
    READY.write_text(ready_marker(images), encoding="utf-8")
    return cluster


def started_earlier(images: Sequence[str]) -> KindCluster | None:
    """The cluster `start_kind` left running with these images (``python -m tests.controlplane
    kind-start``, which ``bash tests/run`` starts beside the other tiers), if its dockerd still
    runs and its nodes answer; else None."""
    try:
        marker = READY.read_text(encoding="utf-8")
    except OSError:
        return None
    pid = _dockerd_pid()
    if marker != ready_marker(images) or pid is None or not _alive(pid):
        return None
    cluster = KindCluster(KindTools.locate().require())
    try:
        cluster.kubectl("get", "nodes", timeout=30)
    except (ControlPlaneError, subprocess.SubprocessError):
        return None
    return cluster


@contextlib.contextmanager
def running_kind(images: Sequence[str] = (), *, keep: bool = False) -> Iterator[KindCluster]:
    """A 3-node kind cluster with `images` loaded into both workers: the one started earlier
    for these images (started_earlier), else a new one; deleted on exit, with everything it
    made (also when starting fails half-way).

    With `keep`, the cluster must have been started earlier and is left running on exit: the
    e2e tier's sessions share it (``bash tests/run`` runs the tests that may run side by side
    in one session of several workers, then the others in a second) and ``python -m
    tests.controlplane kind-stop`` deletes it after the last."""
    cluster = started_earlier(images)
    if keep:
        if cluster is None:
            raise ControlPlaneError(
                "no kind cluster started earlier for the e2e tier's images: start one with "
                "`python -m tests.controlplane kind-start` (root)"
            )
        yield cluster
        return
    if cluster is not None:
        print("kind cluster: the one started beside the other tiers")
    else:
        cluster = start_kind(images)
    try:
        yield cluster
    finally:
        cluster.stop()
