"""Privacy amplification by iteration ([PABI]) for noisy fine-tuning on the retained data ([CUNN], [LU]).

Two processes run the same ``T`` noisy steps on the same retained data, one from the unlearned model's start
``X_0``, the other from a retrained model's start ``X'_0``::

    X_{t+1} = psi_t(X_t) + N(0, sigma_t^2 I),        X'_{t+1} = psi_t(X'_t) + N(0, sigma_t^2 I).

Assumptions (what the theorem needs; ``docs/noisy_finetuning.md`` derives it, [derived] where it is ours):

* start: ``||X_0 - X'_0|| <= D`` surely (e.g. both projected onto one ball of radius ``C0``: ``D = 2 C0``);
* every map is Lipschitz up to a shift, for all ``x, y``: ``||psi_t(x) - psi_t(y)|| <= rho_t ||x - y|| + s_t``
  (:class:`NoisySteps`; e.g. a step with a clipped gradient: ``rho = |1 - eta l2|``, ``s = 2 eta C1``, for *any*
  loss; a gradient step on an ``m``-strongly convex, ``M``-smooth loss: ``rho = max(|1 - eta m|, |1 - eta M|)``,
  ``s = 0``), and optionally its image lies in a ball of radius ``R_t`` (a projection after the step);
* ``psi_t`` may be random (mini-batches, dropout) if its randomness does not depend on the forgotten data: the
  bound holds for each draw and so for the mixture (quasi-convexity of Renyi divergence);
* the noise is Gaussian, independent of everything else.

Theorem ([PABI] Theorem 22 with the shifts of (A_t); [derived] constants). For every ``alpha > 1``, in both
directions, ``D_alpha(X_T || X'_T) <= alpha c`` with

    c = min_tau  Z_tau^2 / (2 sum_{t >= tau} w_t^2 sigma_t^2),     w_t = prod_{k=t+1}^{T-1} rho_k,
    Z_0 = w_0 min(rho_0 D + s_0, 2 R_0) + sum_{t >= 1} w_t s_t,  Z_tau = w_tau 2 R_tau + sum_{t > tau} w_t s_t,

the minimum over the steps ``tau`` after which the chain is restarted (``tau = 0``: from the start distance;
``tau >= 1``: from a projection's diameter), each with the optimal shifts ``a_t = Z_tau w_t sigma_t^2 /
sum w_k^2 sigma_k^2`` (Cauchy-Schwarz), which are checked to keep every intermediate shift non-negative.
``alpha c`` is the Renyi-DP curve of a Gaussian mechanism with noise multiplier ``1 / sqrt(2 c)``, so the
conversion to (epsilon, delta) and the composition of several such releases are dp-accounting's RDP
accountant's (:func:`epsilon`), never a hand-written formula. The bound is an RDP bound: the tighter
privacy-loss-distribution accountant is not justified by it and is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lightning_unlearn.privacy.analysis import check_privacy_parameters

#: relative tolerance of the non-negativity check of the intermediate shifts (rounding of the closed form)
SHIFT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class NoisySteps:
    """``T`` noisy steps ``x -> psi_t(x) + N(0, sigma_t^2 I)``: per step the Lipschitz factor ``rho_t`` and shift
    ``s_t`` of ``psi_t`` (``||psi_t(x) - psi_t(y)|| <= rho_t ||x - y|| + s_t``), the radius ``R_t`` of a ball
    holding its image (``inf``: none) and the noise std ``sigma_t``.

    ``rho_t = inf`` states that nothing bounds how ``psi_t`` moves two points apart (e.g. a gradient step of a
    deep network without gradient clipping): only a projection after it (``R_t``) can then bound the distance.

    Raises:
        ValueError: arrays of different lengths, no step, a negative entry, or ``sigma_t <= 0``.
    """

    rho: tuple[float, ...]
    shift: tuple[float, ...]
    radius: tuple[float, ...]
    sigma: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.rho)
        if n == 0 or not len(self.shift) == len(self.radius) == len(self.sigma) == n:
            raise ValueError(
                f"NoisySteps needs T >= 1 steps and one rho, shift, radius and sigma per step, got lengths "
                f"{len(self.rho)}, {len(self.shift)}, {len(self.radius)}, {len(self.sigma)}"
            )
        for name in ("rho", "shift", "radius"):
            values = getattr(self, name)
            if not all(v >= 0 for v in values):
                raise ValueError(f"NoisySteps {name} must be >= 0 at every step, got {min(values)}")
        if not all(0 < s < math.inf for s in self.sigma):
            raise ValueError(f"NoisySteps sigma must be positive and finite at every step, got {min(self.sigma)}")
        if not all(math.isfinite(s) for s in self.shift):
            raise ValueError("NoisySteps shift must be finite (an unbounded map has rho = inf)")

    def __len__(self) -> int:
        return len(self.rho)

    @classmethod
    def constant(cls, steps: int, *, rho: float, shift: float, sigma: float, radius: float = math.inf) -> NoisySteps:
        """``steps`` identical steps."""
        if steps < 1:
            raise ValueError(f"need steps >= 1, got {steps}")
        return cls((rho,) * steps, (shift,) * steps, (radius,) * steps, (sigma,) * steps)

    @classmethod
    def clipped_gradient(
        cls, steps: int, *, lr: float, clip: float, sigma: float, l2: float = 0.0, radius: float = math.inf
    ) -> NoisySteps:
        """Steps ``x -> (1 - lr l2) x - lr clip_C(g(x))`` ([CUNN]'s gradient clipping; with ``radius``, projected
        onto a ball of that radius after the step, [CUNN]'s model clipping): ``rho = |1 - lr l2|``,
        ``s = 2 lr C`` for any ``g`` (the triangle inequality; ``||clip_C(v)|| <= C``) [derived]."""
        _check_step(lr, l2)
        if not clip > 0:
            raise ValueError(f"gradient clip norm must be positive, got {clip}")
        return cls.constant(steps, rho=abs(1 - lr * l2), shift=2 * lr * clip, sigma=sigma, radius=radius)

    @classmethod
    def convex(
        cls,
        steps: int,
        *,
        lr: float,
        smoothness: float,
        strong_convexity: float,
        sigma: float,
        radius: float = math.inf,
    ) -> NoisySteps:
        """Gradient steps ``x -> x - lr grad F(x)`` on an ``m``-strongly convex, ``M``-smooth ``F`` (``m`` and ``M``
        include any ridge), optionally projected onto a ball: ``rho = max(|1 - lr m|, |1 - lr M|)``, ``s = 0``
        (the Hessian's eigenvalues lie in ``[m, M]``; projection onto a convex set is 1-Lipschitz)."""
        _check_step(lr, strong_convexity)
        if not smoothness >= strong_convexity:
            raise ValueError(f"need smoothness >= strong_convexity, got {smoothness} < {strong_convexity}")
        rho = max(abs(1 - lr * strong_convexity), abs(1 - lr * smoothness))
        return cls.constant(steps, rho=rho, shift=0.0, sigma=sigma, radius=radius)


def _check_step(lr: float, l2: float) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"step size must be positive and finite, got {lr}")
    if not (l2 >= 0 and math.isfinite(l2)):
        raise ValueError(f"weight decay / strong convexity must be >= 0 and finite, got {l2}")


@dataclass(frozen=True)
class Amplification:
    """The bound ``D_alpha(X_T || X'_T) <= alpha * coefficient`` (every ``alpha > 1``, both directions).

    Args:
        coefficient: ``c`` of the module docstring (``0``: the two outputs have the same distribution).
        start: the step ``tau`` the chain of the bound starts after (``0``: the start distance; ``>= 1``: the
            diameter of the projection at step ``tau``).
        total_shift: ``Z_tau``, the distance the noise of steps ``tau..T-1`` hides.
    """

    coefficient: float
    start: int
    total_shift: float

    @property
    def noise_multiplier(self) -> float:
        """``1/sqrt(2c)``: the Gaussian mechanism with the same Renyi-DP curve ``alpha c`` (``inf`` for ``c = 0``)."""
        return math.inf if self.coefficient == 0 else 1.0 / math.sqrt(2.0 * self.coefficient)


def _weights(rho: np.ndarray) -> np.ndarray:
    """``w_t = prod_{k=t+1}^{T-1} rho_k`` (``w_{T-1} = 1``), ``inf`` where a later factor is ``inf``."""
    tail = np.ones(len(rho))
    with np.errstate(invalid="ignore", over="ignore"):
        tail[:-1] = np.cumprod(rho[:0:-1])[::-1]
    tail[np.isnan(tail)] = math.inf  # 0 * inf: a later unbounded step makes the chain unusable anyway
    return tail


def _feasible(u: float, rho: np.ndarray, s: np.ndarray, a: np.ndarray, scale: float) -> bool:
    """Whether the shifts ``a`` keep every intermediate shift ``y_t = rho_t y_{t-1} + s_t - a_t`` (``y_tau = u -
    a_tau``) non-negative and end at ``y_{T-1} = 0`` (to ``SHIFT_TOLERANCE * scale``)."""
    y, tol = u - a[0], SHIFT_TOLERANCE * max(scale, 1e-300)
    for t in range(1, len(a)):
        if y < -tol:
            return False
        y = rho[t] * max(y, 0.0) + s[t] - a[t]
    return abs(y) <= tol


def rdp_coefficient(start_distance: float, steps: NoisySteps) -> Amplification:
    """The smallest ``c`` of the module docstring's theorem: ``D_alpha(X_T || X'_T) <= alpha c``.

    Args:
        start_distance: ``D``, a sure bound on ``||X_0 - X'_0||`` (``inf``: none; then a projection must bound it).
        steps: the noisy steps.

    Raises:
        ValueError: nothing bounds the distance (``D = inf`` and no usable projection), or a negative ``D``.
    """
    if not start_distance >= 0:
        raise ValueError(f"start distance must be >= 0, got {start_distance}")
    rho, s = np.asarray(steps.rho, dtype=float), np.asarray(steps.shift, dtype=float)
    radius, sigma = np.asarray(steps.radius, dtype=float), np.asarray(steps.sigma, dtype=float)
    w = _weights(rho)
    var = (w * sigma) ** 2
    with np.errstate(invalid="ignore"):
        hidden = np.cumsum((var)[::-1])[::-1]  # sum_{t >= tau} w_t^2 sigma_t^2
        later_shift = np.concatenate([np.cumsum((w * s)[:0:-1])[::-1], [0.0]])  # sum_{t > tau} w_t s_t
    u = 2 * radius.copy()
    if start_distance < math.inf:  # rho * 0 is 0 even for an unbounded map: equal starts are coupled equal
        u[0] = min((rho[0] * start_distance if start_distance > 0 else 0.0) + s[0], 2 * radius[0])
    candidates = []
    for tau in range(len(steps)):
        if not (math.isfinite(w[tau]) and math.isfinite(u[tau]) and hidden[tau] > 0):
            continue
        total = w[tau] * u[tau] + later_shift[tau]
        candidates.append((total**2 / (2 * hidden[tau]), tau, total))
    for c, tau, total in sorted(candidates):
        if total == 0:
            return Amplification(0.0, tau, 0.0)
        a = total * w[tau:] * sigma[tau:] ** 2 / hidden[tau]
        if _feasible(u[tau], rho[tau:], s[tau:], a, total):
            return Amplification(float(c), tau, float(total))
    raise ValueError(
        "no bound on the distance between the two processes: give a finite start distance (project the start onto "
        "a ball) with steps of finite rho after it, or a projection (radius) at some step"
    )


def epsilon(coefficient: float, delta: float) -> float:
    """epsilon at ``delta`` of a release whose Renyi-DP curve is ``alpha * coefficient``: dp-accounting's RDP
    accountant on a Gaussian event with noise multiplier ``1/sqrt(2c)`` (its orders and conversion)."""
    check_privacy_parameters(1.0, delta)
    if not coefficient >= 0:
        raise ValueError(f"RDP coefficient must be >= 0, got {coefficient}")
    if coefficient == 0:
        return 0.0
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(dp_event.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(2.0 * coefficient)))
    return float(accountant.get_epsilon(delta))


@lru_cache(maxsize=64)
def target_coefficient(epsilon_target: float, delta: float, rel_tol: float = 1e-10) -> float:
    """The largest ``c`` whose release meets (epsilon, delta) through :func:`epsilon` (bisection on ``log c``; the
    returned ``c`` satisfies it, never just misses it)."""
    check_privacy_parameters(epsilon_target, delta)
    lo, hi = math.log(1e-6), math.log(1e-6)
    while epsilon(math.exp(lo), delta) > epsilon_target:
        lo -= 4.0
    while epsilon(math.exp(hi), delta) <= epsilon_target:
        hi += 4.0
    while hi - lo > rel_tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if epsilon(math.exp(mid), delta) <= epsilon_target else (lo, mid)
    return math.exp(lo)


def calibrate_sigma(epsilon_target: float, delta: float, start_distance: float, unit_steps: NoisySteps) -> float:
    """The constant per-step noise std for which the release meets (epsilon, delta).

    ``unit_steps`` are the steps with ``sigma = 1``: with one ``sigma`` at every step each candidate of
    :func:`rdp_coefficient` scales as ``1/sigma^2``, so ``sigma = sqrt(c(1) / c*)`` with ``c*`` the
    :func:`target_coefficient` (rounded up so that ``c(sigma) <= c*``).

    Raises:
        ValueError: bad (epsilon, delta), ``unit_steps`` with a sigma other than 1, or no bound (see
            :func:`rdp_coefficient`).
    """
    if any(s != 1.0 for s in unit_steps.sigma):
        raise ValueError("calibrate_sigma takes the steps with sigma = 1 at every step")
    unit = rdp_coefficient(start_distance, unit_steps).coefficient
    if unit == 0:
        return 0.0
    target = target_coefficient(epsilon_target, delta)
    sigma = math.sqrt(unit / target)
    while unit / sigma**2 > target:
        sigma = math.nextafter(sigma, math.inf)
    return sigma
