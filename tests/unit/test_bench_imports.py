"""The benchmarks use the tests' support and test bed, never a test tier: import-linter sees
no package in bench/ (a folder of scripts), so this reads their imports itself."""

from __future__ import annotations

import ast
import pathlib

BENCH = pathlib.Path(__file__).parents[2] / "bench"
# What a benchmark may import of tests/: the shared helpers and the test bed.
ALLOWED = ("tests.support", "tests.controlplane")


def imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import in `tree`, function-level ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # `from tests import x` names module tests.x
            found += [
                (
                    node.lineno,
                    f"{node.module}.{alias.name}" if node.module == "tests" else node.module,
                )
                for alias in node.names
            ]
    return found


def test_benchmarks_import_only_the_support_and_the_test_bed_of_tests() -> None:
    scripts = sorted(BENCH.glob("*.py"))
    assert scripts, BENCH
    reaching = [
        f"{script.name}:{line}: {module}"
        for script in scripts
        for line, module in imported_modules(ast.parse(script.read_text(encoding="utf-8")))
        if (module == "tests" or module.startswith("tests."))
        and not any(module == allowed or module.startswith(f"{allowed}.") for allowed in ALLOWED)
    ]
    assert not reaching, "bench/ reaches into test modules:\n" + "\n".join(reaching)
