#!/usr/bin/env bash
# Builds the benchmark baseline: Kubeflow training-operator v1's command
# (github.com/kubeflow/training-operator/cmd/training-operator.v1) from its published Go module,
# at the version this folder's go.mod requires (the last v1 release the Go module proxy serves),
# and copies its TFJob CRD from the same module's manifests.
#
# Cached outside the clone, next to the control-plane tools:
#   ${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}/training-operator-<version>/
#       training-operator      the controller binary
#       kubeflow.org_tfjobs.yaml
# A folder that already holds both is skipped (idempotent). A cold build takes several
# minutes on 2 cores; Go's module and build caches stay in their default places.
# Needs Go >= 1.26 (/usr/local/go/bin is searched) and the Go module proxy. No Docker, no root.
#
# Usage: bash bench/kubeflow/install.sh [--print-dir]
#   --print-dir   print the folder the binary is (or will be) cached in, and exit
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}"
MODULE=github.com/kubeflow/training-operator
VERSION="$(awk -v m="$MODULE" '$1 == "require" && $2 == m {print $3; exit} $1 == m && $2 ~ /^v/ {print $2; exit}' "$HERE/go.mod")"
if [[ -z "$VERSION" ]]; then
    echo "install.sh: cannot read the $MODULE version from $HERE/go.mod" >&2
    exit 1
fi
DEST="$TOOLS_DIR/training-operator-$VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$DEST"
    exit 0
fi

if [[ -x "$DEST/training-operator" && -s "$DEST/kubeflow.org_tfjobs.yaml" ]]; then
    echo "training-operator $VERSION: cached in $DEST"
    exit 0
fi

# shellcheck source=tests/controlplane/go.sh
source "$HERE/../../tests/controlplane/go.sh"
require_go 26 "training-operator's module needs it"

mkdir -p "$TOOLS_DIR"
TMP="$(mktemp -d "$TOOLS_DIR/.training-operator-$VERSION.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
start=$SECONDS
echo "==> building training-operator $VERSION into $DEST"
(cd "$HERE" && "$GO" build -trimpath -ldflags "-s -w" -o "$TMP/training-operator" "$MODULE/cmd/training-operator.v1")
MODDIR="$(cd "$HERE" && "$GO" list -m -f '{{.Dir}}' "$MODULE")"
install -m 0644 "$MODDIR/manifests/base/crds/kubeflow.org_tfjobs.yaml" "$TMP/kubeflow.org_tfjobs.yaml"
rm -rf "$DEST"
mv "$TMP" "$DEST"
chmod 755 "$DEST"
echo "training-operator $VERSION: built in $((SECONDS - start))s ($("$GO" version)) -> $DEST"
