"""The Layout section (wherever it lives: the README, or a page of the docs site, found by its
heading) names every Python package of the product and the test tiers' shared packages, every
top-level module of `trainjob/`, and every module of the packages it lists module by module:
a package or module added without a line there fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from tests.support.markdown import CONTENT_DIR, REPO_ROOT

HEADING: Final = re.compile(r"^#{1,6}\s+Layout\s*$")
# "- `path`: what it holds", one line per package or top-level module.
ENTRY: Final = re.compile(r"^- `([^`]+)`")
# The roots whose packages the section must name (each folder with an __init__.py).
PACKAGE_ROOTS: Final = ("trainjob", "operator", "tests/support", "tests/controlplane")
NOT_MODULES: Final = frozenset({"__init__", "__main__", "conftest"})


def layout_section(
    candidates: list[Path] | None = None,
) -> tuple[Path, list[str]]:
    """The file whose heading is "Layout" (README.md, else a page under docs/content) and the
    lines of that section, up to the next heading of the same or a higher level."""
    if candidates is None:
        candidates = [REPO_ROOT / "README.md", *sorted(CONTENT_DIR.rglob("*.md"))]
    for path in candidates:
        lines = path.read_text(encoding="utf-8").splitlines()
        for start, line in enumerate(lines):
            if HEADING.match(line):
                level = len(line) - len(line.lstrip("#"))
                section: list[str] = []
                for after in lines[start + 1 :]:
                    hashes = len(after) - len(after.lstrip("#"))
                    if 0 < hashes <= level and after[hashes : hashes + 1] == " ":
                        break
                    section.append(after)
                return path, section
    raise AssertionError("no file has a heading 'Layout' (README.md, docs/content/**/*.md)")


def entries(section: list[str] | None = None) -> dict[str, str]:
    """Each listed path -> its line."""
    if section is None:
        _, section = layout_section()
    return {m.group(1): line for line in section if (m := ENTRY.match(line))}


def packages() -> list[str]:
    """Every package under PACKAGE_ROOTS as `path/`, the top one of a root included."""
    found = set()
    for root in PACKAGE_ROOTS:
        for marker in (REPO_ROOT / root).rglob("__init__.py"):
            found.add(f"{marker.parent.relative_to(REPO_ROOT).as_posix()}/")
    return sorted(found - {"trainjob/"})  # the top package is its modules' lines


def test_the_layout_section_is_found_by_its_heading() -> None:
    path, section = layout_section()
    assert entries(), f"{path.relative_to(REPO_ROOT)}: the Layout section lists nothing"
    assert len(section) > 5


def test_every_package_has_a_line_in_the_layout_section() -> None:
    path, _ = layout_section()
    listed = entries()
    missing = [package for package in packages() if package not in listed]
    assert not missing, f"{path.relative_to(REPO_ROOT)} has no line for {missing}"


def test_every_top_level_module_has_a_line_in_the_layout_section() -> None:
    path, _ = layout_section()
    listed = entries()
    modules = sorted(
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "trainjob").glob("*.py")
        if p.stem != "__init__"
    )
    missing = [module for module in modules if module not in listed]
    assert not missing, f"{path.relative_to(REPO_ROOT)} has no line for {missing}"


def test_every_module_of_a_listed_package_is_named_on_its_line() -> None:
    path, _ = layout_section()
    missing: list[str] = []
    for package, line in entries().items():
        folder = REPO_ROOT / package
        if not package.endswith("/") or not (folder / "__init__.py").exists():
            continue
        words = set(re.findall(r"\w+", line))
        missing += [
            f"{package}{p.name}"
            for p in sorted(folder.glob("*.py"))
            if p.stem not in NOT_MODULES and p.stem not in words
        ]
    assert not missing, f"{path.relative_to(REPO_ROOT)} does not name {missing}"


def test_a_package_left_out_of_a_layout_section_is_found(tmp_path: Path) -> None:
    """What the checks compare, on a page of its own: the section ends at the next heading,
    and a package listed only after it counts as left out."""
    page = tmp_path / "layout.md"
    page.write_text(
        "# Elsewhere\n\n## Layout\n\n- `trainjob/core/`: the core\n\n"
        "## Next\n\n- `trainjob/local/`: local runs\n",
        encoding="utf-8",
    )
    found, section = layout_section([page])
    listed = entries(section)
    assert found == page
    assert [p for p in ("trainjob/core/", "trainjob/local/") if p not in listed] == [
        "trainjob/local/"
    ]
