"""`PrivacyAccountant`: the privacy loss of every noised model a strategy has published, composed.

Each certified request publishes a new model ``internal + N(0, sigma^2 I)`` whose distance to the
retrained model is bounded by a sensitivity ``Delta``; the release is a Gaussian mechanism with
noise multiplier ``z = sigma / Delta``. An adversary who sees all K releases learns their
composition, whose total (epsilon, delta) the accountant reports, computed by Google's
``dp-accounting`` (privacy-loss-distribution accountant by default, Renyi-DP on request), never by
hand-written composition.

The accountant is immutable: :meth:`PrivacyAccountant.with_release` returns a new one, so a
strategy puts it in :attr:`UnlearningUpdate.state` and a failed request spends nothing. Its
:meth:`state_dict` is small (the history of releases) and is mirrored into the recorder's state
(checkpoints) and into every ledger entry's certificate (:meth:`from_ledger`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from lightning_unlearn.privacy.analysis import check_privacy_parameters

MECHANISMS = ("pld", "rdp")
#: below this noise multiplier (a per-release epsilon of about 40 at delta = 1e-5) the PLD grid grows
#: as 1/z^2; the RDP accountant (a valid, looser upper bound) is used instead
PLD_MIN_NOISE_MULTIPLIER = 0.1


@dataclass(frozen=True)
class Release:
    """One published model: its noise std, the sensitivity it was calibrated on and the per-release target.

    ``noise_multiplier = sigma / sensitivity``: ``inf`` when nothing was removed from the model
    (sensitivity 0: the release reveals nothing about the deleted samples), ``0`` for a release
    without noise (it reveals them entirely).
    """

    sigma: float
    sensitivity: float
    epsilon: float | None = None
    delta: float | None = None

    @property
    def noise_multiplier(self) -> float:
        if self.sensitivity == 0:
            return math.inf
        return self.sigma / self.sensitivity


class PrivacyAccountant:
    """The composed privacy loss of a history of Gaussian releases (like Opacus' accountants, with a
    ``history``), via ``dp-accounting``.

    Args:
        mechanism: ``"pld"`` (privacy loss distributions: tight; the discretisation interval is
            widened for small noise multipliers, which keeps it an upper bound and fast; below
            :data:`PLD_MIN_NOISE_MULTIPLIER` it falls back to RDP) or ``"rdp"`` (Renyi DP: looser,
            instantaneous).
        history: earlier releases (restoring a saved accountant).
    """

    def __init__(self, mechanism: str = "pld", history: tuple[Release, ...] = ()) -> None:
        if mechanism not in MECHANISMS:
            raise ValueError(f"accountant mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        self.mechanism = mechanism
        self.history: tuple[Release, ...] = tuple(history)

    def __len__(self) -> int:
        return len(self.history)

    def __repr__(self) -> str:
        return f"PrivacyAccountant({self.mechanism!r}, releases={len(self)})"

    def with_release(self, release: Release) -> PrivacyAccountant:
        """A new accountant with ``release`` appended (this one is unchanged)."""
        if not (release.sigma >= 0 and release.sensitivity >= 0):
            raise ValueError(f"a release needs sigma >= 0 and sensitivity >= 0, got {release}")
        return PrivacyAccountant(self.mechanism, (*self.history, release))

    @cached_property
    def _counts(self) -> Counter[float]:
        return Counter(r.noise_multiplier for r in self.history if r.noise_multiplier != math.inf)

    @property
    def effective_mechanism(self) -> str:
        """The accountant actually used: ``"rdp"`` when asked, or when a noise multiplier is too small for PLD."""
        if self.mechanism == "pld" and self._counts and min(self._counts) < PLD_MIN_NOISE_MULTIPLIER:
            return "rdp"
        return self.mechanism

    def _dp_accountant(self) -> Any:
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        if self.effective_mechanism == "rdp":
            acc = rdp_privacy_accountant.RdpAccountant()
        else:
            z_min = min(self._counts)
            acc = pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=min(1e-2, 1e-4 * max(1.0, z_min**-2))
            )
        for z, count in sorted(self._counts.items()):
            acc.compose(dp_event.GaussianDpEvent(noise_multiplier=z), count=count)
        return acc

    def get_epsilon(self, delta: float) -> float:
        """Total epsilon of all releases at total ``delta``: ``0`` without a release that revealed
        anything, ``inf`` if one was published without noise."""
        check_privacy_parameters(1.0, delta)
        if not self._counts:
            return 0.0
        if 0.0 in self._counts:
            return math.inf
        return float(self._dp_accountant().get_epsilon(delta))

    def totals(self, delta: float) -> dict[str, float | str]:
        """``{"releases", "epsilon_total", "delta_total", "accountant"}``: what a certificate reports."""
        return {
            "releases": float(len(self)),
            "epsilon_total": self.get_epsilon(delta),
            "delta_total": delta,
            "accountant": self.effective_mechanism,
        }

    def check_budget(self, budget: tuple[float, float] | None) -> None:
        """``ValueError`` if the total epsilon at the budget's delta exceeds the budget's epsilon."""
        if budget is None:
            return
        eps_budget, delta = budget
        spent = self.get_epsilon(delta)
        if spent > eps_budget:
            raise ValueError(
                f"privacy budget exceeded: this release would bring the total to epsilon = {spent:.4g} at delta = "
                f"{delta:g} "
                f"after {len(self)} releases, over the budget epsilon = {eps_budget:g}; nothing was changed"
            )

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "history": [asdict(r) for r in self.history]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyAccountant:
        try:
            return cls(state["mechanism"], tuple(Release(**r) for r in state["history"]))
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"not a PrivacyAccountant state ({err}): {sorted(state) if isinstance(state, dict) else state!r}"
            ) from None

    @classmethod
    def from_ledger(cls, entries: Any, method: str, mechanism: str = "pld") -> PrivacyAccountant:
        """Rebuild the history from a ledger's entries of ``method`` (each certificate carries its release)."""
        history = []
        for entry in entries:
            if entry.method != method:
                continue
            release = entry.certificate.get("accounting", {}).get("release")
            if release is not None:
                history.append(Release(**release))
        return cls(mechanism, tuple(history))


def normalise_budget(budget: float | tuple[float, float] | None, delta: float) -> tuple[float, float] | None:
    """``budget=`` as ``(epsilon, delta)``: a bare epsilon takes the strategy's per-release ``delta``."""
    if budget is None:
        return None
    eps, d = (budget, delta) if isinstance(budget, (int, float)) else budget
    check_privacy_parameters(float(eps), float(d))
    return float(eps), float(d)
