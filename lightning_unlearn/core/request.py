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


@dataclass(frozen=True)
class ForgetRequest:
    """A forget request at one of three granularities.

    Build one with :meth:`samples`, :meth:`of_class` or :meth:`of_experience`. The request
    only *names* data; which sample ids it covers is decided against what was actually learned
    (:meth:`SampleCatalog.resolve`), so a request for data never learned fails there, loudly.
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
            wrong = [i for i in self.sample_ids if isinstance(i, bool) or not isinstance(i, int)]
            if wrong:
                raise ValueError(f"sample ids must be integers, got {wrong[:5]}")
            if len(set(self.sample_ids)) != len(self.sample_ids):
                dup = sorted(i for i, n in Counter(self.sample_ids).items() if n > 1)
                raise ValueError(f"ForgetRequest names sample ids more than once: {dup[:10]}")
        else:
            if self.sample_ids:
                raise ValueError(f"a {self.kind!r} ForgetRequest takes a target, not sample_ids")
            if not isinstance(self.target, int) or isinstance(self.target, bool) or self.target < 0:
                raise ValueError(f"{self.kind} of a ForgetRequest must be a non-negative int, got {self.target!r}")

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
        checked = []
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise ValueError(f"sample ids must be integers, got {i!r} ({type(i).__name__})")
            checked.append(int(i))
        return cls("samples", tuple(checked))

    @classmethod
    def of_class(cls, label: int) -> ForgetRequest:
        """Forget every still-learned sample of class ``label``."""
        return cls("class", target=label)

    @classmethod
    def of_experience(cls, experience: int) -> ForgetRequest:
        """Forget every still-learned sample of one experience (task)."""
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
