"""`eval_mode`: run a block with a module in eval mode (batch-norm statistics fixed, no dropout);
`module_device`: where a module computes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain

import torch
from torch import Tensor, nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode for the block and restore its previous mode afterwards, even on error."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer), the CPU without either: where inputs must go.

    Lightning's teardown moves a fitted module to the CPU while recorders keep statistics where it was fitted;
    code that feeds data to a module moves it here rather than assuming either."""
    return next(chain(module.parameters(), module.buffers()), torch.empty(0)).device


def module_input(module: nn.Module, x: Tensor) -> Tensor:
    """``x`` moved to ``module``'s device and, when floating, cast to the dtype of its first floating parameter:
    what Lightning's precision plugin does to each batch of a ``precision="64-true"`` (or ``"bf16-true"``) fit, so
    that code evaluating a module outside the Trainer reads the same data the fit did. Integer inputs (token ids)
    keep their dtype."""
    first = next((p for p in chain(module.parameters(), module.buffers()) if p.is_floating_point()), None)
    if first is None or not x.is_floating_point():
        return x.to(module_device(module))
    return x.to(first.device, first.dtype)
