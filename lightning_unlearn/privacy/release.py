"""One noised release: calibrate, account, draw the noise; shared by every noise-adding strategy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.privacy.accountant import PrivacyAccountant, Release
from lightning_unlearn.privacy.analysis import classical_sigma, gaussian_sigma
from lightning_unlearn.privacy.noise import gaussian_noise


@dataclass(frozen=True)
class PlannedRelease:
    """What a release adds and spends, computed before anything changes.

    ``sigma`` is the std actually used (the analytic sigma, or ``sigma_override``, or 0 without
    noise); ``sigma_formula`` the analytic sigma for the target (epsilon, delta) and
    ``sigma_classical`` the textbook formula's (valid for epsilon <= 1 only), both reported.
    ``accountant`` is the strategy's accountant with this release appended (commit it with the
    update's ``state``); ``accounting`` the certificate's field.
    """

    noise: Tensor | None
    sigma: float
    sigma_formula: float
    sigma_classical: float
    accountant: PrivacyAccountant
    accounting: dict[str, Any]
    seeded: bool


@lru_cache(maxsize=64)
def _unit_sigma(epsilon: float, delta: float) -> float:
    return gaussian_sigma(1.0, epsilon, delta)


def calibrated_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The analytic Gaussian mechanism's sigma for ``sensitivity`` ([AGM] Theorem 8), as ``sensitivity`` times
    the sigma of sensitivity 1.

    The condition of Theorem 8 depends on ``sensitivity / sigma`` only, so one calibration per
    ``(epsilon, delta)`` serves every release, and every release of one target gets the same noise
    multiplier ``z = sigma / sensitivity`` up to a few ulp (rounded up, never below ``z``): the accountant
    composes them as a few events with counts, at a cost that does not grow with the number of releases
    (bisecting each sensitivity separately gave every release its own multiplier, to 1e-12).
    """
    if sensitivity == 0:
        return 0.0
    z = _unit_sigma(epsilon, delta)
    sigma = sensitivity * z
    while sigma / sensitivity < z:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def plan_release(
    sensitivity: float,
    shape: torch.Size,
    dtype: torch.dtype,
    *,
    epsilon: float,
    delta: float,
    accountant: PrivacyAccountant,
    noise: bool = True,
    sigma_override: float | None = None,
    seed: int | None = None,
    budget: tuple[float, float] | None = None,
) -> PlannedRelease:
    """Calibrate a Gaussian release of a model within ``sensitivity`` (L2) of retraining
    (:func:`calibrated_sigma`), account for it, check the budget, and draw its noise ([AGM];
    :mod:`lightning_unlearn.privacy.noise`).

    Raises:
        ReleaseRefused: (a ``ValueError``) the release would exceed ``budget`` (``(epsilon, delta)`` of the
            composition of all releases), or its sensitivity is infinite. Nothing is drawn or recorded.
        ValueError: bad parameters. Nothing is drawn or recorded.
    """
    finite = math.isfinite(sensitivity)
    if not finite and noise and sigma_override is None:
        raise ReleaseRefused("an infinite sensitivity cannot be calibrated: no (epsilon, delta) release is possible")
    formula = calibrated_sigma(sensitivity, epsilon, delta) if finite else math.inf
    std = (formula if sigma_override is None else float(sigma_override)) if noise else 0.0
    release = Release(sigma=std, sensitivity=float(sensitivity), epsilon=epsilon, delta=delta)
    new = accountant.with_release(release)
    new.check_budget(budget)
    drawn = gaussian_noise(shape, std, dtype, seed, len(accountant)) if std > 0 else None
    accounting = {**new.totals(budget[1] if budget else delta), "release": release.to_dict()}
    classical = classical_sigma(sensitivity, epsilon, delta) if finite else math.inf
    return PlannedRelease(drawn, std, formula, classical, new, accounting, seed is not None and std > 0)
