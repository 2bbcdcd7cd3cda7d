"""ruff, mypy --strict and the import-linter layering contracts are part of the test command."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
BIN = pathlib.Path(sys.executable).parent
# mypy's incremental cache lives outside the clone, so a fresh clone (each CI run) checks in
# seconds what is unchanged: mypy compares each module's source hash with the cached one, so
# a changed module (and what depends on it) is checked again whatever its path or mtime.
# From an empty cache: 35-63 CPU-seconds (63 in a full run on a slow machine); warm: 1 s.
MYPY_CACHE = pathlib.Path(
    os.environ.get("MYPY_CACHE_DIR")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    / "trainjob-mypy"
)


def run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False, env=env
    )


def test_ruff_is_clean() -> None:
    result = run(str(BIN / "ruff"), "check", "trainjob", "operator", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    """`mypy` as configured in pyproject.toml: strict over the product, tests/ and bench/."""
    result = run(str(BIN / "mypy"), env={**os.environ, "MYPY_CACHE_DIR": str(MYPY_CACHE)})
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
