"""`Certificate`: what an unlearning step guarantees."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Certificate:
    """The guarantee attached to one executed forget request.

    ``exact=True``: the new weights equal those of retraining on the retained data (up to floating
    point), and ``statement`` names the theorem. Otherwise the step is (epsilon, delta)-certified:
    Gaussian noise of standard deviation ``sigma`` was added, calibrated on the bound terms in
    ``bounds`` (e.g. the gradient-residual or parameter-distance bound ``delta_bound``).
    An uncertified heuristic (fine-tuning, NegGrad, ...) has ``exact=False`` and ``epsilon=None``.
    """

    method: str
    exact: bool
    epsilon: float | None = None
    delta: float | None = None
    sigma: float | None = None
    bounds: dict[str, float] = field(default_factory=dict)
    statement: str = ""

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

    @property
    def certified(self) -> bool:
        """True for exact removal or an (epsilon, delta) guarantee; False for heuristics."""
        return self.exact or self.epsilon is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Certificate:
        return cls(**d)

    def __str__(self) -> str:
        if self.exact:
            return f"{self.method}: exact ({self.statement})"
        if self.epsilon is not None:
            return f"{self.method}: ({self.epsilon:g}, {self.delta:g})-certified, sigma={self.sigma:.3g}"
        return f"{self.method}: uncertified"
