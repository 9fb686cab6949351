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

    The objective is the module's own ``objective(x, y)`` (mean loss plus its penalties), averaged
    over all the fit's batches (weighted by their sizes), plus the optimizer's weight decay (the ridge).

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
        decay = {
            id(p): float(g.get("weight_decay", 0.0))
            for opt in trainer.optimizers
            for g in opt.param_groups
            for p in g["params"]
        }
        self.residuals.append(task_residual(pl_module, trainer.train_dataloader, decay))

    def problem(self, n_tasks: int) -> str | None:
        """``None`` if ``n_tasks`` fits were checked and all met the tolerance, else the reason."""
        if len(self.residuals) != n_tasks:
            return (
                f"TaskOptimality checked {len(self.residuals)} fits but {n_tasks} tasks were recorded "
                "(attach it to every fit)"
            )
        bad = [(i, r) for i, r in enumerate(self.residuals) if not r <= self.tolerance]
        if bad:
            i, r = bad[0]
            return (
                f"task {i} was solved to a gradient residual {r:.3g} > tolerance {self.tolerance:g} ([CCL] assumes "
                "exact "
                "task solutions): solve each task further (more L-BFGS steps, full batch)"
            )
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "residuals": list(self.residuals)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.residuals = [float(r) for r in state_dict.get("residuals", [])]


def task_residual(module: L.LightningModule, loader: Any, weight_decay: dict[int, float] | None = None) -> float:
    """``||grad (mean over the loader's samples of the objective) + weight_decay * theta||`` at the module's weights.

    The module's ``objective(x, y)`` on a batch is its mean loss plus any penalty; batches are
    weighted by their sizes. ``weight_decay`` maps ``id(parameter)`` to the optimizer's decay (the
    ridge when it lives in the optimizer).
    """
    objective = getattr(module, "objective", None)
    if not callable(objective):
        raise TypeError(f"{type(module).__name__} has no objective(x, y), whose gradient TaskOptimality measures")
    params = [p for p in module.parameters() if p.requires_grad]
    total, n = None, 0
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            for batch in loader:
                x, y, _ = unpack_batch(batch)
                x, y = x.to(module.device), y.to(module.device)
                term = len(y) * objective(x, y)
                total = term if total is None else total + term
                n += len(y)
            if total is None:
                return 0.0
            grads = torch.autograd.grad(total / n, params, allow_unused=True)
    finally:
        module.train(was_training)
    decay = weight_decay or {}
    out = [
        (torch.zeros_like(p) if g is None else g) + decay.get(id(p), 0.0) * p.detach() for p, g in zip(params, grads)
    ]
    return float(torch.sqrt(sum((g.double().pow(2).sum() for g in out), torch.zeros((), dtype=torch.float64))))
