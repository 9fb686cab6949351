"""`propose_recipe`: a step size and ridge for [HF] on a linear model, chosen by the certificate they would give.

For each candidate ridge ``l2`` the closed-form constants (:func:`linear_model_constants`) fix
``M`` and ``G``; each candidate step size is a fraction of ``2/(M + l2)`` (the largest that [HF]
Lemma 3 allows). For the planned training (``epochs`` of ``ceil(n / batch_size)`` constant-rate
steps) the per-sample bound is evaluated for a sample met in the last batch of every epoch (its
worst case), summed over ``n_deletions`` deleted samples, and turned into the analytic Gaussian
sigma for ``(epsilon, delta)``. The bound is :class:`HFUnlearner`'s default, the contraction bound
[derived] (``bound="contraction"``: :func:`~lightning_unlearn.functional.bounds.sgd_bound`, its
triangle form ``D_T + A_T``, linear in the deletions), or the sum form of Eq. (56)
(``bound="paper"``, :func:`hf.per_sample_bound`).

Choice [derived, a proxy]: among the candidates whose training contracts its initial error by
``rho^T <= converged`` (the trajectory has forgotten its initialisation), the one with the smallest
noise-to-weight ratio ``sigma sqrt(d) / Theta`` (``Theta = max ||theta||`` the recipe permits, the
scale of the weights the noise is added to). Every candidate is returned, so the choice can be
inspected; no recipe outside the theorem's condition is ever proposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightning_unlearn.functional import hf
from lightning_unlearn.functional.bounds import linear_model_constants, sgd_bound
from lightning_unlearn.privacy.analysis import check_privacy_parameters, gaussian_sigma


@dataclass(frozen=True)
class Recipe:
    """A candidate training recipe and the certificate it would give (worst-case sample positions)."""

    lr: float
    l2: float
    smoothness: float
    grad_bound: float
    rho: float
    steps: int
    gamma: float
    taylor_term: float
    gradient_mismatch_term: float
    sigma: float
    noise_to_weight: float


def recipe_bound(
    feature_norm: float,
    num_classes: int,
    n_samples: int,
    *,
    lr: float,
    l2: float,
    epochs: int,
    batch_size: int,
    n_deletions: int,
    epsilon: float,
    delta: float,
    dim: int,
    bound: str = "contraction",
) -> Recipe:
    """The HF bound and sigma a constant-rate recipe would give (see the module docstring; with the contraction
    bound the Taylor term is 0 and the whole per-sample bound is reported as the gradient-mismatch term)."""
    c = linear_model_constants(feature_norm, l2, binary=num_classes == 1)
    per_epoch = math.ceil(n_samples / batch_size)
    T = epochs * per_epoch
    lrs = torch.full((T,), lr, dtype=torch.float64)
    rho = hf.contraction_factor(lrs, l2, c.smoothness)
    occurrences = torch.arange(epochs) * per_epoch + per_epoch - 1
    sizes = torch.full((T,), batch_size)
    if bound == "contraction":
        once = torch.zeros(T, dtype=torch.long).index_fill_(0, occurrences, 1)
        c1, c2 = 0.0, sgd_bound(lrs, sizes, once, c).triangle
    elif bound == "paper":
        c1, c2 = hf.per_sample_bound(occurrences, lrs, sizes, c.grad_bound, rho)
    else:
        raise ValueError(f"bound must be 'contraction' or 'paper', got {bound!r}")
    gamma = n_deletions * (c1 + c2)
    sigma = gaussian_sigma(gamma, epsilon, delta) if math.isfinite(gamma) else math.inf
    theta = c.grad_bound / (2 * l2)  # L_CE / l2: G = 2 L_CE from theta_0 = 0
    return Recipe(
        lr,
        l2,
        c.smoothness,
        c.grad_bound,
        rho,
        T,
        gamma,
        n_deletions * c1,
        n_deletions * c2,
        sigma,
        sigma * math.sqrt(dim) / theta,
    )


def propose_recipe(
    feature_norm: float,
    n_features: int,
    num_classes: int,
    n_samples: int,
    *,
    epsilon: float,
    delta: float,
    n_deletions: int,
    epochs: int,
    batch_size: int,
    l2_grid: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
    lr_fractions: tuple[float, ...] = (1.0, 0.5, 0.25, 0.1),
    converged: float = 1e-2,
    bound: str = "contraction",
) -> tuple[Recipe, list[Recipe]]:
    """The proposed (lr, l2) for [HF] on a linear softmax (``num_classes >= 2``) or sigmoid (1) model, and all
    candidates.

    Args:
        feature_norm: ``max ||phi(x)||`` over the training data; ``n_features``: the width of ``phi`` (with a bias).
        num_classes: outputs of the linear layer (1: binary sigmoid).
        n_samples: training samples; ``epochs`` and ``batch_size``: the planned SGD schedule.
        epsilon, delta: the per-release target; ``n_deletions``: samples to be deleted in total.
        l2_grid, lr_fractions: candidates (step sizes as fractions of ``2/(M + l2)``).
        converged: required contraction ``rho^T`` of the initial error.
        bound: the sensitivity HF will calibrate on (``"contraction"`` or ``"paper"``).

    Raises:
        ValueError: bad privacy parameters, or no candidate converges (more epochs are needed).
    """
    check_privacy_parameters(epsilon, delta)
    dim = (n_features + 1) * num_classes
    candidates = []
    for l2 in l2_grid:
        c = linear_model_constants(feature_norm, l2, binary=num_classes == 1)
        for frac in lr_fractions:
            candidates.append(
                recipe_bound(
                    feature_norm,
                    num_classes,
                    n_samples,
                    lr=frac * c.max_lr,
                    l2=l2,
                    epochs=epochs,
                    batch_size=batch_size,
                    n_deletions=n_deletions,
                    epsilon=epsilon,
                    delta=delta,
                    dim=dim,
                    bound=bound,
                )
            )
    valid = [r for r in candidates if r.rho**r.steps <= converged]
    if not valid:
        raise ValueError(
            f"no candidate recipe contracts its initial error to {converged:g} in {epochs} epochs: train longer"
        )
    return min(valid, key=lambda r: r.noise_to_weight), candidates
