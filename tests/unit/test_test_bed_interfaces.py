"""The test bed's modules (tests/controlplane) and the tests' support (tests/support) use each
other through public names only: node.py once called the control plane's _spawn and
_wait_healthy and imported its _go_mod_version, so a change inside cluster.py broke the node."""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).parents[1]
PACKAGES = ("controlplane", "support")


def private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, code) of each use of another object's or module's underscore name: `x._name`
    where x is not self or cls, and `from tests... import _name`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name[0] == "_"]
    return found


def test_test_bed_and_support_modules_use_only_each_others_public_names() -> None:
    modules = sorted(path for package in PACKAGES for path in (TESTS / package).glob("*.py"))
    assert modules
    uses = [
        f"{module.relative_to(TESTS)}:{line}: {code}"
        for module in modules
        for line, code in private_uses(ast.parse(module.read_text(encoding="utf-8")))
    ]
    assert not uses, "private names used across modules:\n" + "\n".join(uses)
