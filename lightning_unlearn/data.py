"""Stable sample ids: datasets yield ``(x, y, sample_id)``; recorders and strategies key on the id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset


class IndexedDataset(Dataset):
    """Wrap a ``(x, y)`` dataset so each item is ``(x, y, sample_id)``.

    ``ids`` defaults to the row index; pass your own (e.g. a user or record id) to keep ids
    stable across re-splits. ``targets`` is exposed so Avalanche's benchmark builders
    (which read ``dataset.targets``) can use the wrapped dataset directly, and the id survives
    Avalanche subsetting because it is part of the item (Avalanche appends the task label:
    ``(x, y, sample_id, task_label)``).
    """

    def __init__(self, dataset: Dataset, ids: Sequence[int] | Tensor | None = None) -> None:
        n = len(dataset)  # type: ignore[arg-type]
        self.dataset = dataset
        self.ids = torch.arange(n) if ids is None else torch.as_tensor(ids, dtype=torch.long).flatten()
        if self.ids.numel() != n:
            raise ValueError(f"IndexedDataset got {self.ids.numel()} ids for {n} samples")
        if self.ids.unique().numel() != n:
            raise ValueError("IndexedDataset ids must be unique")
        targets = getattr(dataset, "targets", None)
        if targets is None and hasattr(dataset, "tensors"):
            targets = dataset.tensors[1]
        self.targets = torch.as_tensor(targets) if targets is not None else None

    def __len__(self) -> int:
        return int(self.ids.numel())

    def __getitem__(self, i: int) -> tuple[Any, Any, Tensor]:
        x, y = self.dataset[i][:2]
        return x, y, self.ids[i]


def unpack_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, y, ids)`` from a batch of ``(x, y, id)`` or Avalanche's ``(x, y, id, task)``."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 3:
        raise ValueError(
            "batch carries no sample ids: recorders need (x, y, sample_id) batches; "
            "wrap the dataset in lightning_unlearn.IndexedDataset"
        )
    x, y, ids = batch[0], batch[1], batch[2]
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32) or ids.shape != y.shape[:1]:
        raise ValueError(f"third batch element must be an integer tensor of sample ids, one per row, got {ids!r:.80}")
    return x, y, ids.long()


def select_by_ids(data: Dataset | DataLoader, ids: Tensor, batch_size: int = 512) -> tuple[Tensor, Tensor]:
    """Inputs and labels of exactly ``ids`` (in that order) from a dataset yielding sample ids.

    Raises ``ValueError`` naming the ids that ``data`` lacks.
    """
    wanted = {int(i): k for k, i in enumerate(ids.tolist())}
    xs: list[Tensor | None] = [None] * len(wanted)
    ys: list[Tensor | None] = [None] * len(wanted)
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    found = 0
    for batch in loader:
        x, y, bid = unpack_batch(batch)
        for row, i in enumerate(bid.tolist()):
            k = wanted.get(i)
            if k is not None and xs[k] is None:
                xs[k], ys[k] = x[row], y[row]
                found += 1
        if found == len(wanted):
            break
    if found < len(wanted):
        missing = [i for i, k in wanted.items() if xs[k] is None]
        raise ValueError(f"forget data lacks {len(missing)} requested sample ids, e.g. {missing[:10]}")
    return torch.stack(xs), torch.stack(ys)  # type: ignore[arg-type]
