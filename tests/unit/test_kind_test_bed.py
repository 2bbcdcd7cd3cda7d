"""The kind test bed's decisions (tests/controlplane/kind.py, node.py): which layers a worker may
drop after `kind load`, the DaemonSet that enforces NetworkPolicy and the rules that feed it, and
the shared volumes; the cluster's configuration; the reads the e2e tests make over their own
API connection instead of a kubectl process."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.cluster import ControlPlaneError
from tests.controlplane.e2e_cluster import KIND_IMAGES, pod_log_path, qualified_image, read_path
from tests.controlplane.kind import (
    SHARED_MOUNT,
    append_docker_archive,
    cluster_config,
    image_digest,
    manifest_layers,
    set_network_policies_image,
    shared_volumes,
)
from tests.controlplane.node import NETPOL_CHAIN, image_refs, network_policy_rules, queue_bound

pytestmark = pytest.mark.unit

# `ctr images list` as a worker prints it (columns cut short)
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CTR_IMAGES = "\n".join(
    [
        "REF TYPE DIGEST SIZE PLATFORMS LABELS",
        f"docker.io/trainjob/trainjob:0.1.0 {MANIFEST} sha256:aaa 1.9 GiB linux/amd64 managed",
        f"docker.io/trainjob/trainjob:0.1.0-gpu {MANIFEST} sha256:bbb 6.6 GiB linux/amd64 -",
    ]
)


def test_the_digest_of_exactly_the_reference_asked_for() -> None:
    assert image_digest(CTR_IMAGES, "docker.io/trainjob/trainjob:0.1.0") == "sha256:aaa"
    assert image_digest(CTR_IMAGES, "docker.io/trainjob/trainjob:0.1.0-gpu") == "sha256:bbb"


def test_an_image_missing_after_kind_load_is_an_error_naming_it() -> None:
    with pytest.raises(ControlPlaneError, match="trainjob-legacy"):
        image_digest(CTR_IMAGES, "docker.io/trainjob/trainjob-legacy:0.1.0")


def test_the_layers_of_a_manifest_and_of_every_manifest_under_an_index() -> None:
    blobs: dict[str, dict[str, Any]] = {
        "sha256:index": {"manifests": [{"digest": "sha256:m1"}, {"digest": "sha256:m2"}]},
        "sha256:m1": {"config": {"digest": "sha256:c1"}, "layers": [{"digest": "sha256:l1"}]},
        "sha256:m2": {
            "config": {"digest": "sha256:c2"},
            "layers": [{"digest": "sha256:l1"}, {"digest": "sha256:l2"}],
        },
    }
    assert manifest_layers(blobs.__getitem__, "sha256:m1") == ["sha256:l1"]
    # the config blobs are kept: the image is listed and runs from them and its snapshots
    assert manifest_layers(blobs.__getitem__, "sha256:index") == ["sha256:l1", "sha256:l2"]


def _docker_archive(path: Path, ref: str, layers: dict[str, bytes]) -> None:
    """A docker-archive as `buildah push` writes one: layers and config named by digest, each
    layer's legacy folder with its symlink, then manifest.json and repositories last."""
    files = {**{f"{name}.tar": data for name, data in layers.items()}, f"cfg-{ref}.json": b"{}"}
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in layers:
            link = tarfile.TarInfo(f"v1-{name}/layer.tar")
            link.type = tarfile.SYMTYPE
            link.linkname = f"../{name}.tar"
            tar.addfile(link)
        image = {
            "Config": f"cfg-{ref}.json",
            "RepoTags": [ref],
            "Layers": [f"{n}.tar" for n in layers],
        }
        for name, data in (
            ("manifest.json", json.dumps([image]).encode()),
            ("repositories", b"{}"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_an_image_built_on_another_joins_its_archive_with_only_the_layers_it_adds(
    tmp_path: Path,
) -> None:
    runtime, mnist = tmp_path / "runtime.tar", tmp_path / "mnist.tar"
    _docker_archive(runtime, "trainjob:1", {"base": b"B" * 3000, "tf": b"T" * 700})
    _docker_archive(mnist, "mnist:1", {"base": b"B" * 3000, "tf": b"T" * 700, "script": b"S"})
    append_docker_archive(runtime, mnist)
    with tarfile.open(runtime) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        script = tar.extractfile("script.tar").read()  # type: ignore[union-attr]
    # each file once (a worker's containerd reads and hashes every layer file it is given)
    assert sorted(names) == sorted(set(names)), names
    assert [n for n in names if n.endswith(".tar") and "/" not in n] == [
        "base.tar",
        "tf.tar",
        "script.tar",
    ]
    assert script == b"S"
    assert [(i["RepoTags"], i["Layers"]) for i in manifest] == [
        (["trainjob:1"], ["base.tar", "tf.tar"]),
        (["mnist:1"], ["base.tar", "tf.tar", "script.tar"]),
    ]
    assert names[-1] == "manifest.json"  # so the next image can join it the same way
    assert "v1-script/layer.tar" in names


def test_an_archive_not_ending_with_its_manifest_is_refused_not_cut(tmp_path: Path) -> None:
    archive, other = tmp_path / "a.tar", tmp_path / "b.tar"
    _docker_archive(archive, "a:1", {"base": b"B"})
    _docker_archive(other, "b:1", {"base": b"B", "more": b"M"})
    with tarfile.open(archive, "a") as tar:
        info = tarfile.TarInfo("late-layer.tar")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"L"))
    size = archive.stat().st_size
    with pytest.raises(ControlPlaneError, match=r"does not end with its manifest\.json"):
        append_docker_archive(archive, other)
    assert archive.stat().st_size == size


INSTALL_YAML: list[dict[str, Any] | None] = [
    {"kind": "ServiceAccount", "metadata": {"name": "kube-network-policies"}},
    None,
    {
        "kind": "DaemonSet",
        "metadata": {"name": "kube-network-policies"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "image": "registry.k8s.io/networking/kube-network-policies:v0.7.0",
                            "args": ["/bin/netpol", "--v=2", "--nfqueue-id=98"],
                        }
                    ]
                }
            }
        },
    },
]


def test_the_daemonset_runs_the_image_given_and_its_queue_is_read_from_its_arguments() -> None:
    image = "registry.k8s.io/networking/kube-network-policies:v0.8.0"
    assert set_network_policies_image(INSTALL_YAML, image) == 98
    daemonset = INSTALL_YAML[2]
    assert daemonset is not None
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_a_manifest_without_the_daemonset_is_an_error() -> None:
    with pytest.raises(ControlPlaneError, match="DaemonSet"):
        set_network_policies_image(INSTALL_YAML[:2], "x")


def test_the_rules_let_root_and_established_flows_pass_before_queueing_pod_traffic() -> None:
    rules = network_policy_rules("10.245.0.0/16", 98)
    assert rules[0] == ["-t", "mangle", "-N", NETPOL_CHAIN]
    # the chain is hooked last, once complete: no packet meets a half-built chain
    assert rules[-1] == ["-t", "mangle", "-I", "POSTROUTING", "1", "-j", NETPOL_CHAIN]
    body = [" ".join(rule[4:]) for rule in rules[1:-1]]
    assert body == [
        "-m owner --uid-owner 0 -j RETURN",
        "-m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
        "-s 10.245.0.0/16 -j NFQUEUE --queue-num 98",
        "-d 10.245.0.0/16 -j NFQUEUE --queue-num 98",
    ]


def test_a_queue_is_bound_only_when_its_own_number_is_listed() -> None:
    lines = ["   98  3184 0 2 65531 0 0 12 1", "  100  17 0 2 65531 0 0 0 1"]
    assert queue_bound(lines, 98) and queue_bound(lines, 100)
    assert not queue_bound(lines, 9) and not queue_bound([], 98) and not queue_bound([""], 98)


def test_the_shared_volumes_are_distinct_folders_under_the_shared_mount() -> None:
    volumes = shared_volumes(3)
    paths = [v["spec"]["hostPath"]["path"] for v in volumes]  # type: ignore[index]
    assert paths == [f"{SHARED_MOUNT}/pv-00", f"{SHARED_MOUNT}/pv-01", f"{SHARED_MOUNT}/pv-02"]
    assert all("ReadWriteMany" in v["spec"]["accessModes"] for v in volumes)  # type: ignore[index]


@pytest.mark.parametrize(
    ("reference", "listed"),
    [
        ("trainjob/trainjob:0.1.0-gpu", "docker.io/trainjob/trainjob:0.1.0-gpu"),
        ("docker.io/trainjob/trainjob:0.1.0-gpu", "docker.io/trainjob/trainjob:0.1.0-gpu"),
        ("busybox:1.36", "docker.io/library/busybox:1.36"),
        (
            "gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0",
            "gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0",
        ),
        ("localhost/trainjob-cache/trainjob:x", "localhost/trainjob-cache/trainjob:x"),
        ("registry.local:5000/team/model:1", "registry.local:5000/team/model:1"),
    ],
)
def test_an_image_reference_is_spelt_out_as_containerd_lists_it(
    reference: str, listed: str
) -> None:
    assert qualified_image(reference) == listed


def test_kind_loads_no_cuda_image() -> None:
    """7 GB into a worker took 276 s of the cluster's set-up: the CUDA image's tests run it
    from buildah's store (tests/e2e/buildah_pods.py) and the GPU example's workers that name
    it never leave Pending, so no Pod on kind pulls it."""
    assert "docker.io/trainjob/trainjob:{version}" in KIND_IMAGES, KIND_IMAGES  # the CPU twin
    loaded = image_refs(KIND_IMAGES)
    assert not [ref for ref in loaded if ref.endswith("-gpu")], loaded


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("trainjob", "mnist", "-n", "team-a"),
            ("/apis/trainjob.dev/v1alpha1/namespaces/team-a/trainjobs/mnist", []),
        ),
        (("pod", "w-0", "-n", "ns", "--ignore-not-found"), ("/api/v1/namespaces/ns/pods/w-0", [])),
        (
            ("pods", "-n", "ns", "-l", "trainjob.dev/job-name=mnist"),
            ("/api/v1/namespaces/ns/pods", [("labelSelector", "trainjob.dev/job-name=mnist")]),
        ),
        (("nodes",), ("/api/v1/nodes", [])),
    ],
)
def test_a_read_kubectl_would_make_is_the_same_api_path(
    args: tuple[str, ...], expected: tuple[str, list[tuple[str, str]]]
) -> None:
    assert read_path(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        ("events", "-n", "ns"),  # not a resource it knows
        ("trainjob", "mnist"),  # kubectl's default namespace is the kubeconfig's to say
        ("nodes", "-n", "ns"),  # a cluster-wide resource in a namespace: kubectl's error
        ("pods", "-A"),  # a flag it does not know
        ("pods", "-n"),  # a flag without its value
        ("pod", "a", "b", "-n", "ns"),  # two names
        (),
    ],
)
def test_anything_else_is_left_to_kubectl(args: tuple[str, ...]) -> None:
    assert read_path(args) is None


def test_a_log_and_a_name_with_odd_characters_are_quoted_into_the_path() -> None:
    assert pod_log_path("ns", "w-0") == "/api/v1/namespaces/ns/pods/w-0/log"
    assert read_path(("pod", "a/b", "-n", "ns")) == ("/api/v1/namespaces/ns/pods/a%2Fb", [])


def test_a_lost_node_is_called_lost_sooner_but_only_after_several_missed_renewals(
    tmp_path: Path,
) -> None:
    config = yaml.safe_load(cluster_config(tmp_path))
    patches = {p["kind"]: p for p in map(yaml.safe_load, config["kubeadmConfigPatches"])}
    cluster = patches["ClusterConfiguration"]
    manager = cluster["controllerManager"]["extraArgs"]
    grace = int(manager["node-monitor-grace-period"].removesuffix("s"))
    lease = patches["KubeletConfiguration"]["nodeLeaseDurationSeconds"]
    # the kubelet renews its lease every quarter of its duration: several renewals must fail
    # before a live node is called lost
    assert grace < 50 and grace / (lease / 4) >= 5
