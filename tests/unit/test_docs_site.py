"""The documentation is tested like the code: the site builds strict (no broken link or anchor,
no page left out of the nav), every `trainjob ...` command line in the docs parses with the
real parser, and every RBAC rule of the chart is explained on the RBAC page."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest

from tests.support import markdown
from trainjob import cli
from trainjob.runtime import entry

SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
CHART_TEMPLATES = markdown.REPO_ROOT / "helm" / "trainjob-operator" / "templates"
RBAC_PAGE = markdown.CONTENT_DIR / "operations" / "rbac.md"


def test_docs_site_builds_strict_and_offline(tmp_path: Path) -> None:
    result = markdown.build_site(markdown.MKDOCS_YML, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    # Offline: the search index is in the pages' own script, and no page loads from elsewhere.
    assert (tmp_path / "site" / "search" / "search_index.js").is_file()
    for page in (tmp_path / "site").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        loaded = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', text)
        assert not loaded, f"{page.relative_to(tmp_path)} loads {loaded}"


def test_docs_site_fails_on_an_orphan_page_and_a_broken_anchor(tmp_path: Path) -> None:
    """The strictness is real: a page missing from the nav and a link to an anchor that does
    not exist each fail the build, naming the file."""
    docs = tmp_path / "docs"
    shutil.copytree(markdown.DOCS_DIR, docs, ignore=shutil.ignore_patterns("__pycache__"))
    (docs / "content" / "orphan.md").write_text("# Not in the nav\n")
    index = docs / "content" / "index.md"
    index.write_text(index.read_text() + "\n[gone](guides/gangs.md#no-such-anchor)\n")
    result = markdown.build_site(docs / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "orphan.md" in output, output
    assert "no-such-anchor" in output, output


def _docs_command_lines() -> list[tuple[str, list[str]]]:
    found = []
    for path in markdown.doc_files():
        for block in markdown.code_blocks(path):
            if block.lang not in SHELL_LANGS:
                continue
            for line in markdown.shell_lines(block):
                for argv in markdown.commands(line):
                    if argv[0] == "trainjob" or argv[0].endswith("/trainjob"):
                        found.append((block.where, argv[1:]))
                    elif argv[1:3] == ["-m", "trainjob"] and "python" in argv[0]:
                        found.append((block.where, argv[3:]))
    return found


DOCS_COMMANDS = _docs_command_lines()


def test_docs_have_trainjob_commands_to_check() -> None:
    """The extraction finds the commands the pages are known to hold (so the parse test
    below cannot pass by finding nothing)."""
    verbs = {argv[0] for _, argv in DOCS_COMMANDS if argv}
    assert len(DOCS_COMMANDS) >= 20, DOCS_COMMANDS
    assert {"run", "submit", "get", "describe", "logs", "wait", "tensorboard"} <= verbs, verbs


@pytest.mark.parametrize(
    "argv", [argv for _, argv in DOCS_COMMANDS], ids=[where for where, _ in DOCS_COMMANDS]
)
def test_docs_trainjob_command_parses(argv: list[str]) -> None:
    # `train` and `data` are handed to the runtime's own parsers (cli.main does the same).
    runtime_parsers = {"train": entry.train_parser, "data": entry.data_parser}
    if argv and argv[0] in runtime_parsers:
        parser, argv = runtime_parsers[argv[0]](), argv[1:]
    else:
        parser = cli.build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # --help and --version exit 0; a bad line exits 2
            assert exc.code == 0, f"trainjob {' '.join(argv)}: {stderr.getvalue()}"
    assert isinstance(parser, argparse.ArgumentParser)


def _chart_rules() -> set[tuple[str, str, frozenset[str]]]:
    rule = re.compile(
        r"- apiGroups: \[(?P<groups>[^\]]*)\]\s*\n\s*resources: \[(?P<resources>[^\]]*)\]"
        r"\s*\n(?:\s*resourceNames: .*\n)?\s*verbs: \[(?P<verbs>[^\]]*)\]"
    )
    rules = set()
    for template in CHART_TEMPLATES.glob("*"):
        for match in rule.finditer(template.read_text()):
            verbs = frozenset(v.strip() for v in match["verbs"].split(","))
            for group in match["groups"].split(","):
                for resource in match["resources"].split(","):
                    rules.add((group.strip().strip('"') or "core", resource.strip(), verbs))
    return rules


def _page_rules() -> set[tuple[str, str, frozenset[str]]]:
    rules = set()
    for line in RBAC_PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[2] or cells[0] in ("API group", "---"):
            continue
        resource = re.search(r"`([^`]+)`", cells[1])
        if resource:
            verbs = frozenset(v.strip() for v in cells[2].split(","))
            rules.add((cells[0].strip("`"), resource[1], verbs))
    return rules


def test_docs_rbac_page_explains_every_rule_of_the_chart() -> None:
    chart, page = _chart_rules(), _page_rules()
    assert len(chart) >= 20, chart
    missing = sorted(chart - page, key=str)
    assert not missing, f"rules of the chart that {RBAC_PAGE.name} does not explain: {missing}"
    stale = sorted(page - chart, key=str)
    assert not stale, f"rules in {RBAC_PAGE.name} that the chart no longer has: {stale}"


def test_docs_every_example_is_used_by_a_guide() -> None:
    """Each file of examples/ is named by a page of Getting started or the Guides, which says
    what it shows and how to run it."""
    guides = [markdown.CONTENT_DIR / "getting-started", markdown.CONTENT_DIR / "guides"]
    text = "\n".join(page.read_text() for folder in guides for page in folder.rglob("*.md"))
    examples = sorted((markdown.REPO_ROOT / "examples").glob("*.yaml"))
    assert examples
    unused = [path.name for path in examples if f"examples/{path.name}" not in text]
    assert not unused, f"examples no guide uses: {unused}"
