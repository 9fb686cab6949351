"""One noised release: its settings (:class:`ReleaseConfig`), then calibrate, account, draw the noise; shared by
every noise-adding unlearner."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.privacy.accountant import MECHANISMS, PrivacyAccountant, Release, normalise_budget
from lightning_unlearn.privacy.analysis import check_privacy_parameters, classical_sigma, gaussian_sigma
from lightning_unlearn.privacy.noise import gaussian_noise


@dataclass(frozen=True)
class ReleaseConfig:
    """How an unlearner publishes a noised model: the noise, its calibration and its accounting, in one object.

    As Opacus' ``PrivacyEngine(accountant=..., secure_mode=...)`` owns its privacy settings, every noise-adding
    unlearner takes one ``release=`` (:class:`~lightning_unlearn.unlearners.release.ReleasingUnlearner`): it
    publishes ``internal + N(0, sigma^2 I)`` with ``sigma`` calibrated on the per-release (epsilon, delta) by the
    analytic Gaussian mechanism ([AGM]), accounts every release and reports the composed total in each certificate.

    Args:
        epsilon, delta: the per-release target, given together; ``None`` for both: no certified release (SAFE
            then takes a step without calibrated noise).
        noise: add noise at all (``False``: the certificate is not certified, its bounds still reported).
        sigma_override: a fixed noise std instead of the calibrated one (not certified).
        seed: reproducible noise, for experiments only (the certificate is marked seeded, not certified);
            ``None``: noise from the OS entropy source, which nobody can recompute.
        budget: ``epsilon`` or ``(epsilon, delta)`` of the composition of all releases (a bare epsilon at
            ``delta``); a release that would exceed it is refused and nothing changes.
        accountant: ``"pld"`` (exact) or ``"rdp"`` (:class:`~lightning_unlearn.privacy.PrivacyAccountant`).

    Raises:
        ValueError: naming the field: ``epsilon``/``delta`` out of range or only one of them given, a ``budget``
            out of range or without them, a negative or infinite ``sigma_override``, a ``seed`` that is not an
            integer, ``noise`` not a bool, or an unknown ``accountant``.

    Example::

        >>> from lightning_unlearn import ReleaseConfig
        >>> release = ReleaseConfig(epsilon=0.5, budget=4)
        >>> release.epsilon, release.total_budget
        (0.5, (4.0, 1e-05))
        >>> ReleaseConfig(epsilon=0.5, delta=None)
        Traceback (most recent call last):
        ...
        ValueError: ReleaseConfig takes epsilon and delta together; got epsilon=0.5, delta=None
    """

    epsilon: float | None = 1.0
    delta: float | None = 1e-5
    noise: bool = True
    sigma_override: float | None = None
    seed: int | None = None
    budget: float | tuple[float, float] | None = None
    accountant: str = "pld"

    def __post_init__(self) -> None:
        if (self.epsilon is None) != (self.delta is None):
            raise ValueError(
                f"ReleaseConfig takes epsilon and delta together; got epsilon={self.epsilon}, delta={self.delta}"
            )
        if self.epsilon is not None and self.delta is not None:
            check_privacy_parameters(self.epsilon, self.delta)
            object.__setattr__(self, "epsilon", float(self.epsilon))
            object.__setattr__(self, "delta", float(self.delta))
            try:
                normalise_budget(self.budget, self.delta)
            except (TypeError, ValueError) as err:
                raise ValueError(f"ReleaseConfig budget={self.budget!r}: {err}") from None
        elif self.budget is not None:
            raise ValueError("ReleaseConfig budget= accounts (epsilon, delta) releases: give epsilon and delta too")
        if not isinstance(self.noise, bool):
            raise ValueError(f"ReleaseConfig noise must be True or False, got {self.noise!r}")
        if self.sigma_override is not None and not (self.sigma_override >= 0 and math.isfinite(self.sigma_override)):
            raise ValueError(f"ReleaseConfig sigma_override must be finite and >= 0, got {self.sigma_override}")
        if self.seed is not None:
            try:
                operator.index(self.seed)
            except TypeError:
                raise ValueError(f"ReleaseConfig seed must be an integer or None, got {self.seed!r}") from None
        if self.accountant not in MECHANISMS:
            raise ValueError(f"ReleaseConfig accountant must be one of {MECHANISMS}, got {self.accountant!r}")

    @property
    def calibrated(self) -> bool:
        """Whether a release is calibrated on the (epsilon, delta) target (noise on, no ``sigma_override``): what
        a certified release needs."""
        return self.epsilon is not None and self.noise and self.sigma_override is None

    @property
    def uncertified_note(self) -> str:
        """The certificate statement's suffix for a release without a calibrated (epsilon, delta) guarantee (HF App.
        C.3); empty for a calibrated one."""
        if not self.noise:
            return "; NOISE DISABLED: not certified"
        if self.sigma_override is not None:
            return f"; fixed noise std {self.sigma_override:g} (sigma_override): not certified"
        return ""

    def noise_std(self, calibrated: float) -> float:
        """The std a release draws: the ``calibrated`` one, else ``sigma_override``; 0 without noise."""
        if not self.noise:
            return 0.0
        return calibrated if self.sigma_override is None else float(self.sigma_override)

    def target(self) -> tuple[float, float]:
        """The per-release ``(epsilon, delta)``.

        Raises:
            ValueError: there is none (``epsilon=None``): nothing to calibrate the noise on.
        """
        if self.epsilon is None or self.delta is None:
            raise ValueError("a calibrated release needs an (epsilon, delta) target: this ReleaseConfig has none")
        return self.epsilon, self.delta

    @property
    def total_budget(self) -> tuple[float, float] | None:
        """``budget`` as ``(epsilon, delta)`` (:func:`~lightning_unlearn.privacy.normalise_budget`)."""
        return None if self.delta is None else normalise_budget(self.budget, self.delta)


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
    settings: ReleaseConfig,
    accountant: PrivacyAccountant,
) -> PlannedRelease:
    """Calibrate a Gaussian release of a model within ``sensitivity`` (L2) of retraining
    (:func:`calibrated_sigma`), account for it in ``accountant``, check the budget, and draw its noise ([AGM];
    :mod:`lightning_unlearn.privacy.noise`), as ``settings`` say.

    Raises:
        ReleaseRefused: (a ``ValueError``) the release would exceed the budget (``(epsilon, delta)`` of the
            composition of all releases), or its sensitivity is infinite. Nothing is drawn or recorded.
        ValueError: ``settings`` without an (epsilon, delta) target. Nothing is drawn or recorded.
    """
    epsilon, delta = settings.target()
    budget = settings.total_budget
    finite = math.isfinite(sensitivity)
    if not finite and settings.calibrated:
        raise ReleaseRefused("an infinite sensitivity cannot be calibrated: no (epsilon, delta) release is possible")
    formula = calibrated_sigma(sensitivity, epsilon, delta) if finite else math.inf
    std = settings.noise_std(formula)
    release = Release(sigma=std, sensitivity=float(sensitivity), epsilon=epsilon, delta=delta)
    new = accountant.with_release(release)
    new.check_budget(budget)
    drawn = gaussian_noise(shape, std, dtype, settings.seed, len(accountant)) if std > 0 else None
    accounting = {**new.totals(budget[1] if budget else delta), "release": release.to_dict()}
    classical = classical_sigma(sensitivity, epsilon, delta) if finite else math.inf
    return PlannedRelease(drawn, std, formula, classical, new, accounting, settings.seed is not None and std > 0)
