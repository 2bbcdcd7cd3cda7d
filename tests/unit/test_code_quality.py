"""ruff, mypy --strict and the import-linter layering contracts are part of the test command."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
BIN = pathlib.Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


def test_ruff_is_clean() -> None:
    result = run(str(BIN / "ruff"), "check", "trainjob", "operator", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    """`mypy` as configured in pyproject.toml: strict over the product, tests/ and bench/."""
    result = run(str(BIN / "mypy"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_contracts_hold() -> None:
    result = run(str(BIN / "lint-imports"))
    assert result.returncode == 0, result.stdout + result.stderr
