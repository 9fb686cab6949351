"""Analytic Continual Unlearning [ACU], pure torch.

Equation numbers refer to [ACU]. Rows are samples: ``F`` is ``(n, d_F)``, ``Y`` is one-hot
``(n, d_C)``, ``W`` is ``(d_F, d_C)``, ``R = sum f^T f`` and ``Q = sum f^T y`` are the additive
statistics and ``T = (R + gamma I)^{-1}`` is the knowledge tracking matrix of eq. (4).

A request of ``k`` samples has two exact paths, chosen by :func:`woodbury_is_cheaper`:

* the rank-``k`` Woodbury update of eq. (5)/(6) (:func:`forget_factors` then
  :func:`apply_tracking_update`), ``O(k d_F^2)``, the in-place update of ``T`` being its
  largest term;
* re-solving the ridge problem from ``R - F^T F`` (:func:`resolve`), ``O(d_F^3)``, cheaper once
  ``k`` is a sizeable fraction of ``d_F`` (the Woodbury path then pays ``O(k^2 d_F + k^3)``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lightning_unlearn.functional.newton import cholesky_solve


class WoodburyUpdate(NamedTuple):
    """A forget request in factored form: ``T_new = T + FT^T S`` and the new head ``W``.

    ``FT = F T`` and ``S = (I - F T F^T)^{-1} F T`` are ``(k, d_F)``, so the update of the
    ``d_F x d_F`` tracking matrix costs ``O(d_F k)`` memory until it is applied.
    """

    FT: Tensor
    S: Tensor
    W: Tensor


def one_hot(labels: Tensor, num_classes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """``y_j = Onehot(y_j)`` of eq. (1).

    Raises:
        ValueError: a label lies outside ``[0, num_classes)``.
    """
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got range [{int(labels.min())}, {int(labels.max())}]")
    return torch.nn.functional.one_hot(labels.long(), num_classes).to(dtype)


def accumulate(R: Tensor, Q: Tensor, F: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
    """Add a block of samples to the autocorrelation ``R = sum f^T f`` and cross term ``Q = sum f^T y``.

    This is the running-sum form of the CL-phase recursion ([ACU] Appendix C, Lemma 4): after
    all blocks, ``(R + gamma I)^{-1}`` is the tracking matrix of eq. (4) whatever the block order,
    so learning in 1 experience or in 5 gives the same statistics. Sums over disjoint blocks
    (e.g. the ranks of a DDP run) add up to the same ``R`` and ``Q``.
    """
    _check_block(R, Q, F, Y)
    return R + F.T @ F, Q + F.T @ Y


def ridge_solution(R: Tensor, Q: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """Tracking matrix ``T = (R + gamma I)^{-1}`` (eq. 4) and head ``W = T Q`` (eq. 3 / eq. 8).

    Solved through a Cholesky factorisation (``R + gamma I`` is symmetric positive definite
    for ``gamma > 0``) and two triangular solves against ``I`` (LAPACK's ``potri``, behind
    ``torch.cholesky_inverse``, ran 5x slower on CPU), then symmetrised.

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
    T = torch.cholesky_solve(torch.eye(R.shape[0], dtype=R.dtype, device=R.device), torch.linalg.cholesky(A))
    T = (T + T.T) / 2
    return T, T @ Q


def forget_factors(T: Tensor, W: Tensor, F: Tensor, Y: Tensor) -> WoodburyUpdate:
    """Eq. (5) and eq. (6) for forgetting ``(F, Y)``, with ``T`` left untouched.

    Knowledge-tracking update, eq. (5) (Woodbury identity, [ACU] Lemma 3), in factored form:
        ``T_i = T_{i-1} + FT^T S`` with ``FT = F T_{i-1}``, ``S = (I - F T_{i-1} F^T)^{-1} FT``.
    Head update, eq. (6) (= eq. 9 of Theorem 1), using ``T_i F^T = S^T`` [derived]
    (``T_i F^T = T_{i-1} F^T (I + K^{-1} F T_{i-1} F^T) = T_{i-1} F^T K^{-1}`` with
    ``K = I - F T_{i-1} F^T``):
        ``W_i = (I + T_i F^T F) W_{i-1} - T_i F^T Y = W_{i-1} + S^T (F W_{i-1} - Y)``.
    By Theorem 1, ``W_i`` equals the ridge solution (eq. 8) on the retained set. Cost:
    ``2 k d_F^2`` for ``F T`` plus ``O(k^2 d_F + k^3 + k d_F d_C)``; no ``d_F x d_F`` tensor is made.

    Raises:
        ValueError: shapes or dtypes disagree, or ``I - F T F^T`` is not positive definite
            (some rows were never learned, or were already removed).
    """
    _check_block(T, W, F, Y)
    FT = F @ T  # (k, d_F)
    K = torch.eye(F.shape[0], dtype=T.dtype, device=T.device) - FT @ F.T
    L, info = torch.linalg.cholesky_ex(K)
    if int(info):  # K is SPD exactly when every row of F was learned and not yet removed
        raise ValueError(
            "I - F T F^T is not positive definite: the features to forget were not all learned, or were already removed"
        )
    S = cholesky_solve(L, FT)
    return WoodburyUpdate(FT, S, torch.addmm(W, S.T, F @ W - Y))


def apply_tracking_update(T: Tensor, FT: Tensor, S: Tensor, alpha: float = 1.0) -> None:
    """``T += alpha FT^T S`` in place (eq. 5 with ``alpha = 1``; ``alpha = -1`` takes it back).

    One rank-``k`` ``addmm_`` into ``T``: no symmetrising copy and no new ``d_F x d_F`` tensor.
    Taking an update back restores ``T`` up to the rounding of the two additions (a few ulps
    of ``|T| + |FT^T S|`` per entry), not bit for bit.
    """
    T.addmm_(FT.T, S, alpha=alpha)


def forget(T: Tensor, W: Tensor, F: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
    """Out-of-place eq. (5)/(6): the new ``(T, W)`` after forgetting ``(F, Y)`` (``T`` untouched).

    See :func:`forget_factors`; this allocates the new ``T``, which :func:`apply_tracking_update`
    avoids.
    """
    FT, S, W_new = forget_factors(T, W, F, Y)
    return torch.addmm(T, FT.T, S), W_new


def resolve(R: Tensor, Q: Tensor, F: Tensor, Y: Tensor, ridge: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Forget ``(F, Y)`` by re-solving the ridge problem (eq. 8) from the statistics minus the block.

    Returns the new ``(R, Q, T, W)`` (``ridge`` is ``gamma``). Equal to eq. (5)/(6) by Theorem 1;
    ``O(k d_F^2 + d_F^3)``.

    Raises:
        ValueError: shapes or dtypes disagree.
    """
    _check_block(R, Q, F, Y)
    R_new, Q_new = torch.addmm(R, F.T, F, alpha=-1), torch.addmm(Q, F.T, Y, alpha=-1)
    T, W = ridge_solution(R_new, Q_new, ridge)
    return R_new, Q_new, T, W


def woodbury_flops(d_F: int, k: int) -> float:
    """Floating-point operations of one Woodbury request.

    ``F T`` and the ``addmm_`` into ``T`` (``2 k d_F^2`` each), ``F T F^T`` and the solve
    (``2 k^2 d_F`` each) and the ``k x k`` Cholesky (``k^3 / 3``).
    """
    return 4.0 * k * d_F**2 + 4.0 * k**2 * d_F + k**3 / 3


def resolve_flops(d_F: int, d_C: int) -> float:
    """Floating-point operations of a re-solve: Cholesky (``d^3/3``), two triangular solves against ``I``
    (``2 d^3``) and ``T Q``.

    Both paths also subtract ``F^T F`` from ``R`` (the Woodbury path lazily), so that term is left out.
    """
    return 7 * d_F**3 / 3 + 2.0 * d_F**2 * d_C


#: the Cholesky and triangular solves run at about half the rate of the Woodbury path's GEMMs
#: (``benchmarks/acu.py --crossover``, 2 CPU cores, float64, d_F = 2048: measured time ratio / flop ratio
#: 0.45-0.75 for k = 512..2048), so the re-solve takes over from k ~ 0.7 d_F (1,432 at d_F = 2048, d_C = 100)
RESOLVE_SLOWDOWN = 2.0


def woodbury_is_cheaper(d_F: int, d_C: int, k: int) -> bool:
    """Cost model choosing between :func:`forget_factors` (Woodbury) and :func:`resolve` for ``k`` samples."""
    return woodbury_flops(d_F, k) <= RESOLVE_SLOWDOWN * resolve_flops(d_F, d_C)


def consistency_errors(R: Tensor, Q: Tensor, T: Tensor, W: Tensor, ridge: float, probes: int = 4) -> list[str]:
    """What is inconsistent among ``R, Q, T, W`` of one ridge head (empty list: consistent).

    Checks ``W = T Q`` (eq. 3) and ``T (R + gamma I) = I`` (eq. 4), the latter on ``probes``
    random vectors (Freivalds' check, ``O(d_F^2)`` each) [derived]. The tolerance follows from
    float64 rounding (``ridge`` is ``gamma``): the computed ``T`` solves eq. (4) up to
    ``~ d_F eps kappa`` with ``kappa <= (tr R + gamma) / gamma`` a bound on the condition number
    of ``R + gamma I``, and each Woodbury request adds errors of the same order;
    ``tol = 64 d_F eps kappa`` (at most ``1e-2``, so a badly conditioned but honest state is not
    refused while a tampered one, off by O(1), still is).
    """
    d_F, d_C = T.shape[0], W.shape[1]
    given = {"R": R, "Q": Q, "T": T, "W": W}
    expected = {"R": (d_F, d_F), "Q": (d_F, d_C), "T": (d_F, d_F), "W": (d_F, d_C)}
    wrong = [f"{k} has shape {tuple(given[k].shape)}, expected {s}" for k, s in expected.items() if given[k].shape != s]
    if wrong:
        return wrong
    if not all(bool(torch.isfinite(v).all()) for v in given.values()):
        return [f"non-finite values in {[k for k, v in given.items() if not bool(torch.isfinite(v).all())]}"]
    eps = torch.finfo(T.dtype).eps
    kappa = (float(torch.diagonal(R).sum()) + ridge) / ridge
    tol = min(64 * d_F * eps * kappa, 1e-2)
    errors = []
    head_err = float((W - T @ Q).norm() / (T.norm() * Q.norm()).clamp_min(torch.finfo(T.dtype).tiny))
    if head_err > tol:
        errors.append(f"W != T Q (eq. 3): relative residual {head_err:.2e} > {tol:.1e}")
    g = torch.Generator(device=T.device).manual_seed(0)
    V = torch.randn(d_F, probes, generator=g, dtype=T.dtype, device=T.device)
    track_err = float((T @ (R @ V + ridge * V) - V).norm() / V.norm())
    if track_err > tol:
        errors.append(f"T (R + gamma I) != I (eq. 4): relative residual {track_err:.2e} > {tol:.1e}")
    return errors


def _check_block(M: Tensor, N: Tensor, F: Tensor, Y: Tensor) -> None:
    d_F, d_C = M.shape[0], N.shape[1]
    if F.ndim != 2 or F.shape[1] != d_F:
        raise ValueError(f"features must have shape (n, {d_F}), got {tuple(F.shape)}")
    if Y.ndim != 2 or Y.shape != (F.shape[0], d_C):
        raise ValueError(f"one-hot labels must have shape ({F.shape[0]}, {d_C}), got {tuple(Y.shape)}")
    if F.dtype != M.dtype or Y.dtype != M.dtype:
        raise ValueError(f"features/labels dtype {F.dtype}/{Y.dtype} differ from the statistics' {M.dtype}")
