#!/usr/bin/env bash
# Installs the real Kubernetes parts used by tests/integration, without Docker:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#       built from the k8s.io/kubernetes Go module (wrapper module in tests/controlplane/k8s)
#   etcd   built from its Go module (wrapper module in tests/controlplane/etcd)
#   kwok   sigs.k8s.io/kwok/cmd/kwok, with kwok/pod-uid-precondition.patch applied (KWOK_PATCH says why)
#   helm   go install helm.sh/helm/v3/cmd/helm
#   kueue  the Kueue controller, built from its Go module (wrapper module tests/controlplane/kueue),
#          with its CRDs and webhook manifests copied from the module (tests/controlplane/kueue.py)
#   scheduler-plugins  the gang scheduler (kube-scheduler + Coscheduling) and its PodGroup
#          controller, built from their Go module (wrapper module tests/controlplane/scheduler-plugins,
#          which shares the Kubernetes build cache), with the PodGroup and ElasticQuota CRDs copied
#          from the module (tests/controlplane/gang.py)
# and, with --node, the parts of a real node (tests/controlplane/node.py), in a cache folder of
# their own so that the control plane's stays valid:
#   kubelet, kube-proxy   from the same k8s.io/kubernetes module and version as the control plane
#   coredns               CoreDNS with the node's plugins (wrapper module tests/controlplane/coredns)
#   pause                 the pause container's binary, compiled from k8s.io/kubernetes's pause.c
#   kube-network-policies NetworkPolicy enforcement (wrapper module
#                         tests/controlplane/network-policies), in a folder of its own, with
#                         the module's own command (netpol) and install.yaml for kind's nodes
#   katib-trial-status    Katib's reading of a trial's TFJob status (wrapper module
#                         tests/controlplane/katib)
#   versitygw        Versity's S3 gateway (its posix backend: an S3 API server over a directory,
#          in one process; chosen over SeaweedFS for its cold build, 177 s against 469 s), and
#   fake-gcs-server  a GCS JSON-API server, both from their Go modules (wrapper modules
#          tests/controlplane/versitygw and tests/controlplane/fake-gcs-server): the stores the
#          checkpoint-on-object-storage tests write to (tests/controlplane/objectstore.py)
#   trainer  Kubeflow Trainer v2's CRDs (its own TrainJob kind) and torch runtime, and the JobSet
#          CRD, copied from the Trainer and JobSet modules at the versions Kueue is built against
#          (Kueue's wrapper module; tests/controlplane/trainer.py)
# and, with --kind, the parts of a kind cluster (tests/controlplane/kind.py):
#   kind                  go install sigs.k8s.io/kind (its module also holds the node's base files)
#   kubeadm               from the same k8s.io/kubernetes module and version as the control plane
#   coredns               the same CoreDNS wrapper, for the cluster's CoreDNS image
#   the node image        tests/controlplane/kind/node-image.sh (cached by content hash)
#   Debian packages: docker.io (its dockerd runs only inside the test's own network namespace)
#   Debian packages: containerd, runc, containernetworking-plugins, buildah, debootstrap,
#   iptables, gcc + libc6-dev (for pause), chromium (the e2e tier opens `trainjob tensorboard`
#   in headless Chromium), tmux and screen (tests/local/test_multiplexer.py draws the live
#   table in them)   -- installed with apt-get when missing (root)
#
# Binaries are cached outside the clone, one folder per tool and version:
#   ${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}/<name>-<version>/
# A folder that already holds every binary is skipped, so the script is idempotent
# and cheap on a warm machine. Go's module and build caches stay in their default
# places. Needs only Go (>= 1.25; /usr/local/go/bin is searched) and network access
# to the Go module proxy. No stdin, no Docker, no root.
#
# Usage: bash tests/controlplane/install.sh [--print-dir] [--node] [--node-packages] [--kind]
#   --print-dir      print the tools directory and exit
#   --node           also install the node's parts (see above)
#   --kind           also install a kind cluster's parts (see above; implies --node)
#   --node-packages  only the node's Debian packages (buildah, debootstrap, ...), so the images
#                    can build (network, disk) while the Go tools compile (CPU)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}"

# Versions. The Kubernetes version is read from the wrapper go.mod (single source of truth).
# modversion GOMOD MODULE: the version a go.mod requires (block or single-line form)
modversion() {
    awk -v m="$2" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$1"
}
K8S_VERSION="$(modversion "$HERE/k8s/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(modversion "$HERE/etcd/go.mod" go.etcd.io/etcd/server/v3)"
KWOK_VERSION="v0.8.0"
# kwok deletes and patches pods by name alone: one played late for a pod that is gone hits a
# newer pod of the same name (a restarted replica's). Built with kwok/pod-uid-precondition.patch,
# its calls carry the pod's uid as the kubelet's do; the cache folder is named after the patch.
KWOK_PATCH="pod-uid-precondition"
HELM_VERSION="v3.22.0"
KIND_VERSION="v0.33.0"

COREDNS_VERSION="$(modversion "$HERE/coredns/go.mod" github.com/coredns/coredns)"
KUEUE_VERSION="$(modversion "$HERE/kueue/go.mod" sigs.k8s.io/kueue)"
PLUGINS_VERSION="$(modversion "$HERE/scheduler-plugins/go.mod" sigs.k8s.io/scheduler-plugins)"
NETPOL_VERSION="$(modversion "$HERE/network-policies/go.mod" sigs.k8s.io/kube-network-policies)"
KATIB_VERSION="$(modversion "$HERE/katib/go.mod" github.com/kubeflow/katib)"
TRAINER_VERSION="$(modversion "$HERE/kueue/go.mod" github.com/kubeflow/trainer/v2)"
VERSITYGW_VERSION="$(modversion "$HERE/versitygw/go.mod" github.com/versity/versitygw)"
FAKE_GCS_VERSION="$(modversion "$HERE/fake-gcs-server/go.mod" github.com/fsouza/fake-gcs-server)"
NODE=""
KIND=""
PACKAGES_ONLY=""
for arg in "$@"; do
    case "$arg" in
    --print-dir)
        echo "$TOOLS_DIR"
        exit 0
        ;;
    --node) NODE=1 ;;
    --node-packages) PACKAGES_ONLY=1 ;;
    --kind) NODE=1 KIND=1 ;;
    *)
        echo "install.sh: unknown argument $arg" >&2
        exit 2
        ;;
    esac
done

if [[ -z "$K8S_VERSION" || -z "$ETCD_VERSION" ]]; then
    echo "install.sh: cannot read versions from $HERE/k8s/go.mod or $HERE/etcd/go.mod" >&2
    exit 1
fi

# shellcheck source=tests/controlplane/go.sh
source "$HERE/go.sh"
require_go 26 "kwok v0.8.0 and etcd 3.6 need it"

mkdir -p "$TOOLS_DIR"
SUMMARY=()
BUILDING=""  # the temp folder of the build in progress, removed if the script fails
trap '[[ -z "$BUILDING" ]] || rm -rf "$BUILDING"' EXIT

# have DIR BIN... : true when DIR holds every listed executable (a listed .yaml: that file)
have() {
    local dir="$1"
    shift
    local b
    for b in "$@"; do
        [[ -x "$dir/$b" || ("$b" == *.yaml && -f "$dir/$b") ]] || return 1
    done
}

# build_into NAME VERSION BUILD_FUNCTION BIN... : builds into a temp folder, then renames it
# into place, so an interrupted build never leaves a half-filled cache folder.
build_into() {
    local name="$1" version="$2" fn="$3"
    shift 3
    local dest="$TOOLS_DIR/$name-$version"
    if have "$dest" "$@"; then
        SUMMARY+=("$name $version: cached in $dest")
        return 0
    fi
    local tmp
    tmp="$(mktemp -d "$TOOLS_DIR/.$name-$version.XXXXXX")"
    BUILDING="$tmp"
    local start=$SECONDS
    echo "==> building $name $version ($*) into $dest"
    "$fn" "$tmp" "$version"
    have "$tmp" "$@"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    BUILDING=""
    chmod 755 "$dest"
    SUMMARY+=("$name $version: built in $((SECONDS - start))s -> $dest")
}

# kube_ldflags VERSION: the version stamp of a Kubernetes binary (what `--version` prints)
kube_ldflags() {
    local version="$1"
    local v="${version#v}"
    local major="${v%%.*}" rest="${v#*.}"
    local minor="${rest%%.*}"
    local x
    local ldflags="-s -w"
    for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $x.gitVersion=$version -X $x.gitMajor=$major -X $x.gitMinor=$minor"
        ldflags+=" -X $x.gitTreeState=clean -X $x.gitCommit=unknown"
        ldflags+=" -X $x.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    echo "$ldflags"
}

build_kubernetes() {
    local out="$1" version="$2"
    local ldflags
    ldflags="$(kube_ldflags "$version")"
    local bin t0
    for bin in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
        t0=$SECONDS
        (cd "$HERE/k8s" && "$GO" build -trimpath -ldflags "$ldflags" -o "$out/$bin" "k8s.io/kubernetes/cmd/$bin")
        echo "    $bin: $((SECONDS - t0))s"
        SUMMARY+=("  $bin: $((SECONDS - t0))s")
    done
}

build_etcd() {
    local out="$1" _version="$2"
    local t0=$SECONDS
    (cd "$HERE/etcd" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/etcd" .)
    SUMMARY+=("  etcd: $((SECONDS - t0))s")
}

build_kwok() {
    local out="$1" _version="$2"
    local module src
    module="$("$GO" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$module" ]] || { echo "install.sh: kwok $KWOK_VERSION not downloaded" >&2; return 1; }
    src="$(mktemp -d)"
    cp -R "$module/." "$src"
    chmod -R u+w "$src"
    (cd "$src" && git apply -p1 "$HERE/kwok/$KWOK_PATCH.patch" &&
        "$GO" build -trimpath -ldflags "-s -w" -o "$out/kwok" ./cmd/kwok)
    rm -rf "$src"
}

build_helm() {
    local out="$1" version="$2"
    GOBIN="$out" "$GO" install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
        "helm.sh/helm/v3/cmd/helm@$version"
}

build_kueue() {
    local out="$1" _version="$2"
    local t0=$SECONDS src
    (cd "$HERE/kueue" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/kueue" sigs.k8s.io/kueue/cmd/kueue)
    src="$(cd "$HERE/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
    mkdir -p "$out/crds"
    cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
    cp "$src/config/components/webhook/manifests.yaml" "$out/webhooks.yaml"
    chmod -R u+w "$out"
    SUMMARY+=("  kueue: $((SECONDS - t0))s")
}

build_scheduler_plugins() {
    local out="$1" _version="$2"
    local t0=$SECONDS src
    # One go build for both; their Kubernetes packages are the test bed's (same replaces).
    (cd "$HERE/scheduler-plugins" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/" \
        sigs.k8s.io/scheduler-plugins/cmd/scheduler sigs.k8s.io/scheduler-plugins/cmd/controller)
    src="$(cd "$HERE/scheduler-plugins" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)"
    # manifests/crds are symlinks, absent from the module zip: config/crd/bases has the files.
    mkdir -p "$out/crds"
    cp "$src"/config/crd/bases/scheduling.x-k8s.io_*.yaml "$out/crds/"
    chmod -R u+w "$out"
    SUMMARY+=("  scheduler-plugins: $((SECONDS - t0))s")
}

# The node's Debian packages: binary -> package.
NODE_PACKAGES=(
    /usr/bin/containerd:containerd
    /usr/sbin/runc:runc
    /usr/lib/cni/bridge:containernetworking-plugins
    /usr/bin/buildah:buildah
    /usr/sbin/debootstrap:debootstrap
    /usr/sbin/iptables:iptables
    /usr/bin/gcc:gcc
    /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev
    # tests/e2e/test_tensorboard.py: a real browser renders TensorBoard's charts
    /usr/bin/chromium:chromium
    # tests/local/test_multiplexer.py: the live table redrawn in real terminal multiplexers
    /usr/bin/tmux:tmux
    /usr/bin/screen:screen
)

# A kind cluster's: the container engine kind drives (started only by tests/controlplane/kind.py,
# in a network namespace of its own; the package's own service is never started).
KIND_PACKAGES=(
    /usr/sbin/dockerd:docker.io
)

install_node_packages() {
    local missing=() entry
    local wanted=("${NODE_PACKAGES[@]}")
    [[ -z "$KIND" ]] || wanted+=("${KIND_PACKAGES[@]}")
    for entry in "${wanted[@]}"; do
        [[ -e "${entry%%:*}" ]] || missing+=("${entry#*:}")
    done
    if ((${#missing[@]} == 0)); then
        SUMMARY+=("node packages: installed")
        return 0
    fi
    if [[ "$(id -u)" != 0 ]]; then
        echo "install.sh: the node needs Debian packages (${missing[*]}): run as root" >&2
        exit 1
    fi
    local t0=$SECONDS
    echo "==> apt-get install ${missing[*]}"
    # No service is started: the node runs its own containerd with its own config.
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null \
        || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
    SUMMARY+=("node packages: ${missing[*]} installed in $((SECONDS - t0))s")
}

build_node() {
    local out="$1" _version="$2"
    local ldflags t0
    ldflags="$(kube_ldflags "$K8S_VERSION")"
    t0=$SECONDS
    # One go build for both: they share most packages (and the control plane's build cache).
    (cd "$HERE/k8s" && "$GO" build -trimpath -ldflags "$ldflags" -o "$out/" \
        k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
    SUMMARY+=("  kubelet + kube-proxy: $((SECONDS - t0))s")
    t0=$SECONDS
    (cd "$HERE/coredns" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/coredns" .)
    SUMMARY+=("  coredns: $((SECONDS - t0))s")
    local src
    src="$(cd "$HERE/k8s" && "$GO" list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
    gcc -Os -Wall -Werror -static -DVERSION="$K8S_VERSION-trainjob" -o "$out/pause" "$src"
    strip "$out/pause"
}

build_network_policies() {
    local out="$1" _version="$2"
    (cd "$HERE/network-policies" && "$GO" build -trimpath -ldflags "-s -w" \
        -o "$out/kube-network-policies" .)
    # A kind cluster runs it as its users do: the module's own command (a tool of the wrapper
    # module) in the DaemonSet of the module's install.yaml (tests/controlplane/kind.py).
    (cd "$HERE/network-policies" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" \
        -o "$out/netpol" sigs.k8s.io/kube-network-policies/cmd &&
        cp "$("$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kube-network-policies)/install.yaml" "$out/")
    chmod u+w "$out/install.yaml"
}

# kind, kubeadm and CoreDNS for a kind cluster's nodes; the node image is built from them and
# the node's binaries by tests/controlplane/kind/node-image.sh.
build_kind() {
    local out="$1" _version="$2"
    local t0=$SECONDS
    GOBIN="$out" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
    SUMMARY+=("  kind: $((SECONDS - t0))s")
    t0=$SECONDS
    (cd "$HERE/k8s" && "$GO" build -trimpath -ldflags "$(kube_ldflags "$K8S_VERSION")" \
        -o "$out/kubeadm" k8s.io/kubernetes/cmd/kubeadm)
    SUMMARY+=("  kubeadm: $((SECONDS - t0))s")
    t0=$SECONDS
    (cd "$HERE/coredns" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/coredns" .)
    SUMMARY+=("  coredns: $((SECONDS - t0))s")
    # kind's base files (entrypoint, systemd units, containerd config) from the same module
    local src
    src="$("$GO" mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -nE 's/^\s*"Dir": "(.*)",$/\1/p')"
    cp -r "$src/images/base/files" "$out/base-files"
    # the Helm charts of Kueue and scheduler-plugins, which the kind cluster installs
    mkdir -p "$out/charts"
    src="$(cd "$HERE/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
    cp -r "$src/charts/kueue" "$out/charts/kueue"
    src="$(cd "$HERE/scheduler-plugins" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)"
    cp -r "$src/manifests/install/charts/as-a-second-scheduler" "$out/charts/scheduler-plugins"
    chmod -R u+w "$out/base-files" "$out/charts"
}

# Katib's own reading of a trial's job status (wrapper module tests/controlplane/katib), run
# by the TFJob tests on the TFJobs the operator finished.
build_katib() {
    local out="$1" _version="$2"
    (cd "$HERE/katib" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/katib-trial-status" .)
}

# Kubeflow Trainer v2's CRDs and its torch runtime (nothing is built: its controller is not
# needed to see that our TrainJob and its TrainJob live side by side), and the JobSet CRD that
# Kueue's trainer.kubeflow.org/trainjob integration watches: both at the versions Kueue's
# integration is built against, so that what Kueue writes on Trainer's jobs fits their schema.
build_trainer() {
    local out="$1" _version="$2" src
    src="$(cd "$HERE/kueue" && "$GO" list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)"
    mkdir -p "$out/crds"
    cp "$src"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$out/crds/"
    cp "$src/manifests/base/runtimes/torch_distributed.yaml" "$out/"
    src="$(cd "$HERE/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/jobset)"
    cp "$src/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$out/crds/"
    chmod -R u+w "$out"
}

# The object stores of the checkpoint tests: each wrapper module's `tool` line is the module's
# own command, built at the versions its go.mod pins.
build_versitygw() {
    local out="$1" _version="$2"
    (cd "$HERE/versitygw" && "$GO" build -trimpath -ldflags "-s -w" -o "$out/versitygw" \
        github.com/versity/versitygw/cmd/versitygw)
}

build_fake_gcs() {
    local out="$1" _version="$2"
    (cd "$HERE/fake-gcs-server" && "$GO" build -trimpath -ldflags "-s -w" \
        -o "$out/fake-gcs-server" github.com/fsouza/fake-gcs-server)
}

if [[ -n "$PACKAGES_ONLY" ]]; then
    install_node_packages
    echo "==> ${SUMMARY[-1]}"
    exit 0
fi

total_start=$SECONDS
build_into etcd "$ETCD_VERSION" build_etcd etcd
build_into kwok "$KWOK_VERSION-$KWOK_PATCH" build_kwok kwok
build_into helm "$HELM_VERSION" build_helm helm
build_into kubernetes "$K8S_VERSION" build_kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl
build_into kueue "$KUEUE_VERSION" build_kueue kueue
build_into scheduler-plugins "$PLUGINS_VERSION" build_scheduler_plugins scheduler controller
build_into katib "$KATIB_VERSION" build_katib katib-trial-status
build_into trainer "$TRAINER_VERSION" build_trainer crds/trainer.kubeflow.org_trainjobs.yaml \
    crds/jobset.x-k8s.io_jobsets.yaml torch_distributed.yaml
build_into fake-gcs-server "$FAKE_GCS_VERSION" build_fake_gcs fake-gcs-server
build_into versitygw "$VERSITYGW_VERSION" build_versitygw versitygw
if [[ -n "$NODE" ]]; then
    install_node_packages
    build_into node "$K8S_VERSION-coredns-$COREDNS_VERSION" build_node kubelet kube-proxy coredns pause
    build_into network-policies "$NETPOL_VERSION" build_network_policies kube-network-policies netpol
fi
if [[ -n "$KIND" ]]; then
    build_into kind "$KIND_VERSION-$K8S_VERSION-coredns-$COREDNS_VERSION" build_kind kind kubeadm coredns
    t0=$SECONDS
    node_image="$(bash "$HERE/kind/node-image.sh" "$TOOLS_DIR/kind-$KIND_VERSION-$K8S_VERSION-coredns-$COREDNS_VERSION" \
        "$TOOLS_DIR/node-$K8S_VERSION-coredns-$COREDNS_VERSION" "$TOOLS_DIR/kubernetes-$K8S_VERSION" \
        "$TOOLS_DIR/etcd-$ETCD_VERSION" "$TOOLS_DIR/kueue-$KUEUE_VERSION" \
        "$TOOLS_DIR/scheduler-plugins-$PLUGINS_VERSION" "$TOOLS_DIR/network-policies-$NETPOL_VERSION" \
        | tail -n 1)"
    SUMMARY+=("kind node image: $node_image ($((SECONDS - t0))s)")
fi

echo "==> trainjob test tools ($("$GO" version)), total $((SECONDS - total_start))s"
for line in "${SUMMARY[@]}"; do
    echo "    $line"
done
echo "    TRAINJOB_TOOLS_DIR=$TOOLS_DIR"
