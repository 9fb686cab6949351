"""The L1 penalty of l1-sparse unlearning, pure torch ([Sparse]: Jia et al., *Model Sparsity Can Simplify Machine
Unlearning*).

l1-sparse fine-tuning minimises ``L(w; D_r) + gamma_e ||w||_1`` on the retained data, with the
penalty's coefficient decaying linearly over the unlearning epochs, as in the authors' code
(``unlearn/FT.py``, ``FT_iter``): ``gamma_e = gamma (1 - e / (E - E_0))`` for epochs
``e < E - E_0`` and ``0`` for the last ``E_0`` epochs (``no_l1_epochs``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def l1_coefficient(gamma: float, epoch: int, epochs: int, no_l1_epochs: int = 0) -> float:
    """``gamma_e`` of epoch ``epoch`` (0-based) of ``epochs``: ``gamma (1 - e / (E - E_0))``, then 0.

    Like the authors' code, ``E_0 = E`` (no decaying epochs at all) keeps ``gamma`` constant.

    Raises:
        ValueError: ``gamma < 0``, ``epoch`` outside ``[0, epochs)`` or ``no_l1_epochs`` outside ``[0, epochs]``.
    """
    if not gamma >= 0:
        raise ValueError(f"the L1 coefficient gamma must be >= 0, got {gamma}")
    if not 0 <= epoch < epochs:
        raise ValueError(f"epoch {epoch} is outside [0, {epochs})")
    if not 0 <= no_l1_epochs <= epochs:
        raise ValueError(f"no_l1_epochs must lie in [0, epochs={epochs}], got {no_l1_epochs}")
    decaying = epochs - no_l1_epochs
    if decaying == 0:
        return float(gamma)
    return float(gamma) * (1 - epoch / decaying) if epoch < decaying else 0.0


def l1_norm(params: Iterable[Tensor]) -> Tensor:
    """``||w||_1`` over all ``params`` taken together (differentiable).

    Raises:
        ValueError: no parameters.
    """
    norms = [p.abs().sum() for p in params]
    if not norms:
        raise ValueError("the L1 penalty needs at least one parameter")
    return torch.stack(norms).sum()
