"""`Binding`: what a recorder's statistics were recorded with, so that they are never used beside another module.

A recorder's statistics mean something only beside the module and data they were recorded from: a ridge head's
``R = sum f^T f`` holds the features of one frozen backbone, a Hessian the layout of one set of parameters, the
catalog the ids of one field of the batches. A :class:`Binding` names those: a BLAKE3 digest of the frozen
tensors the recorder reads (:func:`~lightning_unlearn.core.digest.tensors_digest`; or :data:`RAW_INPUTS` when it
reads the inputs themselves), the names and shapes of the parameters it solves or records, and where the sample
ids come from. :meth:`Binding.differences` names every part that differs, for the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the ``frozen`` part of a recorder whose features are the inputs themselves (it reads nothing of the module)
RAW_INPUTS = "raw inputs"

Shapes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Binding:
    """What a recorder's statistics are bound to.

    Args:
        frozen: the digest (``"blake3:<hex>"``) of the frozen tensors the statistics were computed through,
            :data:`RAW_INPUTS`, or ``None`` (the recorder reads no frozen part).
        frozen_part: what ``frozen`` covers, for messages (e.g. ``"the frozen parameters (requires_grad=False) of
            the module"``).
        head: the names and shapes of the parameters the recorder solves or records, sorted by name.
        ids: where the sample ids are read from (:meth:`~lightning_unlearn.contract.BatchKeys.id_field`).
        head_part: what ``head`` names, for messages (e.g. ``"trainable parameters' shapes"``).
    """

    frozen: str | None
    frozen_part: str
    head: Shapes
    ids: str
    head_part: str = "head shape"

    def state_dict(self) -> dict[str, Any]:
        return {
            "frozen": self.frozen,
            "frozen_part": self.frozen_part,
            "head": [[name, list(shape)] for name, shape in self.head],
            "ids": self.ids,
            "head_part": self.head_part,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Binding:
        """The binding :meth:`state_dict` saved.

        Raises:
            ValueError: a field is missing or of another type (a corrupted state).
        """
        try:
            frozen, part, ids = state["frozen"], str(state["frozen_part"]), str(state["ids"])
            head_part = str(state.get("head_part", "head shape"))
            head = tuple((str(name), tuple(int(n) for n in shape)) for name, shape in state["head"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"recorder state has a malformed binding ({err!r}): {dict(state)!r:.200}") from err
        if frozen is not None and not isinstance(frozen, str):
            raise ValueError(f"recorder state has a malformed binding: frozen digest {frozen!r:.80}")
        return cls(frozen, part, head, ids, head_part)

    def differences(self, here: Binding) -> list[str]:
        """What differs between this (recorded) binding and ``here`` (the module's), one phrase per part."""
        differ = []
        if self.frozen != here.frozen:
            if self.frozen is None or here.frozen is None or RAW_INPUTS in (self.frozen, here.frozen):
                differ.append(f"statistics computed through {_source(self)} when recorded, {_source(here)} here")
            else:
                differ.append(
                    f"{here.frozen_part} differ from those recorded (digest {_short(self.frozen)} recorded, "
                    f"{_short(here.frozen)} here)"
                )
        if self.head != here.head:
            recorded, ours = _shapes(self.head, here.head), _shapes(here.head, self.head)
            differ.append(f"{here.head_part} {recorded} recorded, {ours} here")
        if self.ids != here.ids:
            differ.append(f"sample ids read from {self.ids} when recorded, from {here.ids} here")
        return differ


def _source(binding: Binding) -> str:
    if binding.frozen is None:
        return "no frozen part"
    return "the raw inputs" if binding.frozen == RAW_INPUTS else f"{binding.frozen_part} ({_short(binding.frozen)})"


def _short(digest: str) -> str:
    return digest[: len("blake3:") + 16] + "..."


def _shapes(shapes: Shapes, other: Shapes, limit: int = 4) -> str:
    """``name (shape)`` of the entries of ``shapes`` that ``other`` lacks or has with another shape."""
    theirs = dict(other)
    differ = [f"{n} {s}" for n, s in shapes if theirs.get(n) != s]
    more = f", ... ({len(differ)} in all)" if len(differ) > limit else ""
    return ", ".join(differ[:limit]) + more if differ else "nothing more"
