"""The docs site's pages stay true: the getting-started example runs as written, and every method (every registry
name and every unlearning strategy class) has a page in the site's navigation that names its strategy class.
The site itself is built with warnings as errors by ``make test`` (``mkdocs build --strict``)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
import yaml

from lightning_unlearn import strategies
from lightning_unlearn.harness.registry import available_methods, method_spec
from lightning_unlearn.strategies.base import UnlearningStrategy

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


NAV = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
#: every concrete unlearning strategy class the package exports, by the method name its certificates carry
STRATEGIES = {
    cls.method: cls
    for cls in (getattr(strategies, name) for name in strategies.__all__)
    if inspect.isclass(cls) and issubclass(cls, UnlearningStrategy) and isinstance(getattr(cls, "method", None), str)
}


@pytest.mark.parametrize("name", available_methods())
def test_every_registered_method_has_a_page_naming_its_strategy(name):
    page = f"methods/{name}.md"
    assert page in NAV
    assert method_spec(name).strategy.__name__ in (DOCS / page).read_text()


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_unlearning_strategy_class_has_a_page(method):
    page = f"methods/{method}.md"
    assert page in NAV
    assert STRATEGIES[method].__name__ in (DOCS / page).read_text()


def test_the_nav_names_only_pages_that_exist():
    assert [page for page in NAV if not (DOCS / page).is_file()] == []


@pytest.mark.slow
def test_the_getting_started_example_runs(tmp_path, monkeypatch, capsys):
    (code,) = re.findall(r"```python\n(.*?)```", (DOCS / "getting-started.md").read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"docs/getting-started.md in {os.getcwd()}", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out
    assert printed.count("acu: exact") == 3
    accuracy = float(re.search(r"training accuracy on digits 5-9: ([0-9.]+)", printed).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.9  # a ridge head on 512 random features fits 900 digits almost exactly
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 3
