"""L2-regularised softmax regression solved to a computed gradient tolerance: the math of [CR] and of our
computed certificate ([derived], ``docs/certified_head.md``).

The problem is a softmax-regression head ``z = W^T a`` on fixed features ``a`` (a frozen backbone's output,
or the raw inputs; a bias is the weight of a constant feature 1 appended to ``a``, regularised like every
other weight), ``W`` of shape ``(p, K)``, over the retained samples ``(a_i, y_i)``, ``i = 1..n``:

    F(W) = (1/n) sum_i CE(W^T a_i, y_i) + (l2/2) ||W||_F^2 + <B, W>/n                      (1)

``B`` is [CR]'s loss perturbation ``b`` (Sec. 3.2; zero without it). [CR] writes the sum form
``L_b(w; D) = sum_i l(w; x_i) + (l2 n/2)||w||^2 + b^T w = n F(w)``: its gradient is ``n`` times ours.

Every CE term is convex, so ``F`` is ``l2``-strongly convex and has one minimiser ``W*``; for any ``W``

    ||W - W*||_F <= ||grad F(W)||_F / l2                                                     (2)

(strong convexity: ``<grad F(W) - grad F(W*), W - W*> >= l2 ||W - W*||^2`` with ``grad F(W*) = 0``, then
Cauchy-Schwarz). (2) turns a *computed* gradient norm into a certified distance to the exact retrained
optimum. The gradient is computed in floating point: :func:`gradient_error_bound` bounds the rounding
error of the computed gradient (a standard summation bound [derived]) and is added to its norm, so the
certified distance also holds for the exact-arithmetic gradient.

:func:`solve` minimises (1) by Newton's method with conjugate-gradient inner solves (Hessian-vector
products only, never a ``pK x pK`` matrix), a Kronecker-factored preconditioner and an Armijo line search,
until the certified gradient norm is at most the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor

_EPS = torch.finfo(torch.float64).eps


@dataclass(frozen=True)
class SoftmaxProblem:
    """Objective (1) over the retained samples.

    Args:
        features: ``(n, p)`` float64 features ``a_i`` (a bias column of ones included by the caller).
        labels: ``(n,)`` class indices.
        num_classes: ``K`` (>= 2).
        l2: the ridge coefficient ``l2 > 0`` (the strong-convexity modulus of (1)).
        perturbation: [CR]'s ``b`` as a ``(p, K)`` matrix, or ``None``.
    """

    features: Tensor
    labels: Tensor
    num_classes: int
    l2: float
    perturbation: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.l2 > 0:
            raise ValueError(f"softmax regression needs l2 > 0 (strong convexity), got {self.l2}")
        if self.num_classes < 2:
            raise ValueError(f"softmax regression needs at least 2 classes, got {self.num_classes}")
        if len(self.features) < 1:
            raise ValueError("softmax regression over no retained samples: nothing to fit")
        if self.features.ndim != 2 or len(self.features) != len(self.labels):
            raise ValueError(
                f"features must be (n, p) with one label per row, got {tuple(self.features.shape)} and "
                f"{tuple(self.labels.shape)}"
            )

    @property
    def count(self) -> int:
        """``n``, the number of samples."""
        return len(self.features)

    @property
    def shape(self) -> tuple[int, int]:
        """The shape ``(p, K)`` of ``W``."""
        return self.features.shape[1], self.num_classes

    def restricted(self, keep: Tensor) -> SoftmaxProblem:
        """The problem over the rows ``keep`` (a boolean mask or indices)."""
        return replace(self, features=self.features[keep], labels=self.labels[keep])


def probabilities(W: Tensor, problem: SoftmaxProblem) -> Tensor:
    """Softmax outputs ``p_i`` of every sample, ``(n, K)``."""
    return torch.softmax(problem.features @ W, dim=1)


def objective(W: Tensor, problem: SoftmaxProblem) -> float:
    """``F(W)`` of (1)."""
    Z = problem.features @ W
    ce = (torch.logsumexp(Z, dim=1) - Z.gather(1, problem.labels.view(-1, 1)).squeeze(1)).sum()
    value = float(ce) / problem.count + 0.5 * problem.l2 * float((W * W).sum())
    if problem.perturbation is not None:
        value += float((problem.perturbation * W).sum()) / problem.count
    return value


def gradient(W: Tensor, problem: SoftmaxProblem) -> Tensor:
    """``grad F(W) = (1/n) sum_i a_i (p_i - e_{y_i})^T + l2 W + B/n``, shape ``(p, K)``."""
    R = probabilities(W, problem)
    R[torch.arange(len(R), device=R.device), problem.labels] -= 1
    G = (problem.features.T @ R) / problem.count + problem.l2 * W
    if problem.perturbation is not None:
        G = G + problem.perturbation / problem.count
    return G


def hessian_vector_product(W: Tensor, problem: SoftmaxProblem, V: Tensor, P: Tensor | None = None) -> Tensor:
    """``H(W) V`` for the Hessian ``(1/n) sum_i (diag(p_i) - p_i p_i^T) (x) a_i a_i^T + l2 I`` of (1).

    ``P`` are the probabilities at ``W`` (:func:`probabilities`), computed here if not given.
    """
    P = probabilities(W, problem) if P is None else P
    Z = problem.features @ V
    S = P * Z
    S = S - P * S.sum(dim=1, keepdim=True)
    return (problem.features.T @ S) / problem.count + problem.l2 * V


def gradient_error_bound(W: Tensor, problem: SoftmaxProblem) -> float:
    """An upper bound on ``||fl(grad F(W)) - grad F(W)||_F``, the rounding error of :func:`gradient` [derived].

    Entry ``(j, k)`` of the sample sum is ``sum_i a_ij r_ik`` with ``|r_ik| <= 1`` (``r_i = p_i - e_{y_i}``).
    A dot product of length ``n`` computed in any order errs by at most ``gamma_n sum_i |a_ij| |r_ik|``
    (Higham, *Accuracy and Stability of Numerical Algorithms*, eq. (3.5); ``gamma_n = n u/(1 - n u)``), and
    each computed ``r_ik`` (an exponential, a sum of ``K`` terms and a division) is within ``(2K + 8) u`` of
    its exact value, so the sample sum errs by at most ``(gamma_n + (2K + 8) u (1 + gamma_n)) sum_i |a_ij|``
    per entry; the division by ``n``, ``l2 W`` and ``B/n`` add a few ``u`` relative. The bound returned is
    twice that, summed in quadrature over the ``p K`` entries.
    """
    u = torch.finfo(problem.features.dtype).eps / 2
    n = problem.count
    gamma = n * u / (1 - n * u)
    abs_sums = problem.features.abs().sum(dim=0) / n  # (1/n) sum_i |a_ij|, per feature j
    per_entry = (gamma + (2 * problem.num_classes + 8) * u * (1 + gamma)) * abs_sums
    sample_part = math.sqrt(problem.num_classes) * float(per_entry.norm())
    rest = 4 * u * (problem.l2 * float(W.norm()) + _norm(problem.perturbation) / n)
    return 2.0 * (sample_part + rest)


def _norm(t: Tensor | None) -> float:
    return 0.0 if t is None else float(t.norm())


def certified_gradient_norm(W: Tensor, problem: SoftmaxProblem) -> tuple[float, Tensor]:
    """``(||fl(grad F(W))|| + rounding bound, fl(grad F(W)))``: an upper bound on the exact gradient norm."""
    G = gradient(W, problem)
    return float(G.norm()) + gradient_error_bound(W, problem), G


def distance_bound(gradient_norm: float, l2: float) -> float:
    """``||W - W*|| <= ||grad F(W)|| / l2``, eq. (2) (strong convexity)."""
    return gradient_norm / l2


@dataclass(frozen=True)
class FeatureCurvature:
    """The ``p x p`` half of :class:`KroneckerPreconditioner`: ``C = sum_i s_i a_i a_i^T / sum_i s_i``.

    The weights ``s_i = tr(diag(p_i) - p_i p_i^T)`` are taken once, at the point the curvature is built (e.g. the
    solution of an experience), and kept per row, so that removing rows is an exact rank-``m`` downdate
    (:meth:`restricted`) and the eigendecomposition (``O(p^3)``) is the only per-request cost.

    Args:
        weighted_sum: ``sum_i s_i a_i a_i^T``.
        weights: ``s_i`` of every row of the problem it was built for.
    """

    weighted_sum: Tensor
    weights: Tensor

    @classmethod
    def at(cls, W: Tensor, problem: SoftmaxProblem) -> FeatureCurvature:
        """The curvature of ``problem``'s rows weighted at ``W``: ``O(n p^2)``."""
        P = probabilities(W, problem)
        s = (P * (1 - P)).sum(dim=1)
        return cls((problem.features * s.unsqueeze(1)).T @ problem.features, s)

    def restricted(self, problem: SoftmaxProblem, keep: Tensor) -> FeatureCurvature:
        """The curvature of the rows ``keep`` (a boolean mask over ``problem``'s rows): the others subtracted."""
        drop = ~keep
        A, s = problem.features[drop], self.weights[drop]
        return FeatureCurvature(self.weighted_sum - (A * s.unsqueeze(1)).T @ A, self.weights[keep])

    def eigh(self) -> tuple[Tensor, Tensor]:
        """Eigenvalues and eigenvectors of ``C``."""
        total = max(float(self.weights.sum()), torch.finfo(self.weighted_sum.dtype).tiny)
        values, vectors = torch.linalg.eigh(self.weighted_sum / total)
        return values.clamp_min(0), vectors


class KroneckerPreconditioner:
    """``(S (x) C + l2 I)^{-1}``, an approximate inverse Hessian of (1) [derived].

    The Hessian is ``(1/n) sum_i S_i (x) a_i a_i^T + l2 I`` with ``S_i = diag(p_i) - p_i p_i^T``. Replacing
    each ``a_i a_i^T`` by its ``s_i``-weighted mean ``C`` (``s_i = tr S_i``; :class:`FeatureCurvature`) and
    ``S_i`` by their mean ``S`` keeps the trace of the sum and gives a Kronecker product, whose inverse (plus
    ``l2 I``) is applied with the eigendecompositions of the ``K x K`` matrix ``S`` and the ``p x p`` matrix
    ``C``: ``O(p^2 K + K^2 p)`` per application. It is only a preconditioner: the certificate rests on the
    computed gradient, never on it.

    Args:
        W: the point whose probabilities give ``S``.
        problem: the problem.
        curvature: the eigendecomposition of ``C`` (:meth:`FeatureCurvature.eigh`).
    """

    def __init__(self, W: Tensor, problem: SoftmaxProblem, curvature: tuple[Tensor, Tensor]) -> None:
        P = probabilities(W, problem)
        lam_S, self.U = torch.linalg.eigh((torch.diag(P.sum(dim=0)) - P.T @ P) / problem.count)
        lam_C, self.V = curvature
        self.denominator = lam_C.unsqueeze(1) * lam_S.clamp_min(0).unsqueeze(0) + problem.l2

    def __call__(self, R: Tensor) -> Tensor:
        return self.V @ ((self.V.T @ R @ self.U) / self.denominator) @ self.U.T


@dataclass(frozen=True)
class Solution:
    """A point of (1) and its certificate.

    Args:
        W: the point, ``(p, K)``.
        gradient_norm: ``||grad F(W)||`` as computed plus :func:`gradient_error_bound` (an upper bound on
            the exact norm).
        newton_steps: Newton iterations taken.
        hessian_products: Hessian-vector products (CG iterations) over all Newton iterations.
        converged: whether ``gradient_norm <= tolerance``.
    """

    W: Tensor
    gradient_norm: float
    newton_steps: int
    hessian_products: int
    converged: bool

    @property
    def work(self) -> int:
        """Passes over the data: one per gradient, objective or Hessian-vector product."""
        return self.hessian_products + 2 * self.newton_steps + 1


def _conjugate_gradient(
    matvec: Callable[[Tensor], Tensor],
    b: Tensor,
    tolerance: float,
    precondition: Callable[[Tensor], Tensor],
    max_iterations: int,
) -> tuple[Tensor, int]:
    """Preconditioned CG for ``H x = b`` until ``||H x - b|| <= tolerance``; returns ``(x, iterations)``."""
    x = torch.zeros_like(b)
    r = b.clone()
    z = precondition(r)
    d = z.clone()
    rz = float((r * z).sum())
    for k in range(1, max_iterations + 1):
        Hd = matvec(d)
        alpha = rz / float((d * Hd).sum())
        x.add_(d, alpha=alpha)
        r.sub_(Hd, alpha=alpha)
        if float(r.norm()) <= tolerance:
            return x, k
        z = precondition(r)
        rz_next = float((r * z).sum())
        d = z + (rz_next / rz) * d
        rz = rz_next
    return x, max_iterations


def solve(
    problem: SoftmaxProblem,
    W0: Tensor,
    tolerance: float,
    *,
    curvature: FeatureCurvature | None = None,
    max_newton_steps: int = 100,
    max_cg_iterations: int = 2000,
) -> Solution:
    """Minimise (1) from ``W0`` until the certified gradient norm (:func:`certified_gradient_norm`) is at most
    ``tolerance``, by inexact Newton-CG with a :class:`KroneckerPreconditioner` and an Armijo backtracking line
    search (Nocedal & Wright, *Numerical Optimization*, Alg. 7.1; CG tolerance ``max(min(1/2, sqrt(||g||)) ||g||,
    tolerance/3)``).

    ``curvature`` (e.g. kept from the last solve and downdated) saves building it at ``W0`` (``O(n p^2)``).
    Returns the last point with its certified gradient norm; ``converged`` is False if ``max_newton_steps``
    ran out (the caller decides: the certificate of (2) needs the tolerance met).

    Raises:
        ValueError: ``tolerance`` is not positive, or ``W0`` does not have the problem's shape.
    """
    if not tolerance > 0:
        raise ValueError(f"the gradient tolerance must be positive, got {tolerance}")
    if tuple(W0.shape) != problem.shape:
        raise ValueError(f"W0 has shape {tuple(W0.shape)}, the problem's W is {problem.shape}")
    W = W0.to(problem.features).clone()
    basis = (curvature if curvature is not None else FeatureCurvature.at(W, problem)).eigh()
    norm, G = certified_gradient_norm(W, problem)
    value = objective(W, problem)
    products = 0
    for step in range(max_newton_steps):
        if norm <= tolerance:
            return Solution(W, norm, step, products, True)
        P = probabilities(W, problem)
        precondition = KroneckerPreconditioner(W, problem, basis)
        g = float(G.norm())
        # inexact Newton's forcing term, but never below what the tolerance needs: the step's gradient is about the
        # CG residual (plus a quadratic remainder), so a residual of a third of the tolerance suffices
        forcing = max(min(0.5, math.sqrt(g)) * g, tolerance / 3)
        direction, k = _conjugate_gradient(
            partial(hessian_vector_product, W, problem, P=P), -G, forcing, precondition, max_cg_iterations
        )
        products += k
        slope = float((G * direction).sum())
        t = 1.0
        while True:  # Armijo: F(W + t d) <= F(W) + 1e-4 t g^T d (d is a descent direction: H is positive definite)
            candidate = W + t * direction
            new_value = objective(candidate, problem)
            # the last term forgives rounding of F itself, where the decrease is at the level of its last bits
            if new_value <= value + 1e-4 * t * slope + 16 * _EPS * abs(value) or t < 1e-12:
                break
            t *= 0.5
        W, value = candidate, new_value
        norm, G = certified_gradient_norm(W, problem)
    return Solution(W, norm, max_newton_steps, products, norm <= tolerance)


def newton_step(
    problem: SoftmaxProblem,
    W: Tensor,
    *,
    tolerance: float,
    curvature: FeatureCurvature | None = None,
    max_cg_iterations: int = 2000,
) -> tuple[Tensor, int]:
    """One Newton step ``W - H(W)^{-1} grad F(W)`` on ``problem`` ([CR] Sec. 3.1, the removal update
    ``w^- = w + H^{-1} Delta`` with ``Delta = -grad L(w; D')``: at the optimum of the data before removal,
    ``Delta = l2 w + grad l(w; x)`` as in [CR] eq. (1), and the gradient left by earlier removals is corrected too).

    The linear system is solved by preconditioned CG to a residual of ``tolerance`` (mean form); what it misses
    ends in the gradient residual, which the caller computes exactly. Returns ``(W', CG iterations)``.
    """
    G = gradient(W, problem)
    if float(G.norm()) <= tolerance:
        return W.clone(), 0
    P = probabilities(W, problem)
    direction, k = _conjugate_gradient(
        partial(hessian_vector_product, W, problem, P=P),
        -G,
        tolerance,
        KroneckerPreconditioner(W, problem, (curvature or FeatureCurvature.at(W, problem)).eigh()),
        max_cg_iterations,
    )
    return W + direction, k
