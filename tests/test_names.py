"""One name, one place (issue 27, item 1): a module of the library or the bench is imported under its own name, never
an alias (``from lightning_unlearn.functional import newton as nt``), and the autodiff helpers every method shares
are defined in ``functional/autodiff.py`` only, not in ``functional/hf.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: where each first-party package's sources live
PACKAGES = {"lightning_unlearn": ROOT, "lightning_unlearn_bench": ROOT / "bench"}
SOURCES = ["lightning_unlearn", "bench", "tests", "benchmarks", "examples"]
MOVED = [
    "ParamSpec",
    "param_spec",
    "unflatten",
    "flat_params",
    "set_flat_params",
    "sum_rows",
    "cross_entropy",
    "ModuleLoss",
    "batch_mean_loss",
    "batch_statistics_only",
    "per_sample_grads",
    "hvps",
    "batch_hessian",
    "top_eigenvalue",
]


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of the library or the bench (from the files, importing nothing)."""
    package = dotted.split(".")[0]
    if package not in PACKAGES:
        return False
    path = PACKAGES[package].joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def module_aliases(source: str) -> list[str]:
    """The imports in ``source`` that bind a first-party module to a name other than its own."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.asname not in (None, alias.name) and is_module(f"{node.module}.{alias.name}"):
                    found.append(f"from {node.module} import {alias.name} as {alias.asname}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname not in (None, alias.name.rsplit(".", 1)[-1]) and is_module(alias.name):
                    found.append(f"import {alias.name} as {alias.asname}")
    return found


def defined(path: Path) -> set[str]:
    """The names a module's top level defines (functions, classes, assignments)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("from lightning_unlearn.functional import newton as nt", True),
        ("import lightning_unlearn.core.ledger as ledger_module", True),
        ("from lightning_unlearn_bench import cli as c", True),
        ("from lightning_unlearn.functional import newton", False),
        ("from lightning_unlearn.functional.newton import newton_step as step", False),  # a function, not a module
        ("import lightning_unlearn.unlearners.base as base", False),  # its own name
        ("import numpy as np", False),
    ],
)
def test_the_alias_finder_tells_modules_from_functions(source, flagged):
    assert module_aliases(source) == ([source] if flagged else [])


def test_no_first_party_module_is_imported_under_an_alias():
    files = [f for folder in SOURCES for f in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 200  # the sources were found
    found = [f"{f.relative_to(ROOT)}: {line}" for f in files for line in module_aliases(f.read_text())]
    assert found == []


def test_the_shared_autodiff_helpers_are_defined_in_autodiff_only():
    functional = ROOT / "lightning_unlearn" / "functional"
    assert set(MOVED) <= defined(functional / "autodiff.py")
    assert set(MOVED) & defined(functional / "hf.py") == set()
    # no re-export either: hf.py imports the module autodiff, none of its names
    hf = ast.parse((functional / "hf.py").read_text())
    imported = {a.asname or a.name for n in ast.walk(hf) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert set(MOVED) & imported == set()


#: names this project retired, with what replaced them: none may come back in the sources, docs or commands
RETIRED = {
    "lightning_unlearn.harness": "lightning_unlearn_bench (the bench is its own distribution)",
    "lightning_unlearn/harness": "bench/lightning_unlearn_bench",
    "python -m lightning_unlearn ": "python -m lightning_unlearn_bench, or the lightning-unlearn command",
    "strategies/": "unlearners/",
    "XXH3 digest": "BLAKE3 (the ledger's and the store's digests)",
    "recorder.ledger_anchor": "recorder.unlearning_state.ledger_anchor",
    # one key per method (issue 27, item 1): [CCL] is ccl_hessian/ccl_gradient, [SAFE] is safe, in every folder
    "HessianCertifiedUnlearner": "CCLHessianUnlearner",
    "GradientCertifiedUnlearner": "CCLGradientUnlearner",
    "TaskDeltaRecorder": "CCLRecorder (and HessianRecorder: CCLHessianRecorder)",
    "StreamingUnlearner": "SAFEUnlearner",
    "StreamingRecorder": "SAFERecorder",
    "lightning_unlearn.unlearners.certified": "lightning_unlearn.unlearners.ccl",
    "lightning_unlearn.functional.certified": "lightning_unlearn.functional.ccl",
    "functional import certified": "functional import ccl",
    "lightning_unlearn.callbacks.hessian": "lightning_unlearn.callbacks.ccl",
    "lightning_unlearn.unlearners.streaming": "lightning_unlearn.unlearners.safe",
    "lightning_unlearn.functional.streaming": "lightning_unlearn.functional.safe",
    "functional import streaming": "functional import safe",
    "lightning_unlearn.callbacks.streaming": "lightning_unlearn.callbacks.safe",
    "lightning_unlearn.callbacks.trajectory": "lightning_unlearn.callbacks.hf",
    "lightning_unlearn.callbacks.analytic": "lightning_unlearn.callbacks.acu",
    "lightning_unlearn.unlearners.sparse": "lightning_unlearn.unlearners.l1_sparse and .woodfisher",
    "lightning_unlearn.functional.sparse": "lightning_unlearn.functional.l1_sparse",
    "unlearners/noisy.py": "unlearners/noisy_finetune.py",
    "methods/hessian.md": "methods/ccl.md",
    "methods/gradient.md": "methods/ccl.md",
}
TEXTS = ["lightning_unlearn", "bench", "docs", "examples", "benchmarks", "README.md", "Makefile", "mkdocs.yml"]


def _texts() -> list[Path]:
    files: list[Path] = []
    for name in TEXTS:
        path = ROOT / name
        suffixes = {".py", ".md", ".yml", ".yaml"}
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in suffixes]
        files += [p for p in found if "results" not in p.parts]
    return files


@pytest.mark.parametrize("retired", sorted(RETIRED))
def test_no_retired_name_comes_back(retired: str) -> None:
    hits = [f"{p.relative_to(ROOT)}" for p in _texts() if retired in p.read_text(encoding="utf-8", errors="replace")]
    assert not hits, f"{retired!r} is retired (now {RETIRED[retired]}), found in {hits}"


#: the modules that hold several methods: a family whose methods share statistics or machinery (docs/layout.md);
#: every other method's modules are named by its key
FAMILIES = {
    "baselines": {"retrain", "finetune", "neggrad", "neggrad_plus", "randomlabel"},
    "ccl": {"ccl_hessian", "ccl_gradient"},
    "convex": {"resolve", "certified_removal"},
    "newton": {"ns", "ij"},
    "rbm": {"rbm", "salun"},
    "sliced": {"sliced_resolve"},
}


def test_each_method_is_found_under_its_key():
    """Every exported unlearner declares its registry entry on its own class, in a module named by its key (or by
    its family's), and the library finds it by that key."""
    from lightning_unlearn import unlearners
    from lightning_unlearn.unlearners.base import MethodInfo, Unlearner

    classes = [
        c for n in unlearners.__all__ if isinstance(c := getattr(unlearners, n), type) and issubclass(c, Unlearner)
    ]
    keys = {}
    for cls in classes:
        if cls is Unlearner:
            continue
        assert "method_info" in vars(cls), f"{cls.__name__} declares no registry entry of its own"
        for key, info in cls.registry_entries().items():
            assert isinstance(info, MethodInfo) and info.guarantee and info.assumptions and info.cost, key
            module = cls.__module__.rsplit(".", 1)[-1]
            assert module == key or key in FAMILIES.get(module, ()), f"{key} lives in unlearners/{module}.py"
            assert unlearners.unlearner_class(key) is cls and key not in keys, key
            keys[key] = cls
    assert sorted(keys) == unlearners.available_unlearners() and len(keys) == 22
    assert set().union(*FAMILIES.values()) <= set(keys)
    # one docs page per method, [CCL]'s two methods on one page named by their family
    pages = {p.stem for p in (ROOT / "docs" / "methods").glob("*.md")} - {"index"}
    assert pages == set(keys) - FAMILIES["ccl"] | {"ccl"}
