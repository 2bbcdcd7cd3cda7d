"""ruff, mypy --strict and the import-linter layering contracts are part of the test command."""

from __future__ import annotations

import pathlib
import re
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


def test_kopf_is_used_through_its_public_api_only() -> None:
    """No module of the product or the tests reaches into kopf's private packages (its
    underscore modules change between releases without notice)."""
    private = re.compile(r"\bkopf\.(_[a-z]\w*)")
    found = [
        f"{path.relative_to(ROOT)}: kopf.{match.group(1)}"
        for folder in ("trainjob", "operator", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for match in private.finditer(path.read_text(encoding="utf-8"))
    ]
    assert found == []
