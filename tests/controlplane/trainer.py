"""Kubeflow Trainer v2 beside the test control plane: its CRDs only (no controller).

Trainer defines its own `TrainJob` kind (`trainer.kubeflow.org/v1alpha1`, plural `trainjobs`,
no short name), which most platform teams now run for PyTorch and JAX; install.sh copies its
CRDs and its torch runtime from Trainer's Go module, and the JobSet CRD that Kueue's
`trainer.kubeflow.org/trainjob` integration watches from JobSet's, both at the versions Kueue
is built against (Kueue's wrapper module tests/controlplane/kueue): what Kueue writes on
Trainer's jobs then fits their schema. Every integration session's control plane has them, so every
integration test runs with both TrainJob kinds served (tests/integration/conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tests.controlplane.tools import (
    HERE,
    INSTALL_COMMAND,
    ToolsMissingError,
    go_mod_version,
    tools_dir,
)

GROUP: Final = "trainer.kubeflow.org"
VERSION: Final = "v1alpha1"
PLURAL: Final = "trainjobs"
KUEUE_FRAMEWORK: Final = "trainer.kubeflow.org/trainjob"
RUNTIME: Final = "torch-distributed"  # the ClusterTrainingRuntime in runtime_file()


def trainer_version() -> str:
    return go_mod_version(HERE / "kueue" / "go.mod", "github.com/kubeflow/trainer/v2")


def trainer_dir() -> Path:
    directory = tools_dir() / f"trainer-{trainer_version()}"
    if not (directory / "crds" / "trainer.kubeflow.org_trainjobs.yaml").is_file():
        raise ToolsMissingError(
            f"Kubeflow Trainer's CRDs are missing: {directory / 'crds'}\nCopy them (with the "
            f"other test tools, cached afterwards) with:\n  {INSTALL_COMMAND}"
        )
    return directory


def crd_files() -> list[Path]:
    """Trainer's three CRDs and JobSet's."""
    return sorted((trainer_dir() / "crds").glob("*.yaml"))


def runtime_file() -> Path:
    """Trainer's own `torch-distributed` ClusterTrainingRuntime."""
    return trainer_dir() / "torch_distributed.yaml"
