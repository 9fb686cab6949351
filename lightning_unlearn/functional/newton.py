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

import torch
from torch import Tensor

from lightning_unlearn.functional import hf


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


def hessian_sum(loss: hf.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = 256) -> Tensor:
    """``sum_i hess l(theta; z_i)`` over the rows of ``x``, dense ``(d, d)`` (zeros for no rows), built from
    batched Hessian-vector products of ``chunk_size`` samples at a time against ``PAIRS_PER_CALL / chunk``
    columns of the identity at a time (a few samples, as a request's, take many columns per call)."""
    d = theta.numel()
    H = torch.zeros(d, d, dtype=theta.dtype, device=theta.device)
    eye = torch.eye(d, dtype=theta.dtype, device=theta.device)
    step = chunk_size or max(len(x), 1)
    for k in range(0, len(x), step):
        xb, yb = x[k : k + step], y[k : k + step]
        H += hf.hvps(loss, theta, xb, yb, eye, chunk_size=max(1, PAIRS_PER_CALL // len(xb))) * len(xb)
    return 0.5 * (H + H.T)


def solve_damped(mean_hessian: Tensor, damping: float, rhs: Tensor) -> tuple[Tensor, bool]:
    """``(mean_hessian + damping I)^{-1} rhs`` (``rhs`` a vector or the columns of a matrix) and whether the damped
    matrix is positive definite: Cholesky if it is, else an LU solve (a non-convex loss whose curvature is below
    ``-damping``; the [HF] authors' code inverts it all the same, ``torch.inverse``).

    Raises:
        ValueError: the damped matrix is singular.
    """
    eye = torch.eye(mean_hessian.shape[0], dtype=mean_hessian.dtype, device=mean_hessian.device)
    damped = mean_hessian + damping * eye
    B = rhs.reshape(len(damped), -1).to(damped)
    chol, info = torch.linalg.cholesky_ex(damped)
    if not int(info):
        return torch.cholesky_solve(B, chol).reshape(rhs.shape), True
    solution, info = torch.linalg.solve_ex(damped, B)
    if int(info):
        raise ValueError(f"the damped mean Hessian (damping {damping:g}) is singular: increase the damping")
    return solution.reshape(rhs.shape), False


# -- the two updates ----------------------------------------------------------------------------------
def newton_step(retained_hessian_sum: Tensor, n_retained: int, grad_sum: Tensor, damping: float) -> tuple[Tensor, bool]:
    """[NS]'s update of [HF] Eq. (15), ``1/(n-m) (H_ret/(n-m) + c I)^{-1} G``, to add to the trained model, and
    whether the damped Hessian was positive definite (:func:`solve_damped`).

    Args:
        retained_hessian_sum: ``sum_i H_i - sum_{u in U} H_u`` at the trained model (``d x d``).
        n_retained: ``n - m``.
        grad_sum: ``G = sum_{u in U} grad l(w; u)`` at the trained model.
        damping: ``c``.

    Raises:
        ValueError: no sample retained, or a singular damped Hessian.
    """
    if n_retained < 1:
        raise ValueError(f"the Newton step needs a retained sample, got n - m = {n_retained}")
    step, definite = solve_damped(retained_hessian_sum / n_retained, damping, grad_sum)
    return (step / n_retained).to(grad_sum), definite


def jackknife_inverse(full_hessian_sum: Tensor, n: int, damping: float) -> tuple[Tensor, bool]:
    """``(1/n sum_i H_i + c I)^{-1}``, the inverse [IJ] computes once before any request ([HF] Eq. (16)), and
    whether the damped Hessian was positive definite (:func:`solve_damped`)."""
    if n < 1:
        raise ValueError(f"the jackknife needs learned samples, got n = {n}")
    eye = torch.eye(full_hessian_sum.shape[0], dtype=full_hessian_sum.dtype, device=full_hessian_sum.device)
    return solve_damped(full_hessian_sum / n, damping, eye)


def jackknife_step(inverse: Tensor, n: int, grad_sum: Tensor) -> Tensor:
    """[IJ]'s update of [HF] Eq. (16), ``1/n (1/n sum_i H_i + c I)^{-1} G``, to add to the trained model."""
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
