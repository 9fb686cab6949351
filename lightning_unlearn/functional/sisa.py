"""The pure parts of [SISA] training on a stream: shard and slice assignment, stage epochs and seeds, and which
(shard, stage) pairs a change of the slices retrains.

A *stage* is one slice position of the stream (the same positions in every shard); stage ``t`` of shard ``s`` trains
shard ``s``'s model, from its state after stage ``t - 1``, on the shard's slices ``1..t`` (cumulative, as [SISA]
Sec. IV-B). Every function here is deterministic in its arguments, so the assignment and the training recipe of a
from-scratch run on the retained data can be replayed exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

Partition = Literal["random", "class"]
PARTITIONS: tuple[Partition, ...] = ("random", "class")
#: the multiplier that separates the shards' stage seeds (``seed + SHARD_STRIDE * shard + stage``)
SHARD_STRIDE = 100_003


def sisa_epochs(total_epochs: int, slices: int) -> list[int]:
    """Epochs of each stage such that the sliced training costs about as many sample-epochs as ``total_epochs`` epochs
    over all the data: stage ``k`` runs ``floor(k a) - floor((k - 1) a)`` epochs, ``a = 2 total_epochs / (slices + 1)``
    (the schedule of [SISA]'s released code, ``sisa.py``: stage ``k`` sees ``k / slices`` of the data).

    Raises:
        ValueError: ``total_epochs`` or ``slices`` below 1.
    """
    if total_epochs < 1 or slices < 1:
        raise ValueError(f"sisa_epochs needs total_epochs >= 1 and slices >= 1, got {total_epochs} and {slices}")
    a = 2 * total_epochs / (slices + 1)
    return [int(k * a) - int((k - 1) * a) for k in range(1, slices + 1)]


def stage_seed(seed: int, shard: int, stage: int) -> int:
    """The seed of stage ``stage`` (1-based) of shard ``shard``: its RNGs and its loader's shuffling."""
    return seed + SHARD_STRIDE * shard + stage


def class_shard(label: int, shards: int) -> int:
    """The shard of class ``label`` under ``partition="class"``: ``label mod shards`` ([ARCANE]'s split by class)."""
    return label % shards


def assign(
    ids: Tensor, labels: Tensor, shards: int, slices: int, seed: int, experience: int, partition: Partition = "random"
) -> list[list[Tensor]]:
    """Split one experience's samples into ``shards`` x ``slices`` id lists (``[shard][slice]``, in training order).

    ``"random"``: the ids are permuted by a generator seeded ``(seed, experience)`` and cut into ``shards`` nearly equal
    parts; ``"class"``: each sample goes to the shard of its class (:func:`class_shard`), in a permuted order. Each
    shard's part is then cut into ``slices`` nearly equal slices.

    Raises:
        ValueError: an unknown partition, fewer than one shard or slice, or ids and labels of different lengths.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    if shards < 1 or slices < 1:
        raise ValueError(f"assign needs shards >= 1 and slices >= 1, got {shards} and {slices}")
    if len(ids) != len(labels):
        raise ValueError(f"assign: {len(ids)} ids and {len(labels)} labels")
    generator = torch.Generator().manual_seed(seed * SHARD_STRIDE + experience)
    order = torch.randperm(len(ids), generator=generator)
    ids, labels = ids[order], labels[order]
    if partition == "random":
        parts = list(torch.tensor_split(ids, shards))
    else:
        owner = torch.tensor([class_shard(int(c), shards) for c in labels.tolist()], dtype=torch.long)
        parts = [ids[owner == s] for s in range(shards)]
    return [[p.clone() for p in torch.tensor_split(part, slices)] for part in parts]


def first_changed(old: Sequence[Tensor], new: Sequence[Tensor]) -> int:
    """The first stage (0-based) whose slice differs between ``old`` and ``new`` (one shard's slices, by stage); the
    shorter length if one is a prefix of the other, and ``len(new)`` if they are equal: stages before it are the same
    function of the same inputs, so their states are kept."""
    for t, (a, b) in enumerate(zip(old, new)):
        if a.shape != b.shape or not torch.equal(a, b):
            return t
    return min(len(old), len(new))


def stage_rows(slices: Sequence[Tensor], stage: int) -> Tensor:
    """The ids stage ``stage`` (1-based) trains on: slices ``1..stage`` in order; none if its own slice is empty (the
    stage is skipped: its state is the one before it)."""
    if not len(slices[stage - 1]):
        return torch.zeros(0, dtype=torch.long)
    return torch.cat(list(slices[:stage]))
