#!/usr/bin/env bash
# Installs the real Kubernetes parts used by tests/integration, without Docker:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#       built from the k8s.io/kubernetes Go module (wrapper module in tests/controlplane/k8s)
#   etcd   built from its Go module (wrapper module in tests/controlplane/etcd)
#   kwok   go install sigs.k8s.io/kwok/cmd/kwok
#   helm   go install helm.sh/helm/v3/cmd/helm
#
# Binaries are cached outside the clone, one folder per tool and version:
#   ${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}/<name>-<version>/
# A folder that already holds every binary is skipped, so the script is idempotent
# and cheap on a warm machine. Go's module and build caches stay in their default
# places. Needs only Go (>= 1.25; /usr/local/go/bin is searched) and network access
# to the Go module proxy. No stdin, no Docker, no root.
#
# Usage: bash tests/controlplane/install.sh [--print-dir]
#   --print-dir   print the tools directory and exit
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
HELM_VERSION="v3.22.0"

if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$TOOLS_DIR"
    exit 0
fi

if [[ -z "$K8S_VERSION" || -z "$ETCD_VERSION" ]]; then
    echo "install.sh: cannot read versions from $HERE/k8s/go.mod or $HERE/etcd/go.mod" >&2
    exit 1
fi

GO="$(command -v go || true)"
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
fi
if [[ -z "$GO" ]]; then
    echo "install.sh: Go toolchain not found (PATH or /usr/local/go/bin/go); Go >= 1.25 is required" >&2
    exit 1
fi
# Never download another toolchain behind our back; static binaries need no C compiler.
export GOTOOLCHAIN=local CGO_ENABLED=0
GO_VERSION="$("$GO" env GOVERSION)"  # e.g. go1.26.8
GO_MINOR="$(echo "$GO_VERSION" | sed -E 's/^go1\.([0-9]+).*/\1/')"
if [[ ! "$GO_MINOR" =~ ^[0-9]+$ ]] || ((GO_MINOR < 26)); then
    echo "install.sh: $GO is $GO_VERSION; Go >= 1.26 is required (kwok v0.8.0 and etcd 3.6 need it)" >&2
    exit 1
fi

mkdir -p "$TOOLS_DIR"
SUMMARY=()
BUILDING=""  # the temp folder of the build in progress, removed if the script fails
trap '[[ -z "$BUILDING" ]] || rm -rf "$BUILDING"' EXIT

# have DIR BIN... : true when DIR holds every listed executable
have() {
    local dir="$1"
    shift
    local b
    for b in "$@"; do
        [[ -x "$dir/$b" ]] || return 1
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

build_kubernetes() {
    local out="$1" version="$2"
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
    local out="$1" version="$2"
    GOBIN="$out" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$version"
}

build_helm() {
    local out="$1" version="$2"
    GOBIN="$out" "$GO" install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
        "helm.sh/helm/v3/cmd/helm@$version"
}

total_start=$SECONDS
build_into etcd "$ETCD_VERSION" build_etcd etcd
build_into kwok "$KWOK_VERSION" build_kwok kwok
build_into helm "$HELM_VERSION" build_helm helm
build_into kubernetes "$K8S_VERSION" build_kubernetes kube-apiserver kube-controller-manager kube-scheduler kubectl

echo "==> trainjob test tools ($("$GO" version)), total $((SECONDS - total_start))s"
for line in "${SUMMARY[@]}"; do
    echo "    $line"
done
echo "    TRAINJOB_TOOLS_DIR=$TOOLS_DIR"
