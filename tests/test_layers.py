"""The package's import arrows point down its layers: core <- functional, privacy <- callbacks <- strategies <-
avalanche, harness, cli; and no module imports itself back through others (issue 22, item 8)."""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_unlearn

PACKAGE = Path(lightning_unlearn.__file__).parent
LAYER = {"core": 0, "functional": 1, "privacy": 1, "callbacks": 2, "strategies": 3, "avalanche": 4, "harness": 4}
LAYER["cli"] = 4


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports (type-checking imports included: a circle there is a circle)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_unlearn"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def test_every_arrow_points_down_the_layers():
    modules = _modules()
    upward = [
        f"{m} -> {t}"
        for m, path in modules.items()
        for t in _imports(path, modules)
        if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)  # type: ignore[operator]
    ]
    assert upward == []


def test_core_knows_no_strategy_and_the_recorders_no_reporting():
    modules = _modules()
    core = {t for m, p in modules.items() if m.startswith("lightning_unlearn.core") for t in _imports(p, modules)}
    assert {t for t in core if not t.startswith("lightning_unlearn.core")} <= {"lightning_unlearn.warnings"}
    assert "lightning_unlearn.reporting" not in _imports(modules["lightning_unlearn.callbacks.base"], modules)


def test_no_import_circle():
    modules = _modules()
    edges = {m: {t for t in _imports(p, modules) if t in modules and t != m} for m, p in modules.items()}
    circles = []
    for start in edges:  # a depth-first walk from each module: a path back to it is a circle
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    circles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert circles == []
