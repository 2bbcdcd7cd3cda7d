#!/usr/bin/env bash
# Builds the four TrainJob images from their Dockerfiles with buildah (no Docker daemon) and
# prints their sizes:
#   docker.io/trainjob/trainjob-operator:<version>   images/operator/Dockerfile
#   docker.io/trainjob/trainjob:<version>            images/trainjob/Dockerfile (tensorflow-cpu)
#   docker.io/trainjob/trainjob:<version>-gpu        the same, TENSORFLOW=tensorflow[and-cuda]
#   docker.io/trainjob/trainjob-legacy:<version>     images/trainjob-legacy/Dockerfile
# and, for the e2e tier only, the image Kubeflow's own TFJob e2e test (kubeflow-training's
# test/e2e/test_e2e_tfjob.py, tests/e2e/test_kubeflow_sdk.py) runs, FROM the runtime image:
#   gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0   images/kubeflow-sdk-e2e/Dockerfile
# <version> is pyproject.toml's. The base image is BASE_IMAGE when set (e.g. the official
# python:3.11-slim-bookworm where a registry is reachable); otherwise an equivalent base is
# built here, offline from any registry, by images/base/build.sh (debootstrap + Debian's
# python3.11).
#
# Images live in their own buildah store under ${TRAINJOB_TOOLS_DIR:-~/.cache/trainjob-tools}/
# images/. Each image is tagged with a hash of everything it is built from (Dockerfile, the
# files it copies, the base image); an image whose hash is already there is not rebuilt, so a
# warm run takes seconds. Needs root and buildah (+ debootstrap for the local base).
#
# Usage: bash images/build.sh [--storage-flags]
#   --storage-flags   print the buildah flags of the store (for `buildah $(...) push ...`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools_dir="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}"
store="$tools_dir/images"
storage_flags=(--root "$store/storage" --runroot /run/trainjob-images --storage-driver overlay)
if [[ "${1:-}" == "--storage-flags" ]]; then
    echo "${storage_flags[*]}"
    exit 0
fi
for tool in buildah debootstrap; do
    if ! command -v "$tool" >/dev/null; then
        echo "images/build.sh: $tool not found (Debian: apt-get install buildah debootstrap)" >&2
        exit 1
    fi
done
if [[ "$(id -u)" != 0 ]]; then
    echo "images/build.sh: run as root (buildah's store and debootstrap need it)" >&2
    exit 1
fi
mkdir -p "$store"
bah() { buildah "${storage_flags[@]}" "$@"; }

version="$(sed -nE 's/^version = "([^"]+)"/\1/p' pyproject.toml | awk 'NR == 1')"
work="$(mktemp -d "${TMPDIR:-/tmp}/trainjob-images.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# exists REF: the store holds an image named REF
exists() { bah inspect --type image "$1" >/dev/null 2>&1; }

# content_hash PATH...: one hash of the given files and folders (no bytecode, no build output)
content_hash() {
    find "$@" -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | LC_ALL=C sort -z \
        | xargs -0 sha256sum | sha256sum | cut -c1-16
}

started=$SECONDS
base="${BASE_IMAGE:-}"
if [[ -z "$base" ]]; then
    base="localhost/trainjob/python:3.11-bookworm-$(content_hash images/base)"
    if exists "$base"; then
        echo "==> base $base: cached"
    else
        t0=$SECONDS
        echo "==> base $base: debootstrap bookworm + python3.11"
        BUILDAH_FLAGS="${storage_flags[*]}" bash images/base/build.sh "$base"
        echo "    built in $((SECONDS - t0))s"
    fi
fi
base_id="$(bah images --no-trunc --format '{{.ID}}' "$base" 2>/dev/null | awk 'NR == 1')"
base_id="${base_id:-$base}"

# pip inside the build uses the host's CA bundle: on a network behind a TLS-inspecting proxy
# the image's own bundle cannot verify PyPI. The bundle is mounted for the build only; the
# images keep Debian's.
ca="${TRAINJOB_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
mounts=()
if [[ -f "$ca" ]]; then
    printf '[global]\ncert = /etc/ssl/certs/trainjob-build-ca.crt\n' >"$work/pip.conf"
    mounts+=(-v "$ca:/etc/ssl/certs/trainjob-build-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
fi

# The runtime image with TensorFlow's CUDA build: the CPU image's Dockerfile with another wheel.
gpu_tensorflow="tensorflow[and-cuda]"

summary=()
for name in operator trainjob trainjob-legacy trainjob-gpu; do
    image="$name"
    dockerfile="images/$name/Dockerfile"
    ref="docker.io/trainjob/$image:$version"
    build_args=(--build-arg "BASE_IMAGE=$base")
    case "$name" in
        operator) image="trainjob-operator" ref="docker.io/trainjob/$image:$version" ;;
        trainjob-gpu)
            dockerfile="images/trainjob/Dockerfile" ref="docker.io/trainjob/trainjob:$version-gpu"
            build_args+=(--build-arg "TENSORFLOW=$gpu_tensorflow")
            ;;
    esac
    sources=("$(dirname "$dockerfile")" pyproject.toml README.md trainjob)
    [[ "$name" == operator ]] && sources+=(operator)
    hash="$(printf '%s %s %s\n' "$base_id" "${build_args[*]}" "$(content_hash "${sources[@]}")" \
        | sha256sum | cut -c1-16)"
    cached="localhost/trainjob-cache/$image:$hash"
    t0=$SECONDS
    if exists "$cached"; then
        state="cached"
    else
        echo "==> building $ref from $dockerfile (base $base)"
        # --network host: pip reaches PyPI through the host's network; --isolation chroot:
        # RUN steps need no cgroup or network namespace set-up; --layers: a change to the
        # trainjob sources rebuilds only the steps after the big pip install.
        log="$store/build-$image.log"
        if ! bah bud --quiet --layers --pull=false --network host --isolation chroot \
            --ulimit nofile=1024:1024 "${mounts[@]}" \
            "${build_args[@]}" -f "$dockerfile" -t "$cached" . >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "images/build.sh: building $ref failed (log: $log)" >&2
            exit 1
        fi
        state="built in $((SECONDS - t0))s"
    fi
    bah tag "$cached" "$ref"
    # Earlier builds of this image (other hashes) only take space: remove their tags.
    for old in $(bah images --format '{{.Name}}:{{.Tag}}' | grep "^localhost/trainjob-cache/$image:"); do
        [[ "$old" == "$cached" ]] || bah rmi "$old" >/dev/null 2>&1 || true
    done
    size="$(bah images --format '{{.Size}}' "$ref" | awk 'NR == 1')"
    summary+=("$(printf '%-45s %10s  %s' "$ref" "$size" "$state")")
done

# The Kubeflow SDK e2e test's image: the runtime image plus one script. Its hash covers the
# runtime image's ID, so a changed runtime image rebuilds it (one small layer, seconds).
runtime_ref="docker.io/trainjob/trainjob:$version"
runtime_id="$(bah images --no-trunc --format '{{.ID}}' "$runtime_ref" | awk 'NR == 1')"
ref="gcr.io/kubeflow-ci/tf-mnist-with-summaries:1.0"
hash="$(printf '%s %s\n' "$runtime_id" "$(content_hash images/kubeflow-sdk-e2e)" \
    | sha256sum | cut -c1-16)"
cached="localhost/trainjob-cache/kubeflow-sdk-e2e:$hash"
t0=$SECONDS
if exists "$cached"; then
    state="cached"
else
    echo "==> building $ref from images/kubeflow-sdk-e2e/Dockerfile (base $runtime_ref)"
    log="$store/build-kubeflow-sdk-e2e.log"
    if ! bah bud --quiet --layers --pull=false --network host --isolation chroot \
        --build-arg "RUNTIME_IMAGE=$runtime_ref" \
        -f images/kubeflow-sdk-e2e/Dockerfile -t "$cached" . >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "images/build.sh: building $ref failed (log: $log)" >&2
        exit 1
    fi
    state="built in $((SECONDS - t0))s"
fi
bah tag "$cached" "$ref"
for old in $(bah images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/trainjob-cache/kubeflow-sdk-e2e:'); do
    [[ "$old" == "$cached" ]] || bah rmi "$old" >/dev/null 2>&1 || true
done
size="$(bah images --format '{{.Size}}' "$ref" | awk 'NR == 1')"
summary+=("$(printf '%-45s %10s  %s' "$ref" "$size" "$state")")

echo "==> images (buildah store ${storage_flags[*]}), $((SECONDS - started))s"
for line in "${summary[@]}"; do
    echo "    $line"
done
