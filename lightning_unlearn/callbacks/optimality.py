"""`TaskOptimality`: checks that every task was solved to a stated tolerance ([CCL]'s recipe condition)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from lightning_unlearn.contract import training_loss, unpack_batch
from lightning_unlearn.regularization import ProximalRegularizer


class TaskOptimality(L.Callback):
    """After each fit, the norm of the gradient of the task objective at the solution, over the fit's data.

    [CCL] (Eq. (1), Theorems 3.1-4.1) assumes each task's solution is the exact minimiser of
    ``mean_{z in D_i} l(w; z) + (lambda/2)||w - w_{i-1}||^2``; for a (mu + lambda)-strongly convex
    objective a residual gradient ``r`` means the solution is within ``r/(mu + lambda)`` of it. The
    certified [CCL] strategies refuse a certified release when a recorded task's residual exceeds
    ``tolerance`` (and state ``recipe="unchecked"`` without this callback).

    The objective is what the fit minimised, read from the module and the Trainer, so any module works
    (:mod:`lightning_unlearn.contract`): the module's own training loss (what ``training_step`` returns,
    penalties it adds included, e.g. :class:`ProximalClassifier`'s) averaged over all the fit's batches
    (weighted by their sizes, in eval mode), plus the penalty of each :class:`ProximalRegularizer` callback
    that adds its gradient after backward (``in_loss=False``), plus the optimizer's weight decay (the ridge).

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
        hooks = [c for c in trainer.callbacks if isinstance(c, ProximalRegularizer) and not c.in_loss]  # type: ignore[attr-defined]
        self.residuals.append(task_residual(pl_module, trainer.train_dataloader, decay, hooks))

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


def task_residual(
    module: L.LightningModule,
    loader: Any,
    weight_decay: dict[int, float] | None = None,
    penalties: Sequence[ProximalRegularizer] = (),
) -> float:
    """``||grad (mean training loss + sum of penalties) + weight_decay * theta||`` at the module's weights.

    The training loss of a batch is the module's own (:func:`lightning_unlearn.contract.training_loss`: what
    its ``training_step`` returns); batches are weighted by their sizes. ``penalties`` are proximal terms
    applied as gradients, outside that loss; ``weight_decay`` maps ``id(parameter)`` to the optimizer's decay
    (the ridge when it lives in the optimizer).

    Raises:
        ValueError: the module's ``training_step`` returns no scalar loss.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    total, n = None, 0
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad():
            for i, batch in enumerate(loader):
                batch = move_data_to_device(batch, module.device)
                size = len(unpack_batch(batch)[1])
                term = size * training_loss(module, batch, i)
                total = term if total is None else total + term
                n += size
            if total is None:
                return 0.0
            objective = total / n + sum((t.penalty(module) for t in penalties), torch.zeros(()))
            grads = torch.autograd.grad(objective, params, allow_unused=True)
    finally:
        module.train(was_training)
    decay = weight_decay or {}
    out = [
        (torch.zeros_like(p) if g is None else g) + decay.get(id(p), 0.0) * p.detach() for p, g in zip(params, grads)
    ]
    return float(torch.sqrt(sum((g.double().pow(2).sum() for g in out), torch.zeros((), dtype=torch.float64))))
