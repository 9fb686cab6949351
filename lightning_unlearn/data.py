"""Stable sample ids: datasets yield ``(x, y, sample_id, ...)`` or dicts with a sample id; recorders and
strategies key on the id. The batch format is specified in :mod:`lightning_unlearn.contract`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from lightning_unlearn.contract import BatchKeys, unpack_batch

__all__ = ["BatchKeys", "IndexedDataset", "sample_ids_of", "select_by_ids", "unpack_batch"]


class IndexedDataset(Dataset):
    """Wrap a ``(x, y, ...)`` dataset so each item is ``(x, y, sample_id)``, or a dataset of dicts so each
    item is the dict plus ``{id_key: sample_id}``.

    ``ids`` defaults to the row index; pass your own (e.g. a user or record id) to keep ids
    stable across re-splits. ``targets`` is exposed so Avalanche's benchmark builders
    (which read ``dataset.targets``) can use the wrapped dataset directly, and the id survives
    Avalanche subsetting because it is part of the item (Avalanche appends the task label:
    ``(x, y, sample_id, task_label)``).

    Raises:
        TypeError: ``dataset`` has no length (an iterable-style dataset).
        ValueError: the ids are not one unique id per sample, or dict items already hold ``id_key``.
    """

    def __init__(self, dataset: Dataset, ids: Sequence[int] | Tensor | None = None, id_key: str = "sample_id") -> None:
        if not isinstance(dataset, Sized):
            raise TypeError(f"IndexedDataset needs a dataset with a length, got {type(dataset).__name__}")
        n = len(dataset)
        self.dataset, self.id_key = dataset, id_key
        self.ids = torch.arange(n) if ids is None else torch.as_tensor(ids, dtype=torch.long).flatten()
        if self.ids.numel() != n:
            raise ValueError(f"IndexedDataset got {self.ids.numel()} ids for {n} samples")
        if self.ids.unique().numel() != n:
            raise ValueError("IndexedDataset ids must be unique")
        targets = getattr(dataset, "targets", None)
        if targets is None and hasattr(dataset, "tensors"):
            targets = dataset.tensors[1]
        self.targets = torch.as_tensor(targets) if targets is not None else None
        if n and isinstance(first := dataset[0], Mapping) and id_key in first:
            raise ValueError(
                f"IndexedDataset: the dataset's items already have a {id_key!r} entry; pass another id_key"
            )

    def __len__(self) -> int:
        return int(self.ids.numel())

    def __getitem__(self, i: int) -> tuple[Any, Any, Tensor] | dict[str, Any]:
        item = self.dataset[i]
        if isinstance(item, Mapping):
            return {**item, self.id_key: self.ids[i]}
        return item[0], item[1], self.ids[i]


def sample_ids_of(data: Dataset) -> Tensor | None:
    """The sample id at each position of ``data``, known without reading an item: an :class:`IndexedDataset`'s
    ids, also through ``Subset`` and ``ConcatDataset`` of them; ``None`` for any other dataset."""
    if isinstance(data, IndexedDataset):
        return data.ids
    if isinstance(data, Subset):
        inner = sample_ids_of(data.dataset)
        return None if inner is None else inner[torch.as_tensor(list(data.indices), dtype=torch.long)]
    if isinstance(data, ConcatDataset):
        parts = [sample_ids_of(d) for d in data.datasets]
        known = [p for p in parts if p is not None]
        return torch.cat(known) if len(known) == len(parts) else None
    return None


def select_by_ids(
    data: Dataset | DataLoader, ids: Tensor, batch_size: int = 512, keys: BatchKeys | None = None
) -> tuple[Tensor, Tensor]:
    """Inputs and labels of exactly ``ids`` (in that order) from a dataset yielding sample ids (tuples or dicts,
    read with ``keys``, see :mod:`lightning_unlearn.contract`).

    A dataset whose ids are known by position (:func:`sample_ids_of`: an :class:`IndexedDataset`, or subsets and
    concatenations of them) is read at those rows only, so the other samples (the retained data, possibly a
    lazily loaded store) are never read; any other dataset, or a ``DataLoader``, is scanned until every id is found.

    Raises:
        ValueError: naming the ids that ``data`` lacks.
    """
    wanted = {int(i): k for k, i in enumerate(ids.tolist())}
    xs: list[Tensor | None] = [None] * len(wanted)
    ys: list[Tensor | None] = [None] * len(wanted)
    if isinstance(data, Dataset) and (positions := sample_ids_of(data)) is not None:
        # each wanted id's first position, by a stable sort and a binary search (a Python dict of every id of a
        # 50,000-sample dataset cost tens of milliseconds per request)
        order = torch.argsort(positions, stable=True)
        ordered = positions[order]
        want = torch.tensor(list(wanted), dtype=torch.long)
        at = torch.searchsorted(ordered, want).clamp_(max=max(len(ordered) - 1, 0))
        found_at = ordered[at] == want if len(ordered) else torch.zeros(len(want), dtype=torch.bool)
        if not bool(found_at.all()):
            missing = want[~found_at].tolist()
            raise ValueError(f"forget data lacks {len(missing)} requested sample ids, e.g. {missing[:10]}")
        data = Subset(data, order[at].tolist())
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=batch_size)
    found = 0
    for batch in loader:
        x, y, bid = unpack_batch(batch, keys)
        for r, i in enumerate(bid.tolist()):
            k = wanted.get(i)
            if k is not None and xs[k] is None:
                xs[k], ys[k] = x[r], y[r]
                found += 1
        if found == len(wanted):
            break
    if found < len(wanted):
        missing = [i for i, k in wanted.items() if xs[k] is None]
        raise ValueError(f"forget data lacks {len(missing)} requested sample ids, e.g. {missing[:10]}")
    return torch.stack(cast(list[Tensor], xs)), torch.stack(cast(list[Tensor], ys))  # every slot found above
