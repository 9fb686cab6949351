"""Models the methods are defined on: a frozen backbone with an analytic (closed-form) head."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn


class RandomExpansion(nn.Module):
    """The nonlinear map G of eq. (1): ``f = ReLU(b P)`` with a fixed Gaussian projection ``P``.

    A random-projection feature expansion (as in analytic continual learning); ``P`` is a buffer,
    seeded, so it is saved with the module and identical across ranks and restarts.
    """

    def __init__(self, in_features: int, out_features: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("P", torch.randn(in_features, out_features, generator=g) / in_features**0.5)

    def forward(self, b: Tensor) -> Tensor:
        return torch.relu(b @ self.P.to(b.dtype))


class AnalyticClassifier(L.LightningModule):
    """Frozen backbone, optional expansion G, and a bias-free float64 ridge head ``W`` (eq. 1-3).

    Training is gradient-free: fit it with an :class:`AnalyticRecorder` callback, which solves
    the head in closed form after each experience. ``training_step`` only computes features and
    hands them to the recorder, so no optimizer is configured.
    """

    def __init__(self, backbone: nn.Module, backbone_dim: int, num_classes: int, expansion_dim: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone.requires_grad_(False).eval()
        self.expansion = RandomExpansion(backbone_dim, expansion_dim, seed) if expansion_dim else nn.Identity()
        d_F = expansion_dim or backbone_dim
        # the head is the learned parameter; it is solved in closed form, never by an optimizer
        # (it keeps requires_grad so that DDP and Avalanche's loops accept the module)
        self.head = nn.Linear(d_F, num_classes, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.head.weight)
        self.num_classes = num_classes
        self.automatic_optimization = False

    def train(self, mode: bool = True) -> AnalyticClassifier:
        super().train(mode)
        self.backbone.eval()  # frozen: batch-norm statistics and dropout must not move
        return self

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        return self.expansion(self.backbone(x)).to(torch.float64)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return {"features": self.features(batch[0])}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        acc = (self(x).argmax(-1) == y).float().mean()
        self.log("val_acc", acc, prog_bar=True, batch_size=len(y))

    def configure_optimizers(self) -> None:
        return None


def mlp_backbone(in_features: int, hidden: int = 128, out_features: int = 64) -> nn.Sequential:
    """A small MLP used as a stand-in pre-trained backbone in examples and tests."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features), nn.ReLU())


class SupervisedClassifier(L.LightningModule):
    """A network trained by plain mini-batch SGD on ``mean CE + (l2/2) ||theta||^2``.

    The regulariser is part of the objective (not optimizer weight decay), so the loss the
    certified methods reason about is exactly :meth:`objective`. Used by the gradient-based
    methods (HF, certified CL, the baselines).

    Args:
        net: maps inputs to logits.
        lr: SGD step size.
        l2: ridge coefficient ``lambda`` of ``(lambda/2)||theta||^2``.
        momentum: SGD momentum (keep 0 for methods that replay the SGD trajectory).
    """

    def __init__(self, net: nn.Module, lr: float = 0.1, l2: float = 0.0, momentum: float = 0.0) -> None:
        super().__init__()
        self.net = net
        self.lr, self.l2, self.momentum = lr, l2, momentum

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def sample_losses(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample cross-entropy (no regulariser)."""
        return nn.functional.cross_entropy(self(x), y.long(), reduction="none")

    def regulariser(self) -> Tensor:
        return 0.5 * self.l2 * sum(p.pow(2).sum() for p in self.parameters() if p.requires_grad)

    def objective(self, x: Tensor, y: Tensor) -> Tensor:
        return self.sample_losses(x, y).mean() + self.regulariser()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.objective(batch[0], batch[1])
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch[1]))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch[0], batch[1]
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), prog_bar=True, batch_size=len(y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr, momentum=self.momentum)
