"""Every Python snippet of the README, and of the docs pages its longer examples moved to, runs as written (in a
scratch directory); the README stays a short front page; no page uses a retired name."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
#: the README and the pages that took its longer examples (your own module; a certified release)
PAGES = [README, ROOT / "docs" / "own-model.md", ROOT / "docs" / "methods" / "index.md"]
SNIPPETS = [
    (page.relative_to(ROOT), code)
    for page in PAGES
    for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
]
#: names the package retired (the unlearners' old folder, the old weights digest in prose) and internal issue numbers
RETIRED = re.compile(r"strategies/|XXH3|\b[Ii]ssues? #?\d")
TEXT = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 3
    assert {page for page, _ in SNIPPETS} == {page.relative_to(ROOT) for page in PAGES}


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_the_readmes_links_lead_to_files():
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert len(links) >= 10  # the README sends everything else to the docs pages
    assert [link for link in links if not (ROOT / link).is_file()] == []


@pytest.mark.parametrize("page", TEXT, ids=[str(page.relative_to(ROOT)) for page in TEXT])
def test_no_retired_names(page):
    lines = page.read_text().splitlines()
    assert [f"{k}: {line}" for k, line in enumerate(lines, 1) if RETIRED.search(line)] == []


@pytest.mark.slow
@pytest.mark.parametrize("page, code", SNIPPETS, ids=[f"{page}-snippet{k}" for k, (page, _) in enumerate(SNIPPETS)])
def test_snippet_runs(page, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page} snippet in {os.getcwd()}", "exec"), {"__name__": "__readme__"})
