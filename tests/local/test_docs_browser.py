"""The documentation site as a reader sees it: built strict, opened from disk (file://, no
server: the site is offline) in headless Chromium (Debian's `chromium`, which `tests/run`
installs as root), the page shows the navigation by section and a search box, and a search
typed into the address (`?q=`, Material's own parameter) lists results, found by the search
index built into the site. Checked once here; the links and anchors of every page are the
strict build's (tests/unit/test_docs_site.py). The screenshot is kept under
`$TRAINJOB_DOCS_ARTIFACTS` (else the test's tmp_path), and its path printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e import browser
from tests.support import markdown, waits

T = 60.0
SECTIONS = ("Getting started", "Concepts", "Guides", "Reference", "Operations", "Development")

# What the reader sees, read from the live page: the navigation's section titles, whether
# the search box is there and visible, and the search results listed.
READ_PAGE = """JSON.stringify({
  sections: [...document.querySelectorAll('.md-sidebar--primary .md-nav__item--section > label,'
    + ' .md-sidebar--primary .md-nav__item--section > .md-nav__link')]
    .map(e => e.textContent.trim()),
  searchBox: (() => { const i = document.querySelector('input.md-search__input');
    return !!i && i.getBoundingClientRect().width > 0; })(),
  query: (document.querySelector('input.md-search__input') || {}).value || '',
  results: [...document.querySelectorAll('.md-search-result__item h1, .md-search-result__item h2')]
    .map(e => e.textContent.trim()).slice(0, 5),
})"""


def test_docs_page_in_chromium_shows_navigation_and_search(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = markdown.build_site(markdown.MKDOCS_YML, site)
    assert built.returncode == 0, built.stdout + built.stderr
    artifacts = Path(os.environ.get("TRAINJOB_DOCS_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    screenshot = artifacts / "docs-site.png"
    seen: dict[str, object] = {}

    with browser.headless(tmp_path / "chromium-profile", width=1280, height=900) as page:
        page.open((site / "index.html").as_uri() + "?q=kueue")

        def shown() -> bool:
            seen.update(json.loads(page.evaluate(READ_PAGE) or "{}"))
            return bool(seen.get("sections") and seen.get("searchBox") and seen.get("results"))

        waits.wait_until(
            shown, timeout=T, what="the docs' navigation, search box and results", interval=0.2
        )
        page.screenshot(screenshot)

    print(f"\nscreenshot of the docs site: {screenshot}")
    sections = seen["sections"]
    assert isinstance(sections, list)
    assert [s for s in SECTIONS if s in sections] == list(SECTIONS), seen
    assert seen["query"] == "kueue", seen
    assert screenshot.stat().st_size > 10_000
