"""`UnlearningState`: what an unlearner keeps between requests, persisted with its recorder's checkpoint."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lightning_unlearn.core.keys import current_key

__all__ = ["UnlearningState"]


@dataclass
class UnlearningState:
    """The unlearner's persisted state: the ledger anchor, the accepted ledgers, the privacy accountants and the
    run's lineage. The recorder holds one (``recorder.unlearning_state``) and saves it in its checkpoint state, at
    the top level of that state (the keys of :meth:`state_dict`, as checkpoints of earlier versions hold them).

    Args:
        ledger_anchor: ``{"count", "head", "keyed"}`` of the ledger file after the last request; a strategy verifies
            the ledger it is given against it before executing anything. ``None``: no request anchored yet.
        ledger_overrides: every ledger an operator accepted although it did not match the anchor
            (``Unlearner.accept_ledger``).
        privacy: the accountant state of each noise-adding strategy's releases, by method key (a state saved under
            a retired key is restored under its successor's).
        lineage: a random id of this recorder's run; the ledger entries of its requests carry it.
        unerased: ids of committed requests whose rows the recorder has not erased yet (its erasure failed); not
            saved (a recorder erases them before it saves its state).

    Example::

        >>> from lightning_unlearn.core.state import UnlearningState
        >>> state = UnlearningState(ledger_anchor={"count": 2, "head": "ab12", "keyed": False}, lineage="run-1")
        >>> saved = state.state_dict()
        >>> sorted(saved)
        ['ledger_anchor', 'ledger_overrides', 'lineage', 'privacy']
        >>> restored = UnlearningState()
        >>> restored.load_state_dict({"ledger_anchor": saved["ledger_anchor"], "lineage": "run-1"})  # keys missing
        >>> restored == state, restored.describe_anchor()
        (True, 'ledger anchored at 2 entries')
    """

    ledger_anchor: dict[str, Any] | None = None
    ledger_overrides: list[dict[str, Any]] = field(default_factory=list)
    privacy: dict[str, Any] | None = None
    lineage: str = field(default_factory=lambda: uuid.uuid4().hex)
    unerased: list[Tensor] = field(default_factory=list, compare=False)

    def state_dict(self) -> dict[str, Any]:
        """The saved fields (all but :attr:`unerased`)."""
        return {
            "ledger_anchor": self.ledger_anchor,
            "ledger_overrides": list(self.ledger_overrides),
            "privacy": self.privacy,
            "lineage": self.lineage,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the saved fields; a key missing (a state saved before it existed) gets its default, and the
        lineage stays this one's."""
        self.ledger_anchor = state_dict.get("ledger_anchor")
        self.ledger_overrides = list(state_dict.get("ledger_overrides", []))
        privacy = state_dict.get("privacy")
        self.privacy = None if privacy is None else {current_key(method): state for method, state in privacy.items()}
        self.lineage = state_dict.get("lineage", self.lineage)

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any]) -> UnlearningState:
        """A new state restored from ``state_dict`` (without a lineage: a new one)."""
        state = cls()
        state.load_state_dict(state_dict)
        return state

    def describe_anchor(self) -> str:
        """Where the ledger is anchored, in words (``"no ledger anchored"``, ``"ledger anchored at 3 entries"``)."""
        if self.ledger_anchor is None:
            return "no ledger anchored"
        count = self.ledger_anchor.get("count")
        return f"ledger anchored at {count} {'entry' if count == 1 else 'entries'}"
