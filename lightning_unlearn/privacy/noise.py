"""Gaussian noise that nobody can recompute, and the explicit, marked exception for experiments.

Like Opacus' ``secure_mode``, the source of noise that carries a guarantee is an explicit choice.
By default every release draws its noise from the operating system's entropy (``os.urandom``, a
cryptographically secure source) through the Box-Muller transform: nothing seeds it and nothing
about it is stored, so knowing the code, the data and every setting does not let anyone subtract
the noise. ``seed=`` makes the noise reproducible from ``seed`` and the release number, for
experiments only: whoever knows the seed can remove the noise, so such a release is marked
``seeded`` and its certificate is not a certificate (``Certificate.certified`` is False).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from lightning_unlearn.warnings import warn


def _secure_uniform(n: int) -> Tensor:
    """``n`` float64 numbers uniform on (0, 1], 53 random bits each, from ``os.urandom``."""
    raw = torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64) if n else torch.zeros(0, dtype=torch.int64)
    bits = torch.bitwise_right_shift(raw, 11) & ((1 << 53) - 1)
    return (bits.double() + 1.0) / float(1 << 53)


def secure_gaussian(shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal samples from the OS entropy source (Box-Muller on :func:`_secure_uniform`)."""
    n = math.prod(shape)
    u = _secure_uniform(2 * ((n + 1) // 2)).view(2, -1)
    radius = torch.sqrt(-2.0 * torch.log(u[0]))
    angle = 2 * math.pi * u[1]
    z = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]
    return z.view(shape).to(dtype)


def gaussian_noise(
    shape: torch.Size | tuple[int, ...], sigma: float, dtype: torch.dtype, seed: int | None, release: int
) -> Tensor:
    """``N(0, sigma^2 I)`` of ``shape``: OS entropy (``seed=None``), or ``torch.Generator`` seeded with
    ``seed + release`` (reproducible, not private; warns).

    Args:
        shape: of the noise.
        sigma: standard deviation (``>= 0``).
        dtype: of the result.
        seed: ``None`` for secure noise; an integer for reproducible experiments.
        release: the release number (the strategy's count of published models), so that the
            seeded noise of successive releases differs.
    """
    if seed is None:
        return sigma * secure_gaussian(shape, dtype)
    warn(
        f"certified noise seeded from seed={seed}: reproducible, hence NOT private (anyone with the seed can remove "
        "it); "
        "the certificate is marked seeded and not certified"
    )
    g = torch.Generator().manual_seed(int(seed) + int(release))
    return sigma * torch.randn(shape, generator=g, dtype=dtype)
