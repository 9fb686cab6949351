"""Newton-CG for a smooth, strongly convex objective, run until its gradient norm is below a stated tolerance.

[CCL] assumes each task of Eq. (1) is solved exactly; the certificate accepts a gradient residual ``tau`` (the
solution is then within ``tau / (mu + lambda)`` of the minimiser). Quasi-Newton solvers that stop on the change
of the objective's value (L-BFGS's line search) cannot get there in float32 when the task is ill-conditioned: at a
residual ``g`` the attainable decrease is about ``g^2 / (2 (M + lambda))``, below the float32 resolution of the
value (on mnist-5k's normalised digits a task's inputs have a second moment of top eigenvalue 220-393, so
M ~ 200 for the softmax: a residual of 1e-3 is worth a decrease of ~2e-9, the value is ~1 with float32 steps of
~1e-7). Newton steps need the gradient and Hessian-vector products, not the value's last digits: truncated Newton
([NW] Alg. 7.1), conjugate gradients on exact Hessian-vector products (double backward) to the forcing tolerance
``min(0.5, sqrt(||g||)) ||g||``, then a backtracking line search whose Armijo test allows the value's rounding (near
the minimiser the full Newton step is taken). Pure torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: the Armijo constant and the most halvings of a step before the line search gives up
ARMIJO, MAX_HALVINGS = 1e-4, 30
#: units of the dtype's epsilon (relative to ``|f| + 1``) by which a step may raise the value and still be accepted
VALUE_ULPS = 16


@dataclass(frozen=True)
class NewtonCGResult:
    """How a :func:`newton_cg` run ended: the final gradient ``residual`` norm, the Newton ``steps`` taken, the
    conjugate-gradient ``cg_iterations`` in all, and whether ``residual <= tolerance`` (``converged``)."""

    residual: float
    steps: int
    cg_iterations: int
    converged: bool


def _dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> Tensor:
    return sum((x * y).sum() for x, y in zip(a, b))  # type: ignore[return-value]


def _norm(a: Sequence[Tensor]) -> float:
    return float(_dot(a, a).sqrt())


def _cg(
    hvp: Callable[[list[Tensor]], list[Tensor]], g: list[Tensor], forcing: float, max_iter: int
) -> tuple[list[Tensor], int]:
    """Conjugate gradients for ``H p = -g`` from ``p = 0`` until ``||H p + g|| <= forcing``; stops at a direction of
    non-positive curvature (then ``-g`` if no step was made). Returns ``(p, iterations)``."""
    p = [torch.zeros_like(t) for t in g]
    r = [-t for t in g]
    d = [t.clone() for t in r]
    rr = _dot(r, r)
    for it in range(max_iter):
        if float(rr.sqrt()) <= forcing:
            return p, it
        hd = hvp(d)
        curvature = _dot(d, hd)
        if not float(curvature) > 0:
            return (p if it else [-t for t in g]), it
        alpha = rr / curvature
        p = [a + alpha * b for a, b in zip(p, d)]
        r = [a - alpha * b for a, b in zip(r, hd)]
        rr_new = _dot(r, r)
        d = [a + (rr_new / rr) * b for a, b in zip(r, d)]
        rr = rr_new
    return p, max_iter


def newton_cg(
    objective: Callable[[], Tensor],
    params: Sequence[Tensor],
    tolerance: float,
    max_steps: int = 50,
    max_cg: int = 250,
) -> NewtonCGResult:
    """Minimise ``objective()`` (a differentiable scalar of ``params``) in place until ``||grad|| <= tolerance``.

    Each step solves ``H p = -g`` by conjugate gradients (``H v`` by double backward) to ``min(0.5, sqrt(||g||))
    ||g||`` (superlinear convergence, [NW] Thm. 7.2), then takes the largest ``alpha in {1, 1/2, ...}`` with
    ``f(w + alpha p) <= f(w) + 1e-4 alpha g.p + VALUE_ULPS eps (|f(w)| + 1)`` (Armijo, up to the value's
    rounding). Stops converged, after ``max_steps`` steps, or when no step is accepted; ``params`` keep the last
    accepted point. ``objective`` should be strongly convex (else a step may be a descent direction only).

    Raises:
        ValueError: ``tolerance <= 0``.
    """
    if not tolerance > 0:
        raise ValueError(f"newton_cg: tolerance must be positive, got {tolerance}")
    params = list(params)
    cg_total = 0
    for step in range(max_steps + 1):
        with torch.enable_grad():
            value = objective()
            g = list(torch.autograd.grad(value, params, create_graph=True))
        residual = _norm([t.detach() for t in g])
        if residual <= tolerance:
            return NewtonCGResult(residual, step, cg_total, True)
        if step == max_steps:
            break

        def hvp(v: list[Tensor], g: list[Tensor] = g) -> list[Tensor]:
            with torch.enable_grad():
                return [t.detach() for t in torch.autograd.grad(g, params, v, retain_graph=True)]

        gd = [t.detach() for t in g]
        p, iterations = _cg(hvp, gd, min(0.5, residual**0.5) * residual, max_cg)
        cg_total += iterations
        f0, slope = float(value.detach()), float(_dot(gd, p))
        slack = VALUE_ULPS * torch.finfo(value.dtype).eps * (abs(f0) + 1.0)
        del g, value
        origin = [w.detach().clone() for w in params]
        alpha, accepted = 1.0, False
        for _ in range(MAX_HALVINGS):
            with torch.no_grad():
                for w, w0, pk in zip(params, origin, p):
                    w.copy_(w0 + alpha * pk)
                f = float(objective())
            if f <= f0 + ARMIJO * alpha * slope + slack:
                accepted = True
                break
            alpha /= 2
        if not accepted:
            with torch.no_grad():
                for w, w0 in zip(params, origin):
                    w.copy_(w0)
            break
    with torch.enable_grad():
        g = list(torch.autograd.grad(objective(), params))
    residual = _norm(g)
    return NewtonCGResult(residual, step, cg_total, residual <= tolerance)
