"""`Certificate`: what an unlearning step guarantees."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

CONSTANTS = ("bounded", "given", "estimated")
RECIPES = ("checked", "unchecked")


@dataclass(frozen=True)
class Certificate:
    """The guarantee attached to one executed forget request.

    ``exact=True``: the new weights equal those of retraining on the retained data (up to floating
    point), and ``statement`` names the theorem. Otherwise the step may be (epsilon, delta)-certified:
    Gaussian noise of standard deviation ``sigma`` was added, calibrated on the bound terms in
    ``bounds`` (e.g. the gradient-residual or parameter-distance bound ``gamma``).
    An uncertified heuristic (fine-tuning, NegGrad, ...) has ``exact=False`` and ``epsilon=None``; if it
    added noise all the same (a fixed noise std, ``ReleaseConfig(sigma_override=...)``), ``sigma`` says how much, and
    :attr:`guarantee` calls it uncertified noise.

    A noised release states what its (epsilon, delta) rests on, and is :attr:`certified` only if
    all of it holds:

    * ``constants``: ``"bounded"`` (the smoothness, gradient and strong-convexity constants are
      proved upper/lower bounds for the model and data), ``"given"`` (asserted by the caller) or
      ``"estimated"`` (observed maxima along training: not a proof, so not certified);
    * ``recipe``: ``"checked"`` (the training satisfied the theorem's conditions, e.g. the step
      size of [HF] Lemma 3 or each [CCL] task solved to the stated tolerance) or ``"unchecked"``;
    * ``seeded``: the noise came from a user seed (reproducible, so removable: not private);
    * ``accounting``: the composition of all releases so far (``releases``, ``epsilon_total`` at
      ``delta_total``, the ``accountant`` used, and this ``release``), whatever the per-release
      epsilon says;
    * ``assumptions``: what the bound's proof rests on, one line each, saying whether it was checked
      (and against what), asserted by the caller, or estimated from the data (empty in entries written
      before the field existed).

    Raises:
        ValueError: an exact certificate with an epsilon or noise; an epsilon not positive and finite, a delta
            outside (0, 1) or a sigma below 0; an unknown ``constants`` or ``recipe``.

    Example::

        >>> from lightning_unlearn import Certificate
        >>> exact = Certificate("retrain", exact=True, statement="retrained on the retained data")
        >>> exact.certified, exact.exact
        (True, True)
        >>> print(exact)
        retrain: exact (retrained on the retained data)
        >>> noised = Certificate("hf", exact=False, epsilon=1.0, delta=1e-5, sigma=0.25, constants="bounded")
        >>> noised.certified, noised.exact, noised.guarantee
        (True, False, '(1,1e-05)')
        >>> print(noised)
        hf: (1, 1e-05) certified, sigma=0.25
        >>> print(Certificate("hf", exact=False, epsilon=1.0, delta=1e-5, sigma=0.25, constants="estimated"))
        hf: (1, 1e-05) NOT certified (estimated constants), sigma=0.25
    """

    method: str
    exact: bool
    epsilon: float | None = None
    delta: float | None = None
    sigma: float | None = None
    bounds: dict[str, float] = field(default_factory=dict)
    statement: str = ""
    constants: str | None = None
    recipe: str | None = None
    seeded: bool = False
    accounting: dict[str, Any] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.exact and (self.epsilon is not None or self.sigma):
            raise ValueError("an exact Certificate carries no (epsilon, delta) or noise")
        if self.epsilon is not None:
            if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
                raise ValueError(f"Certificate epsilon must be positive and finite, got {self.epsilon}")
            if self.delta is None or not (0 < self.delta < 1):
                raise ValueError(f"Certificate delta must lie in (0, 1), got {self.delta}")
            if self.sigma is None or self.sigma < 0:
                raise ValueError(f"a certified Certificate needs a noise sigma >= 0, got {self.sigma}")
        if self.sigma is not None and not self.sigma >= 0:
            raise ValueError(f"Certificate sigma (the noise std) must be >= 0, got {self.sigma}")
        if self.constants not in (None, *CONSTANTS):
            raise ValueError(f"Certificate constants must be one of {CONSTANTS}, got {self.constants!r}")
        if self.recipe not in (None, *RECIPES):
            raise ValueError(f"Certificate recipe must be one of {RECIPES}, got {self.recipe!r}")

    @property
    def caveats(self) -> list[str]:
        """Why an (epsilon, delta) statement is not a certificate (empty when it is)."""
        out = []
        if self.constants == "estimated":
            out.append("estimated constants")
        if self.recipe == "unchecked":
            out.append("recipe unchecked")
        if self.seeded:
            out.append("seeded: not private")
        return out

    @property
    def certified(self) -> bool:
        """True for exact removal, or an (epsilon, delta) guarantee without :attr:`caveats`; False otherwise."""
        return self.exact or (self.epsilon is not None and not self.caveats)

    @property
    def noised(self) -> bool:
        """Whether the release added noise (a positive ``sigma``)."""
        return bool(self.sigma)

    @property
    def guarantee(self) -> str:
        """What the request promises, in one space-free token for tables: ``exact``, ``(eps,delta)`` when
        :attr:`certified`, ``uncertified-noise(sigma=...)`` for noise without a valid certificate (never
        ``none``: the noise was released), ``none`` when nothing is promised and no noise was added."""
        if self.exact:
            return "exact"
        if self.certified:
            return f"({self.epsilon:g},{self.delta:g})"
        if self.noised:
            return f"uncertified-noise(sigma={self.sigma:.3g})"
        return "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Certificate:
        return cls(**d)

    def __str__(self) -> str:
        if self.exact:
            return f"{self.method}: exact ({self.statement})"
        if self.epsilon is not None:
            total = self.accounting.get("epsilon_total")
            spent = (
                f", total epsilon {total:.3g} after {int(self.accounting['releases'])} releases"
                if total is not None
                else ""
            )
            status = "certified" if self.certified else f"NOT certified ({'; '.join(self.caveats)})"
            return f"{self.method}: ({self.epsilon:g}, {self.delta:g}) {status}, sigma={self.sigma:.3g}{spent}"
        if self.noised:
            return f"{self.method}: uncertified noise, sigma={self.sigma:.3g} (no (epsilon, delta) certificate)"
        return f"{self.method}: uncertified"
