# Sourced by the install scripts (tests/controlplane/install.sh, bench/kubeflow/install.sh).
#
# require_go MINOR WHY: set GO to the Go toolchain on PATH, else /usr/local/go/bin/go, and exit
# unless it is Go >= 1.MINOR (WHY says what needs it).
require_go() {
    local minor="$1" why="$2" version found
    GO="$(command -v go || true)"
    if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
        GO=/usr/local/go/bin/go
    fi
    if [[ -z "$GO" ]]; then
        echo "install.sh: Go toolchain not found (PATH or /usr/local/go/bin/go); Go >= 1.$minor is required" >&2
        exit 1
    fi
    # Never download another toolchain behind our back; static binaries need no C compiler.
    export GOTOOLCHAIN=local CGO_ENABLED=0
    # No debug info from the compiler: every binary is linked with -s -w, which drops it anyway,
    # and not generating it took 13 % less CPU for etcd's build from an empty build cache
    # (70 against 80 CPU-seconds, mean of 3 and 2 builds, 2026-11-29). Only a cold build sees it:
    # the tools are cached by version.
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-gcflags=all=-dwarf=false"
    # The compiler and linker collect garbage a quarter as often. Every tool of `install.sh
    # --node` from an empty build cache, its modules downloaded: 595 s and 1,135 CPU-seconds
    # against 624 s and 1,186; alone, kube-apiserver's build 249 CPU-seconds against 287, at up
    # to 1.5 GB per process instead of 0.4 (2026-12-01; GOGC=800 gained nothing more on kwok's).
    # Building two tools at a time as well gained nothing more (594 s): the two builds compiled
    # their shared packages twice. A GOGC of the caller's own is kept.
    export GOGC="${GOGC:-400}"
    version="$("$GO" env GOVERSION)"  # e.g. go1.26.8
    found="$(echo "$version" | sed -E 's/^go1\.([0-9]+).*/\1/')"
    if [[ ! "$found" =~ ^[0-9]+$ ]] || ((found < minor)); then
        echo "install.sh: $GO is $version; Go >= 1.$minor is required ($why)" >&2
        exit 1
    fi
}
