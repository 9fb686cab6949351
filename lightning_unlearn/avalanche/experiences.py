"""What ``fit_stream`` accepts as one experience, and how it becomes Lightning's data.

An experience of a stream may be

* an Avalanche experience (its ``dataset``: :func:`~lightning_unlearn.avalanche.items_with_ids` gives its
  training items their sample ids), or a ``Dataset`` yielding ``(x, y, sample_id, ...)``: ``fit_stream``
  makes its loader (``batch_size``, ``num_workers``, a ``sampler`` or shuffling);
* a ``DataLoader`` of such items, used as it is (your sampler, workers, collate);
* a ``LightningDataModule``: ``Trainer.fit(datamodule=...)`` reads its ``train_dataloader`` (and its
  ``val_dataloader``, if it has one).

Validation and test data (``val_stream``, ``test_stream``) need no sample ids: an Avalanche experience's
items ``(x, y, task)``, a ``Dataset`` or a ``DataLoader``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import lightning as L
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_unlearn.avalanche.benchmarks import items_with_ids

#: makes the training sampler of an experience's dataset (e.g. ``lambda d: WeightedRandomSampler(...)``)
SamplerFactory = Callable[[Dataset], Sampler[Any] | Iterable[int]]


@dataclass(frozen=True)
class LoaderOptions:
    """How ``fit_stream`` loads an experience given as a dataset (not as a ``DataLoader`` or data module)."""

    batch_size: int = 64
    num_workers: int = 0
    sampler: SamplerFactory | None = None

    def train(self, dataset: Dataset) -> DataLoader:
        sampler = self.sampler(dataset) if self.sampler is not None else None
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=sampler is None,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def evaluate(self, data: Any) -> DataLoader:
        if isinstance(data, DataLoader):
            return data
        return DataLoader(_dataset(data), batch_size=self.batch_size, num_workers=self.num_workers)


def experience_number(experience: Any, position: int) -> int:
    """An Avalanche experience's ``current_experience``; otherwise its position in the stream."""
    return int(getattr(experience, "current_experience", position))


def training_data(experience: Any, k: int, trainer: L.Trainer | None = None) -> Dataset:
    """The experience's training items with their sample ids (what forget requests read).

    After its fit, a data module's are those of the ``trainer``'s training loader; without one (an experience
    skipped when resuming) the data module is set up for fitting (``setup("fit")``). Its training data must be
    one ``DataLoader``.

    Raises:
        ValueError: the data carry no sample ids, or a data module's training data is not one ``DataLoader``.
    """
    if isinstance(experience, L.LightningDataModule):
        if trainer is None:
            experience.setup("fit")
        loader = experience.train_dataloader() if trainer is None else trainer.train_dataloader
        if not isinstance(loader, DataLoader):
            raise ValueError(
                f"experience {k}: the data module's train_dataloader returns a {type(loader).__name__}; "
                "fit_stream reads an experience's training data from one DataLoader"
            )
        return items_with_ids(loader.dataset)
    if isinstance(experience, DataLoader):
        return items_with_ids(experience.dataset)
    return items_with_ids(_dataset(experience))


def _dataset(data: Any) -> Dataset:
    """A dataset as it is; an Avalanche experience's ``dataset``."""
    return data if isinstance(data, Dataset) else data.dataset
