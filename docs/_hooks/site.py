"""mkdocs hooks of the docs site (``hooks:`` in mkdocs.yml)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

#: the benchmarks' figures, which the pages link where they lie in the repository (``../benchmarks/results/x.png``
#: from a page of docs/), so that the links work on the repository's own pages too
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_startup(command: str, dirty: bool) -> None:
    """api-autonav logs one line per module it documents: keep its warnings, drop the listing."""
    logging.getLogger("mkdocs.plugins.api-autonav").setLevel(logging.WARNING)


def on_files(files: Files, config: Any) -> Files:
    """The benchmarks' figures become site files at ``benchmarks/results/``."""
    for path in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/results/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    """A link to ``benchmarks/results/`` from the repository's docs/ folder is one ``../`` deeper than on the site."""
    up = "../" * page.file.src_uri.count("/")
    return markdown.replace(f"](../{up}benchmarks/results/", f"]({up}benchmarks/results/")
