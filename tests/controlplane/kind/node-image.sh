#!/usr/bin/env bash
# The kind node image, assembled here without a registry (`kind build node-image` cannot work
# offline: every mode downloads from dl.k8s.io or a registry; kind's pkg/build/nodeimage).
# It follows kind's own base image (images/base/Dockerfile in the kind module) step by step:
#   - a Debian bookworm rootfs from debootstrap with the packages kind's base installs, and
#     Debian's containerd, runc and CNI plugins in place of kind's source builds;
#   - kind's base files (entrypoint, systemd units, containerd config) from the kind module,
#     with restrict_oom_score_adj on (this machine's root cannot raise oom_score_adj in a
#     container, as for the test node);
#   - kubeadm, kubelet and kubectl of the test bed's Kubernetes build;
#   - the control plane's images (kube-apiserver, -controller-manager, -scheduler, -proxy, etcd,
#     CoreDNS, pause), each the test bed's static binary in an otherwise empty image, as
#     docker-archives in /kind/images, imported into the node's containerd when it first boots
#     (kind's own node image has them imported at build time);
#   - the same for Kueue and scheduler-plugins (scheduler and controller), under the names their
#     Helm charts use, so that tests/controlplane/kind.py installs them with those charts, and
#     for kube-network-policies (its module's command, as its install.yaml names it).
# The result is a docker-archive, cached by content hash under the tools folder; its path is
# printed last. Needs root, debootstrap, buildah, and the parts of install.sh --kind.
#
# Usage: bash tests/controlplane/kind/node-image.sh KIND_DIR NODE_DIR K8S_DIR ETCD_DIR KUEUE_DIR PLUGINS_DIR NETPOL_DIR
#   (the tools folders of install.sh; install.sh --kind runs it)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kind_dir="${1:?usage: node-image.sh KIND_DIR NODE_DIR K8S_DIR ETCD_DIR KUEUE_DIR PLUGINS_DIR NETPOL_DIR}"
node_dir="${2:?}" k8s_dir="${3:?}" etcd_dir="${4:?}" kueue_dir="${5:?}" plugins_dir="${6:?}"
netpol_dir="${7:?}"
# the versions are the folders' (install.sh names them <tool>-<version>)
kueue_version="${kueue_dir##*/kueue-}"
plugins_version="${plugins_dir##*/scheduler-plugins-}"
netpol_version="${netpol_dir##*/network-policies-}"
tools_dir="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}"
mirror="${TRAINJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

k8s_version="$("$k8s_dir/kubectl" version --client -o json | jq -r .clientVersion.gitVersion)"
etcd_version="$("$etcd_dir/etcd" --version | awk '/^etcd Version:/ {print $3}')"
coredns_version="$("$kind_dir/coredns" -version | awk -F- 'NR == 1 {print $2}')"
# The tags kubeadm asks for are the versions inside (see kind.py's ClusterConfiguration patch).
etcd_tag="$etcd_version-0"
coredns_tag="v$coredns_version"
ref="localhost/trainjob/kind-node:$k8s_version"

# One hash of everything that goes in: this script, kind's files and the binaries, by content
# and by their names inside the tools folder, never by where the clone or the tools folder is
# (with this script's path in it, every fresh clone rebuilt the image: 83-93 s of each run).
hash="$(
    {
        sha256sum <"${BASH_SOURCE[0]}"
        find "$kind_dir" "$node_dir" "$k8s_dir" "$etcd_dir" "$kueue_dir/kueue" "$plugins_dir/scheduler" \
            "$plugins_dir/controller" "$netpol_dir/netpol" -type f -print0 | LC_ALL=C sort -z \
            | xargs -0 sha256sum | sed "s#  $tools_dir/#  #"
        echo "$mirror"
    } | sha256sum | cut -c1-16
)"
cache="$tools_dir/kind-node"
archive="$cache/kind-node-$k8s_version-$hash.tar"
if [[ -s "$archive" ]]; then
    echo "==> kind node image $ref: cached in $archive"
    echo "$archive"
    exit 0
fi

for tool in debootstrap buildah jq; do
    command -v "$tool" >/dev/null || {
        echo "node-image.sh: $tool not found (bash tests/controlplane/install.sh --kind)" >&2
        exit 1
    }
done
[[ "$(id -u)" == 0 ]] || {
    echo "node-image.sh: run as root (debootstrap, chroot, buildah)" >&2
    exit 1
}

started=$SECONDS
mkdir -p "$cache"
work="$(mktemp -d "$cache/.build.XXXXXX")"
# A buildah store of its own: nothing is left in the images' store or anywhere else.
bah() { buildah --root "$work/store" --runroot "$work/run" --storage-driver vfs "$@"; }
cleanup() {
    bah rm --all >/dev/null 2>&1 || true
    # debootstrap may leave /proc and /sys mounted in the rootfs when it fails half-way
    for m in proc sys dev/pts dev; do umount -l "$work/rootfs/$m" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

rootfs="$work/rootfs"
echo "==> kind node image $ref: debootstrap bookworm"
# kind's base packages (images/base/Dockerfile) less the ones only rootless or exotic storage
# need (fuse-overlayfs, nfs-common, open-iscsi, e2fsprogs), plus Debian's container runtime.
packages=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod
packages+=,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps
packages+=,containerd,runc,containernetworking-plugins
debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    echo "node-image.sh: debootstrap failed (mirror $mirror)" >&2
    exit 1
}
echo "    debootstrap: $((SECONDS - started))s"

# kind's files, placed as its Dockerfile COPYs them
files="$kind_dir/base-files"
install -m 0755 "$files"/usr/local/bin/* "$rootfs/usr/local/bin/"
mkdir -p "$rootfs/kind/bin" "$rootfs/kind/images" "$rootfs/kind/manifests"
cp -r "$files/kind/." "$rootfs/kind/"
chmod 0755 "$rootfs"/kind/bin/*
cp -r "$files/etc/." "$rootfs/etc/"
# Debian's runtime where kind's units and containerd expect kind's own builds
ln -sf /usr/bin/containerd "$rootfs/usr/local/bin/containerd"
mkdir -p "$rootfs/opt/cni/bin"
for plugin in host-local loopback ptp portmap; do
    ln -sf "/usr/lib/cni/$plugin" "$rootfs/opt/cni/bin/$plugin"
done
sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
    "$rootfs/etc/containerd/config.toml"
grep -q 'restrict_oom_score_adj = true' "$rootfs/etc/containerd/config.toml"
# The OCI spec every container starts from, with kind's product-files hook (as kind's build)
chroot "$rootfs" sh -c "ctr oci spec \
    | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' \
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json"

# Kubernetes on the node
install -m 0755 "$kind_dir/kubeadm" "$node_dir/kubelet" "$k8s_dir/kubectl" "$rootfs/usr/bin/"
echo "$k8s_version" >"$rootfs/kind/version"
# The default StorageClass kind applies; its volumes are made by kind.py (shared storage)
cat >"$rootfs/kind/manifests/default-storage.yaml" <<'EOF'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF

# The images kubeadm runs, imported by containerd when the node first boots; kubelet waits.
mkdir -p "$rootfs/etc/systemd/system/containerd.service.d"
cat >"$rootfs/etc/systemd/system/containerd.service.d/10-preload.conf" <<'EOF'
[Service]
ExecStartPost=/bin/sh -c 'test -e /var/lib/containerd/.kind-preloaded && exit 0; for f in /kind/images/*.tar; do ctr -n k8s.io images import --no-unpack "$f" >/dev/null || exit 1; done; touch /var/lib/containerd/.kind-preloaded'
EOF
mkdir -p "$rootfs/etc/systemd/system/kubelet.service.d"
printf '[Unit]\nAfter=containerd.service\n' >"$rootfs/etc/systemd/system/kubelet.service.d/05-after-containerd.conf"

# image NAME REF ENTRYPOINT FILE...: an image of the given files (FILE = src:dest) and a /tmp,
# as a docker-archive in /kind/images. IMAGE_USER (uid:gid) sets the image's user, IMAGE_CMD its
# command (for an empty ENTRYPOINT).
image() {
    local name="$1" ref="$2" entrypoint="$3"
    shift 3
    local c mnt spec
    c="$(bah from scratch)"
    mnt="$(bah mount "$c")"
    mkdir -m 1777 "$mnt/tmp"
    for spec in "$@"; do
        mkdir -p "$mnt/$(dirname "${spec#*:}")"
        cp -L "${spec%%:*}" "$mnt/${spec#*:}"  # libraries' links by their targets
    done
    bah umount "$c" >/dev/null
    bah config --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        ${entrypoint:+--entrypoint "$entrypoint"} ${IMAGE_CMD:+--cmd "$IMAGE_CMD"} \
        ${IMAGE_USER:+--user "$IMAGE_USER"} "$c"
    bah commit --quiet "$c" "$ref" >/dev/null
    bah rm "$c" >/dev/null
    bah push --quiet "$ref" "docker-archive:$rootfs/kind/images/$name.tar:$ref"
}
t0=$SECONDS
for bin in kube-apiserver kube-controller-manager kube-scheduler; do
    image "$bin" "registry.k8s.io/$bin:$k8s_version" "[\"/usr/local/bin/$bin\"]" \
        "$k8s_dir/$bin:/usr/local/bin/$bin"
done
image etcd "registry.k8s.io/etcd:$etcd_tag" '["/usr/local/bin/etcd"]' "$etcd_dir/etcd:/usr/local/bin/etcd"
image coredns "registry.k8s.io/coredns/coredns:$coredns_tag" '["/coredns"]' "$kind_dir/coredns:/coredns"
# kind's containerd config names pause:3.10; kubeadm's 1.34 default is 3.10.1: both, one binary
image pause "registry.k8s.io/pause:3.10" '["/pause"]' "$node_dir/pause:/pause"
image pause-3.10.1 "registry.k8s.io/pause:3.10.1" '["/pause"]' "$node_dir/pause:/pause"
# kube-proxy programs iptables (nft backend): its image carries iptables and conntrack with the
# libraries they load, taken from the node's own rootfs.
proxy_specs=("$node_dir/kube-proxy:/usr/local/bin/kube-proxy")
# (the xtables extensions are loaded at run time and bring libraries of their own: libm, ...)
proxy_files=(/usr/sbin/xtables-nft-multi /usr/sbin/conntrack)
while read -r ext; do
    proxy_files+=("$ext")
done < <(cd "$rootfs" && find usr/lib/x86_64-linux-gnu/xtables -name '*.so' -printf '/%p\n')
while read -r file; do
    proxy_specs+=("$rootfs$file:$file")
done < <(
    for f in "${proxy_files[@]}"; do
        echo "$f"
        chroot "$rootfs" ldd "$f" | awk '$2 == "=>" {print $3} $1 ~ /^\// {print $1}'
    done | sort -u
)
# the iptables commands: xtables-nft-multi under their own names (it reads argv[0])
for cmd in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    proxy_specs+=("$rootfs/usr/sbin/xtables-nft-multi:/usr/sbin/$cmd")
done
image kube-proxy "registry.k8s.io/kube-proxy:$k8s_version" '["/usr/local/bin/kube-proxy"]' "${proxy_specs[@]}"
# Kueue and scheduler-plugins as their charts name them, non-root as upstream's images are
IMAGE_USER=65532:65532 image kueue "registry.k8s.io/kueue/kueue:$kueue_version" '["/manager"]' \
    "$kueue_dir/kueue:/manager"
IMAGE_USER=65532:65532 image scheduler-plugins-scheduler \
    "registry.k8s.io/scheduler-plugins/kube-scheduler:$plugins_version" '["/bin/kube-scheduler"]' \
    "$plugins_dir/scheduler:/bin/kube-scheduler"
IMAGE_USER=65532:65532 image scheduler-plugins-controller \
    "registry.k8s.io/scheduler-plugins/controller:$plugins_version" '["/bin/controller"]' \
    "$plugins_dir/controller:/bin/controller"
# kube-network-policies as upstream's image: the command in CMD (its install.yaml's args name
# the binary first), run as root (it programs the node's netfilter)
IMAGE_CMD=/bin/netpol image kube-network-policies \
    "registry.k8s.io/networking/kube-network-policies:$netpol_version" "" "$netpol_dir/netpol:/bin/netpol"
echo "    control-plane images: $((SECONDS - t0))s ($(du -sh "$rootfs/kind/images" | cut -f1))"

# kind's Dockerfile: services, masks, init
chroot "$rootfs" sh -c '
    find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
        /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
        /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >> /etc/systemd/journald.conf
    ln -sf /usr/lib/systemd/systemd /sbin/init
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
    systemctl mask systemd-binfmt.service >/dev/null 2>&1
    mkdir -p /etc/kubernetes/manifests'
# What a node never reads
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/var/log/* "$rootfs"/tmp/*

node="$(bah from scratch)"
mnt="$(bah mount "$node")"
tar -C "$rootfs" --exclude=./proc/* --exclude=./sys/* -cf - . | tar -C "$mnt" -xf -
bah umount "$node" >/dev/null
bah config --env container=docker --stop-signal SIGRTMIN+3 \
    --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --label org.opencontainers.image.description="kind node $k8s_version, assembled by tests/controlplane/kind/node-image.sh" \
    "$node"
bah commit --quiet "$node" "$ref" >/dev/null
rm -f "$cache"/kind-node-*.tar
bah push --quiet "$ref" "docker-archive:$archive.part:$ref"
mv "$archive.part" "$archive"
echo "==> kind node image $ref: built in $((SECONDS - started))s ($(du -h "$archive" | cut -f1))"
echo "$archive"
