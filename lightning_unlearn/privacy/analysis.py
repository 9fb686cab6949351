"""Pure privacy analysis of the Gaussian mechanism: calibration of the noise to a sensitivity.

A release ``M(D) = f(D) + N(0, sigma^2 I)`` whose query moves by at most ``Delta`` (L2) between
neighbouring inputs is (epsilon, delta)-indistinguishable iff ([AGM] Theorem 8)

    Phi(Delta/(2 sigma) - epsilon sigma/Delta) - e^epsilon Phi(-Delta/(2 sigma) - epsilon sigma/Delta) <= delta.

:func:`analytic_sigma` returns the smallest such sigma (the tightest valid Gaussian noise, at any
epsilon). :func:`classical_sigma` is the textbook ``Delta sqrt(2 ln(1.25/delta))/epsilon`` that [HF]
Alg. 1 line 13, [CCL] Alg. 1 line 12 and [SAFE] Thm 2(iii) write: it is valid only for
``epsilon <= 1`` ([AGM] Sec. 2 shows it fails for larger epsilon) and is never smaller than the
analytic sigma there; the library calibrates with :func:`gaussian_sigma` (the analytic one) and
reports the classical one for comparison.
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr, ndtri


def check_privacy_parameters(epsilon: float, delta: float) -> None:
    """``ValueError`` unless ``epsilon`` is positive and finite and ``delta`` lies in (0, 1)."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


def _check_sensitivity(sensitivity: float) -> None:
    if not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"noise sensitivity (bound) must be finite and >= 0, got {sensitivity}")


def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """The exact delta of the Gaussian mechanism at ``epsilon`` ([AGM] Theorem 8), computed in log space.

    ``0`` for ``sensitivity = 0`` (nothing to hide), ``1`` for ``sigma = 0`` and a positive sensitivity.
    """
    _check_sensitivity(sensitivity)
    if sensitivity == 0:
        return 0.0
    if sigma <= 0:
        return 1.0
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    log_first = log_ndtr(a - b)
    # e^eps Phi(-a-b) <= Phi(a-b) exactly (delta >= 0): the bound keeps the rounding of a huge epsilon plus a huge
    # negative log_ndtr (their exact sum is <= log_first <= 0) from overflowing exp
    log_second = min(epsilon + log_ndtr(-a - b), log_first)
    return max(math.exp(log_first) - math.exp(log_second), 0.0)


def classical_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """``sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon`` ([HF] Alg. 1 line 13, [CCL] Alg. 1 line 12,
    [SAFE] Thm 2(iii)): an (epsilon, delta) guarantee for ``epsilon <= 1`` only; never below
    :func:`analytic_sigma` in that range. Reported next to the analytic sigma, not used to calibrate.
    """
    check_privacy_parameters(epsilon, delta)
    _check_sensitivity(sensitivity)
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def analytic_sigma(sensitivity: float, epsilon: float, delta: float, rel_tol: float = 1e-12) -> float:
    """The smallest sigma satisfying the [AGM] Theorem 8 condition, valid for every epsilon > 0.

    ``gaussian_delta`` decreases in sigma; bisection on ``log sigma`` between a bracket that is
    checked to contain the root, to relative precision ``rel_tol``, returning the upper end (so
    the returned sigma satisfies the condition, never just misses it).

    Raises:
        ValueError: bad epsilon, delta or sensitivity.
    """
    check_privacy_parameters(epsilon, delta)
    _check_sensitivity(sensitivity)
    if sensitivity == 0:
        return 0.0
    lo, hi = math.log(sensitivity) - 2.0, math.log(sensitivity) + 2.0
    while gaussian_delta(math.exp(lo), sensitivity, epsilon) <= delta:
        lo -= 4.0
    while gaussian_delta(math.exp(hi), sensitivity, epsilon) > delta:
        hi += 4.0
    while hi - lo > rel_tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if gaussian_delta(math.exp(mid), sensitivity, epsilon) <= delta else (mid, hi)
    return math.exp(hi)


def gaussian_epsilon(mu: float, delta: float, rel_tol: float = 1e-12) -> float:
    """The smallest epsilon at which a Gaussian mechanism with ``Delta / sigma = mu`` is (epsilon, delta)-DP:
    the [AGM] Theorem 8 condition (:func:`gaussian_delta`, decreasing in epsilon) solved by bisection to relative
    precision ``rel_tol``, returning the upper end (never below the true epsilon). ``0`` when ``delta`` already
    covers ``epsilon = 0``, ``inf`` for ``mu = inf`` (a release without noise).

    Above ``mu = 1e6`` (noise far below the sensitivity, e.g. an uncertified ``sigma_override``) the condition's two
    terms cancel beyond float precision, and the privacy loss's tail bound is returned instead: the loss is
    ``N(mu^2/2, mu^2)``, and ``delta(epsilon) <= P(loss > epsilon)`` gives the valid
    ``epsilon = mu^2/2 + mu Phi^{-1}(1 - delta)``, within a relative ``2 Phi^{-1}(1 - delta) / mu < 1e-5`` of the
    exact one [derived]; ``inf`` where that exceeds the float range.

    Raises:
        ValueError: ``mu < 0`` or ``delta`` outside (0, 1).
    """
    check_privacy_parameters(1.0, delta)
    if not mu >= 0:
        raise ValueError(f"mu = Delta/sigma must be >= 0, got {mu}")
    if mu > 1e6:
        return mu * mu / 2 + mu * float(ndtri(1 - delta))  # inf beyond the float range
    if gaussian_delta(1.0, mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    while gaussian_delta(1.0, mu, hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if gaussian_delta(1.0, mu, mid) <= delta else (mid, hi)
    return hi


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Noise std of an (epsilon, delta) Gaussian release of a query with L2 sensitivity ``sensitivity``:
    the analytic Gaussian mechanism (:func:`analytic_sigma`) at every epsilon. ``N(0, sigma I)`` in
    [HF]/[CCL] is read as standard deviation sigma."""
    return analytic_sigma(sensitivity, epsilon, delta)
