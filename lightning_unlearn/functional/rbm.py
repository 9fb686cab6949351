"""Weight-saliency masking for fine-tuning-based unlearning, pure torch ([RBM]: Ding et al.,
*Understanding Fine-tuning in Approximate Unlearning: A Theoretical Perspective*).

Two masks from the gradient of the loss at the original weights ``w_o``:

* forgetting-based (SalUn, Eq. (6)): ``m_f = 1(|grad L(w; D_f)|_{w_o} >= gamma)``; the salient
  weights are trained and the rest stay at ``w_o`` (Eq. (7));
* retention-based (RBM, Eq. (9)): ``m_r = 1(|grad L(w; D_r)|_{w_o} >= gamma)``; weights salient
  for the *remaining* data stay at ``w_o`` and the rest are trained (Eq. (10)).

Either way the update is ``w_u = u * (w_o + Delta w) + (1 - u) * w_o`` with the trainable mask
``u`` (``m_f`` or ``1 - m_r``), and ``Delta w`` minimises Eq. (8).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import torch
from torch import Tensor

Masking = Literal["retain", "forget"]
MASKINGS: tuple[Masking, ...] = ("retain", "forget")


def mean_loss_gradient(params: Mapping[str, Tensor], batch_losses: Iterable[tuple[Tensor, int]]) -> dict[str, Tensor]:
    """``grad_w L(w; D)``, the saliency gradient of Eqs. (6)/(9), from the mean losses of the batches of ``D``.

    ``batch_losses`` yields ``(L_b, n_b)``: the mean loss of batch ``b`` (a graph leading to
    ``params``) and its number of samples; the result is ``sum_b n_b grad L_b / sum_b n_b``,
    the gradient of the mean loss over ``D`` (a regulariser added to every ``L_b`` is added once).
    Returned for ``params`` by name, in float64, without touching their ``.grad``.

    Raises:
        ValueError: ``D`` has no samples.
    """
    total = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    count = 0
    for loss, n in batch_losses:
        for name, g in zip(params, torch.autograd.grad(loss * n, list(params.values()), allow_unused=True)):
            if g is not None:
                total[name] += g.double()
        count += n
    if count == 0:
        raise ValueError("the saliency gradient needs at least one sample")
    return {n: g / count for n, g in total.items()}


def saliency_mask(
    gradients: Mapping[str, Tensor], *, threshold: float | None = None, sparsity: float | None = None
) -> dict[str, Tensor]:
    """``1(|g| >= gamma)`` elementwise (Eq. (6) on ``D_f``, Eq. (9) on ``D_r``).

    Give the hard threshold ``gamma`` directly, or a ``sparsity`` in ``[0, 1)``: the fraction of all
    parameters (taken together) that is not salient, the paper's "sparsity 50%". The
    ``floor(sparsity * d)`` weights with the smallest ``|g|`` are then not salient, and neither
    are weights tied with the largest of them.
    """
    if threshold is not None and sparsity is None:
        check_saliency_level(threshold=threshold)
        return {n: g.abs() >= threshold for n, g in gradients.items()}
    if sparsity is None or threshold is not None:
        raise ValueError("saliency_mask takes exactly one of threshold (gamma) and sparsity")
    check_saliency_level(sparsity=sparsity)
    scores = {n: g.abs() for n, g in gradients.items()}
    flat = torch.cat([s.flatten() for s in scores.values()])
    k = int(sparsity * flat.numel())
    below = float(flat.kthvalue(k).values) if k > 0 else float("-inf")
    return {n: s > below for n, s in scores.items()}


def check_saliency_level(*, threshold: float | None = None, sparsity: float | None = None) -> None:
    """``ValueError`` unless ``threshold`` (if given) is positive and ``sparsity`` (if given) lies in ``[0, 1)``."""
    if sparsity is not None and not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must lie in [0, 1), got {sparsity}")
    if threshold is not None and not threshold > 0:
        raise ValueError(f"the saliency threshold gamma must be positive, got {threshold}")


def trainable_mask(salient: Mapping[str, Tensor], masking: Masking) -> dict[str, Tensor]:
    """The weights fine-tuning may move: ``m_f`` (Eq. (7), forget-based) or ``1 - m_r`` (Eq. (10), RBM)."""
    if masking == "forget":
        return dict(salient)
    if masking == "retain":
        return {n: ~m for n, m in salient.items()}
    raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}")


def masked_update(w_o: Tensor, w: Tensor, trainable: Tensor) -> Tensor:
    """``u * w + (1 - u) * w_o`` (Eq. (7)/(10) with ``w = w_o + Delta w``)."""
    return torch.where(trainable, w, w_o.to(w.dtype))
