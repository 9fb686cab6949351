"""`UnlearningResult`: what one executed forget request did (the ledger records it, reporting logs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.request import ForgetRequest


@dataclass
class UnlearningResult:
    """What one executed :class:`ForgetRequest` did."""

    request: ForgetRequest
    removed_ids: Tensor
    certificate: Certificate
    wall_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)
