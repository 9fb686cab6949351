"""Analytic Continual Unlearning (ACU), pure torch.

Equation numbers refer to Tang et al., "ACU: Analytic Continual Unlearning for Efficient and
Exact Forgetting with Privacy Preservation" (``shared/papers/acu_analytic_continual_unlearning.txt``).
Rows are samples: ``F`` is ``(n, d_F)``, ``Y`` is one-hot ``(n, d_C)``, ``W`` is ``(d_F, d_C)``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def one_hot(labels: Tensor, num_classes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``y_j = Onehot(y_j)`` of eq. (1)."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{int(labels.min())}, {int(labels.max())}]")
    return torch.nn.functional.one_hot(labels.long(), num_classes).to(dtype)


def accumulate(R: Tensor, Q: Tensor, F: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
    """Add a block of samples to the autocorrelation ``R = sum f^T f`` and cross term ``Q = sum f^T y``.

    This is the running-sum form of the CL-phase recursion (Appendix C, Lemma 4): after all
    blocks, ``(R + gamma I)^{-1}`` is the tracking matrix of eq. (4) whatever the block order,
    so learning in 1 experience or in 5 gives the same statistics.
    """
    _check_block(R, Q, F, Y)
    return R + F.T @ F, Q + F.T @ Y


def ridge_solution(R: Tensor, Q: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """Tracking matrix ``T = (R + gamma I)^{-1}`` (eq. 4) and head ``W = T Q`` (eq. 3 / eq. 8).

    Solved through a Cholesky factorisation (``R + gamma I`` is symmetric positive definite
    for ``gamma > 0``), then symmetrised.

    Args:
        R: autocorrelation ``sum f^T f``.
        Q: cross term ``sum f^T y``.
        ridge: the ridge regulariser, [ACU]'s ``gamma`` of eq. (2).

    Raises:
        ValueError: ``ridge`` is not positive.
    """
    if ridge <= 0:
        raise ValueError(f"the ridge regulariser must be positive, got {ridge}")
    A = R + ridge * torch.eye(R.shape[0], dtype=R.dtype, device=R.device)
    L = torch.linalg.cholesky(A)
    T = torch.cholesky_inverse(L)
    T = (T + T.T) / 2
    return T, T @ Q


def forget(T: Tensor, W: Tensor, F: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
    """Remove samples ``(F, Y)`` from an analytic head without any retained data.

    Knowledge-tracking update, eq. (5) (Woodbury identity, Lemma 3):
        ``T_i = T_{i-1} + T_{i-1} F^T (I - F T_{i-1} F^T)^{-1} F T_{i-1}``
    Head update, eq. (6) (= eq. 9 of Theorem 1):
        ``W_i = (I + T_i F^T F) W_{i-1} - T_i F^T Y``
    By Theorem 1, ``W_i`` equals the ridge solution (eq. 8) on the retained set. Cost is
    ``O(d_F^2 k + k^3)`` for ``k`` forgotten samples, against ``O(d_F^3 + N d_F^2)`` for retraining.
    """
    _check_block(T, W, F, Y)
    FT = F @ T  # (k, d_F)
    K = torch.eye(F.shape[0], dtype=T.dtype, device=T.device) - FT @ F.T
    try:
        L = torch.linalg.cholesky(K)
    except RuntimeError as err:  # K is SPD exactly when every row of F was learned and not yet removed
        raise ValueError(
            "I - F T F^T is not positive definite: the features to forget were not all learned, "
            "or were already removed"
        ) from err
    T_new = T + FT.T @ torch.cholesky_solve(FT, L)
    T_new = (T_new + T_new.T) / 2
    TF = T_new @ F.T  # (d_F, k)
    W_new = W + TF @ (F @ W) - TF @ Y
    return T_new, W_new


def _check_block(M: Tensor, N: Tensor, F: Tensor, Y: Tensor) -> None:
    d_F, d_C = M.shape[0], N.shape[1]
    if F.ndim != 2 or F.shape[1] != d_F:
        raise ValueError(f"features must have shape (n, {d_F}), got {tuple(F.shape)}")
    if Y.ndim != 2 or Y.shape != (F.shape[0], d_C):
        raise ValueError(f"one-hot labels must have shape ({F.shape[0]}, {d_C}), got {tuple(Y.shape)}")
    if F.dtype != M.dtype or Y.dtype != M.dtype:
        raise ValueError(f"features/labels dtype {F.dtype}/{Y.dtype} differ from the statistics' {M.dtype}")
