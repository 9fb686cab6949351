"""`ReleasingUnlearner`: the release settings, accounting and publishing shared by the unlearners that publish a
noised model.

[HF], both [CCL] methods and [SAFE] (with ``epsilon``) end a request the same way: a noise-free
internal model within an L2 ``sensitivity`` of retraining is published as ``internal + N(0, sigma^2 I)``
with ``sigma`` from the analytic Gaussian mechanism ([AGM]), the release is accounted and checked
against the budget (:func:`~lightning_unlearn.privacy.plan_release`). This base class owns the settings
(one :class:`~lightning_unlearn.privacy.ReleaseConfig`), the accountant and that one step,
:meth:`ReleasingUnlearner._release`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.privacy import PlannedRelease, ReleaseConfig, plan_release
from lightning_unlearn.unlearners.base import Unlearner


def all_finite(t: Tensor) -> bool:
    """Whether every entry of ``t`` is finite, in one pass without a mask: the smallest and the largest entry are
    finite exactly when all are (a NaN propagates to both); 8x faster than a float64 sum, 17x than ``isfinite``."""
    if not t.numel():
        return True
    low, high = torch.aminmax(t)
    return math.isfinite(float(low)) and math.isfinite(float(high))


@dataclass(frozen=True)
class Publication:
    """One noised release of a flat internal model, computed before anything changes.

    Args:
        weights: ``internal + noise`` (flat), what the module receives; without noise ``internal`` itself (no
            copy: the module's parameters become views of it, so a strategy keeping ``internal`` sees them move
            when the module trains, and tells a trained module apart by its recorder, not by comparing weights).
        noise_norm: the L2 norm of the noise drawn (0 without noise).
        plan: the calibration and accounting (:class:`~lightning_unlearn.privacy.PlannedRelease`).
        noised: whether noise was added at all (the strategy's ``noise``).
        certified: noise calibrated on the (epsilon, delta) target (``noise`` and no ``sigma_override``).
        target: the per-release ``(epsilon, delta)``.
    """

    weights: Tensor
    noise_norm: float
    plan: PlannedRelease
    noised: bool
    certified: bool
    target: tuple[float, float]

    @property
    def state(self) -> dict[str, Any]:
        """The strategy's state change to commit with the update (the accountant with this release)."""
        return {"accountant": self.plan.accountant}

    @property
    def sigma_bounds(self) -> dict[str, float]:
        """The analytic ([AGM]) and the classical sigma of the target, for the certificate's bounds."""
        return {"sigma_formula": self.plan.sigma_formula, "sigma_classical": self.plan.sigma_classical}

    def certificate_fields(self) -> dict[str, Any]:
        """``epsilon``/``delta`` (only for a certified release), ``sigma`` (``None`` without noise),
        ``seeded`` and ``accounting`` of the :class:`~lightning_unlearn.core.certificate.Certificate`."""
        epsilon, delta = self.target if self.certified else (None, None)
        return {
            "epsilon": epsilon,
            "delta": delta,
            "sigma": self.plan.sigma if self.noised else None,
            "seeded": self.plan.seeded,
            "accounting": self.plan.accounting,
        }


class ReleasingUnlearner(Unlearner):
    """An :class:`Unlearner` that publishes ``internal + N(0, sigma^2 I)`` ([AGM]) and accounts every release.

    Its :attr:`release` (a :class:`~lightning_unlearn.privacy.ReleaseConfig`) owns the noise, its calibration and
    its accounting; :meth:`_release` is the one step that applies it. Every release is recorded in
    :attr:`accountant` (restored from the recorder's state or the ledger; ``None`` without an (epsilon, delta)
    target), the certificate reports the composed total, and a release beyond the budget is refused (nothing
    changes).

    Args:
        module, recorder, ledger: as for :class:`Unlearner`.
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`);
            ``None``: the unlearner's :attr:`default_release`.

    Raises:
        TypeError: ``release`` is not a :class:`~lightning_unlearn.privacy.ReleaseConfig`.
    """

    certified_noise = True
    #: the release of an unlearner built with ``release=None``
    default_release: ClassVar[ReleaseConfig] = ReleaseConfig()

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        ledger: Ledger | None = None,
        *,
        release: ReleaseConfig | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger)
        if release is not None and not isinstance(release, ReleaseConfig):
            raise TypeError(f"{self.method} release= takes a ReleaseConfig, got {type(release).__name__}")
        self.release = self.default_release if release is None else release
        if self.release.epsilon is not None:
            self.accountant = self.restore_accountant(self.release.accountant)

    def _release(self, sensitivity: float, internal: Tensor) -> Publication:
        """Calibrate, account and draw the noise of publishing ``internal`` (flat) at L2 ``sensitivity``.

        Touches nothing: commit :attr:`Publication.state` with the update to record the release.

        Raises:
            ValueError: the release would exceed the budget, an infinite ``sensitivity`` for a
                calibrated release, or a published model that is not finite.
        """
        if self.accountant is None:
            raise ValueError(f"{self.method} was built without epsilon/delta: it has no calibrated release")
        plan = plan_release(sensitivity, internal.shape, internal.dtype, self.release, self.accountant)
        if plan.noise is None:  # sigma = 0 on every rank alike: nothing drawn, nothing to broadcast
            weights, noise_norm = internal, 0.0
        else:  # drawn on the CPU (OS entropy); under DDP every rank publishes rank 0's draw
            noise = self.recorder.broadcast_from_rank0(plan.noise).to(internal.device)
            weights, noise_norm = internal + noise, float(noise.norm())
        if not all_finite(weights):
            raise ValueError(f"{self.method} update is not finite (diverged statistics or weights?)")
        release = self.release
        return Publication(weights, noise_norm, plan, release.noise, release.calibrated, release.target())
