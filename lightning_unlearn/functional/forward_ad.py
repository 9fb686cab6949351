"""torch's forward-mode autodiff, loaded once without the deprecation warning torch raises about its own code.

On the first forward-mode call of a process (``torch.func.jvp``, ``jacfwd``, ``hessian``), torch 2.14 loads the
decompositions of forward-mode AD by ``torch.jit.script``-ing them, and ``torch.jit.script`` warns that it is
deprecated (a ``FutureWarning`` per decomposition): torch's call, nothing a user of this library can change.
:func:`load_forward_ad` makes that first call on a scalar inside a filter that drops this one warning (every
other warning passes); the library calls it before its own forward-mode products.
"""

from __future__ import annotations

import warnings
from functools import cache

import torch
from torch.func import jvp


@cache
def load_forward_ad() -> None:
    """Load torch's forward-mode decompositions (once per process), without their ``torch.jit.script`` warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
        jvp(torch.sin, (torch.zeros(()),), (torch.ones(()),))
