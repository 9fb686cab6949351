"""The weights digest of a ledger entry: BLAKE3 over a module's ``state_dict``, named by its algorithm.

An entry pins which weights a request published with ``"blake3:<hex>"`` (256 bits) over the names,
dtypes, shapes and bytes of every tensor of the module's ``state_dict`` (sorted by name). BLAKE3 is
a cryptographic hash (collision- and preimage-resistant), so a forger cannot publish other weights
under a recorded digest. It was chosen over SHA-256 and BLAKE2b by measurement on a resnet18's
44.6 MiB (``benchmarks/digest.py``, table in docs/benchmarks.md): 3 to 6 times faster than SHA-256 on one
thread here, so a request pays a few hundredths of a second for it at 11M parameters. Entries
written before (a bare 32-hex-digit digest) used XXH3-128, which is fast but not collision-resistant:
they are still read and compared (:func:`digest_matches`), and :func:`digest_algorithm` names them so
an auditor knows which entries the digest does not protect against a forger.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import blake3
import torch
import xxhash
from torch import Tensor, nn

ALGORITHM = "blake3"
LEGACY = "xxh3-128"
_LEGACY_FORM = re.compile(r"[0-9a-f]{32}")


def state_bytes(module: nn.Module) -> Iterator[bytes | memoryview]:
    """What the digest covers, in order: for each ``state_dict`` entry (sorted by name) a ``name|dtype|shape|``
    header, then the tensor's bytes (read in place when the tensor is contiguous on the CPU)."""
    return tensors_bytes(module.state_dict())


def tensors_bytes(tensors: Mapping[str, Tensor]) -> Iterator[bytes | memoryview]:
    """:func:`state_bytes` of any named tensors (e.g. part of a module's ``state_dict``)."""
    for name, t in sorted(tensors.items()):
        t = t.detach().cpu().contiguous()
        yield f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
        if t.numel():
            yield t.reshape(-1).view(torch.uint8).numpy().data


def weights_digest(module: nn.Module, algorithm: str = ALGORITHM) -> str:
    """``"blake3:<hex>"`` of a module's ``state_dict`` (:func:`state_bytes`); ``algorithm="xxh3-128"`` checks a
    legacy entry (returned bare, as such entries were written).

    Raises:
        ValueError: another algorithm.
    """
    h: Any
    if algorithm == ALGORITHM:
        h = blake3.blake3()
    elif algorithm == LEGACY:
        h = xxhash.xxh3_128()
    else:
        raise ValueError(
            f"weights digest algorithm must be {ALGORITHM!r} (or {LEGACY!r} for old entries), got {algorithm!r}"
        )
    for chunk in state_bytes(module):
        h.update(chunk)
    return h.hexdigest() if algorithm == LEGACY else f"{algorithm}:{h.hexdigest()}"


def tensors_digest(tensors: Mapping[str, Tensor]) -> str:
    """``"blake3:<hex>"`` of named tensors (:func:`tensors_bytes`), e.g. the frozen part of a module."""
    h = blake3.blake3()
    for chunk in tensors_bytes(tensors):
        h.update(chunk)
    return f"{ALGORITHM}:{h.hexdigest()}"


def digest_algorithm(recorded: str) -> str:
    """The algorithm of a recorded digest: ``"blake3"``, or ``"xxh3-128"`` for a bare 32-hex-digit one.

    Raises:
        ValueError: neither form.
    """
    if recorded.startswith(ALGORITHM + ":"):
        return ALGORITHM
    if _LEGACY_FORM.fullmatch(recorded):
        return LEGACY
    raise ValueError(f"unrecognised weights digest {recorded[:40]!r} (expected 'blake3:<hex>' or 32 hex digits)")


def digest_matches(module: nn.Module, recorded: str) -> bool:
    """Whether ``module``'s weights have the ``recorded`` digest, computed with the algorithm it was written with."""
    return weights_digest(module, digest_algorithm(recorded)) == recorded
