"""What a user brings to ``compare_with_retrain`` and ``compare --model/--data``: their own module and datamodule.

Importable by class path (``helpers_own.UserNet``): ``tests/`` is on ``sys.path`` (conftest.py).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from helpers import N_CLASSES, N_FEATURES, toy_tensors
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import AnalyticHead, IndexedDataset

#: (default_root_dir, logger) of every fit a UserNet or UserHead took part in, in order
FITS: list[tuple[str, Any]] = []


class UserNet(L.LightningModule):
    """A user's module: BatchNorm, label-smoothed loss, SGD with momentum; it records the Trainer of each fit."""

    def __init__(self, width: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(N_FEATURES, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, N_CLASSES)
        )
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1], label_smoothing=0.05)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def on_fit_start(self) -> None:
        FITS.append((self.trainer.default_root_dir, self.trainer.logger))


class UserHead(L.LightningModule):
    """ACU on a user's module: a frozen "pre-trained" trunk with BatchNorm and a (float64) ``AnalyticHead`` that the
    recorder alone solves (nothing else to train: ``training_step`` returns ``None``)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.BatchNorm1d(16), nn.Tanh()).requires_grad_(False)
        with torch.no_grad():  # "pre-trained" batch-norm statistics
            self.trunk[1].running_mean.uniform_(-0.5, 0.5)
            self.trunk[1].running_var.uniform_(0.5, 2.0)
        self.head = AnalyticHead(16, num_classes=N_CLASSES, expansion_dim=24, bias=True, seed=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> None:
        return None


class UserData(L.LightningDataModule):
    """A user's datamodule: ``(x, y, sample_id)`` items with ids of their own (1000 + row), a test loader."""

    def __init__(self, n: int = 48, offset: int = 1000) -> None:
        super().__init__()
        self.n, self.offset = n, offset

    def setup(self, stage: str) -> None:
        x, y = toy_tensors(self.n, seed=0)
        self.train = IndexedDataset(TensorDataset(x, y), ids=torch.arange(self.n) + self.offset)
        self.test = TensorDataset(*toy_tensors(24, seed=1))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=16, shuffle=True)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=16)


class PairsData(UserData):
    """A mistake: training items ``(x, y)`` without sample ids."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train.dataset, batch_size=16)


class NoTestData(UserData):
    """A mistake: no test (or validation) loader."""

    test_dataloader = L.LightningDataModule.test_dataloader
