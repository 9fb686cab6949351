"""Forgotten samples out of Avalanche's replay buffers.

Avalanche keeps exemplars in storage policies (``ExemplarsBuffer``): a ``ReplayPlugin``'s
``storage_policy``, or a strategy's own (``DER``, ``ER_ACE``, ...). Their buffers are Avalanche
datasets, subsets of the experiences' datasets, so they carry the ``sample_id`` attribute and every
other per-sample attribute aligned with it (DER's stored ``logits``): keeping the rows of the ids not
forgotten drops a forgotten sample together with everything stored about it.

A ``ReservoirSamplingBuffer`` also ranks its rows by random priorities, which Avalanche exposes no
public way to subset; its retained rows are put into a new reservoir of the same capacity through
``update_from_dataset``, which draws their priorities afresh [interp] (they then compete with later
samples as fresh draws do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from avalanche.training.storage_policy import BalancedExemplarsBuffer, ExemplarsBuffer, ReservoirSamplingBuffer
from torch import Tensor

from lightning_unlearn.avalanche.benchmarks import sample_ids


def storage_policies(owners: Iterable[Any]) -> list[tuple[Any, ExemplarsBuffer]]:
    """``(owner, policy)`` for every ``storage_policy`` among ``owners`` (a strategy and its plugins)."""
    found = []
    for owner in owners:
        policy = getattr(owner, "storage_policy", None)
        if isinstance(policy, ExemplarsBuffer):
            found.append((owner, policy))
    return found


def drop_forgotten(owners: Iterable[Any], forgotten: Callable[[Tensor], Tensor]) -> int:
    """Remove the samples whose ids ``forgotten(ids)`` marks from every buffer of the owners' storage
    policies; returns the number of rows removed.

    Raises:
        ValueError: a buffer holding samples without sample ids (see :func:`sample_ids`).
    """
    removed = 0
    for owner, policy in storage_policies(owners):
        if isinstance(policy, BalancedExemplarsBuffer):
            for key, group in list(policy.buffer_groups.items()):
                kept, n = _kept(group, forgotten)
                if kept is not None:
                    policy.buffer_groups[key] = _rebuilt(group, kept)
                    removed += n
        else:
            kept, n = _kept(policy, forgotten)
            if kept is not None:
                owner.storage_policy = _rebuilt(policy, kept)
                removed += n
    return removed


def _kept(buffer: ExemplarsBuffer, forgotten: Callable[[Tensor], Tensor]) -> tuple[Any, int]:
    """The buffer's dataset without its forgotten rows, and how many they were (``None, 0``: nothing to drop)."""
    if not len(buffer.buffer):
        return None, 0
    drop = forgotten(sample_ids(buffer.buffer))
    if not bool(drop.any()):
        return None, 0
    return buffer.buffer.subset((~drop).nonzero().flatten().tolist()), int(drop.sum())


def _rebuilt(buffer: ExemplarsBuffer, kept: Any) -> ExemplarsBuffer:
    if isinstance(buffer, ReservoirSamplingBuffer):  # its priorities must stay aligned with its rows
        fresh = ReservoirSamplingBuffer(buffer.max_size)
        fresh.update_from_dataset(kept)
        return fresh
    buffer.buffer = kept
    return buffer
