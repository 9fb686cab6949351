"""Undoable changes: a step returns its undo, and a failure part-way undoes what was done before it propagates."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["Undo", "applied", "replace_attributes", "undoing"]

Undo = Callable[[], None]


def applied(change: Callable[[], None], undo: Undo) -> Undo:
    """Run ``change``; return ``undo``. If ``change`` raises (an interrupt included), ``undo`` runs first, so
    ``undo`` must put back whatever part of the change was made."""
    try:
        change()
    except BaseException:
        undo()
        raise
    return undo


def replace_attributes(obj: object, values: Mapping[str, Any]) -> Undo:
    """Set attributes of ``obj`` to new values (no copies); return the undo (all or nothing)."""
    old = {k: getattr(obj, k) for k in values}

    def change() -> None:
        for k, v in values.items():
            setattr(obj, k, v)

    def undo() -> None:
        for k, v in old.items():
            setattr(obj, k, v)

    return applied(change, undo)


@contextmanager
def undoing() -> Iterator[list[Undo]]:
    """A list to append each step's undo to; if the block raises, the undos run newest first before it propagates."""
    undos: list[Undo] = []
    try:
        yield undos
    except BaseException:
        for undo in reversed(undos):
            undo()
        raise
