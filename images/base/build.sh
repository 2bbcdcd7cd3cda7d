#!/usr/bin/env bash
# Builds a local stand-in for the official python:3.11-slim-bookworm image without a registry:
# a Debian bookworm rootfs from debootstrap (--variant=minbase) with Debian's python3.11, and a
# virtual environment at /usr/local so that `python`, `python3` and `pip` are on PATH in
# /usr/local/bin exactly as in the official image. pip installs into that environment, so
# Debian's PEP 668 marker (which guards the system interpreter) is not in the way.
#
# Usage: bash images/base/build.sh IMAGE_NAME   (needs root, debootstrap, buildah; run by
#        images/build.sh, which passes its buildah storage flags in BUILDAH_FLAGS)
set -euo pipefail

name="${1:?usage: images/base/build.sh IMAGE_NAME}"
mirror="${TRAINJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
read -r -a buildah_flags <<<"${BUILDAH_FLAGS:-}"

work="$(mktemp -d "${TMPDIR:-/tmp}/trainjob-base.XXXXXX")"
container=""
cleanup() {
    if [[ -n "$container" ]]; then
        buildah "${buildah_flags[@]}" rm "$container" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

rootfs="$work/rootfs"
# python3-distutils: provides python3.11-distutils, which python3.11-venv needs and
# debootstrap does not resolve through the virtual package.
# netbase: /etc/services and /etc/protocols (gRPC and getaddrinfo read them);
# ca-certificates: as in the official image.
debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-distutils,ca-certificates,netbase \
    bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    echo "images/base/build.sh: debootstrap failed (mirror $mirror)" >&2
    exit 1
}
# The venv's pip is the one Debian ships in python3.11-venv (no network needed).
chroot "$rootfs" /usr/bin/python3.11 -m venv /usr/local
ln -sf python3.11 "$rootfs/usr/local/bin/python"
# Files a runtime never reads: package lists, caches, documentation, man pages, locales.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/* "$rootfs"/tmp/*
find "$rootfs/usr/lib/python3.11" "$rootfs/usr/local/lib" -name __pycache__ -prune -exec rm -rf {} +

container="$(buildah "${buildah_flags[@]}" from scratch)"
mountpoint="$(buildah "${buildah_flags[@]}" mount "$container")"
tar -C "$rootfs" -cf - . | tar -C "$mountpoint" -xf -
buildah "${buildah_flags[@]}" umount "$container" >/dev/null
buildah "${buildah_flags[@]}" config \
    --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.description="Debian bookworm + python3.11 (debootstrap)" \
    "$container"
buildah "${buildah_flags[@]}" commit --quiet "$container" "$name" >/dev/null
