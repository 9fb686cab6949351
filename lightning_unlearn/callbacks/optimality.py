"""`TaskOptimality`: checks that every task was solved to a stated tolerance ([CCL]'s recipe condition)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lightning_unlearn.data import unpack_batch


class TaskOptimality(L.Callback):
    """After each fit, the norm of the gradient of the task objective at the solution, over the fit's data.

    [CCL] (Eq. (1), Theorems 3.1-4.1) assumes each task's solution is the exact minimiser of
    ``mean_{z in D_i} l(w; z) + (lambda/2)||w - w_{i-1}||^2``; for a (mu + lambda)-strongly convex
    objective a residual gradient ``r`` means the solution is within ``r/(mu + lambda)`` of it. The
    certified [CCL] strategies refuse a certified release when a recorded task's residual exceeds
    ``tolerance`` (and state ``recipe="unchecked"`` without this callback).

    The objective is the module's own ``objective(x, y)`` (mean loss plus its regularisers), whose
    data term is averaged over all the fit's batches (weighted by their sizes).

    Args:
        tolerance: the largest accepted residual ``||grad objective(end_i)||``.
    """

    def __init__(self, tolerance: float = 1e-4) -> None:
        if not tolerance > 0:
            raise ValueError(f"TaskOptimality tolerance must be positive, got {tolerance}")
        self.tolerance = float(tolerance)
        self.residuals: list[float] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(tolerance=self.tolerance)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.residuals.append(task_residual(pl_module, trainer.train_dataloader))

    def problem(self, n_tasks: int) -> str | None:
        """``None`` if ``n_tasks`` fits were checked and all met the tolerance, else the reason."""
        if len(self.residuals) != n_tasks:
            return f"TaskOptimality checked {len(self.residuals)} fits but {n_tasks} tasks were recorded (attach it to every fit)"
        bad = [(i, r) for i, r in enumerate(self.residuals) if not r <= self.tolerance]
        if bad:
            i, r = bad[0]
            return (f"task {i} was solved to a gradient residual {r:.3g} > tolerance {self.tolerance:g} ([CCL] assumes exact "
                    "task solutions): solve each task further (more L-BFGS steps, full batch)")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "residuals": list(self.residuals)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.residuals = [float(r) for r in state_dict.get("residuals", [])]


def task_residual(module: L.LightningModule, loader: Any) -> float:
    """``||grad (mean over the loader's samples of the loss + regularisers)||`` at the module's weights.

    The module's ``objective(x, y)`` on a batch is its mean loss plus regularisers; the regulariser
    part is ``objective`` minus ``sample_losses().mean()``, added once.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    total_loss, n, reg = None, 0, None
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            for batch in loader:
                x, y, _ = unpack_batch(batch)
                x, y = x.to(module.device), y.to(module.device)
                losses = module.sample_losses(x, y)
                total_loss = losses.sum() if total_loss is None else total_loss + losses.sum()
                n += len(y)
                if reg is None:
                    reg = module.objective(x, y) - losses.mean()
            if total_loss is None:
                return 0.0
            grads = torch.autograd.grad(total_loss / n + reg, params)
    finally:
        module.train(was_training)
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads)))
