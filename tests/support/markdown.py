"""The user documentation as data: its Markdown files (the README and the site's pages under
docs/content/) and their fenced code blocks, for the tests that hold the docs to the code
(tests/unit/test_docs_site.py, tests/integration/test_docs_manifests.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO_ROOT / "docs"
CONTENT_DIR = DOCS_DIR / "content"
MKDOCS_YML = DOCS_DIR / "mkdocs.yml"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
# A shell line's operators that end one simple command and start the next.
_OPERATORS = frozenset({"&&", "||", "|", ";", "&", "(", ")", "$(", "<(", "|&"})
_REDIRECTIONS = frozenset({">", ">>", "<", ">&", "&>", ">|", "<<<"})
# Words that run the command after them (and their own options are not the command's).
_WRAPPERS = frozenset({"sudo", "nohup", "env", "exec", "time", "timeout", "nice", "source"})
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def build_site(config: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the site ``config`` describes, into ``site_dir``."""
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(
        [*command, "--site-dir", str(site_dir)],
        # Material's banner about MkDocs 2.0 on every build would bury a failure's own lines.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "true"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def doc_files() -> list[Path]:
    """The README and every page of the site, in a stable order."""
    return [REPO_ROOT / "README.md", *sorted(CONTENT_DIR.rglob("*.md"))]


def code_blocks(path: Path) -> list[CodeBlock]:
    """The fenced code blocks of one Markdown file (indented fences inside lists included)."""
    blocks: list[CodeBlock] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        blocks.append(CodeBlock(path, index + 1, opening["lang"].lower(), "\n".join(body)))
        index = end + 1
    return blocks


def shell_lines(block: CodeBlock) -> list[str]:
    """The command lines of a shell block: continuations joined, heredoc bodies and, in a
    `console` block, everything but the `$ ` prompts' lines left out."""
    lines: list[str] = []
    pending = ""
    heredoc_end: str | None = None
    for raw in block.text.splitlines():
        if heredoc_end is not None:
            if raw.strip() == heredoc_end:
                heredoc_end = None
            continue
        line = raw
        if block.lang == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line.removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line = pending + line
        pending = ""
        heredoc = _HEREDOC.search(line)
        if heredoc:
            heredoc_end = heredoc[1]
            line = line[: heredoc.start()]
        lines.append(line)
    return lines


def commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line, each an argv: comments dropped, split at the
    operators (`&&`, `|`, `;`, `&`, subshells, `$(...)`, `<(...)`), leading `VAR=value`
    assignments and wrappers such as `sudo` or `nohup` left out."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    argvs: list[list[str]] = []
    current: list[str] = []
    redirected = False
    for token in tokens:
        if redirected:  # a redirection's file is no word of the command
            redirected = False
            continue
        if token in _REDIRECTIONS:
            redirected = True
            continue
        if token in _OPERATORS or (token and set(token) <= set("&|;()<>")):
            if current:
                argvs.append(current)
            current = []
            continue
        if token.endswith("$") and not current:
            continue  # the `$` of `$(` arrives on its own
        current.append(token)
    if current:
        argvs.append(current)
    return [_unwrapped(argv) for argv in argvs if _unwrapped(argv)]


def _unwrapped(argv: list[str]) -> list[str]:
    words = list(argv)
    while words and (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]) or words[0] in _WRAPPERS):
        words.pop(0)
        while words and words[0].startswith("-"):  # the wrapper's own options (nice -n 10)
            words.pop(0)
            if words and words[0].isdigit():
                words.pop(0)
    return words
