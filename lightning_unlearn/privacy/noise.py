"""Gaussian noise that nobody can recompute, and the explicit, marked exception for experiments.

Like Opacus' ``secure_mode``, the source of noise that carries a guarantee is an explicit choice.
By default every release draws its noise from a cryptographically secure generator keyed by the
operating system's entropy: the ChaCha20 keystream (RFC 8439, the ``cryptography`` package's OpenSSL
implementation) under a fresh 256-bit key and 128-bit nonce from ``os.urandom``, used once and
discarded, through the Box-Muller transform. Nothing seeds it and nothing about it is stored, so
knowing the code, the data and every setting does not let anyone subtract the noise. (ChaCha20 is
the generator behind the Linux kernel's own ``getrandom``; drawing the whole keystream in user space
makes a release of d = 2M parameters several times faster than ``os.urandom`` for every byte. A
seeded statistical generator such as PCG64 or Philox is NOT a substitute: its state can be recovered
from its output.) ``seed=`` makes the noise reproducible from ``seed`` and the release number, for
experiments only: whoever knows the seed can remove the noise, so such a release is marked
``seeded`` and its certificate is not a certificate (``Certificate.certified`` is False).
"""

from __future__ import annotations

import math
import os

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor

from lightning_unlearn.warnings import warn


def secure_bytes(n: int) -> bytearray:
    """``n`` bytes of the ChaCha20 keystream under a fresh key and nonce from ``os.urandom`` (discarded).

    The keystream is the encryption of zeros, written chunk by chunk into one preallocated buffer
    (``update_into`` from a reused block of zeros into a slice of the result): as fast as encrypting in place, and
    within ``update_into``'s contract on every ``cryptography`` release (from 51.0 it refuses an output that
    overlaps its input, which an in-place call did)."""
    buffer = bytearray(n)
    encryptor = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None).encryptor()
    zeros, view = bytes(min(n, _CHUNK)), memoryview(buffer)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        encryptor.update_into(zeros[: stop - start], view[start:stop])
    return buffer


#: bytes of keystream per ``update_into`` call of :func:`secure_bytes` (1 MiB: the block of zeros stays in cache)
_CHUNK = 1 << 20


def _secure_uniform(n: int) -> Tensor:
    """``n`` float64 numbers uniform on (0, 1], on the grid of step ``2^-52``, from :func:`secure_bytes`: 52 random
    mantissa bits (the low bits of each keystream word) under the exponent of 1 give ``[1, 2)``, and ``2 - x``
    maps it onto (0, 1]."""
    if not n:
        return torch.zeros(0, dtype=torch.float64)
    raw = torch.frombuffer(secure_bytes(8 * n), dtype=torch.int64)
    bits = raw.bitwise_and_((1 << 52) - 1).bitwise_or_(0x3FF0000000000000)
    return bits.view(torch.float64).neg_().add_(2.0)


def secure_gaussian(shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float64) -> Tensor:
    """Standard normal samples from the secure generator (Box-Muller on :func:`_secure_uniform`): the radius
    ``sqrt(-2 ln u)`` in float64, the sines and cosines of the angles in float64, or in float32 for a float32 or
    narrower result (an error of ~1e-7 |z|, the order of the result's own rounding; half the time of float64).
    The radius of ``u >= 2^-52`` reaches 8.49: the tails beyond it, probability ``2e-17`` per coordinate, are cut
    (the previous 53-bit uniforms cut at 8.57)."""
    n = math.prod(shape)
    half = (n + 1) // 2
    z = _secure_uniform(2 * half)
    radius, angle = z[:half].log_().mul_(-2.0).sqrt_(), z[half:].mul_(2 * math.pi)
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        radius, angle = radius.float(), angle.float()
        z = torch.empty(2 * half, dtype=torch.float32)
        torch.sin(angle, out=z[:half]).mul_(radius)
        torch.cos(angle, out=z[half:]).mul_(radius)
    else:  # in place: r cos(a) over the angles, r sin(a) over the radii
        sine = torch.sin(angle)
        angle.cos_().mul_(radius)
        radius.mul_(sine)
    return z[:n].view(shape).to(dtype)


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
        return secure_gaussian(shape, dtype).mul_(sigma)
    warn(
        f"certified noise seeded from seed={seed}: reproducible, hence NOT private (anyone with the seed can remove "
        "it); "
        "the certificate is marked seeded and not certified"
    )
    g = torch.Generator().manual_seed(int(seed) + int(release))
    return sigma * torch.randn(shape, generator=g, dtype=dtype)
