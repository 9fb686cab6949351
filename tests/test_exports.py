"""The top-level package exports every strategy, recorder and core type a user needs, lazily, and importing it (or
listing the reproduction configs) costs no torch import (issue 22, items 6 and 8)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_unlearn
from lightning_unlearn import callbacks, core, unlearners


def test_importing_the_package_imports_neither_torch_nor_lightning():
    code = "import sys, lightning_unlearn; print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", [callbacks, core, unlearners], ids=lambda p: p.__name__)
def test_every_public_name_of_the_subpackages_is_exported_at_the_top(package):
    missing = sorted(set(package.__all__) - set(lightning_unlearn.__all__))
    assert missing == []
    for name in package.__all__:
        assert getattr(lightning_unlearn, name) is getattr(package, name)


def test_every_exported_name_resolves_and_is_listed():
    for name in lightning_unlearn.__all__:
        assert getattr(lightning_unlearn, name).__name__ == name
    assert set(lightning_unlearn.__all__) <= set(dir(lightning_unlearn))
    namespace: dict[str, object] = {}
    exec("from lightning_unlearn import *", namespace)
    assert set(lightning_unlearn.__all__) <= set(namespace)


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="'NoSuchUnlearner'"):
        lightning_unlearn.NoSuchUnlearner  # noqa: B018


def test_the_type_checking_imports_match_the_lazy_table():
    """mypy and IDEs read the ``TYPE_CHECKING`` block, users get the lazy table: both must name the same objects."""
    tree = ast.parse(Path(lightning_unlearn.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    imported = {
        alias.name: node.module.removeprefix("lightning_unlearn.")
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert imported == lightning_unlearn._MODULE
    assert set(lightning_unlearn.__all__) == set(lightning_unlearn._MODULE)


def test_the_command_lists_the_reproduction_configs_without_importing_torch():
    from lightning_unlearn_bench.papers import list_configs

    code = (
        "import sys; from lightning_unlearn_bench.__main__ import main; main(['reproduce', '--list']); "
        "print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout == list_configs() + "\n[]\n"
