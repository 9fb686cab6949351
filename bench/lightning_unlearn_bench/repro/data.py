"""A setup's data: a bundled or on-disk dataset as tensors, [CCL]'s task stream, the stream as a BenchmarkInfo."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_unlearn.data import IndexedDataset
from lightning_unlearn_bench.datasets import ACU_BASE_FRACTION
from lightning_unlearn_bench.repro.models import classifier
from lightning_unlearn_bench.repro.schema import Scale, Setup
from lightning_unlearn_bench.types import BenchmarkInfo, describe_benchmark

#: one split's inputs, labels and stable sample ids
Split = tuple[Tensor, Tensor, Tensor]


def load_data(
    dataset: str,
    root: str | Path | None,
    *,
    seed: int,
    per_class: int | None,
    base_fraction: float,
    train_size: int | None = None,
    test_size: int | None = None,
) -> tuple[dict[str, Split], int]:
    """``base``/``train``/``test`` tensors (inputs, labels, sample ids) of a dataset and its number of classes.

    ``digits`` is scikit-learn's bundled set (1x8x8 images, its own base split); the others are the
    datasets of :mod:`lightning_unlearn_bench.datasets`, read from torchvision-format files under
    ``root`` or bundled with a package (``mnist-5k``): :func:`~lightning_unlearn_bench.datasets.load_splits`,
    ``per_class`` kept per class, ``base_fraction`` of them in ``base``, at most ``train_size``/``test_size``
    drawn from the stream and the test set before any image is read, ids being the rows of the dataset's own
    training (test) set.

    Raises:
        ValueError: a dataset on disk without ``root``, or an unknown dataset.
        DatasetNotFoundError: its files are missing under ``root`` (naming them).
    """
    if dataset == "digits":
        from lightning_unlearn_bench.digits import digits_splits

        g = torch.Generator().manual_seed(seed)
        out = {}
        for k, (x, y) in digits_splits(seed=seed).items():
            ids = torch.arange(len(y))
            if per_class is not None and k != "base":
                ids = _per_class(y, per_class, g)
            out[k] = (x[ids].reshape(-1, 1, 8, 8), y[ids], ids)
        return out, 10
    from lightning_unlearn_bench.datasets import BUNDLED, dataset_spec, load_splits

    dataset_spec(dataset)  # an unknown name is refused before the missing root
    if root is None and dataset not in BUNDLED:
        raise ValueError(f"dataset {dataset!r} is read from local files: give their directory with --root")

    splits = load_splits(
        dataset,
        root,
        seed=seed,
        per_class=per_class,
        base_fraction=base_fraction,
        train_size=train_size,
        test_size=test_size,
    )
    return {k: _tensors(getattr(splits, k)) for k in ("base", "train", "test")}, splits.num_classes


def _per_class(y: Tensor, n: int, g: torch.Generator) -> Tensor:
    order = torch.randperm(len(y), generator=g)
    return torch.cat([order[y[order] == c][:n] for c in y.unique().tolist()]).sort().values


def _tensors(data: Dataset) -> Split:
    """Materialise ``(x, y, sample_id)`` items (the harness evaluates on tensors)."""
    xs, ys, ids = [], [], []
    for x, y, i in DataLoader(data, batch_size=1024):
        xs.append(x)
        ys.append(torch.as_tensor(y).long())
        ids.append(torch.as_tensor(i).long())
    if not xs:
        return torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    return torch.cat(xs), torch.cat(ys), torch.cat(ids)


def _cap(split: Split, size: int | None, g: torch.Generator) -> Split:
    if size is None or size >= len(split[1]):
        return split
    keep = torch.randperm(len(split[1]), generator=g)[:size].sort().values
    return split[0][keep], split[1][keep], split[2][keep]


@dataclass(frozen=True)
class _Experience:
    current_experience: int
    dataset: Dataset
    classes_in_this_experience: list[int]


@dataclass(frozen=True)
class TaskStream:
    """A stream of given experiences (``train_stream``, ``test_stream``, ``n_classes``), as the harness reads
    Avalanche benchmarks; items are ``(x, y, sample_id, task_label)``."""

    train_stream: list[_Experience]
    test_stream: list[_Experience]
    n_classes: int


class _WithTask(Dataset):
    """``(x, y, sample_id)`` items with a task label 0 appended, as Avalanche's items are."""

    def __init__(self, dataset: IndexedDataset) -> None:
        self.dataset, self.targets = dataset, dataset.targets

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return (*self.dataset[i], 0)


def task_stream(
    x: Tensor,
    y: Tensor,
    xt: Tensor,
    yt: Tensor,
    n_tasks: int,
    labels_per_task: int,
    num_classes: int,
    seed: int,
    ids: Tensor | None = None,
) -> TaskStream:
    """[CCL] Section 6's stream: the training set split into ``n_tasks`` non-i.i.d. tasks, each drawing
    ``labels_per_task`` labels at random and an equal share of the samples of those labels.

    [interp] A label's samples are dealt round-robin to the tasks that drew it, so the tasks are
    disjoint and every sample is learned once; a label no task drew is left out. ``ids``: the samples'
    ids (default: their rows).
    """
    g = torch.Generator().manual_seed(seed)
    labels = [torch.randperm(num_classes, generator=g)[:labels_per_task].tolist() for _ in range(n_tasks)]
    task = torch.full_like(y, -1)
    for c in range(num_classes):
        owners = [t for t in range(n_tasks) if c in labels[t]]
        rows = torch.nonzero(y == c).flatten()
        rows = rows[torch.randperm(len(rows), generator=g)]
        for j, r in enumerate(rows.tolist()):
            if owners:
                task[r] = owners[j % len(owners)]
    ds = IndexedDataset(TensorDataset(x, y), ids=ids)
    train = [
        _Experience(t, _WithTask(_subset(ds, task == t)), sorted(labels[t]))
        for t in range(n_tasks)
        if (task == t).any()
    ]
    test = [_Experience(0, _WithTask(IndexedDataset(TensorDataset(xt, yt))), list(range(num_classes)))]
    return TaskStream(train, test, num_classes)


def _subset(ds: IndexedDataset, rows: Tensor) -> IndexedDataset:
    idx = torch.nonzero(rows).flatten()
    x, y = ds.dataset.tensors  # type: ignore[attr-defined]
    return IndexedDataset(TensorDataset(x[idx], y[idx]), ids=ds.ids[idx])


def build_info(
    setup: Setup, scale: Scale, root: str | Path | None, seed: int, trainer_kwargs: Mapping[str, Any]
) -> BenchmarkInfo:
    """The setup's stream at ``scale`` as the harness's :class:`BenchmarkInfo`.

    With ``scale.pretrain_epochs`` the classifier is first trained on the disjoint ``base`` split by
    :func:`~lightning_unlearn_bench.models.pretrain_backbone` ([ACU] App. E.1's recipe: SGD with
    momentum 0.9, weight decay 5e-4, cosine decay from ``scale.lr``; random crops and flips on files
    from disk) and its frozen feature extractor is the backbone; otherwise the backbone starts untrained.
    """
    from lightning_unlearn.avalanche import benchmark_with_sample_ids
    from lightning_unlearn_bench.models import backbone_of, pretrain_backbone, standard_augmentation

    base = ACU_BASE_FRACTION if scale.pretrain_epochs > 0 else 0.0
    splits, num_classes = load_data(
        scale.dataset,
        root,
        seed=seed,
        per_class=scale.per_class,
        base_fraction=base,
        train_size=scale.train_size,
        test_size=scale.test_size,
    )
    g = torch.Generator().manual_seed(seed)
    x, y, ids = _cap(splits["train"], scale.train_size, g)
    xt, yt, idt = _cap(splits["test"], scale.test_size, g)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = classifier(scale.model, num_classes, tuple(x.shape[1:]), scale.width)
    if scale.pretrain_epochs > 0:
        xb, yb, _ = splits["base"]
        augment = None if scale.dataset == "digits" else standard_augmentation(tuple(x.shape[1:]), flip=x.shape[1] == 3)
        net, dim = pretrain_backbone(
            model,
            TensorDataset(xb, yb),
            epochs=scale.pretrain_epochs,
            lr=scale.lr,
            batch_size=scale.batch_size,
            augment=augment,
            seed=seed,
            trainer_kwargs=trainer_kwargs,
        )
    else:
        net, dim = backbone_of(model)
    if setup.protocol == "tasks":
        n_tasks, per_task = scale.n_experiences, scale.labels_per_task
        bm: Any = task_stream(x, y, xt, yt, n_tasks, per_task, num_classes, seed, ids=ids)
    else:
        n = scale.n_experiences if setup.protocol == "class-incremental" else 1
        train = IndexedDataset(TensorDataset(x, y), ids=ids)
        test = IndexedDataset(TensorDataset(xt, yt), ids=idt)
        bm = benchmark_with_sample_ids(train, test, n, seed=seed)
    return describe_benchmark(
        bm, backbone=net, backbone_dim=dim, seed=seed, epochs=scale.epochs, lr=scale.lr, batch_size=scale.batch_size
    )
