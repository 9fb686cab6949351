"""Stable sample ids on Avalanche datasets, carried as an Avalanche data attribute.

Avalanche items stay ``(x, y, task_label)``: strategies read them by position (``mb_task_id`` is
``mbatch[-1]``; DER unpacks ``(x, y, t)`` to compute its logits and ``(x, y, t, logits)`` from its
buffer), so a sample id inside the item breaks them. The id is instead a :class:`DataAttribute`
named ``sample_id`` (``use_in_getitem=False``), the mechanism Avalanche uses for per-sample
information (targets, task labels, DER's logits): ``subset``/``concat``, and therefore every
benchmark builder, experience split and replay buffer, carry it along with the samples.

* :func:`with_sample_ids`: attach ids to a dataset before handing it to any Avalanche builder;
* :func:`benchmark_with_sample_ids`: Avalanche's ``class_incremental_benchmark`` over such datasets;
* :func:`sample_ids`: the ids of an Avalanche dataset (or experience, or replay buffer);
* :func:`items_with_ids`: a view yielding ``(x, y, sample_id, task_label)``, the library's batch
  format (:mod:`lightning_unlearn.contract`), for Lightning fits and forget requests.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any

import torch
from avalanche.benchmarks.scenarios.supervised import class_incremental_benchmark
from avalanche.benchmarks.utils import AvalancheDataset, DataAttribute
from avalanche.benchmarks.utils.classification_dataset import TaskAwareSupervisedClassificationDataset
from torch import Tensor
from torch.utils.data import Dataset

from lightning_unlearn.data import IndexedDataset

#: name of the Avalanche data attribute holding each sample's id
SAMPLE_ID = "sample_id"


def with_sample_ids(dataset: Dataset, ids: Sequence[int] | Tensor | None = None, task_label: int = 0) -> Any:
    """``dataset`` as an Avalanche dataset whose data attribute ``sample_id`` holds one stable id per sample.

    Items are not changed: a torch dataset of ``(x, y)`` pairs becomes Avalanche's
    ``(x, y, task_label)`` (its ``targets`` attribute, or a ``TensorDataset``'s second tensor, are
    the targets); an Avalanche dataset keeps its items and attributes. An :class:`IndexedDataset`
    gives its ids (its items ``(x, y, sample_id)`` become ``(x, y, task_label)``).

    Args:
        dataset: a torch dataset of ``(x, y)`` with targets, an Avalanche dataset, or an :class:`IndexedDataset`.
        ids: one unique integer per sample (default: the ``IndexedDataset``'s ids, else the row index).
        task_label: the task label of a torch dataset's items.

    Raises:
        ValueError: ids given twice, not one per sample, or not unique; a torch dataset without targets.
    """
    if isinstance(dataset, IndexedDataset):
        if ids is not None:
            raise ValueError("with_sample_ids: an IndexedDataset carries its ids; pass its .dataset to give others")
        ids = dataset.ids
        dataset = dataset.dataset
    if not isinstance(dataset, Sized):
        raise ValueError(f"with_sample_ids needs a dataset with a length, got {type(dataset).__name__}")
    n = len(dataset)
    id_list = list(range(n)) if ids is None else torch.as_tensor(ids, dtype=torch.long).flatten().tolist()
    if len(id_list) != n or len(set(id_list)) != n:
        raise ValueError(
            f"with_sample_ids needs {n} unique ids, one per sample, got {len(id_list)} ({len(set(id_list))} distinct)"
        )
    attribute = DataAttribute(id_list, SAMPLE_ID)
    if isinstance(dataset, AvalancheDataset):
        return dataset.update_data_attribute(SAMPLE_ID, attribute)
    targets = getattr(dataset, "targets", None)
    if targets is None and hasattr(dataset, "tensors"):
        targets = dataset.tensors[1]
    if targets is None:
        raise ValueError(
            f"with_sample_ids: {type(dataset).__name__} has no targets (give it .targets, one label per sample)"
        )
    return TaskAwareSupervisedClassificationDataset(
        [dataset],
        data_attributes=[
            DataAttribute(torch.as_tensor(targets).tolist(), "targets"),
            DataAttribute([task_label] * n, "targets_task_labels", use_in_getitem=True),
            attribute,
        ],
    )


def benchmark_with_sample_ids(
    train: Dataset,
    test: Dataset,
    n_experiences: int,
    *,
    seed: int = 0,
    class_order: Sequence[int] | None = None,
) -> Any:
    """Avalanche's ``class_incremental_benchmark`` (``train_stream``/``test_stream``) over datasets with sample ids.

    Each dataset goes through :func:`with_sample_ids` (a ``TensorDataset(x, y)``'s ids are its rows, an
    :class:`IndexedDataset` keeps its own); the classes ``0..C-1`` (``C`` = 1 + the largest training label)
    are split into ``n_experiences`` experiences of consecutive classes of ``class_order``, by default a
    permutation drawn from ``seed`` (with its own generator: the global RNG is left alone). Items are
    Avalanche's ``(x, y, task_label)``; ``sample_ids(experience.dataset)`` gives their ids. No download.

    Raises:
        ValueError: a ``class_order`` that is not a permutation of the classes, or bad ids.
    """
    train_ds, test_ds = with_sample_ids(train), with_sample_ids(test)
    num_classes = 1 + max(int(c) for c in train_ds.targets.uniques)
    if class_order is None:
        order = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed)).tolist()
    else:
        order = [int(c) for c in class_order]
        if sorted(order) != list(range(num_classes)):
            raise ValueError(f"class_order must be a permutation of 0..{num_classes - 1}, got {order}")
    datasets = {"train": train_ds, "test": test_ds}
    return class_incremental_benchmark(datasets, class_order=order, num_experiences=n_experiences)


def sample_ids(dataset: Any) -> Tensor:
    """The ``sample_id`` attribute of an Avalanche dataset (an experience's, a replay buffer's) as a tensor.

    Raises:
        ValueError: the dataset carries no sample ids.
    """
    attribute = getattr(dataset, SAMPLE_ID, None)
    if not isinstance(attribute, DataAttribute):
        raise ValueError(
            f"the {type(dataset).__name__} carries no sample ids: give its data a {SAMPLE_ID!r} attribute with "
            "lightning_unlearn.avalanche.with_sample_ids before building the benchmark "
            "(or use lightning_unlearn.avalanche.benchmark_with_sample_ids)"
        )
    return torch.as_tensor(list(attribute), dtype=torch.long)


class _ItemsWithIds(Dataset):
    """An Avalanche dataset's items ``(x, y, *rest)`` as ``(x, y, sample_id, *rest)``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.ids = dataset, sample_ids(dataset)
        self.targets = torch.as_tensor(list(dataset.targets))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        x, y, *rest = self.dataset[i]
        return (x, y, self.ids[i], *rest)


def items_with_ids(dataset: Dataset) -> Dataset:
    """A dataset yielding ``(x, y, sample_id, ...)`` (:mod:`lightning_unlearn.contract`) for ``dataset``.

    An Avalanche dataset (its ``sample_id`` attribute, see :func:`with_sample_ids`) is viewed as
    ``(x, y, sample_id, task_label)``; any other dataset must already yield sample ids third (e.g. an
    :class:`IndexedDataset`) and is returned as is.

    Raises:
        ValueError: an Avalanche dataset without the ``sample_id`` attribute; another dataset that is empty
            or whose items carry no sample ids.
    """
    if isinstance(dataset, AvalancheDataset):
        return _ItemsWithIds(dataset)
    require_sample_ids(dataset)
    return dataset


def require_sample_ids(dataset: Dataset) -> None:
    """``ValueError`` unless ``dataset`` is non-empty and its first item is ``(x, y, sample_id, ...)`` with an
    integer id (only the first item is inspected).

    Raises:
        ValueError: the dataset is empty, or its items carry no integer sample id third.
    """
    if not isinstance(dataset, Sized) or len(dataset) == 0:
        raise ValueError(f"the {type(dataset).__name__} has no samples")
    item = dataset[0]
    sample_id = item[2] if isinstance(item, (list, tuple)) and len(item) >= 3 else None
    is_int = isinstance(sample_id, int) or (
        isinstance(sample_id, Tensor) and sample_id.numel() == 1 and not sample_id.is_floating_point()
    )
    if not is_int:
        shape = f"{len(item)} elements" if isinstance(item, (list, tuple)) else type(item).__name__
        raise ValueError(
            f"the {type(dataset).__name__}'s items carry no sample ids (an item has {shape}; expected "
            "(x, y, sample_id, ...)): wrap it in lightning_unlearn.IndexedDataset, or give an Avalanche dataset a "
            f"{SAMPLE_ID!r} attribute with lightning_unlearn.avalanche.with_sample_ids"
        )
