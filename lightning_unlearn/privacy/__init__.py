"""Privacy analysis of certified releases: noise calibration ([AGM]), composition accounting
(``dp-accounting``), secure noise, and the release helper the noise-adding strategies share."""

from lightning_unlearn.privacy.accountant import PrivacyAccountant, Release, normalise_budget
from lightning_unlearn.privacy.analysis import analytic_sigma, classical_sigma, gaussian_delta, gaussian_sigma
from lightning_unlearn.privacy.noise import gaussian_noise, secure_gaussian
from lightning_unlearn.privacy.release import PlannedRelease, ReleaseConfig, plan_release

__all__ = [
    "PlannedRelease",
    "PrivacyAccountant",
    "Release",
    "ReleaseConfig",
    "analytic_sigma",
    "classical_sigma",
    "gaussian_delta",
    "gaussian_noise",
    "gaussian_sigma",
    "normalise_budget",
    "plan_release",
    "secure_gaussian",
]
