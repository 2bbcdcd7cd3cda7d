"""The cluster the e2e tier and bench/e2e_timings.py run on, and small helpers to drive it
with kubectl and helm.

Two kinds of cluster, chosen by ``TRAINJOB_E2E_CLUSTER``:

``node`` (default)
    The real node of this machine (tests/controlplane/node.py): brought up for the session,
    with the images of ``images/build.sh`` imported into its containerd; stopped and cleaned
    up afterwards. Needs root, ``bash tests/controlplane/install.sh --node`` and
    ``bash images/build.sh`` (``bash tests/run -m e2e`` runs both).
``kind``
    A 3-node kind cluster built on this machine without a registry (tests/controlplane/kind.py):
    1 control-plane + 2 workers, the runtime and operator images imported into the workers;
    deleted afterwards. Needs root and ``bash tests/controlplane/install.sh --kind``. The tests
    marked ``kind`` run there and are deselected on the node (tests/e2e/conftest.py).
``current``
    The cluster of the current kubeconfig context, e.g. kind, with the images already loaded
    (``kind load docker-image``); kubectl and helm from PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote, urlencode

import urllib3

from tests.support import waits

if TYPE_CHECKING:  # the node's control plane is imported only where a node runs
    from kubernetes.client import ApiClient

    from tests.controlplane.cluster import ControlPlane

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CLUSTER_ENV: Final = "TRAINJOB_E2E_CLUSTER"
# Set by `bash tests/run`: the kind cluster was started before the e2e sessions, which share it
# and leave it running (kind.running_kind's `keep`); tests/run deletes it after the last.
KIND_KEEP_ENV: Final = "TRAINJOB_KIND_KEEP"
PROGRESS_PREFIX: Final = "TRAINJOB_PROGRESS "
RESTRICTED: Final = "pod-security.kubernetes.io/enforce=restricted"
CHART: Final = REPO_ROOT / "helm" / "trainjob-operator"
OPERATOR_NAMESPACE: Final = "trainjob-system"
RELEASE: Final = "trainjob"
OPERATOR_DEPLOYMENT: Final = "deployment/trainjob-trainjob-operator"
CHECKPOINT_CLAIM: Final = "trainjob-checkpoints"
HELM_LOCK: Final = Path(tempfile.gettempdir()) / "trainjob-e2e-helm.lock"

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The cluster could not be reached or set up."""


@dataclass(frozen=True)
class Cluster:
    """kubectl and helm bound to one cluster."""

    name: str
    kubectl_path: str
    helm_path: str
    env: Mapping[str, str]
    # The node's control plane (None on another cluster): host processes such as Kueue
    # start against it.
    plane: ControlPlane | None = None

    def run(
        self, *argv: str | Path, check: bool = True, stdin: str | None = None, timeout: float = 600
    ) -> str:
        result = subprocess.run(
            [str(a) for a in argv],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=dict(self.env),
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(map(str, argv))} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result.stdout

    def kubectl(
        self, *args: str | Path, check: bool = True, stdin: str | None = None, timeout: float = 300
    ) -> str:
        return self.run(self.kubectl_path, *args, check=check, stdin=stdin, timeout=timeout)

    def helm(self, *args: str | Path, timeout: float = 600) -> str:
        return self.run(self.helm_path, *args, timeout=timeout)

    def get_json(self, *args: str) -> dict[str, Any]:
        """``kubectl get ... -o json``; {} when the object does not exist (yet). What
        `read_path` understands is read over the session's own API connection instead."""
        request = read_path(args)
        if request is None:
            out = self.kubectl("get", *args, "-o", "json", check=False)
        else:
            out = self.api_get(*request)
        try:
            value = json.loads(out) if out else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    @functools.cached_property
    def _api(self) -> ApiClient:
        # The e2e tests poll once a second. A kubectl process per probe cost about 0.09
        # CPU-seconds on the client alone (a new process, its discovery cache read, a TLS
        # handshake): 758 processes, 68 CPU-s, in an 8-minute side-by-side e2e session with
        # every core busy (tests/README.md). One client per session keeps its connections.
        from kubernetes import config

        kubeconfig = self.env.get("KUBECONFIG") or None
        client: ApiClient = config.new_client_from_config(config_file=kubeconfig)
        return client

    def api_get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> str:
        """The body of a GET of `path` on the API server; "" for an error, as a failed
        kubectl prints nothing on stdout. Through the client's connection pool, TLS and
        credentials (the same in every client version the project supports)."""
        api = self._api
        settings = api.configuration
        headers = {"Accept": "application/json, */*"}
        for auth in settings.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        url = f"{settings.host}{path}" + (f"?{urlencode(query)}" if query else "")
        try:
            response = api.rest_client.pool_manager.request(
                "GET", url, headers=headers, timeout=READ_TIMEOUT
            )
        except (OSError, urllib3.exceptions.HTTPError):
            return ""
        return response.data.decode("utf-8", "replace") if response.status == 200 else ""

    def apply(self, namespace: str, manifest: str | Path) -> str:
        if isinstance(manifest, Path):
            return self.kubectl("apply", "-n", namespace, "-f", manifest)
        return self.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)

    def progress(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        """The runtime's progress events (one JSON line each) in a pod's log."""
        logs = self.api_get(pod_log_path(namespace, pod), [("container", "tensorflow")])
        events = []
        for line in logs.splitlines():
            if line.startswith(PROGRESS_PREFIX):
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line[len(PROGRESS_PREFIX) :]))
        return events

    def conditions(self, namespace: str, job: str) -> dict[str, str]:
        """type -> status of the TrainJob's conditions."""
        status = self.get_json("trainjob", job, "-n", namespace).get("status") or {}
        return {c.get("type", ""): c.get("status", "") for c in status.get("conditions") or []}

    def wait_finished(self, namespace: str, job: str, timeout: float) -> str:
        """Wait until the job is Succeeded or Failed; returns which."""

        def finished() -> str | None:
            conditions = self.conditions(namespace, job)
            for ctype in ("Succeeded", "Failed"):
                if conditions.get(ctype) == "True":
                    return ctype
            return None

        return wait_until(finished, timeout=timeout, what=f"TrainJob {namespace}/{job} to finish")

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        pods = self.get_json("pods", "-n", namespace, "-l", f"trainjob.dev/job-name={job}")
        items = pods.get("items") or []
        return [p for p in items if isinstance(p, dict)]


def create_namespace(cluster: Cluster, name: str) -> None:
    """A namespace that enforces the Pod Security Standard "restricted"."""
    cluster.kubectl("create", "namespace", name, check=False)
    cluster.kubectl("label", "namespace", name, RESTRICTED, "--overwrite")


def install_operator(cluster: Cluster, repository: str, tag: str) -> None:
    """``helm upgrade --install`` the chart into its restricted namespace; waits until Ready.
    The e2e sessions' workers that share a cluster install one after the other (Helm refuses
    a second operation on a release while one is in progress)."""
    with open(HELM_LOCK, "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        create_namespace(cluster, OPERATOR_NAMESPACE)
        cluster.helm(
            "upgrade",
            "--install",
            RELEASE,
            CHART,
            f"--namespace={OPERATOR_NAMESPACE}",
            f"--set=image.repository={repository}",
            f"--set=image.tag={tag}",
            "--set=image.pullPolicy=IfNotPresent",
            "--wait",
            "--timeout=5m",
        )


def create_job_namespace(cluster: Cluster, name: str) -> None:
    """A restricted namespace with an empty 1Gi ReadWriteOnce checkpoint claim."""
    create_namespace(cluster, name)
    cluster.apply(
        name,
        f"""apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {CHECKPOINT_CLAIM}}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
""",
    )


def wait_until(
    probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 1.0
) -> T:
    """The tests' one wait, polling once a second by default: each probe here runs kubectl."""
    return waits.wait_until(probe, timeout=timeout, what=what, interval=interval)


def qualified_image(image: str) -> str:
    """An image reference as containerd lists it: Docker Hub's registry and `library/`
    spelt out where the reference leaves them implicit."""
    first, _, rest = image.partition("/")
    if not rest:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


CLUSTER_KINDS: Final = ("node", "kind", "current")
# What a kind cluster loads into both workers: every image the e2e tier's Pods run. Not the
# CUDA image (7 GB, twice that while it unpacks): its tests run it from buildah's store on this
# machine (tests/e2e/buildah_pods.py), and the GPU example's workers, which name it, wait for
# nvidia.com/gpu and never pull it. Kubeflow's test image is the runtime image plus two small
# layers, which the workers read and store once (kind.append_docker_archive). The runtime image
# first: the archive starts as its push, and each later image is copied onto it.
KIND_IMAGES: Final = (
    "docker.io/trainjob/trainjob:{version}",
    "docker.io/trainjob/trainjob-operator:{version}",
    "docker.io/trainjob/trainjob-legacy:{version}",
    "gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0",
)


# The resources the tests read, as kubectl names them: their API path, plural, namespaced.
READABLE: Final[Mapping[str, tuple[str, str, bool]]] = {
    **dict.fromkeys(("pod", "pods", "po"), ("api/v1", "pods", True)),
    **dict.fromkeys(("node", "nodes", "no"), ("api/v1", "nodes", False)),
    **dict.fromkeys(
        ("trainjob", "trainjobs", "tj"), ("apis/trainjob.dev/v1alpha1", "trainjobs", True)
    ),
}
READ_TIMEOUT: Final = 60.0


def read_path(args: Sequence[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """The API path and query of ``kubectl get ARGS -o json``, or None where ARGS go beyond
    one resource of READABLE, a name, ``-n``, ``-l`` and ``--ignore-not-found`` (kubectl
    then reads it): a namespaced read names its namespace, as kubectl's default one is the
    kubeconfig's to say."""
    if not args or args[0] not in READABLE:
        return None
    prefix, plural, namespaced = READABLE[args[0]]
    name = namespace = None
    query: list[tuple[str, str]] = []
    tokens = iter(args[1:])
    for token in tokens:
        if token in ("-n", "-l"):
            value = next(tokens, None)
            if value is None:
                return None
            if token == "-n":
                namespace = value
            else:
                query.append(("labelSelector", value))
        elif token == "--ignore-not-found":
            continue
        elif not token.startswith("-") and name is None:
            name = token
        else:
            return None
    if namespaced != (namespace is not None):
        return None
    scope = f"/namespaces/{quote(namespace, safe='')}" if namespace is not None else ""
    item = f"/{quote(name, safe='')}" if name is not None else ""
    return f"/{prefix}{scope}/{plural}{item}", query


def pod_log_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/log"


def cluster_kind() -> str:
    kind = os.environ.get(CLUSTER_ENV, "node")
    if kind not in CLUSTER_KINDS:
        raise ClusterError(f"{CLUSTER_ENV}={kind!r}: expected one of {', '.join(CLUSTER_KINDS)}")
    return kind


@contextlib.contextmanager
def open_cluster(workdir: Path | None = None) -> Iterator[Cluster]:
    """The cluster ``TRAINJOB_E2E_CLUSTER`` names (see the module docstring)."""
    if cluster_kind() == "current":
        kubectl, helm = shutil.which("kubectl"), shutil.which("helm")
        if kubectl is None or helm is None:
            raise ClusterError("kubectl and helm must be on PATH for TRAINJOB_E2E_CLUSTER=current")
        yield Cluster("current", kubectl, helm, dict(os.environ))
        return
    if cluster_kind() == "kind":
        from tests.controlplane.kind import running_kind

        keep = os.environ.get(KIND_KEEP_ENV, "") == "1"
        with running_kind(KIND_IMAGES, keep=keep) as kind:
            yield Cluster("kind", str(kind.tools.kubectl), str(kind.tools.helm), kind.env)
        return
    from tests.controlplane.node import running_node

    # crds/ and its folders: Kubeflow's TFJob CRD (crds/kubeflow/), served with --tfjob.
    crds = sorted((REPO_ROOT / "crds").rglob("*.yaml"))
    with running_node(workdir=workdir, crds=crds) as node:
        plane = node.plane
        yield Cluster("node", str(plane.tools.kubectl), str(plane.tools.helm), plane.env(), plane)


def address_pods_reach(cluster: Cluster) -> str | None:
    """An address of this machine that the cluster's pods reach and nothing beyond it does,
    for a server a test starts here (the S3 server of a checkpoint test): kind's end of the
    veth into dockerd's namespace (the nodes masquerade pods' connections to it,
    kind.host_masquerade_rule), or the node's own address, to which its pods have a route.
    None on another cluster: where its pods reach this machine is not known here."""
    if cluster.name == "kind":
        from tests.controlplane.kind import KIND_HOST_IP

        return KIND_HOST_IP
    if cluster.name == "node":
        from tests.controlplane.node import NODE_IP

        return NODE_IP
    return None


def signal_training_process(cluster: Cluster, namespace: str, pod: str, signal_name: str) -> None:
    """Send `signal_name` (SIGKILL, SIGSTOP) to the training process from a shell in the pod:
    its process namespace must be shared (shareProcessNamespace), so that the process is not
    the namespace's init, which ignores signals from inside."""
    script = (
        "import os, signal\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit() and p != str(os.getpid()):\n"
        "        try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "        except OSError: continue\n"
        "        if cmd.endswith(b'trainjob' + bytes(1) + b'train' + bytes(1)):\n"
        f"            os.kill(int(p), signal.{signal_name}); print('signalled', p)\n"
    )
    out = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "tensorflow", "--", "python", "-c", script
    )
    assert "signalled" in out, out
