"""The docs site's pages stay true: the getting-started example and the tutorial run as written and print what their
text says, and every method (every registry name and every unlearner class) has a page in the site's
navigation that names its strategy class. The site itself is built with warnings as errors by ``make test``
(``mkdocs build --strict``)."""

from __future__ import annotations

import inspect
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from lightning_unlearn import unlearners
from lightning_unlearn.unlearners.base import Unlearner
from lightning_unlearn_bench.registry import available_methods, method_spec

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
#: every concrete unlearner class the package exports, by the method name its certificates carry
STRATEGIES = {
    cls.method: cls
    for cls in (getattr(unlearners, name) for name in unlearners.__all__)
    if inspect.isclass(cls) and issubclass(cls, Unlearner) and isinstance(getattr(cls, "method", None), str)
}


def method_page(name: str) -> str:
    """The docs page of the method ``name``: ``methods/<name>.md``, or its family's page holding a section anchored
    ``#<name>`` (``methods/ccl.md`` for ``ccl_hessian`` and ``ccl_gradient``)."""
    if (DOCS / "methods" / f"{name}.md").is_file():
        return f"methods/{name}.md"
    pages = [p for p in sorted((DOCS / "methods").glob("*.md")) if f"{{ #{name} }}" in p.read_text()]
    assert len(pages) == 1, f"no page or section of its own for {name}: {pages}"
    return str(pages[0].relative_to(DOCS))


@pytest.mark.parametrize("name", available_methods())
def test_every_registered_method_has_a_page_naming_its_strategy(name):
    page = method_page(name)
    assert page in NAV
    assert method_spec(name).strategy.__name__ in (DOCS / page).read_text()


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_unlearning_strategy_class_has_a_page(method):
    page = method_page(method)
    assert page in NAV
    assert STRATEGIES[method].__name__ in (DOCS / page).read_text()


def test_the_nav_names_only_pages_that_exist():
    assert [page for page in NAV if not (DOCS / page).is_file()] == []


def test_every_page_is_in_the_nav():
    pages = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md") if "_hooks" not in path.parts)
    assert [page for page in pages if page not in NAV] == []


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


def _cells(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_the_tutorial_follows_getting_started_in_the_nav():
    assert NAV.index("tutorial.md") == NAV.index("getting-started.md") + 1


@pytest.mark.slow
def test_the_tutorial_runs_in_order_and_prints_what_it_says(tmp_path, monkeypatch, capsys):
    """The tutorial's cells, in order, in one namespace, as a notebook runs them; every warning recorded (none may
    reach the user but the one its own first cell drops, with its reason); then its claims, one by one."""
    cells = _cells("tutorial.md")
    assert len(cells) == 8
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    threads = torch.get_num_threads()
    # one thread: the tutorial's tiny convolutions gain nothing from more, and on cores shared with other jobs
    # OpenMP's spinning threads make them a hundred times slower; only the last bits of its numbers depend on it
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k, cell in enumerate(cells):
                exec(compile(cell, f"docs/tutorial.md cell {k} in {os.getcwd()}", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    actionable = "does not have many workers"  # Lightning's advice to raise num_workers, on machines with > 2 cores
    assert [str(w.message) for w in caught if actionable not in str(w.message)] == []
    printed = capsys.readouterr().out
    ns = namespace

    # 1-2: the data split and the user's CNN, pre-trained on the public images only
    assert "public 500, stream 1000, test 297 images of (1, 8, 8)" in printed
    assert float(re.search(r"CNN test accuracy: ([0-9.]+)", printed).group(1)) > 0.85  # type: ignore[union-attr]
    # 4: five experiences of two digits, every digit once
    assert sorted(c for pair in ns["classes"] for c in pair) == list(range(10))
    assert printed.count("experience ") >= 5 and "experience 4: digits " in printed
    # 5: three requests, each certified by resolve, the releases composed by the accountant
    first, class_, experience = ns["results"]
    train_labels = ns["y"][ns["train"]]
    assert first.removed_ids.numel() == 3
    assert class_.removed_ids.numel() == int((train_labels == ns["classes"][1][1]).sum())
    assert experience.removed_ids.numel() == int(torch.isin(train_labels, torch.tensor(ns["classes"][0])).sum()) - 3
    (final,) = ns["more"]
    certificates = [r.certificate for r in (*ns["results"], final)]
    assert [c.method for c in certificates] == ["resolve"] * 4
    assert all(c.certified and not c.exact and (c.epsilon, c.delta) == (1.0, 1e-5) for c in certificates)
    assert [int(c.accounting["releases"]) for c in certificates] == [1, 2, 3, 4]  # the 4th counts those before
    totals = [c.accounting["epsilon_total"] for c in certificates]
    assert totals == sorted(totals) and totals[0] == pytest.approx(1.0)
    assert printed.count("resolve: (1, 1e-05) certified, sigma=0.000746") == 4
    assert "total epsilon 2.15 after 4 releases" in printed
    assert any("stated by the user" in a for a in certificates[2].assumptions)
    retained = re.search(r"digits \[5, 3, 9\]: ([0-9.]+), on the forgotten digits \[1, 4, 7\]: ([0-9.]+)", printed)
    assert retained is not None and float(retained.group(1)) > 0.9 and float(retained.group(2)) == 0.0
    # 6: the checkpoint restores the model exactly; the ledger verifies against its anchor before and after resuming
    assert ns["before"] == ns["after"]
    reports = re.findall(r"ledger ledger.jsonl: (\d) entries, SHA-256 chain intact, head \w+, consistent with the "
                         r"anchor of (\d) entries", printed)  # fmt: skip
    assert reports == [("3", "3"), ("3", "3"), ("4", "4")]
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 4
    assert final.request.kind == "class"
    assert final.removed_ids.numel() == int((train_labels == ns["classes"][1][0]).sum())
    *_, still = re.findall(r"accuracy on the retained digits \[[0-9, ]+\]: ([0-9.]+)\n", printed)
    assert float(still) > 0.9
