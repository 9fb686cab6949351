"""Griffe extension for the docs site: the docstrings' Sphinx roles become mkdocstrings cross-references.

The library's docstrings cite objects the Sphinx way (``:class:`~lightning_unlearn.core.Certificate```,
``:meth:`forget```), readable in ``help()`` and in an editor; mkdocstrings renders Markdown. Before rendering, each
role is resolved in the scope of the object whose docstring holds it (griffe's own name resolution: the module's
imports, the class's members, the enclosing scopes). A target the API reference renders becomes a link
(``[`Certificate`][lightning_unlearn.core.certificate.Certificate]``, its canonical path); anything else (a
private helper, a third-party class, a name griffe cannot resolve) becomes plain code, so the strict build never
sees a link without a target. reST's ``text::`` (a paragraph introducing a literal block) becomes ``text:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|obj|exc):`([^`<>]+)`")
LITERAL_BLOCK = re.compile(r"(?<=\S)::$", flags=re.M)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded (``on_package``)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _markdown(obj, obj.docstring.value, loader)


def _markdown(scope: griffe.Object, text: str, loader: griffe.GriffeLoader) -> str:
    text = ROLE.sub(lambda m: _reference(scope, m.group(1), loader), text)
    return LITERAL_BLOCK.sub(":", text)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and every member it defines (aliases excluded: their docstrings are their targets')."""
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out += _objects(member)  # type: ignore[arg-type]
    return out


def _reference(scope: griffe.Object, written: str, loader: griffe.GriffeLoader) -> str:
    """A cross-reference to ``written`` (``~`` shows the last name only) if the site renders it, else code."""
    name = written.strip().removeprefix("~").removeprefix(".").removesuffix("()")
    shown = name.rsplit(".", 1)[-1] if written.strip().startswith("~") else name
    target = _target(scope, name, loader)
    return f"[`{shown}`][{target}]" if target is not None else f"`{shown}`"


def _target(scope: griffe.Object, name: str, loader: griffe.GriffeLoader) -> str | None:
    first, _, rest = name.partition(".")
    try:
        path = scope.resolve(first) + (f".{rest}" if rest else "")
    except griffe.NameResolutionError:
        path = _inherited(scope, first) + (f".{rest}" if rest else "")
    try:
        obj = loader.modules_collection.get_member(path)
        obj = obj.final_target if obj.is_alias else obj
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return obj.canonical_path if _rendered(obj) else None


def _inherited(scope: griffe.Object, name: str) -> str:
    """``name`` as a member a class in scope inherits (``:meth:`forget``` in a subclass's docstring), else as is."""
    cls: griffe.Object | None = scope
    while cls is not None and not cls.is_class:
        cls = cls.parent
    try:
        member = cls.all_members.get(name) if cls is not None else None  # type: ignore[attr-defined]
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        member = None
    if member is None:
        return name
    return member.target_path if member.is_alias else member.path


def _rendered(obj: griffe.Object) -> bool:
    """Whether the API reference renders ``obj``: public names only, documented, and not inside a package's
    ``__init__`` (package pages show their docstring; their re-exports are documented where they are defined)."""
    if any(part.startswith("_") for part in obj.canonical_path.split(".")):
        return False
    if obj.is_module:
        return True
    parent = obj.parent
    while parent is not None and not parent.is_module:
        parent = parent.parent
    return obj.has_docstrings and parent is not None and not parent.is_package
