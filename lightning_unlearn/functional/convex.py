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

**Sharded rows** (``docs/scale.md``): every product over the rows (objective, gradient, Hessian-vector product,
curvature) is a sum over samples, computed in blocks of :data:`BLOCK_ROWS` rows (in the problem's compute dtype:
float32 rows are promoted block by block) over the rows this process holds, then summed over the processes that
hold the others by one all-reduce (:class:`RankSum`); every process then runs the same Newton-CG on the same
``p x K`` numbers. Each sweep over the rows is counted in :attr:`SoftmaxProblem.passes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

import torch
from torch import Tensor

_EPS = torch.finfo(torch.float64).eps
#: the share of the tolerance (less the rounding bound) a Newton step's CG residual is brought to (:func:`cg_target`)
CG_MARGIN = 0.9
#: the share of the curvature's weight that rows removed since its eigendecomposition may hold before it is recomputed
STALE_BASIS = 0.05
#: rows per block of a sweep: bounds the ``(rows, K)`` temporaries and a float32 block's promoted copy
BLOCK_ROWS = 4096


@dataclass(frozen=True)
class RankSum:
    """How the local sums of a problem whose rows are sharded over processes become global sums.

    Args:
        all_reduce: returns the sum of a tensor over the processes (every process calls it with a tensor of the same
            shape and dtype, in the same order: a collective, e.g. ``trainer.strategy.reduce(t, reduce_op="sum")``).
        world_size: ``R``, the number of processes summed over (it enters the rounding bound,
            :func:`gradient_error_bound`).
    """

    all_reduce: Callable[[Tensor], Tensor]
    world_size: int


class PassCount:
    """The number of sweeps over the retained rows (each gradient, objective, Hessian-vector product or curvature
    build reads every row once)."""

    def __init__(self) -> None:
        self.passes = 0


@dataclass(frozen=True)
class SoftmaxProblem:
    """Objective (1) over the retained samples (this process's share of them, with ``ranks``).

    Args:
        features: ``(n, p)`` features ``a_i`` (a bias column of ones included by the caller), float64 or float32.
        labels: ``(n,)`` class indices.
        num_classes: ``K`` (>= 2).
        l2: the ridge coefficient ``l2 > 0`` (the strong-convexity modulus of (1)).
        perturbation: [CR]'s ``b`` as a ``(p, K)`` matrix, or ``None``.
        ranks: the all-reduce over the processes holding the other rows (``None``: this process holds all of them);
            every process builds the problem, and runs each function on it, together.
        dtype: the compute dtype (default: the features'); float32 rows with ``dtype=torch.float64`` are promoted
            block by block, so the arithmetic and its rounding bound are float64's.
        rows: a boolean mask of the rows of ``features`` the problem is over (``None``: all): a restricted problem
            masks its rows, it never copies them.

    Raises:
        ValueError: ``l2`` not positive, fewer than 2 classes, no row on any process, or shapes that disagree.
    """

    features: Tensor
    labels: Tensor
    num_classes: int
    l2: float
    perturbation: Tensor | None = None
    ranks: RankSum | None = None
    dtype: torch.dtype | None = None
    rows: Tensor | None = None
    #: the dtype the products are computed in (``dtype``, else the features')
    compute_dtype: torch.dtype = field(init=False)
    #: ``n``, the number of samples over every process
    count: int = field(init=False)
    #: the sweeps over the rows made on this problem
    counter: PassCount = field(init=False, default_factory=PassCount, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.l2 > 0:
            raise ValueError(f"softmax regression needs l2 > 0 (strong convexity), got {self.l2}")
        if self.num_classes < 2:
            raise ValueError(f"softmax regression needs at least 2 classes, got {self.num_classes}")
        if self.features.ndim != 2 or len(self.features) != len(self.labels):
            raise ValueError(
                f"features must be (n, p) with one label per row, got {tuple(self.features.shape)} and "
                f"{tuple(self.labels.shape)}"
            )
        object.__setattr__(self, "compute_dtype", self.dtype or self.features.dtype)
        if self.rows is not None and (self.rows.dtype != torch.bool or self.rows.shape != self.labels.shape):
            raise ValueError(f"rows must be a boolean mask of the {len(self.labels)} rows, got {self.rows!r}")
        here = len(self.features) if self.rows is None else int(self.rows.sum())
        local = torch.tensor([float(here)], dtype=torch.float64, device=self.features.device)
        object.__setattr__(self, "count", int(self.sum(local)))
        if self.count < 1:
            raise ValueError("softmax regression over no retained samples: nothing to fit")

    @property
    def shape(self) -> tuple[int, int]:
        """The shape ``(p, K)`` of ``W``."""
        return self.features.shape[1], self.num_classes

    @property
    def world_size(self) -> int:
        """``R``, the number of processes holding rows (1 without ``ranks``)."""
        return 1 if self.ranks is None else self.ranks.world_size

    @property
    def passes(self) -> int:
        """Sweeps over the rows made so far on this problem (:class:`PassCount`)."""
        return self.counter.passes

    def sum(self, t: Tensor) -> Tensor:
        """``t`` summed over the processes (``t`` itself without ``ranks``; a collective with them)."""
        return t if self.ranks is None else self.ranks.all_reduce(t)

    def restricted(self, keep: Tensor) -> SoftmaxProblem:
        """The problem over its rows that are in ``keep`` (a boolean mask, or indices, of the rows of ``features``
        on this process), masked, not copied; with ``ranks`` every process calls it."""
        return replace(self, rows=self.mask(keep))

    def mask(self, rows: Tensor | None = None) -> Tensor | None:
        """The problem's rows (in ``rows`` too: a mask or indices of the rows of ``features``) as a boolean mask over
        the rows of ``features`` (``None``: all of them)."""
        if rows is not None and rows.dtype != torch.bool:
            rows = torch.zeros(len(self.labels), dtype=torch.bool, device=rows.device).index_fill_(0, rows, True)
        if rows is None or self.rows is None:
            return rows if rows is not None else self.rows
        return self.rows & rows.to(self.rows.device)

    def kept(self) -> tuple[Tensor, Tensor]:
        """The features and labels of the problem's rows on this process (a copy if it is restricted)."""
        return (self.features, self.labels) if self.rows is None else (self.features[self.rows], self.labels[self.rows])

    def blocks(self, rows: Tensor | None = None) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        """``(features, labels, weights)`` of the problem's rows on this process (those also in ``rows``: a mask or
        indices of the rows of ``features``), in blocks of :data:`BLOCK_ROWS` of ``features``, in the compute dtype.

        A block that keeps at least half of its rows is yielded whole with 0/1 ``weights`` (``None``: every row kept),
        which the caller multiplies into each row's term: a masked copy of the block would cost more than the block's
        products (a request's problem masks one row in thousands). Zero terms add nothing and no rounding to a sum, so
        the sums and their rounding bound (:func:`gradient_error_bound`, over the kept rows) are those of the kept
        rows. A block that keeps fewer is copied (e.g. a request's removed rows)."""
        F, y, mask = self.features, self.labels, self.mask(rows)
        for start in range(0, len(F), BLOCK_ROWS):
            A, b = F[start : start + BLOCK_ROWS], y[start : start + BLOCK_ROWS]
            weights = None
            if mask is not None:
                part = mask[start : start + BLOCK_ROWS].to(A.device)
                kept = int(part.sum())
                if 2 * kept < len(part):
                    A, b = A[part], b[part]
                elif kept < len(part):
                    weights = part.to(self.compute_dtype).unsqueeze(1)
            yield A.to(self.compute_dtype), b, weights


def _sweep(problem: SoftmaxProblem) -> None:
    problem.counter.passes += 1


def _summed(problem: SoftmaxProblem, parts: list[Tensor]) -> list[Tensor]:
    """The ``parts`` summed over the processes in ONE all-reduce of their concatenation."""
    if problem.ranks is None:
        return parts
    total = problem.sum(torch.cat([t.reshape(-1) for t in parts]))
    return [t.view_as(part) for t, part in zip(total.split([p.numel() for p in parts]), parts)]


def _residuals(A: Tensor, y: Tensor, W: Tensor) -> tuple[Tensor, Tensor]:
    """Probabilities ``P`` and residuals ``R = P - onehot(y)`` of a block."""
    P = torch.softmax(A @ W, dim=1)
    R = P.clone()
    R[torch.arange(len(R), device=R.device), y] -= 1
    return P, R


def probabilities(W: Tensor, problem: SoftmaxProblem) -> Tensor:
    """Softmax outputs ``p_i`` of this process's samples, ``(n, K)`` (one pass)."""
    _sweep(problem)
    return torch.softmax(problem.kept()[0].to(problem.compute_dtype) @ W, dim=1)


def objective(W: Tensor, problem: SoftmaxProblem) -> float:
    """``F(W)`` of (1) (one pass)."""
    _sweep(problem)
    ce = W.new_zeros(())
    for A, y, weights in problem.blocks():
        Z = A @ W
        terms = torch.logsumexp(Z, dim=1) - Z.gather(1, y.view(-1, 1)).squeeze(1)
        ce += (terms if weights is None else terms * weights.squeeze(1)).sum()
    value = float(problem.sum(ce)) / problem.count + 0.5 * problem.l2 * float((W * W).sum())
    if problem.perturbation is not None:
        value += float((problem.perturbation * W).sum()) / problem.count
    return value


@dataclass(frozen=True)
class HeadSums:
    """Sums over the rows at a head ``W``, each exact to downdate when rows are removed (:meth:`without`).

    Args:
        W: the head they are taken at, ``(p, K)``.
        gradient_sum: ``sum_i a_i (p_i - e_{y_i})^T``, the sample part of ``n grad F(W)``.
        class_sum: ``sum_i diag(p_i) - p_i p_i^T`` (``K x K``), the class half of the preconditioner.
        abs_sum: ``sum_i |a_i|`` (per feature), for the rounding bound (:func:`gradient_error_bound`).
        count: ``n``.
    """

    W: Tensor
    gradient_sum: Tensor
    class_sum: Tensor
    abs_sum: Tensor
    count: int

    @classmethod
    def at(cls, W: Tensor, problem: SoftmaxProblem, rows: Tensor | None = None) -> HeadSums:
        """The sums over every process's rows (or over ``rows``, a mask of this process's rows, and their
        counterparts on the others): one pass (``rows``: none, only those rows are read) and one all-reduce."""
        if rows is None:
            _sweep(problem)
        K = problem.num_classes
        G, S, absum = W.new_zeros(W.shape), W.new_zeros(K, K), W.new_zeros(W.shape[0])
        count = W.new_zeros(1)
        for A, y, weights in problem.blocks(rows):
            P, R = _residuals(A, y, W)
            if weights is not None:  # 0/1: P P^T of a kept row is weighted once
                P, R = P * weights, R * weights
            G.addmm_(A.T, R)
            S += torch.diag(P.sum(dim=0)) - P.T @ P
            absum += A.abs().sum(dim=0) if weights is None else A.abs().T @ weights.squeeze(1)
            count += len(A) if weights is None else weights.sum()
        G, S, absum, count = _summed(problem, [G, S, absum, count])
        return cls(W, G, S, absum, int(count))

    def without(self, problem: SoftmaxProblem, drop: Tensor) -> HeadSums:
        """The sums over the rows left when this process's rows ``drop`` (a boolean mask over the rows of
        ``problem.features``) and the other processes' are removed: computed from the removed rows only (no pass; one
        all-reduce)."""
        removed = HeadSums.at(self.W, problem, drop)
        return HeadSums(
            self.W,
            self.gradient_sum - removed.gradient_sum,
            self.class_sum - removed.class_sum,
            self.abs_sum - removed.abs_sum,
            self.count - removed.count,
        )

    def gradient(self, problem: SoftmaxProblem) -> Tensor:
        """``grad F(W)`` of (1) from the sums: ``gradient_sum/n + l2 W + B/n``."""
        G = self.gradient_sum / self.count + problem.l2 * self.W
        if problem.perturbation is not None:
            G = G + problem.perturbation / self.count
        return G


def gradient(W: Tensor, problem: SoftmaxProblem) -> Tensor:
    """``grad F(W) = (1/n) sum_i a_i (p_i - e_{y_i})^T + l2 W + B/n``, shape ``(p, K)`` (one pass)."""
    return HeadSums.at(W, problem).gradient(problem)


def hessian_vector_product(W: Tensor, problem: SoftmaxProblem, V: Tensor) -> Tensor:
    """``H(W) V`` for the Hessian ``(1/n) sum_i (diag(p_i) - p_i p_i^T) (x) a_i a_i^T + l2 I`` of (1) (one pass: the
    probabilities at ``W`` are recomputed per block with the product, so no ``(n, K)`` matrix is kept)."""
    _sweep(problem)
    K = problem.num_classes
    out = V.new_zeros(V.shape)
    WV = torch.cat([W, V], dim=1)
    for A, _, weights in problem.blocks():
        Z = A @ WV
        P, Zv = torch.softmax(Z[:, :K], dim=1), Z[:, K:]
        S = P * Zv
        S -= P * S.sum(dim=1, keepdim=True)
        if weights is not None:
            S *= weights
        out.addmm_(A.T, S)
    return problem.sum(out) / problem.count + problem.l2 * V


def gradient_error_bound(W: Tensor, problem: SoftmaxProblem, sums: HeadSums | None = None) -> float:
    """An upper bound on ``||fl(grad F(W)) - grad F(W)||_F``, the rounding error of :func:`gradient` [derived]
    (``sums``: the :class:`HeadSums` the gradient was computed from, for their ``abs_sum``; else one pass).

    Entry ``(j, k)`` of the sample sum is ``sum_i a_ij r_ik`` with ``|r_ik| <= 1`` (``r_i = p_i - e_{y_i}``).
    Each of its ``n`` products is rounded once and then goes through at most ``n_r - 1`` additions on its process
    (blocks and BLAS in any order: a summation tree over the ``n_r`` local terms) and at most ``R - 1`` more in the
    all-reduce over ``R`` processes (any order or tree: ring, tree, recursive doubling), so it carries at most
    ``n + R - 1`` roundings and the computed entry errs by at most ``gamma_{n+R-1} sum_i |a_ij| |r_ik|`` (Higham,
    *Accuracy and Stability of Numerical Algorithms*, eq. (3.5) and Lemma 3.3; ``gamma_m = m u/(1 - m u)``); one
    process (``R = 1``) is Higham's dot-product bound. Each computed ``r_ik`` (an exponential, a sum of ``K`` terms
    and a division) is within ``(2K + 8) u`` of its exact value, so the sample sum errs by at most
    ``(gamma_{n+R-1} + (2K + 8) u (1 + gamma_{n+R-1})) sum_i |a_ij|`` per entry; the division by ``n``, ``l2 W`` and
    ``B/n`` add a few ``u`` relative. The bound returned is twice that, summed in quadrature over the ``p K``
    entries. ``u`` is the compute dtype's (float32 rows promoted to float64 are exact float64 numbers).
    """
    u = torch.finfo(problem.compute_dtype).eps / 2
    n = problem.count
    roundings = n + problem.world_size - 1
    gamma = roundings * u / (1 - roundings * u)
    absum = (sums if sums is not None else HeadSums.at(W, problem)).abs_sum
    per_entry = (gamma + (2 * problem.num_classes + 8) * u * (1 + gamma)) * (absum / n)
    sample_part = math.sqrt(problem.num_classes) * float(per_entry.norm())
    rest = 4 * u * (problem.l2 * float(W.norm()) + _norm(problem.perturbation) / n)
    return 2.0 * (sample_part + rest)


def _norm(t: Tensor | None) -> float:
    return 0.0 if t is None else float(t.norm())


def certify(W: Tensor, problem: SoftmaxProblem) -> tuple[float, HeadSums]:
    """``(||fl(grad F(W))|| + rounding bound, the sums at W)``: an upper bound on the exact gradient norm (one pass)."""
    sums = HeadSums.at(W, problem)
    return float(sums.gradient(problem).norm()) + gradient_error_bound(W, problem, sums), sums


def certified_gradient_norm(W: Tensor, problem: SoftmaxProblem) -> tuple[float, Tensor]:
    """``(||fl(grad F(W))|| + rounding bound, fl(grad F(W)))``: an upper bound on the exact gradient norm."""
    norm, sums = certify(W, problem)
    return norm, sums.gradient(problem)


def distance_bound(gradient_norm: float, l2: float) -> float:
    """``||W - W*|| <= ||grad F(W)|| / l2``, eq. (2) (strong convexity)."""
    return gradient_norm / l2


@dataclass(frozen=True)
class FeatureCurvature:
    """The ``p x p`` half of :class:`KroneckerPreconditioner`: ``C = sum_i s_i a_i a_i^T / sum_i s_i``.

    The weights ``s_i = tr(diag(p_i) - p_i p_i^T)`` are taken at one head ``W`` (e.g. the solution of an
    experience), so removing rows is an exact rank-``m`` downdate (:meth:`restricted`, which recomputes the removed
    rows' weights at ``W``). The eigendecomposition (``O(p^3)``) is kept across downdates until the weight removed
    since it was computed exceeds :data:`STALE_BASIS` of its total (:meth:`eigh`): one sample in thousands does not
    change a preconditioner, and the certificate never rests on it. Nothing per row is kept.

    Args:
        W: the head the weights are taken at.
        weighted_sum: ``sum_i s_i a_i a_i^T`` over every process's rows.
        weight_sum: ``sum_i s_i``.
    """

    W: Tensor
    weighted_sum: Tensor
    weight_sum: Tensor
    #: the eigendecomposition last computed and the weight sum it was computed at (:meth:`eigh`)
    basis: tuple[Tensor, Tensor] | None = field(default=None, compare=False, repr=False)
    basis_weight: float = field(default=0.0, compare=False, repr=False)

    @classmethod
    def at(cls, W: Tensor, problem: SoftmaxProblem, rows: Tensor | None = None) -> FeatureCurvature:
        """The curvature of ``problem``'s rows (or of this process's ``rows`` and the others') weighted at ``W``:
        ``O(n p^2)``, one pass (none with ``rows``) and one all-reduce."""
        if rows is None:
            _sweep(problem)
        C, total = W.new_zeros(W.shape[0], W.shape[0]), W.new_zeros(())
        for A, _, weights in problem.blocks(rows):
            P = torch.softmax(A @ W, dim=1)
            s = (P * (1 - P)).sum(dim=1, keepdim=True)
            if weights is not None:
                s *= weights
            C.addmm_((A * s).T, A)
            total += s.sum()
        C, total = _summed(problem, [C, total])
        return cls(W, C, total)

    def restricted(self, problem: SoftmaxProblem, keep: Tensor) -> FeatureCurvature:
        """The curvature of the rows ``keep`` (a boolean mask over ``problem.features``' rows here; every process
        calls it): the others' contributions, recomputed at ``W``, subtracted."""
        removed = FeatureCurvature.at(self.W, problem, ~keep)
        return FeatureCurvature(
            self.W,
            self.weighted_sum - removed.weighted_sum,
            self.weight_sum - removed.weight_sum,
            self.basis,
            self.basis_weight,
        )

    def eigh(self) -> tuple[Tensor, Tensor]:
        """Eigenvalues and eigenvectors of ``C``: those of an earlier ``C`` this one was downdated from while the
        weight removed since is at most :data:`STALE_BASIS` of that one's (the same on every process: the sums are
        all-reduced)."""
        total = max(float(self.weight_sum), torch.finfo(self.weighted_sum.dtype).tiny)
        if self.basis is not None and total >= (1 - STALE_BASIS) * self.basis_weight:
            return self.basis
        values, vectors = torch.linalg.eigh(self.weighted_sum / total)
        object.__setattr__(self, "basis", (values.clamp_min(0), vectors))
        object.__setattr__(self, "basis_weight", total)
        return self.basis  # type: ignore[return-value]


class KroneckerPreconditioner:
    """``(S (x) C + l2 I)^{-1}``, an approximate inverse Hessian of (1) [derived].

    The Hessian is ``(1/n) sum_i S_i (x) a_i a_i^T + l2 I`` with ``S_i = diag(p_i) - p_i p_i^T``. Replacing
    each ``a_i a_i^T`` by its ``s_i``-weighted mean ``C`` (``s_i = tr S_i``; :class:`FeatureCurvature`) and
    ``S_i`` by their mean ``S`` keeps the trace of the sum and gives a Kronecker product, whose inverse (plus
    ``l2 I``) is applied with the eigendecompositions of the ``K x K`` matrix ``S`` and the ``p x p`` matrix
    ``C``: ``O(p^2 K + K^2 p)`` per application, no pass over the rows. It is only a preconditioner: the
    certificate rests on the computed gradient, never on it.

    Args:
        sums: the :class:`HeadSums` at the current point (``S = class_sum / n``).
        curvature: the eigendecomposition of ``C`` (:meth:`FeatureCurvature.eigh`).
        l2: the ridge.
    """

    def __init__(self, sums: HeadSums, curvature: tuple[Tensor, Tensor], l2: float) -> None:
        lam_S, self.U = torch.linalg.eigh(sums.class_sum / sums.count)
        lam_C, self.V = curvature
        self.denominator = lam_C.unsqueeze(1) * lam_S.clamp_min(0).unsqueeze(0) + l2

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
        passes: sweeps over the retained rows (gradients, objectives, Hessian-vector products, curvature builds).
        sums: the :class:`HeadSums` at ``W`` (what the next request downdates).
    """

    W: Tensor
    gradient_norm: float
    newton_steps: int
    hessian_products: int
    converged: bool
    passes: int
    sums: HeadSums


def _conjugate_gradient(
    matvec: Callable[[Tensor], Tensor],
    b: Tensor,
    tolerance: float,
    precondition: Callable[[Tensor], Tensor],
    max_iterations: int,
) -> tuple[Tensor, int]:
    """Preconditioned CG for ``H x = b`` until ``||H x - b|| <= tolerance``; returns ``(x, iterations)``.

    The step sizes stay on the tensors' device; the stopping test reads one number per iteration to the host (the
    only synchronisation of an iteration besides the product's all-reduce)."""
    x = torch.zeros_like(b)
    if bool(b.norm() <= tolerance):
        return x, 0
    r = b.clone()
    z = precondition(r)
    d = z.clone()
    rz = (r * z).sum()
    for k in range(1, max_iterations + 1):
        Hd = matvec(d)
        alpha = rz / (d * Hd).sum()
        x.add_(alpha * d)
        r.sub_(alpha * Hd)
        if bool(r.norm() <= tolerance):
            return x, k
        z = precondition(r)
        rz_next = (r * z).sum()
        d = z + (rz_next / rz) * d
        rz = rz_next
    return x, max_iterations


def solve(
    problem: SoftmaxProblem,
    W0: Tensor,
    tolerance: float,
    *,
    curvature: FeatureCurvature | None = None,
    sums: HeadSums | None = None,
    max_newton_steps: int = 100,
    max_cg_iterations: int = 2000,
) -> Solution:
    """Minimise (1) from ``W0`` until the certified gradient norm (:func:`certify`) is at most ``tolerance``, by
    inexact Newton-CG with a :class:`KroneckerPreconditioner` (Nocedal & Wright, *Numerical Optimization*, Alg. 7.1;
    CG tolerance ``max(min(1/2, sqrt(||g||)) ||g||, t)``, ``t`` what the certified tolerance needs: :func:`cg_target`).

    Each Newton step first tries the full step and computes the certified gradient there (one pass, needed anyway):
    it is taken if that meets the tolerance or at least halves the gradient norm; otherwise an Armijo backtracking
    line search on ``F`` picks the step. ``curvature`` (e.g. kept from the last solve and downdated) saves building
    it at ``W0`` (``O(n p^2)``); ``sums`` (the :class:`HeadSums` at ``W0`` over the problem's rows, e.g. downdated
    from the last solve's) saves the first pass. Only a gradient computed on all the rows at the returned point
    certifies it. Returns the last point with its certified gradient norm; ``converged`` is False if
    ``max_newton_steps`` ran out (the caller decides: the certificate of (2) needs the tolerance met).

    Raises:
        ValueError: ``tolerance`` is not positive, or ``W0`` does not have the problem's shape.
    """
    if not tolerance > 0:
        raise ValueError(f"the gradient tolerance must be positive, got {tolerance}")
    if tuple(W0.shape) != problem.shape:
        raise ValueError(f"W0 has shape {tuple(W0.shape)}, the problem's W is {problem.shape}")
    W = W0.to(device=problem.features.device, dtype=problem.compute_dtype).clone()
    basis = (curvature if curvature is not None else FeatureCurvature.at(W, problem)).eigh()
    norm = math.inf  # not certified yet: downdated sums are not a computation over the rows
    if sums is None:
        norm, sums = certify(W, problem)
    products = 0
    for step in range(max_newton_steps + 1):
        if norm <= tolerance or step == max_newton_steps:
            break
        G = sums.gradient(problem)
        g = float(G.norm())
        forcing = max(min(0.5, math.sqrt(g)) * g, cg_target(W, problem, sums, tolerance))
        direction, k = _conjugate_gradient(
            partial(hessian_vector_product, W, problem),
            -G,
            forcing,
            KroneckerPreconditioner(sums, basis, problem.l2),
            max_cg_iterations,
        )
        products += k
        new_norm, new_sums = certify(W + direction, problem)
        if not (new_norm <= tolerance or new_norm <= 0.5 * g):
            W_new = _line_search(problem, W, G, direction)
            new_norm, new_sums = certify(W_new, problem)
        W, norm, sums = new_sums.W, new_norm, new_sums
    return Solution(W, norm, step, products, norm <= tolerance, problem.passes, sums)


def cg_target(W: Tensor, problem: SoftmaxProblem, sums: HeadSums, tolerance: float) -> float:
    """The CG residual at which a Newton step from ``W`` should meet the certified ``tolerance``:
    ``CG_MARGIN (tolerance - rounding bound)``.

    The gradient at ``W + d`` is the CG residual ``grad F(W) + H d`` plus the step's quadratic remainder, and the
    certificate adds the rounding bound (:func:`gradient_error_bound`, about the same at ``W + d``: taken here from
    ``sums``, no pass); the margin leaves room for the remainder. Stopping at a fixed fraction of the tolerance
    instead (a third) spends CG iterations, each a pass, below what the certificate needs; a step whose certified
    gradient still misses is followed by another (the caller's loop), so the margin trades passes, never soundness.
    Never below ``tolerance / 100`` (a rounding bound near the tolerance leaves no room: the solve then fails on
    ``max_newton_steps``, which names the cause).
    """
    room = tolerance - gradient_error_bound(W, problem, sums)
    return max(CG_MARGIN * room, tolerance / 100)


def _line_search(problem: SoftmaxProblem, W: Tensor, G: Tensor, direction: Tensor) -> Tensor:
    """Armijo backtracking: the first ``W + t d``, ``t = 1, 1/2, ...``, with ``F(W + t d) <= F(W) + 1e-4 t g^T d``
    (``d`` is a descent direction: ``H`` is positive definite)."""
    value, slope = objective(W, problem), float((G * direction).sum())
    t = 1.0
    while True:
        candidate = W + t * direction
        # the last term forgives rounding of F itself, where the decrease is at the level of its last bits
        if objective(candidate, problem) <= value + 1e-4 * t * slope + 16 * _EPS * abs(value) or t < 1e-12:
            return candidate
        t *= 0.5


def newton_step(
    problem: SoftmaxProblem,
    W: Tensor,
    *,
    tolerance: float,
    curvature: FeatureCurvature | None = None,
    sums: HeadSums | None = None,
    max_cg_iterations: int = 2000,
) -> tuple[Tensor, int]:
    """One Newton step ``W - H(W)^{-1} grad F(W)`` on ``problem`` ([CR] Sec. 3.1, the removal update
    ``w^- = w + H^{-1} Delta`` with ``Delta = -grad L(w; D')``: at the optimum of the data before removal,
    ``Delta = l2 w + grad l(w; x)`` as in [CR] eq. (1), and the gradient left by earlier removals is corrected too).

    The linear system is solved by preconditioned CG to a residual of ``tolerance`` (mean form); what it misses
    ends in the gradient residual, which the caller computes exactly. ``sums`` (the :class:`HeadSums` at ``W``, e.g.
    downdated) saves the pass for the gradient at ``W``. Returns ``(W', CG iterations)``.
    """
    sums = sums if sums is not None else HeadSums.at(W, problem)
    G = sums.gradient(problem)
    if float(G.norm()) <= tolerance:
        return W.clone(), 0
    direction, k = _conjugate_gradient(
        partial(hessian_vector_product, W, problem),
        -G,
        tolerance,
        KroneckerPreconditioner(sums, (curvature or FeatureCurvature.at(W, problem)).eigh(), problem.l2),
        max_cg_iterations,
    )
    return W + direction, k
