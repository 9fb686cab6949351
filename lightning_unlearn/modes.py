"""`eval_mode`: run a block with a module in eval mode (batch-norm statistics fixed, no dropout)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode for the block and restore its previous mode afterwards, even on error."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)
