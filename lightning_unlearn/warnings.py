"""The library's own warning category, so users and tests can filter it apart from third-party noise."""

from __future__ import annotations

from lightning.pytorch.utilities.rank_zero import rank_zero_warn


class UnlearningWarning(UserWarning):
    """An assumption of a method visibly fails, or a result is weaker than asked (e.g. a certificate
    built on estimated constants). Filter with ``-W error::lightning_unlearn.warnings.UnlearningWarning``."""


def warn(message: str, stacklevel: int = 4) -> None:
    """Warn once per process group (rank 0), as :class:`UnlearningWarning`."""
    rank_zero_warn(message, category=UnlearningWarning, stacklevel=stacklevel)
