"""`ForgetRequest`: what a user asks the model to forget."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

RequestKind = Literal["samples", "class", "experience"]
_KINDS: tuple[RequestKind, ...] = ("samples", "class", "experience")
#: sample ids, classes and experiences are int64 wherever they are stored (catalog, tensors, checkpoints)
_INT64 = (-(2**63), 2**63 - 1)


def _integer(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (``int``, a numpy integer, a 0-d integer tensor), else None.

    Booleans (Python, numpy, torch) are not integers here: ``True`` is no sample id.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, torch.Tensor):
        if value.ndim != 0 or value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            return None
        return int(value.item())
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


@dataclass(frozen=True)
class ForgetRequest:
    """A forget request at one of three granularities.

    Build one with :meth:`samples`, :meth:`of_class` or :meth:`of_experience`. The request
    only *names* data; which sample ids it covers is decided against what was actually learned
    (:meth:`SampleCatalog.resolve`), so a request for data never learned fails there, loudly.

    Args:
        kind: ``"samples"``, ``"class"`` or ``"experience"``.
        sample_ids: the sample ids to forget (``kind="samples"`` only).
        target: the class or experience to forget (the other kinds).

    Raises:
        ValueError: an unknown ``kind``; no, duplicate or non-integer sample ids; a target that is not a
            non-negative integer; ids or a target beyond 64 bits; ids and a target mixed.

    Example::

        >>> from lightning_unlearn import ForgetRequest
        >>> request = ForgetRequest.samples([3, 1, 4])
        >>> request.kind, request.sample_ids
        ('samples', (3, 1, 4))
        >>> print(ForgetRequest.of_class(2), ForgetRequest.of_experience(0))
        class=2 experience=0
        >>> ForgetRequest.samples([1, 1])
        Traceback (most recent call last):
        ...
        ValueError: ForgetRequest names sample ids more than once: [1]
    """

    kind: RequestKind
    sample_ids: tuple[int, ...] = ()
    target: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"ForgetRequest kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "samples":
            if self.target is not None:
                raise ValueError("a 'samples' ForgetRequest takes sample_ids, not a target")
            if len(self.sample_ids) == 0:
                raise ValueError("empty ForgetRequest: no sample ids given")
            ids = [_integer(i) for i in self.sample_ids]
            wrong = [i for i, v in zip(self.sample_ids, ids) if v is None]
            if wrong:
                raise ValueError(f"sample ids must be integers, got {wrong[:5]}")
            huge = [i for i in ids if i is not None and not _INT64[0] <= i <= _INT64[1]]
            if huge:
                raise ValueError(f"sample ids must fit in 64 bits (they are stored as int64), got {huge[:5]}")
            object.__setattr__(self, "sample_ids", tuple(ids))  # numpy/torch integers as Python ints
            if len(set(self.sample_ids)) != len(self.sample_ids):
                dup = sorted(i for i, n in Counter(self.sample_ids).items() if n > 1)
                raise ValueError(f"ForgetRequest names sample ids more than once: {dup[:10]}")
        else:
            if self.sample_ids:
                raise ValueError(f"a {self.kind!r} ForgetRequest takes a target, not sample_ids")
            target = _integer(self.target)
            if target is None or target < 0:
                raise ValueError(f"{self.kind} of a ForgetRequest must be a non-negative int, got {self.target!r}")
            if target > _INT64[1]:
                raise ValueError(
                    f"{self.kind} of a ForgetRequest must fit in 64 bits (stored as int64), got {self.target!r}"
                )
            object.__setattr__(self, "target", target)

    @classmethod
    def samples(cls, ids: Iterable[int] | torch.Tensor | np.ndarray) -> ForgetRequest:
        """Forget these sample ids (the ids the dataset yields, see :class:`IndexedDataset`).

        Raises:
            ValueError: an id is not an integer (floats, strings and booleans are refused, never
                truncated: forgetting the wrong sample under an exact certificate is worse than an error).
        """
        if isinstance(ids, (str, bytes)):
            raise ValueError(f"sample ids must be integers, got the string {ids!r}")
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            integral = (
                ids.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
                if isinstance(ids, torch.Tensor)
                else bool(np.issubdtype(ids.dtype, np.integer))
            )
            if not integral:
                raise ValueError(f"sample ids must be integers, got a {type(ids).__name__} of dtype {ids.dtype}")
            return cls("samples", tuple(int(i) for i in ids.reshape(-1).tolist()))
        return cls("samples", tuple(ids))  # each id is checked (and numpy/torch integers converted) on construction

    @classmethod
    def of_class(cls, label: int) -> ForgetRequest:
        """Forget every still-learned sample of class ``label`` (an int, a numpy integer or a 0-d integer tensor).

        Raises:
            ValueError: ``label`` is not a non-negative integer that fits in 64 bits.
        """
        return cls("class", target=label)

    @classmethod
    def of_experience(cls, experience: int) -> ForgetRequest:
        """Forget every still-learned sample of one experience (task); ``experience`` as for :meth:`of_class`.

        Raises:
            ValueError: ``experience`` is not a non-negative integer that fits in 64 bits.
        """
        return cls("experience", target=experience)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sample_ids": list(self.sample_ids), "target": self.target}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForgetRequest:
        return cls(d["kind"], tuple(d.get("sample_ids", ())), d.get("target"))

    def __str__(self) -> str:
        if self.kind == "samples":
            shown = ", ".join(map(str, self.sample_ids[:5])) + (", ..." if len(self.sample_ids) > 5 else "")
            return f"samples[{len(self.sample_ids)}]({shown})"
        return f"{self.kind}={self.target}"
