"""`ProximalRegularizer`: [CCL]'s continual-learning regulariser for any module, as a callback."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lightning_unlearn.functional.proximal import add_proximal_gradient, proximal_penalty


class ProximalRegularizer(L.Callback):
    """[CCL] Eq. (1)'s penalty ``(lambda/2)||w - w_{i-1}||^2`` towards the previous task's solution, on any module.

    Each experience ``i`` is learned from the anchor ``w_{i-1}``: the parameters at the start of the
    experience, except for the first one, anchored at ``w_0 = 0`` (so that "retrain without task s"
    uniformly skips step s). Two ways to apply it:

    * ``in_loss=False`` (default): the callback adds ``lambda (w - anchor)`` (and ``ridge * w``) to the
      gradients after every backward pass (Lightning's ``on_after_backward``, Avalanche's
      ``before_update``). Nothing changes in the module. For first-order optimizers only.
    * ``in_loss=True``: the module adds :meth:`penalty` to its own training loss (needed by L-BFGS,
      whose line search reads the loss value)::

          loss = ce + self.regularizer.penalty(self)

    ``ridge`` is a ridge ``(ridge/2)||w||^2`` of [CCL]'s per-sample loss ``l`` (its strong convexity
    ``mu``) for optimizers without ``weight_decay`` (L-BFGS); with SGD put it in ``weight_decay``.
    :class:`CCLRecorder` / :class:`CCLHessianRecorder` read ``reg_lambda``, ``ridge`` and the anchors
    from here (the formulas: :mod:`lightning_unlearn.functional.proximal`). Lightning fits set the anchor
    at ``on_train_start`` (a fit resumed mid-experience restores the experience open and keeps the saved
    one; one Trainer may fit several experiences) and close the experience at ``on_train_end``; other loops call
    :meth:`begin_experience` / :meth:`end_experience`, or pass this object to an Avalanche strategy's
    ``plugins`` (it implements ``before_training_exp``, ``before_update`` and ``after_training_exp``).

    Args:
        reg_lambda: [CCL]'s ``lambda`` (> 0).
        in_loss: the module adds :meth:`penalty` to its loss itself (else the gradient is added here).
        ridge: ``mu`` of a ridge that is part of the per-sample loss but not the optimizer's weight decay.

    Raises:
        ValueError: ``reg_lambda <= 0`` or ``ridge < 0``; at fit start, L-BFGS with ``in_loss=False``.
    """

    def __init__(self, reg_lambda: float, in_loss: bool = False, ridge: float = 0.0) -> None:
        if not reg_lambda > 0 or ridge < 0:
            raise ValueError(f"ProximalRegularizer needs reg_lambda > 0 and ridge >= 0, got {reg_lambda}, {ridge}")
        self.reg_lambda, self.in_loss, self.ridge = float(reg_lambda), bool(in_loss), float(ridge)
        self.anchors: dict[str, Tensor] | None = None
        self.tasks_learned = 0
        self._open = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(reg_lambda=self.reg_lambda)

    # -- framework-neutral API ---------------------------------------------------------------------
    def begin_experience(self, module: nn.Module) -> None:
        """Anchor at the current parameters (``w_0 = 0`` before the first task); idempotent within an experience."""
        if self._open:
            return
        with torch.no_grad():
            self.anchors = {
                n: p.detach().clone() if self.tasks_learned else torch.zeros_like(p)
                for n, p in module.named_parameters()
                if p.requires_grad
            }
        self._open = True

    def end_experience(self, module: nn.Module) -> None:
        """Close the experience: the next :meth:`begin_experience` anchors at the solution reached."""
        if self._open:
            self.tasks_learned += 1
            self._open = False

    def _pairs(self, module: nn.Module) -> list[tuple[Tensor, Tensor]]:
        if self.anchors is None:
            raise ValueError(
                "ProximalRegularizer has no anchor yet: begin_experience(module) was not called (add it to the "
                "callbacks)"
            )
        params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        if params.keys() != self.anchors.keys():
            raise ValueError(
                f"ProximalRegularizer anchors {sorted(self.anchors)[:5]} do not match the module's trainable parameters"
            )
        return [(params[n], a) for n, a in self.anchors.items()]

    def penalty(self, module: nn.Module) -> Tensor:
        """``(lambda/2)||w - anchor||^2 + (ridge/2)||w||^2`` (differentiable; add it to the loss with
        ``in_loss=True``)."""
        return proximal_penalty(self._pairs(module), self.reg_lambda, self.ridge)

    def anchor_vector(self, module: nn.Module) -> Tensor:
        """The anchor as one flat vector, in the order of the module's trainable parameters."""
        return torch.cat([a.reshape(-1) for _, a in self._pairs(module)])

    def add_gradient(self, module: nn.Module) -> None:
        """Add the penalty's gradient ``lambda (w - anchor) + ridge w`` to ``.grad`` (``in_loss=False``)."""
        if not self.in_loss:
            add_proximal_gradient(self._pairs(module), self.reg_lambda, self.ridge)

    # -- Lightning hooks ---------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.in_loss and any(isinstance(o, torch.optim.LBFGS) for o in trainer.optimizers):
            raise ValueError(
                "ProximalRegularizer(in_loss=False) adds its gradient after backward, but L-BFGS's line search reads "
                "the loss value: use in_loss=True and add regularizer.penalty(self) to the training loss"
            )
        self.begin_experience(pl_module)  # a fit resumed mid-experience restored it open: it keeps the saved anchor

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.add_gradient(pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.end_experience(pl_module)

    # -- Avalanche plugin hooks (duck-typed: no Avalanche import) ------------------------------------
    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.begin_experience(strategy.model)

    def before_update(self, strategy: Any, **kwargs: Any) -> None:
        self.add_gradient(strategy.model)

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.end_experience(strategy.model)

    # -- state -------------------------------------------------------------------------------------
    def progress(self) -> Tensor:
        """``(tasks_learned, experience open)`` as a tensor (a module owning the regulariser keeps it in its
        state_dict)."""
        return torch.tensor([self.tasks_learned, int(self._open)])

    def load_progress(self, progress: Tensor) -> None:
        """Restore :meth:`progress` (e.g. a module reset to its initial state starts over at ``w_0 = 0``)."""
        self.tasks_learned, self._open = int(progress[0]), bool(progress[1])

    def state_dict(self) -> dict[str, Any]:
        anchors = None if self.anchors is None else {n: a.clone() for n, a in self.anchors.items()}
        return {
            "anchors": anchors,
            "tasks_learned": self.tasks_learned,
            "open": self._open,
            "reg_lambda": self.reg_lambda,
            "ridge": self.ridge,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        theirs = (state_dict.get("reg_lambda", self.reg_lambda), state_dict.get("ridge", self.ridge))
        if theirs != (self.reg_lambda, self.ridge):
            raise ValueError(
                f"checkpoint's ProximalRegularizer has (reg_lambda, ridge)={theirs}, this one "
                f"{(self.reg_lambda, self.ridge)}"
            )
        anchors = state_dict.get("anchors")
        self.anchors = None if anchors is None else {n: a.clone() for n, a in anchors.items()}
        self.tasks_learned, self._open = int(state_dict.get("tasks_learned", 0)), bool(state_dict.get("open", False))
