"""[CCL] Eq. (1)'s proximal penalty towards the previous task's solution, and its gradient (pure torch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

#: each trainable parameter ``w`` paired with its anchor ``w_{i-1}``
Pairs = Sequence[tuple[Tensor, Tensor]]


def proximal_penalty(pairs: Pairs, reg_lambda: float, ridge: float = 0.0) -> Tensor:
    """``(lambda/2)||w - w_{i-1}||^2 + (ridge/2)||w||^2`` ([CCL] Eq. (1); ``ridge`` is the per-sample loss's
    strong convexity ``mu`` when no optimizer weight decay carries it). Differentiable in ``w``."""
    prox = sum((w - a.to(w)).pow(2).sum() for w, a in pairs)
    norm = sum(w.pow(2).sum() for w, _ in pairs) if ridge else 0.0
    return 0.5 * reg_lambda * prox + 0.5 * ridge * norm  # type: ignore[return-value]


@torch.no_grad()
def add_proximal_gradient(pairs: Pairs, reg_lambda: float, ridge: float = 0.0) -> None:
    """Add the penalty's gradient ``lambda (w - w_{i-1}) + ridge w`` to each ``w.grad`` (parameters without a
    gradient are skipped)."""
    for w, a in pairs:
        if w.grad is None:
            continue
        w.grad.add_(w - a.to(w), alpha=reg_lambda)
        if ridge:
            w.grad.add_(w, alpha=ridge)
