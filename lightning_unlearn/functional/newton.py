"""Newton step ([NS]) and infinitesimal jackknife ([IJ]) unlearning, the Hessian-based baselines of [HF], pure torch.

Both start from the trained model ``w`` (the empirical risk minimiser of the per-sample loss
``l(w; z) = loss_fn(f_w(x), y) + (l2/2)||w||^2`` over the ``n`` learned samples) and the dense Hessian
sum ``sum_i hess l(w; z_i)`` evaluated there, and forget the samples ``U`` (``m`` of them, gradient sum
``G = sum_{u in U} grad l(w; u)``) by one second-order step:

* [NS], [HF] Eq. (15): ``w + 1/(n-m) (1/(n-m) (sum_i H_i - sum_{u in U} H_u) + c I)^{-1} G``; the Hessians
  of the forgotten samples are subtracted at request time (they need the samples);
* [IJ], [HF] Eq. (16): ``w + 1/n (1/n sum_i H_i + c I)^{-1} G``, with the inverse computed once.

``c`` is the damping ([HF] Sec. 5.1: "following Basu et al. (2021), a damping factor of 0.01 is added to
the Hessian"), added to the mean Hessian as the [HF] authors' unofficial NS/IJ code does (``average_hessian +
damping * I`` in ``utils/NU.py``, ``utils/IJ.py`` of github.com/XinbaoQiao/Hessian-Free-Certified-Unlearning).

Noise ([NS] Alg. 2; [IJ] builds on it): the noise-free step is within ``gamma`` of retraining (L2), and
``internal + N(0, sigma^2 I)`` with ``sigma`` calibrated on ``gamma`` is (epsilon, delta)-indistinguishable
from retraining plus the same noise. :func:`newton_sensitivity` and :func:`jackknife_sensitivity` give
``gamma`` under [NS]'s assumptions: every ``l(., z)`` is ``lambda``-strongly convex, ``L``-Lipschitz,
``beta``-smooth (used by [IJ] only) and has an ``M``-Lipschitz Hessian.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.func import functional_call, hessian, jacrev, vmap

from lightning_unlearn.functional import autodiff
from lightning_unlearn.functional.forward_ad import load_forward_ad


# -- dense Hessians --------------------------------------------------------------------------------
def dense_bytes(dim: int, dtype: torch.dtype) -> int:
    """Bytes of one dense ``dim x dim`` matrix of ``dtype``."""
    return dim * dim * torch.empty(0, dtype=dtype).element_size()


def check_dense(dim: int, dtype: torch.dtype, max_bytes: int, who: str) -> None:
    """``ValueError`` naming ``dim`` and the memory of a dense ``dim x dim`` Hessian if it exceeds ``max_bytes``.

    [HF] reports NS and IJ "out-of-memory" for ResNet-18 (11M parameters: a 490 TB Hessian in float32).
    """
    need = dense_bytes(dim, dtype)
    if need > max_bytes:
        raise ValueError(
            f"{who} stores a dense d x d Hessian: d = {dim:,} parameters need {need / 2**30:,.2f} GiB "
            f"({dtype}), above the limit of {max_bytes / 2**30:,.2f} GiB (max_bytes); use a smaller model "
            "(e.g. train only a linear head) or a Hessian-free method such as 'hf'"
        )


#: (sample, vector) pairs per batched Hessian-vector call of :func:`hessian_sum` (bounds its peak memory)
PAIRS_PER_CALL = 32768
#: relative difference, in units of the dtype's epsilon, below which the Gauss-Newton product equals the
#: exact Hessian-vector product on the probe (:func:`gauss_newton_sum`); rounding alone stays far below it
AFFINE_PROBE_ULPS = 1000


def _outputs(loss: autodiff.ModuleLoss, theta: Tensor, xu: Tensor) -> Tensor:
    """The module's output for ONE sample at ``theta``, flattened."""
    return functional_call(loss.module, autodiff.unflatten(theta, loss.spec), (xu.unsqueeze(0),)).reshape(-1)


def _gauss_newton_factors(
    loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor
) -> tuple[Tensor, Tensor] | None:
    """``(J, S)`` such that ``sum_u (J_u^T S_u J_u + l2 I)`` is the Hessian sum over the rows of ``x``, else ``None``.

    ``J_u`` (``K x d``) is the Jacobian of the module's (flattened) output ``z_u`` in ``theta`` and ``S_u``
    (``K x K``, symmetrised) the Hessian of ``loss_fn`` in ``z_u``. The per-sample Hessian is
    ``J^T S J + sum_k (dl/dz_k) hess z_k + l2 I``: the middle term vanishes exactly when the output is affine in
    ``theta`` (a trained linear head on a frozen backbone: the [HF] LR rows), which is checked on a random
    direction ``v``: ``H v`` by autodiff against ``J^T S J v + l2 v`` (for a non-affine module they differ with
    probability one; equal here means within :data:`AFFINE_PROBE_ULPS` epsilons, relative). [derived]
    """
    z = vmap(lambda xu: _outputs(loss, theta, xu))(x)
    J = vmap(jacrev(_outputs, argnums=1), in_dims=(None, None, 0))(loss, theta, x)  # (k, K, d)
    shape = functional_call(loss.module, autodiff.unflatten(theta, loss.spec), (x[:1],)).shape[1:]

    def loss_of_output(zu: Tensor, yu: Tensor) -> Tensor:
        return loss.loss_fn(zu.reshape(1, *shape), yu.reshape(1, *yu.shape)).sum()

    load_forward_ad()
    S = vmap(hessian(loss_of_output))(z, y).to(J)  # (k, K, K)
    S = 0.5 * (S + S.mT)
    g = torch.Generator(device=theta.device).manual_seed(0)
    v = torch.randn(theta.shape, generator=g, dtype=theta.dtype, device=theta.device)
    exact = autodiff.hvps(loss, theta, x, y, v[None])[0] * len(x)
    formula = torch.einsum("kod,ko->d", J, torch.einsum("kop,kp->ko", S, J @ v)) + loss.l2 * len(x) * v
    tolerance = AFFINE_PROBE_ULPS * torch.finfo(theta.dtype).eps * float(exact.norm())
    return (J, S) if float((exact - formula).norm()) <= tolerance else None


#: rows per block of a low-rank update of a dense matrix into another (:func:`_low_rank_update`): a block stays in
#: the cache between its read and its write (one pass over the matrix instead of a copy and a separate update: 3x
#: faster at d = 7,850 than one ``addmm`` into a new matrix, whose rank-10 product MKL runs far below its peak)
UPDATE_ROWS = 32


def _low_rank_update(src: Tensor | None, left: Tensor, right: Tensor, sign: float, out: Tensor | None) -> Tensor:
    """``src + sign left @ right`` (``src``: zeros) for a thin ``left`` (``d x r``) and ``right`` (``r x d``), written
    into ``out`` (may be ``src``: in place, one ``addmm_``) or a new tensor, :data:`UPDATE_ROWS` rows at a time.

    In place, one call reads and writes the matrix once at any rank (2.5x faster than row blocks at rank 2,560, a
    chunk of 256 samples of a 10-output head, whose blocks would each read all of ``right``; 2x at rank 10)."""
    if src is None:
        product = torch.mm(left, right, out=out) if out is not None else left @ right
        return product if sign == 1 else product.mul_(sign)
    if out is src:
        return src.addmm_(left, right, alpha=sign)
    result = torch.empty_like(src) if out is None else out
    for i in range(0, len(src), UPDATE_ROWS):
        j = i + UPDATE_ROWS
        torch.addmm(src[i:j], left[i:j], right, alpha=sign, out=result[i:j])
    return result


def gauss_newton_sum(loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> Tensor | None:
    """``sum_u (J_u^T S_u J_u + l2 I)`` over the rows of ``x``, dense ``(d, d)``, if it is the Hessian sum (the module's
    output is affine in ``theta``, :func:`_gauss_newton_factors`), else ``None``.

    Cost: ``k K`` output gradients and one ``(k K x d)^T (k K x d)`` product: ``O(k K d^2)`` for a ``K``-output
    linear head, instead of ``k d`` Hessian-vector products (whose per-vector overhead dominates at d ~ 10^4).
    """
    factors = _gauss_newton_factors(loss, theta, x, y)
    if factors is None:
        return None
    J, S = factors
    d = theta.numel()
    H = _low_rank_update(None, J.reshape(-1, d).T, torch.bmm(S, J).reshape(-1, d), 1.0, None)
    H.diagonal().add_(loss.l2 * len(x))
    return H


def gauss_newton_factor(loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> Tensor | None:
    """``F`` (``k K x d``) with ``F^T F + k l2 I`` the Hessian sum over the ``k`` rows of ``x``, if the module's output
    is affine in ``theta`` (:func:`_gauss_newton_factors`) and every ``S_u`` is positive semi-definite (a convex
    ``loss_fn`` in the outputs, e.g. cross-entropy: ``S = diag(p) - p p^T``), else ``None``. [derived]

    Rows ``diag(sqrt(s_u)) V_u^T J_u`` per sample from ``S_u = V_u diag(s_u) V_u^T`` (``eigh``), so ``F^T F =
    sum_u J_u^T S_u J_u``: the Hessian of rank ``<= k K`` stored in ``k K d`` numbers instead of ``d^2``, applied by
    two products. An eigenvalue below ``-AFFINE_PROBE_ULPS eps max|s_u|`` (beyond rounding) means ``S_u`` is
    indefinite: ``None``; smaller negative ones are rounding and set to 0.
    """
    factors = _gauss_newton_factors(loss, theta, x, y)
    if factors is None:
        return None
    J, S = factors
    values, vectors = torch.linalg.eigh(S)  # (k, K), (k, K, K)
    floor = AFFINE_PROBE_ULPS * torch.finfo(S.dtype).eps * values.abs().amax(-1, keepdim=True)
    if bool((values < -floor).any()):
        return None
    root = vectors * values.clamp_min(0).sqrt().unsqueeze(-2)  # S_u = root root^T
    return torch.bmm(root.mT, J).reshape(-1, theta.numel())


def hessian_sum(
    loss: autodiff.ModuleLoss,
    theta: Tensor,
    x: Tensor,
    y: Tensor,
    chunk_size: int | None = 256,
    base: Tensor | None = None,
    sign: float = 1.0,
    out: Tensor | None = None,
) -> Tensor:
    """``base + sign sum_i hess l(theta; z_i)`` over the rows of ``x`` (``base``: zeros; never modified), dense
    ``(d, d)``: written into ``out`` (a buffer of that shape, not ``base``) if given, else a new tensor (a fresh
    ``d x d`` allocation costs the operating system's page faults on top of the write), ``chunk_size`` samples at a
    time.

    By the Gauss-Newton product ``J^T S J + l2 I`` when the module's output is affine in ``theta``
    (:func:`_gauss_newton_factors`): a ``(d x kK) (kK x d)`` product added block by block
    (:func:`_low_rank_update`), so removing a request's samples from a Hessian sum reads and writes the ``d x d``
    matrix once. Otherwise from batched Hessian-vector products against ``PAIRS_PER_CALL / chunk`` columns of the
    identity at a time (a few samples, as a request's, take many columns per call), each chunk symmetrised.
    Symmetric up to rounding."""
    d = theta.numel()
    if out is not None and out is base:
        raise ValueError("hessian_sum: out must not be base")
    result: Tensor | None = None  # the running sum, once written (into out or a new tensor)
    step = chunk_size or max(len(x), 1)
    affine = True
    for k in range(0, len(x), step):
        xb, yb = x[k : k + step], y[k : k + step]
        factors = _gauss_newton_factors(loss, theta, xb, yb) if affine else None
        if factors is not None:
            J, S = factors
            left, right = J.reshape(-1, d).T, torch.bmm(S, J).reshape(-1, d)
            src = base if result is None else result
            result = _low_rank_update(src, left, right, sign, out if result is None else result)
            result.diagonal().add_(sign * loss.l2 * len(xb))
            continue
        affine = False  # the module is not affine in theta: the other chunks' probes would fail too
        eye = torch.eye(d, dtype=theta.dtype, device=theta.device)
        part = autodiff.hvps(loss, theta, xb, yb, eye, chunk_size=max(1, PAIRS_PER_CALL // len(xb))) * len(xb)
        part = (part + part.T).mul_(0.5 * sign)
        if result is not None:
            result.add_(part)
        elif base is not None:
            result = torch.add(base, part, out=out) if out is not None else base + part
        else:
            result = out.copy_(part) if out is not None else part
    if result is None:  # no rows
        zeros = torch.zeros(d, d, dtype=theta.dtype, device=theta.device)
        src = zeros if base is None else base
        return src.clone() if out is None else out.copy_(src)
    return result


def _damped(matrix: Tensor, shift: float) -> Tensor:
    """``matrix + shift I`` as a new tensor (no identity is allocated)."""
    out = matrix.clone()
    out.diagonal().add_(shift)
    return out


def cholesky_solve(chol: Tensor, B: Tensor) -> Tensor:
    """``A^{-1} B`` for the columns of ``B``, from the lower Cholesky factor ``chol`` of ``A``: two triangular solves,
    which read the factor where it lies (``torch.cholesky_solve`` copies it, ``d^2`` floats, on every call: at
    d = 7,850 a 490 MB allocation and its page faults per solve, most of the solve's time)."""
    half = torch.linalg.solve_triangular(chol, B, upper=False)
    return torch.linalg.solve_triangular(chol.mT, half, upper=True)


def solve_damped(mean_hessian: Tensor, damping: float, rhs: Tensor) -> tuple[Tensor, bool]:
    """``(mean_hessian + damping I)^{-1} rhs`` (``rhs`` a vector or the columns of a matrix) and whether the damped
    matrix is positive definite: Cholesky and two triangular solves if it is, else an LU solve (a non-convex loss
    whose curvature is below ``-damping``; the [HF] authors' code inverts it all the same, ``torch.inverse``).

    Raises:
        ValueError: the damped matrix is singular.
    """
    damped = _damped(mean_hessian, damping)
    B = rhs.reshape(len(damped), -1).to(damped)
    chol, info = torch.linalg.cholesky_ex(damped)
    if not int(info):
        return cholesky_solve(chol, B).reshape(rhs.shape), True
    solution, info = torch.linalg.solve_ex(damped, B)
    if int(info):
        raise ValueError(f"the damped mean Hessian (damping {damping:g}) is singular: increase the damping")
    return solution.reshape(rhs.shape), False


def damped_inverse(mean_hessian: Tensor, damping: float) -> tuple[Tensor, bool]:
    """``(mean_hessian + damping I)^{-1}`` and whether the damped matrix is positive definite: from its Cholesky
    factor (``cholesky_inverse``) if it is, else by LU (:func:`solve_damped`'s fallback).

    Raises:
        ValueError: the damped matrix is singular.
    """
    damped = _damped(mean_hessian, damping)
    chol, info = torch.linalg.cholesky_ex(damped)
    if not int(info):
        return torch.cholesky_inverse(chol), True
    inverse, info = torch.linalg.inv_ex(damped)
    if int(info):
        raise ValueError(f"the damped mean Hessian (damping {damping:g}) is singular: increase the damping")
    return inverse, False


@dataclass(frozen=True)
class NewtonSolve:
    """A solved Newton system: the ``step``, whether the damped Hessian is positive definite (``None``: not
    checked, a conjugate-gradient solve) and the conjugate-gradient ``iterations`` (0: a direct solve)."""

    step: Tensor
    definite: bool | None
    iterations: int


#: conjugate-gradient iterations after which :func:`newton_step` falls back to the direct solve
MAX_CG_ITERATIONS = 100


def conjugate_gradients(
    apply: Callable[[Tensor], Tensor],
    b: Tensor,
    precondition: Callable[[Tensor], Tensor],
    x: Tensor,
    norm: float,
    max_iter: int,
) -> tuple[Tensor, int, bool]:
    """Preconditioned conjugate gradients for ``A x = b`` from ``x`` until ``||b - A x|| <= sqrt(d) eps ||A|| ||x||``
    (LAPACK ``dsposv``'s stopping rule for iterative refinement; ``norm`` bounds ``||A||``), the residual recomputed
    from ``A x`` before stopping. Returns ``(x, iterations, converged)``: not converged after ``max_iter``
    iterations or at a direction of non-positive curvature (``A`` is then not positive definite)."""
    scale = math.sqrt(b.numel()) * torch.finfo(b.dtype).eps * norm
    r = b - apply(x)
    p = torch.zeros_like(b)
    rz_old = 1.0
    for it in range(max_iter + 1):
        if float(r.norm()) <= scale * float(x.norm()):
            r = b - apply(x)  # the recursion's residual drifts from the true one: stop on the true one
            if float(r.norm()) <= scale * float(x.norm()):
                return x, it, True
        if it == max_iter:
            break
        z = precondition(r)
        rz = float(r @ z)
        p = z + (rz / rz_old) * p
        q = apply(p)
        curvature = float(p @ q)
        if not curvature > 0:
            return x, it, False
        alpha = rz / curvature
        x = x + alpha * p
        r = r - alpha * q
        rz_old = rz
    return x, max_iter, False


# -- the two updates ----------------------------------------------------------------------------------
def newton_step(
    retained_hessian_sum: Tensor,
    n_retained: int,
    grad_sum: Tensor,
    damping: float,
    preconditioner: Tensor | None = None,
    start: Tensor | None = None,
    norm: float | None = None,
) -> NewtonSolve:
    """[NS]'s update of [HF] Eq. (15), ``1/(n-m) (H_ret/(n-m) + c I)^{-1} G = (H_ret + c (n-m) I)^{-1} G``, to add to
    the trained model.

    With a ``preconditioner`` (a positive definite approximation of the inverse up to scale: the recorder's
    ``(H/n + c I)^{-1}`` of ALL learned samples), the system is solved by preconditioned conjugate gradients, two
    ``O(d^2)`` products per iteration, from ``start`` (e.g. the previous request's step). [derived] Why not a
    low-rank update of a factor: ``A = H_ret + c (n-m) I`` differs from ``P = H + c n I`` by the forgotten
    samples' Hessians AND by ``(l2 + c) m I`` (each per-sample loss carries the ridge, the damping is on the
    mean), a full-rank change, so Woodbury on a Cholesky factor is not exact; an eigendecomposition would absorb
    the shift but costs ``~9 d^3`` (minutes at d = 7,850), and a rank-``K`` factor per forgotten sample would keep
    its input. For a convex loss ``P - A`` is the forgotten samples' damped Hessians, so ``P^{-1} A`` has its
    spectrum in ``(0, 1]``, at ``1 - m/n`` in directions only the ridge and damping reach (lower where the
    forgotten samples hold most of the data's curvature): a few iterations reach the stopping rule of
    :func:`conjugate_gradients`, the accuracy of a dense solve. Without a preconditioner, or if CG meets
    non-positive curvature or does not converge in :data:`MAX_CG_ITERATIONS`, the damped matrix is factorised
    (:func:`solve_damped`, ``O(d^3)``).

    Args:
        retained_hessian_sum: ``sum_i H_i - sum_{u in U} H_u`` at the trained model (``d x d``).
        n_retained: ``n - m``.
        grad_sum: ``G = sum_{u in U} grad l(w; u)`` at the trained model.
        damping: ``c``.
        preconditioner: see above (``None``: the direct solve).
        start: the first CG iterate (``None``: zero).
        norm: a bound or estimate of ``||H_ret||``, the scale of the stopping rule (e.g. ``n`` times the top
            eigenvalue of the full mean Hessian); ``None``: ``||H_ret||_inf`` (one more pass over the matrix).

    Raises:
        ValueError: no sample retained, or a singular damped Hessian.
    """
    if n_retained < 1:
        raise ValueError(f"the Newton step needs a retained sample, got n - m = {n_retained}")
    G = grad_sum.to(retained_hessian_sum)
    if preconditioner is not None:
        shift = damping * n_retained
        M = preconditioner.to(retained_hessian_sum)
        if norm is None:
            norm = float(torch.linalg.matrix_norm(retained_hessian_sum, ord=math.inf))
        scale = norm + abs(shift)
        x0 = torch.zeros_like(G) if start is None else start.to(G)
        x, iterations, converged = conjugate_gradients(
            lambda v: torch.addmv(v, retained_hessian_sum, v, beta=shift),
            G,
            lambda r: M @ r,
            x0,
            scale,
            MAX_CG_ITERATIONS,
        )
        if converged:
            return NewtonSolve(x.to(grad_sum), None, iterations)
    step, definite = solve_damped(retained_hessian_sum / n_retained, damping, grad_sum)
    return NewtonSolve((step / n_retained).to(grad_sum), definite, 0)


def jackknife_inverse(full_hessian_sum: Tensor, n: int, damping: float) -> tuple[Tensor, bool]:
    """``(1/n sum_i H_i + c I)^{-1}``, the inverse [IJ] computes once before any request ([HF] Eq. (16)), and
    whether the damped Hessian was positive definite (:func:`damped_inverse`)."""
    if n < 1:
        raise ValueError(f"the jackknife needs learned samples, got n = {n}")
    return damped_inverse(full_hessian_sum / n, damping)


def jackknife_step(inverse: Tensor, n: int, grad_sum: Tensor) -> Tensor:
    """[IJ]'s update of [HF] Eq. (16), ``1/n (1/n sum_i H_i + c I)^{-1} G``, to add to the trained model: one
    ``O(d^2)`` product with the inverse computed once."""
    return (inverse @ grad_sum.to(inverse)).to(grad_sum) / n


# -- sensitivities (the noise bound) -----------------------------------------------------------------
def newton_sensitivity(
    m: int, n: int, lipschitz: float, strong_convexity: float, hessian_lipschitz: float, damping: float
) -> dict[str, float]:
    """``gamma`` of the damped Newton step after deleting ``m`` of ``n`` samples: ``||w_NS - w_retrain|| <= gamma``.

    ``taylor``: [NS] Alg. 2's ``2 M m^2 L^2 / (lambda^3 n^2)`` (its Newton-step Lemma, for ``m <= n/2``)
    [interp: the power of lambda is not confirmed from the paper text here; lambda^3 is what the argument
    gives: ``||w - w_retrain|| <= 2 m L / (lambda n)`` by strong convexity, and one Newton step from there
    leaves ``M/(2 lambda) ||w - w_retrain||^2``]. ``damping``: [derived] the damped step differs from the
    exact one by ``c m L / ((n - m) lambda (lambda + c))`` (``||(A + cI)^{-1} - A^{-1}|| <= c/(lambda(lambda + c))``
    for ``A >= lambda I``, ``||G|| <= m L``). Infinite when ``lambda = 0`` or ``m > n/2``.
    """
    lam, c = float(strong_convexity), float(damping)
    if m == 0:
        return {"taylor_term": 0.0, "damping_term": 0.0, "sensitivity": 0.0}
    if lam <= 0 or 2 * m > n:
        return {"taylor_term": math.inf, "damping_term": math.inf, "sensitivity": math.inf}
    taylor = 2.0 * hessian_lipschitz * m**2 * lipschitz**2 / (lam**3 * n**2)
    damp = c * m * lipschitz / ((n - m) * lam * (lam + c))
    return {"taylor_term": taylor, "damping_term": damp, "sensitivity": taylor + damp}


def jackknife_sensitivity(
    m: int,
    n: int,
    lipschitz: float,
    smoothness: float,
    strong_convexity: float,
    hessian_lipschitz: float,
    damping: float,
) -> dict[str, float]:
    """``gamma`` of the damped jackknife step after deleting ``m`` of ``n`` samples.

    [derived] (the [IJ] bound's constants are not confirmed here): the exact Newton step's
    ``taylor_term`` (:func:`newton_sensitivity`), plus ``hessian_term`` ``m^2 beta L / (lambda^2 n (n - m))``,
    the gap between the full-data and the retained Hessian (``n H_n = (n - m) H_ret + sum_U H_u``, so
    ``(n H_n)^{-1} - ((n - m) H_ret)^{-1} = -(n H_n)^{-1} (sum_U H_u) ((n - m) H_ret)^{-1}``), plus the
    damping's ``c m L / (n lambda (lambda + c))``. Infinite when ``lambda = 0`` or ``m > n/2``.
    """
    ns = newton_sensitivity(m, n, lipschitz, strong_convexity, hessian_lipschitz, 0.0)
    lam, c = float(strong_convexity), float(damping)
    if m == 0:
        return {**ns, "hessian_term": 0.0, "damping_term": 0.0}
    if not math.isfinite(ns["sensitivity"]):
        return {"taylor_term": math.inf, "hessian_term": math.inf, "damping_term": math.inf, "sensitivity": math.inf}
    gap = m**2 * smoothness * lipschitz / (lam**2 * n * (n - m))
    damp = c * m * lipschitz / (n * lam * (lam + c))
    return {
        "taylor_term": ns["taylor_term"],
        "hessian_term": gap,
        "damping_term": damp,
        "sensitivity": ns["taylor_term"] + gap + damp,
    }


def hessian_lipschitz_bound(feature_norm: float, bias: bool = True, binary: bool = False) -> float:
    """[derived] ``M``, a Lipschitz constant of the per-sample Hessian of cross-entropy on a linear model.

    With logits ``z = W x~`` the Hessian in the parameters is ``J^T S(z) J`` with ``S(z) = diag(p) - p p^T``
    and ``||J|| = ||x~||`` (the ridge's Hessian is constant), so ``M = M_S ||x~||^3`` with ``M_S`` a
    Lipschitz constant of ``S`` in ``z``: ``1/8`` for a sigmoid (``max |sigma'''|``), and for a softmax
    ``5 sqrt(2)/4``: for unit ``v`` and ``a``, ``dS[v] = diag(q) - q p^T - p q^T`` with
    ``q_i = p_i (v_i - p.v)``, ``|q_i| <= sqrt(2) p_i (1 - p_i) <= sqrt(2)/4`` and
    ``||q||^2 <= Var_p(v) <= 1/2``, so ``|a^T dS[v] a| <= sqrt(2)/4 + 2 ||q|| ||p||``. Not tight.
    ``feature_norm`` is ``max ||phi(x)||`` over the learned data, as for
    :func:`~lightning_unlearn.functional.bounds.linear_model_constants`.
    """
    if feature_norm < 0:
        raise ValueError(f"feature_norm must be >= 0, got {feature_norm}")
    r = math.sqrt(feature_norm**2 + (1.0 if bias else 0.0))
    return (0.125 if binary else 5 * math.sqrt(2) / 4) * r**3
