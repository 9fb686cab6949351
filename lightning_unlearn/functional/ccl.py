"""Certified unlearning in continual learning ([CCL]), pure torch (noise calibration: :mod:`lightning_unlearn.privacy`).

Equation numbers refer to [CCL]. Tasks are indexed ``0..t-1`` in learning order.
Each task ``i`` is solved as ``w_i = argmin mean_{z in D_i} l(w; z) + (lambda/2)||w - w_{i-1}||^2``
(Eq. (1), with the mean task loss of [CCL] Sec. 5.1) from the anchor ``start_i`` (``w_0 = 0`` for the first task);
``H_i`` is the mean Hessian of ``l`` (which includes the ``l2`` ridge, so ``mu = l2``) at ``end_i``.

Task status for a request: ``"kept"``, ``"deleted"`` (the whole task) or ``"partial"`` (some of
its samples; [derived]: [CCL] gives no formula).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_unlearn.functional import autodiff
from lightning_unlearn.functional.newton import cholesky_solve, conjugate_gradients


# -- notes shared by the noise-adding strategies ------------------------------------------------
# -- [CCL]: tasks, transport and the Hessian-based correction ---------------------------------------
@dataclass
class TaskStatus:
    """What a request leaves of task ``i``: ``n`` samples learned, ``m`` forgotten (by now, incl. this request)."""

    n: int
    m: int

    @property
    def kind(self) -> str:
        return "kept" if self.m == 0 else "deleted" if self.m >= self.n else "partial"


def retained_after(status: Sequence[TaskStatus], a: int) -> int:
    """``kappa_t(a)``: number of tasks after ``a`` (up to the latest) that are not fully deleted."""
    return sum(1 for s in status[a + 1 :] if s.kind != "deleted")


def partial_rhs(lam: float, n: int, m: int, grad_sum: Tensor, delta_i: Tensor) -> Tensor:
    """[derived] The right-hand side of the linearised change of a task's solution when ``m`` of its ``n`` samples go,
    ``delta_i = (H_i + lambda I)^{-1} r_i`` with

    ``r_i = (1/(n-m)) sum_{u in U} grad l(w_i; u) - (m/(n-m)) lambda Delta_i``
    (``H_i^{-U}`` approximated by ``H_i``).
    """
    return grad_sum / (n - m) - (m / (n - m)) * lam * delta_i


def hessian_correction(
    status: Sequence[TaskStatus],
    starts: Sequence[Tensor],
    ends: Sequence[Tensor],
    current: Tensor,
    solves: Sequence[Callable[[Tensor], Tensor] | None],
    grad_sums: Sequence[Tensor | None],
    lam: float,
) -> Tensor:
    """Corrected Eq. (13) in Horner form ([interp], index fix ``i not in S_<=t``).

    Runs the linearised error recursion ``e_i = retrain_i - end_i`` over all tasks:
    a kept task maps ``e <- P_i (e - D_{i-1})``, a deleted task ``e <- e - D_{i-1} + Delta_i``, and
    a partially deleted one ``e <- P_i (e - D_{i-1}) + delta_i`` ([derived]; one solve,
    ``(H_i + lambda I)^{-1} (lambda (e - D_{i-1}) + r_i)``, :func:`partial_rhs`), where
    ``P_i = (H_i + lambda I)^{-1} lambda`` (the operator of Eq. (13)),
    ``D_{i-1} = start_i - end_{i-1}`` is what was actually done to the model between tasks (the
    previous unlearning updates ``Delta-bar_tau`` of Eq. (13), measured from the recorded chain
    rather than stored, so it stays exact whatever was published) and ``Delta_i = start_i - end_i``.
    Returns the update to add to ``current`` (the model now) so that it approximates retraining.
    """
    e = torch.zeros_like(current)
    prev_end = torch.zeros_like(current)  # end_{-1} = w_0 = start_0 for the first task
    for i, s in enumerate(status):
        e = e - (starts[i] - prev_end)
        if s.kind == "deleted":
            e = e + (starts[i] - ends[i])
        else:
            solve = solves[i]
            if solve is None:
                raise ValueError(f"task {i} is {s.kind} but has no Hessian solve")
            rhs = lam * e  # the transport P_i e = (H_i + lambda I)^{-1} lambda e
            if s.kind == "partial":
                grad_sum = grad_sums[i]
                if grad_sum is None:
                    raise ValueError(f"task {i} is partially deleted but has no sum of its forgotten gradients")
                rhs += partial_rhs(lam, s.n, s.m, grad_sum, starts[i] - ends[i])  # P_i e + delta_i: one solve
            e = solve(rhs)
        prev_end = ends[i]
    return e - (current - prev_end)


# -- [CCL]: noise bounds -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CLConstants:
    """Assumption 2.1 constants: ``lipschitz`` L, ``smoothness`` M, ``strong_convexity`` mu; and [CCL]'s
    ``reg_lambda``."""

    lipschitz: float
    smoothness: float
    strong_convexity: float
    reg_lambda: float

    @property
    def rho(self) -> float:
        """``rho = lambda / (mu + lambda)`` (Theorem 3.1)."""
        return self.reg_lambda / (self.strong_convexity + self.reg_lambda)

    def injection(self, s: TaskStatus) -> float:
        """Bound on the perturbation a deleted task injects: ``||Delta_s|| <= L/lambda`` (proof of Thm. 4.1),
        or for a partial task [derived] ``2 m L / ((n - m)(mu + lambda))``."""
        if s.kind == "deleted":
            return self.lipschitz / self.reg_lambda
        return 2 * s.m * self.lipschitz / ((s.n - s.m) * (self.strong_convexity + self.reg_lambda))


def _gap_kappas(status: Sequence[TaskStatus], gaps: Sequence[float]) -> list[tuple[int, float]]:
    """``(kappa, ||D||)`` for the gap before each task: it is transported by the retained tasks from that task on."""
    return [(retained_after(status, i - 1), g) for i, g in enumerate(gaps) if g > 0]


def sensitivity_natural_forgetting(
    status: Sequence[TaskStatus], c: CLConstants, gaps: Sequence[float] = ()
) -> dict[str, float]:
    """``gamma^NF = sum_{s in S_<=t} rho^{kappa_t(s)} ||injection_s||`` (Theorem 4.1, Eq. (9), with the
    conservative exponent ``kappa_t(s)`` and the [derived] partial-task injection).

    ``gaps[i] = ||start_i - end_{i-1}||``: what was done to the model between tasks (earlier
    published noise, if training continued from it). [derived] Each is transported like a
    deletion, adding ``rho^kappa ||gap||`` (data-dependent; 0 when training continued from the
    internal model, as Alg. 1 prescribes).
    """
    deletions = sum(
        c.rho ** retained_after(status, i) * c.injection(s) for i, s in enumerate(status) if s.kind != "kept"
    )
    chain = sum(c.rho**k * g for k, g in _gap_kappas(status, gaps))
    return {"sensitivity": deletions + chain, "deletion_term": deletions, "chain_term": chain, "rho": c.rho}


def sensitivity_hessian(status: Sequence[TaskStatus], c: CLConstants, gaps: Sequence[float] = ()) -> dict[str, float]:
    """``gamma^H``: bound on ``||retrain - (model + Eq. (13) correction)||`` ([interp, derived], via Lemma D.2).

    Each deleted/partial task contributes ``kappa rho^kappa (M - mu)/(mu + lambda) * injection``
    (the product-of-transports mismatch; 0 when nothing is transported) and a partial task also
    its own Newton error ``rho^kappa (M - mu)/(mu + lambda) * injection`` [derived]. [CCL]'s
    ``Delta-bar_tau`` terms become the measured gaps ``||start_i - end_{i-1}||`` between tasks
    (earlier corrections plus any published noise training continued from), each adding
    ``kappa rho^kappa (M - mu)/(mu + lambda) ||gap||`` [derived, data-dependent: [CCL]'s
    data-independent ``B-bar_tau`` cannot cover noise]. With ``mu = 0`` rho = 1 and nothing decays.
    """
    ratio = max(c.smoothness - c.strong_convexity, 0.0) / (c.strong_convexity + c.reg_lambda)
    transport_term = newton_term = 0.0
    for i, s in enumerate(status):
        if s.kind == "kept":
            continue
        kappa = retained_after(status, i)
        transport_term += kappa * c.rho**kappa * ratio * c.injection(s)
        if s.kind == "partial":
            newton_term += c.rho**kappa * ratio * c.injection(s)
    chain = sum(k * c.rho**k * ratio * g for k, g in _gap_kappas(status, gaps))
    return {
        "sensitivity": transport_term + newton_term + chain,
        "transport_term": transport_term,
        "newton_term": newton_term,
        "chain_term": chain,
        "rho": c.rho,
    }


# -- Hessian estimation at a task's solution ([CCL] Alg. 2 line 5) --------------------------------------
def _chunks(x: Tensor, y: Tensor, chunk_size: int | None) -> list[tuple[Tensor, Tensor, float]]:
    """Sample blocks of ``chunk_size`` with their weight ``len(block)/n`` in the mean (bounds peak memory)."""
    step = chunk_size or len(x)
    return [(x[k : k + step], y[k : k + step], min(step, len(x) - k) / len(x)) for k in range(0, len(x), step)]


def dense_hessian(
    loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = 256
) -> Tensor:
    """``H = (1/n) sum_z hess l(theta; z)``, dense ``(d, d)`` ([CCL] Alg. 2 line 5), ``chunk_size`` samples at a
    time."""
    H = torch.zeros(theta.numel(), theta.numel(), dtype=theta.dtype, device=theta.device)
    for xb, yb, weight in _chunks(x, y, chunk_size):
        H += autodiff.batch_hessian(loss, theta, xb, yb, chunk_size) * weight
    return H


def hessian_operator(
    loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = 256
) -> Callable[[Tensor], Tensor]:
    """``V -> V H`` for the rows of ``V`` (``H`` the mean Hessian over all of ``x``), by chunked batched HVPs."""

    def apply(V: Tensor) -> Tensor:
        parts = [autodiff.hvps(loss, theta, xb, yb, V, chunk_size=8) * w for xb, yb, w in _chunks(x, y, chunk_size)]
        return torch.stack(parts).sum(0)

    return apply


def hutchinson_diagonal(
    apply_h: Callable[[Tensor], Tensor],
    dim: int,
    n_probes: int,
    floor: float,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Hutchinson's estimate ``diag(H) ~ mean_k z_k * (H z_k)`` with Rademacher probes, clamped below at
    ``floor`` (the ridge ``mu``, a lower bound of the true diagonal). [approximation, not in [CCL]]"""
    Z = (torch.randint(0, 2, (n_probes, dim), generator=generator) * 2 - 1).to(dtype=dtype, device=device)
    return (Z * apply_h(Z)).mean(0).clamp_min(floor)


def is_exact(H: Tensor | dict[str, Tensor]) -> bool:
    """Whether a recorded Hessian is the task's exact mean Hessian: dense ``(d, d)`` or factored (``{"factor",
    "ridge", "top"}``, :func:`factored_solver`); a diagonal or low-rank record is an approximation."""
    return "factor" in H if isinstance(H, dict) else H.ndim == 2


#: conjugate-gradient iterations after which :func:`factored_solver` solves directly (Woodbury)
FACTORED_CG_ITERATIONS = 300


def _local(t: Tensor) -> Tensor:
    return t


@dataclass(frozen=True)
class Shards:
    """How the rows of a factor ``F`` sharded over processes (each holds some rows, ``F^T F`` is the sum of their
    ``F_r^T F_r``) are summed and gathered; the default is one process holding every row.

    Args:
        all_reduce: a tensor summed over the processes (a collective: every process calls it with a tensor of the same
            shape, in the same order; e.g. ``trainer.strategy.reduce(t, reduce_op="sum")``).
        gather: every process's rows concatenated along dim 0, in rank order (a collective).
    """

    all_reduce: Callable[[Tensor], Tensor] = _local
    gather: Callable[[Tensor], Tensor] = _local


#: one process holding every row
ONE_PROCESS = Shards()


def gauss_newton_operator(factor: Tensor, shift: float, shards: Shards = ONE_PROCESS) -> Callable[[Tensor], Tensor]:
    """``v -> F^T (F v) + shift v`` for ``F`` (``r x d``) whose rows are sharded over ``shards`` (this process's
    ``F_r^T (F_r v)``, then one all-reduce of ``d`` numbers)."""

    def apply(v: Tensor) -> Tensor:
        F = factor.to(v)
        return shards.all_reduce(F.T @ (F @ v)).add_(v, alpha=shift)

    return apply


def factored_solver(
    factor: Tensor, ridge: float, top: float, lam: float, shards: Shards = ONE_PROCESS
) -> Callable[[Tensor], Tensor]:
    """``v -> (F^T F + c I)^{-1} v``, ``c = ridge + lambda``, for a Hessian stored factored, ``H = F^T F + ridge I``
    (``F``: ``r x d``, :func:`~lightning_unlearn.functional.newton.gauss_newton_factor` scaled by ``1/sqrt(n)``; its
    rows possibly sharded over processes, ``shards``).

    Conjugate gradients on ``v -> F^T (F v) + c v`` (:func:`gauss_newton_operator`: two ``O(r d)`` products per
    iteration, one all-reduce under sharding), from 0, to
    :func:`~lightning_unlearn.functional.newton.conjugate_gradients`' stopping rule ``||b - A x|| <= sqrt(d) eps
    ||A|| ||x||`` (the accuracy of a dense solve; ``||A|| <= top + lambda``, ``top`` the largest eigenvalue of ``H``);
    the condition number is at most ``(top + lambda) / c``, so few iterations. Sharded, every process runs the same
    iterations: each product is all-reduced, so every vector and scalar of the iteration is the same on every
    process (``v`` must be). If CG has not met the rule in :data:`FACTORED_CG_ITERATIONS`, the Woodbury identity
    ``(1/c) (v - F^T (c I + F F^T)^{-1} F v)`` with a Cholesky factor of the ``r x r`` matrix (``O(r^2 d)``, once per
    solver); sharded, it gathers every row on every process for each such solve (rare; ``docs/scale.md``). [derived]
    """
    c = ridge + lam
    cache: list[Tensor] = []

    def woodbury(v: Tensor) -> Tensor:
        F = shards.gather(factor).to(v)
        if not cache:
            gram = F @ F.T
            gram.diagonal().add_(c)
            cache.append(torch.linalg.cholesky(gram))
        inner = cholesky_solve(cache[0], (F @ v).reshape(-1, 1)).reshape(-1)
        return (v - F.T @ inner) / c

    def solve(v: Tensor) -> Tensor:
        apply = gauss_newton_operator(factor, c, shards)
        x, _, converged = conjugate_gradients(
            apply, v, lambda r: r / c, torch.zeros_like(v), top + lam, FACTORED_CG_ITERATIONS
        )
        return x if converged else woodbury(v)

    return solve


def inverse_solver(
    H: Tensor | dict[str, Tensor], floor: float, lam: float, shards: Shards = ONE_PROCESS
) -> Callable[[Tensor], Tensor]:
    """A function applying ``(H + lambda I)^{-1}`` (the operator of Eq. (13)) for a recorded Hessian:
    Cholesky for a dense ``(d, d)`` matrix, elementwise for a diagonal ``(d,)``, :func:`factored_solver` for
    ``{"factor", "ridge", "top"}`` (the factor's rows sharded over ``shards``) and :func:`lowrank_inverse` for
    ``{"values", "vectors"}`` (complement curvature ``floor``)."""
    if isinstance(H, dict) and "factor" in H:
        return factored_solver(H["factor"], float(H["ridge"]), float(H["top"]), lam, shards)
    if isinstance(H, dict):
        return lowrank_inverse(H["values"], H["vectors"], floor, lam)
    if H.ndim == 1:
        return lambda v: v / (H.to(v) + lam)
    damped = H.clone()  # H + lambda I without the d x d identity and its product (same values)
    damped.diagonal().add_(lam)
    chol = torch.linalg.cholesky(damped)
    return lambda v: cholesky_solve(chol, v.reshape(-1, 1).to(chol)).reshape(-1).to(v)


# -- low-rank Hessian approximation (not in the paper) ------------------------------------------------
def lanczos(
    apply_h: Callable[[Tensor], Tensor],
    dim: int,
    rank: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """Top of the spectrum of a symmetric operator from ``rank`` HVPs: Lanczos with full
    reorthogonalisation. Returns Ritz values ``(k,)`` and orthonormal Ritz vectors ``(d, k)``.
    [approximation, not in [CCL]] Used by ``CCLHessianRecorder(hessian="lowrank")``.
    """
    Q = torch.zeros(rank + 1, dim, dtype=dtype, device=device)
    q = torch.randn(dim, generator=generator, dtype=dtype).to(device)
    Q[0] = q / q.norm()
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(rank):
        w = apply_h(Q[j]) - (betas[-1] * Q[j - 1] if betas else 0)
        alphas.append(float(w @ Q[j]))
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)  # full reorthogonalisation (twice is enough)
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        beta = float(w.norm())
        if beta < 1e-10 * max(abs(a) for a in alphas) or j == rank - 1:
            break
        betas.append(beta)
        Q[j + 1] = w / beta
    k = len(alphas)
    off = torch.tensor(betas[: k - 1], dtype=dtype, device=device)
    T = torch.diag(torch.tensor(alphas, dtype=dtype, device=device)) + torch.diag(off, 1) + torch.diag(off, -1)
    values, vectors = torch.linalg.eigh(T)
    return values, Q[:k].T @ vectors


def lowrank_inverse(values: Tensor, vectors: Tensor, floor: float, lam: float) -> Callable[[Tensor], Tensor]:
    """``(H + lambda I)^{-1}`` for ``H ~ V diag(values) V^T + floor (I - V V^T)`` (the complement of the
    Ritz space is given the smallest curvature ``floor = mu``, the ridge's strong convexity)."""

    def solve(v: Tensor) -> Tensor:
        coeff = vectors.T.to(v) @ v
        return vectors.to(v) @ (coeff / (values.to(v) + lam)) + (v - vectors.to(v) @ coeff) / (floor + lam)

    return solve
