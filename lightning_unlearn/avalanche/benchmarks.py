"""Avalanche benchmarks whose items carry stable sample ids, and the check that they do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from avalanche.benchmarks import nc_benchmark
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from lightning_unlearn.data import IndexedDataset


def class_incremental_benchmark(
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    n_experiences: int,
    seed: int = 0,
    fixed_class_order: Sequence[int] | None = None,
) -> Any:
    """An Avalanche class-incremental benchmark (``nc_benchmark``) from in-memory tensors.

    Training items are ``(x, y, sample_id, task)`` with ``sample_id`` the row of ``x_train``;
    test items ``(x, y, row, task)``. No download. For other data, wrap each dataset in
    :class:`IndexedDataset` (your own ids) before handing it to an Avalanche benchmark builder.
    """
    train = IndexedDataset(TensorDataset(x_train, y_train))
    test = IndexedDataset(TensorDataset(x_test, y_test))
    return nc_benchmark(
        train, test, n_experiences=n_experiences, task_labels=False, seed=seed, fixed_class_order=fixed_class_order
    )


def require_sample_ids(dataset: Dataset, experience: int) -> None:
    """``ValueError`` unless the experience's items are ``(x, y, sample_id, task_label)``.

    Avalanche appends the task label to every item, so a dataset of ``(x, y)`` pairs yields
    ``(x, y, task_label)``, whose last element would otherwise be mistaken for a sample id.
    Only the first item is inspected.

    Raises:
        ValueError: the experience is empty, or its items carry no integer sample id before the task label.
    """
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError(f"experience {experience} has no training samples")
    item = dataset[0]
    sample_id = item[2] if isinstance(item, (list, tuple)) and len(item) >= 4 else None
    is_int = isinstance(sample_id, int) or (
        isinstance(sample_id, Tensor) and sample_id.numel() == 1 and not sample_id.is_floating_point()
    )
    if not is_int:
        shape = f"{len(item)} elements" if isinstance(item, (list, tuple)) else type(item).__name__
        raise ValueError(
            f"experience {experience}: items carry no sample ids (an item has {shape}; Avalanche items must be "
            "(x, y, sample_id, task_label)): wrap the benchmark's datasets in lightning_unlearn.IndexedDataset, "
            "e.g. with lightning_unlearn.avalanche.class_incremental_benchmark"
        )
