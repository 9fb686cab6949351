"""The bundled benchmark: scikit-learn's real handwritten digits (no download) as a continual stream."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning
from lightning_unlearn_bench.types import BenchmarkInfo, describe_benchmark


def digits_splits(
    seed: int = 0, base_fraction: float = 0.3, test_fraction: float = 0.2
) -> dict[str, tuple[Tensor, Tensor]]:
    """scikit-learn's 1,797 real 8x8 handwritten digits (10 classes), split three ways as in ACU
    App. E.1: ``base`` (to pre-train the frozen backbone), ``train`` (the continual stream) and
    ``test``. Pixels are scaled to [0, 1]; the split is stratified and seeded."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    x_train, x_base, y_train, y_base = train_test_split(
        x_rest,
        y_rest,
        test_size=base_fraction / (1 - test_fraction),
        stratify=y_rest,
        random_state=seed,
    )
    return {
        "base": (x_base, y_base),
        "train": (x_train, y_train),
        "test": (x_test, y_test),
    }


def digits_benchmark(
    n_experiences: int = 5,
    *,
    seed: int = 0,
    pretrain_epochs: int = 30,
    epochs: int = 5,
    lr: float = 0.05,
    batch_size: int = 64,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> BenchmarkInfo:
    """scikit-learn's real handwritten digits (no download) as a class-incremental stream (ACU App. E.1).

    An MLP pre-trained for ``pretrain_epochs`` on the disjoint ``base`` split is the frozen
    backbone (``trainer_kwargs``: further arguments of that fit's ``Trainer``, e.g. ``accelerator``);
    the ``train`` split is learned in ``n_experiences`` experiences of whole classes.
    """
    from lightning_unlearn.avalanche import benchmark_with_sample_ids
    from lightning_unlearn.models import SupervisedClassifier, mlp_backbone

    splits = digits_splits(seed=seed)
    (xb, yb), (x, y), (xt, yt) = splits["base"], splits["train"], splits["test"]
    with torch.random.fork_rng(), quiet_lightning():  # the harness's own pre-training: no banners
        torch.manual_seed(seed)
        backbone = mlp_backbone(x.shape[1], 128, 64)
        net = nn.Sequential(backbone, nn.Linear(64, 10))
        trainer = L.Trainer(max_epochs=pretrain_epochs, **{**QUIET_TRAINER, **(trainer_kwargs or {})})
        trainer.fit(
            SupervisedClassifier(net, lr=0.1),
            DataLoader(TensorDataset(xb, yb), batch_size=32, shuffle=True),
        )
    bm = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), n_experiences, seed=seed)
    return describe_benchmark(
        bm,
        backbone=backbone.requires_grad_(False),
        backbone_dim=64,
        seed=seed,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
    )
