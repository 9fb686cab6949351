"""`SampleCatalog`: which samples a model has learned, and which it has since forgotten.

The catalog holds only ids, labels, experience indices and a fingerprint of each input (a
64-bit BLAKE2b digest of its bytes, never the input). Recorders fill it during fit; strategies
resolve a :class:`ForgetRequest` against it, and check the data they are given against the
fingerprints, before touching anything. A forgotten sample's fingerprint is erased.
"""

from __future__ import annotations

import hashlib
from typing import cast

import torch
from torch import Tensor

from lightning_unlearn.core.request import ForgetRequest


def _preview(ids: Tensor | list[int], n: int = 10) -> str:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    return str(ids[:n])[:-1] + (f", ... ({len(ids)} in all)]" if len(ids) > n else "]")


def fingerprints(x: Tensor) -> Tensor:
    """One 64-bit BLAKE2b digest per row of ``x`` (its dtype, shape and bytes); 0 is reserved for "none"."""
    rows = x.detach().cpu().contiguous()
    head = f"{rows.dtype}{tuple(rows.shape[1:])}".encode()
    flat = rows.reshape(rows.shape[0], -1)
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    data = flat.numpy()
    out = [
        int.from_bytes(hashlib.blake2b(head + r.tobytes(), digest_size=8).digest(), "little", signed=True) or 1
        for r in data
    ]
    return torch.tensor(out, dtype=torch.long)


class SampleCatalog:
    """Ids, labels and experience of every learned sample, plus a forgotten mask."""

    def __init__(self) -> None:
        self.ids = torch.empty(0, dtype=torch.long)
        self.labels = torch.empty(0, dtype=torch.long)
        self.experiences = torch.empty(0, dtype=torch.long)
        self.forgotten = torch.empty(0, dtype=torch.bool)
        self.fingerprints = torch.empty(0, dtype=torch.long)
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return int(self.ids.numel())

    @property
    def n_active(self) -> int:
        return int((~self.forgotten).sum())

    def __contains__(self, sample_id: int) -> bool:
        return int(sample_id) in self._row

    def add(self, ids: Tensor, labels: Tensor, experience: int, prints: Tensor | None = None) -> None:
        """Register newly learned samples. Ids must be new to the catalog and unique.

        ``prints`` are the inputs' :func:`fingerprints` (0: not fingerprinted, never checked).
        """
        ids, labels = ids.detach().long().cpu().flatten(), labels.detach().long().cpu().flatten()
        prints = torch.zeros_like(ids) if prints is None else prints.detach().long().cpu().flatten()
        if ids.shape != labels.shape or ids.shape != prints.shape:
            raise ValueError(f"{ids.numel()} sample ids but {labels.numel()} labels and {prints.numel()} fingerprints")
        if ids.unique().numel() != ids.numel():
            raise ValueError("SampleCatalog.add got duplicate ids in one call")
        known = [i for i in ids.tolist() if i in self._row]
        if known:
            raise ValueError(
                f"sample ids already learned (a sample may be learned once): {_preview(known)}; "
                "give every sample a unique id with IndexedDataset"
            )
        start = len(self)
        self._row.update({i: start + k for k, i in enumerate(ids.tolist())})
        self.ids = torch.cat([self.ids, ids])
        self.labels = torch.cat([self.labels, labels])
        self.experiences = torch.cat([self.experiences, torch.full_like(ids, experience)])
        self.forgotten = torch.cat([self.forgotten, torch.zeros_like(ids, dtype=torch.bool)])
        self.fingerprints = torch.cat([self.fingerprints, prints])

    def rows(self, ids: Tensor) -> Tensor:
        """Row index of each id (ids must be known)."""
        return torch.tensor([self._row[int(i)] for i in ids.tolist()], dtype=torch.long)

    def resolve(self, request: ForgetRequest) -> Tensor:
        """Sample ids a request covers; raises ``ValueError`` naming what is wrong.

        Unknown ids, ids already forgotten, a class or experience never learned, or one whose
        samples are all forgotten already are errors. Nothing is changed here.
        """
        if len(self) == 0:
            raise ValueError("nothing has been learned yet: fit the model with a recorder before forgetting")
        if request.kind == "samples":
            ids = torch.tensor(request.sample_ids, dtype=torch.long)
            unknown = [i for i in request.sample_ids if i not in self._row]
            if unknown:
                raise ValueError(f"unknown sample ids (never learned): {_preview(unknown)}")
            twice = ids[self.forgotten[self.rows(ids)]]
            if twice.numel():
                raise ValueError(f"sample ids already forgotten: {_preview(twice)}")
            return ids
        column = self.labels if request.kind == "class" else self.experiences
        of_target = column.eq(cast(int, request.target))  # ForgetRequest checks class/experience targets are ints
        if not bool(of_target.any()):
            learned = sorted(set(column.tolist()))
            raise ValueError(f"{request.kind} {request.target} was never learned (learned: {learned})")
        active = of_target & ~self.forgotten
        if not bool(active.any()):
            raise ValueError(f"{request.kind} {request.target} has already been forgotten entirely")
        return self.ids[active]

    def check_fingerprints(self, ids: Tensor, x: Tensor) -> None:
        """``ValueError`` naming the ids whose inputs ``x`` are not the ones learned under that id."""
        recorded = self.fingerprints[self.rows(ids)]
        checked = recorded != 0
        if not bool(checked.any()):
            return
        bad = checked & (fingerprints(x) != recorded)
        if bool(bad.any()):
            raise ValueError(
                f"forget data inputs differ from the inputs learned under sample ids {_preview(ids[bad])}: "
                "pass the same samples (same preprocessing, no random augmentation) that were learned"
            )

    def mark_forgotten(self, ids: Tensor) -> Tensor:
        """Mark ``ids`` forgotten and erase their fingerprints; returns the erased fingerprints
        (for :meth:`unmark_forgotten`, the undo)."""
        rows = self.rows(ids)
        prints = self.fingerprints[rows].clone()
        self.forgotten[rows] = True
        self.fingerprints[rows] = 0
        return prints

    def unmark_forgotten(self, ids: Tensor, prints: Tensor) -> None:
        """Undo :meth:`mark_forgotten` of ``ids`` (``prints``: their fingerprints before it)."""
        rows = self.rows(ids)
        self.forgotten[rows] = False
        self.fingerprints[rows] = prints

    def active_ids(self) -> Tensor:
        return self.ids[~self.forgotten]

    def live(self, ids: list[int]) -> list[int]:
        """Those of ``ids`` that are learned and not forgotten."""
        return [i for i in ids if i in self._row and not bool(self.forgotten[self._row[i]])]

    def labels_of(self, ids: Tensor) -> Tensor:
        return self.labels[self.rows(ids)]

    def experiences_of(self, ids: Tensor) -> Tensor:
        return self.experiences[self.rows(ids)]

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "ids": self.ids.clone(),
            "labels": self.labels.clone(),
            "experiences": self.experiences.clone(),
            "forgotten": self.forgotten.clone(),
            "fingerprints": self.fingerprints.clone(),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.ids = state["ids"].clone().long()
        self.labels = state["labels"].clone().long()
        self.experiences = state["experiences"].clone().long()
        self.forgotten = state["forgotten"].clone().bool()
        prints = state.get("fingerprints")
        self.fingerprints = torch.zeros_like(self.ids) if prints is None else prints.clone().long()
        lengths = {t.numel() for t in (self.ids, self.labels, self.experiences, self.forgotten, self.fingerprints)}
        if len(lengths) != 1:
            raise ValueError(f"catalog state is inconsistent: its columns have different lengths {sorted(lengths)}")
        self._row = {int(i): k for k, i in enumerate(self.ids.tolist())}
