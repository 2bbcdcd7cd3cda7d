#!/usr/bin/env bash
# The cluster side's calls into the kubernetes client (trainjob/cluster/api.py, api_pods.py)
# with the lowest client release pyproject.toml allows (kubernetes-lowest.txt), against real
# servers: a local HTTP server that answers or misbehaves, and the test control plane with a
# kwok node serving a Pod's log. The release and what it needs are installed into a folder of
# their own (cached under the tools folder by the constraints' hash), put first on PYTHONPATH,
# so the venv keeps the newest. Run by tests/run beside the tiers; alone:
#   bash tests/constraints/run-lowest.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python="${TRAINJOB_PYTHON:-.venv/bin/python}"
constraints=tests/constraints/kubernetes-lowest.txt
hash="$(sha256sum "$constraints" | cut -c1-12)"
target="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}/kubernetes-lowest-$hash"
if [[ ! -f "$target/.installed" ]]; then
  rm -rf "$target"
  "$python" -m pip install --quiet --disable-pip-version-check --target "$target" \
    -c "$constraints" kubernetes
  touch "$target/.installed"
fi
version="$(PYTHONPATH="$target" "$python" -c 'import kubernetes; print(kubernetes.__version__)')"
echo "==> the cluster side's client calls with kubernetes $version (the lowest supported)"
# Their own pytest session: not counted in tests/run's table (the same tests run in the tiers).
env -u TRAINJOB_TIMINGS PYTHONPATH="$target" "$python" -m pytest -p no:cacheprovider -q \
  tests/unit/test_cluster_deadline.py tests/unit/test_cluster_api.py \
  tests/integration/test_cluster_logs_follow.py "$@"
