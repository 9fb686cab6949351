"""What the harness runs: a benchmark's description, a method, and the model a method builds for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.data import IndexedDataset, unpack_batch
from lightning_unlearn.unlearners.base import Unlearner


@dataclass(frozen=True)
class BenchmarkInfo:
    """What a method needs to build its model for a benchmark, and the data the harness evaluates on.

    ``train`` yields ``(x, y, sample_id)`` for every training sample of the stream; ``ids``,
    ``labels`` and ``experiences`` say what each experience teaches. ``backbone`` is a frozen
    pre-trained feature extractor (methods copy it) with output width ``backbone_dim``.
    ``epochs``, ``lr`` and ``batch_size`` are the continual-learning recipe of gradient-trained
    models (retraining replays it).
    """

    benchmark: Any
    train: IndexedDataset
    test: Dataset
    ids: Tensor
    labels: Tensor
    experiences: Tensor
    num_classes: int
    backbone: nn.Module
    backbone_dim: int
    seed: int = 0
    epochs: int = 1
    lr: float = 0.1
    batch_size: int = 64

    def catalog(self) -> SampleCatalog:
        """A fresh catalog of everything the stream teaches (nothing forgotten)."""
        cat = SampleCatalog()
        for e in self.experiences.unique().tolist():
            rows = self.experiences == e
            cat.add(self.ids[rows], self.labels[rows], int(e))
        return cat


def describe_benchmark(
    benchmark: Any,
    *,
    backbone: nn.Module | None = None,
    backbone_dim: int | None = None,
    seed: int = 0,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 64,
) -> BenchmarkInfo:
    """Read an Avalanche benchmark whose training samples carry sample ids (e.g. built with
    :func:`~lightning_unlearn.avalanche.benchmark_with_sample_ids`) into a :class:`BenchmarkInfo`.

    Without a ``backbone`` the inputs themselves (flattened) are the features. The number of classes is
    the benchmark's ``n_classes`` if it has one, else 1 + the largest training or test label.
    """
    from lightning_unlearn.avalanche import items_with_ids  # imports Avalanche (slow), as running the stream does

    xs, ys, ids, exps = [], [], [], []
    for experience in benchmark.train_stream:
        for batch in DataLoader(items_with_ids(experience.dataset), batch_size=1024):
            x, y, i = unpack_batch(batch)
            xs.append(x)
            ys.append(y.long())
            ids.append(i)
            exps.append(torch.full_like(i, experience.current_experience))
    test = [b for exp in benchmark.test_stream for b in DataLoader(exp.dataset, batch_size=1024)]
    x, y, i = torch.cat(xs), torch.cat(ys), torch.cat(ids)
    test_y = torch.cat([torch.as_tensor(b[1]) for b in test]).long()
    classes = getattr(benchmark, "n_classes", None)  # a TaskStream names its classes; Avalanche's scenarios do not
    if backbone is None:
        backbone, backbone_dim = nn.Flatten(), int(x[0].numel())
    elif backbone_dim is None:
        raise ValueError("give the backbone's output width as backbone_dim")
    return BenchmarkInfo(
        benchmark=benchmark,
        train=IndexedDataset(TensorDataset(x, y), ids=i),
        test=TensorDataset(torch.cat([b[0] for b in test]), test_y),
        ids=i,
        labels=y,
        experiences=torch.cat(exps),
        num_classes=int(classes) if classes is not None else 1 + int(torch.cat([y, test_y]).max()),
        backbone=backbone,
        backbone_dim=int(backbone_dim),
        seed=seed,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
    )


@dataclass
class Built:
    """A method's model for one benchmark: the module, the callbacks that learn the stream with it
    (its recorder among them), the strategy factory (called after learning), and the Trainer
    options of its continual-learning fits (e.g. ``{"max_epochs": 5}``) and their batch size
    (``None``: the benchmark's ``batch_size``)."""

    module: L.LightningModule
    callbacks: list[L.Callback]
    strategy: Callable[[], Unlearner]
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None


@dataclass(frozen=True)
class Method:
    """A named unlearning method: ``build(info)`` makes a fresh :class:`Built` for a benchmark.

    ``reference`` is the gold standard it is measured against (retraining from scratch on the
    retained data, for the same model family); ``None`` means the method *is* its family's gold
    standard. The harness always runs the reference separately, so a retrain method is checked
    against an independent retrain. ``family`` names the model family the method runs on (e.g.
    ``"analytic"``); reports group and label methods by it.
    """

    name: str
    build: Callable[[BenchmarkInfo], Built]
    reference: Method | None = None
    family: str = "custom"
