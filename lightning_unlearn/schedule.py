"""A seeded, validated sequence of forget requests (the continual-unlearning phase of ACU, Section 4.1).

ACU's protocol (App. E.1) splits a subset of the learned samples into K disjoint forgetting sets
and executes them one after another. :func:`make_schedule` draws such K requests from what a
stream teaches (a :class:`SampleCatalog`), at sample, class or experience granularity, from a
seed; :func:`validate_schedule` checks any list of requests against the catalog before anything
is trained: each must name learned data, no two may share a sample, and something must be
retained.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.request import ForgetRequest, RequestKind

_KINDS = ("samples", "class", "experience")


@dataclass(frozen=True)
class Schedule:
    """K forget requests executed in order; ``seed`` and ``kinds`` say how they were drawn (``None``: given by hand).

    ``after[i]``: request ``i`` arrives once the experience of that ``current_experience`` is learned, and
    learning continues after it (as [CCL] Alg. 1-2 interleave requests with tasks); ``None`` (or an empty
    ``after``): after the whole stream.
    """

    requests: tuple[ForgetRequest, ...]
    seed: int | None = None
    kinds: tuple[RequestKind, ...] = ()
    samples_per_request: int | None = None
    after: tuple[int | None, ...] = ()

    def __len__(self) -> int:
        return len(self.requests)

    def arrival(self, i: int) -> int | None:
        """The experience after which request ``i`` arrives (``None``: after the whole stream)."""
        return self.after[i] if self.after else None

    def __iter__(self) -> Iterator[ForgetRequest]:
        return iter(self.requests)


def named_ids(request: ForgetRequest, catalog: SampleCatalog) -> Tensor:
    """Every learned sample id a request names (forgotten or not); ``ValueError`` if it names unlearned data."""
    if request.kind == "samples":
        ids = torch.tensor(request.sample_ids, dtype=torch.long)
        unknown = ids[~torch.isin(ids, catalog.ids)]
        if unknown.numel():
            raise ValueError(f"sample ids never learned: {unknown[:10].tolist()}")
        return ids
    column = catalog.labels if request.kind == "class" else catalog.experiences
    ids = catalog.ids[column == request.target]
    if not ids.numel():
        raise ValueError(f"{request.kind} {request.target} was never learned (learned: {sorted(set(column.tolist()))})")
    return ids


def validate_schedule(
    requests: Sequence[ForgetRequest], catalog: SampleCatalog, after: Sequence[int | None] = ()
) -> list[Tensor]:
    """The ids of each request; ``ValueError`` naming the request at fault if one names data never
    learned, two requests overlap, or the requests together would leave nothing retained.

    With arrival times ``after`` (:attr:`Schedule.after`; experiences are learned in increasing order) also
    if they are not one per request, decrease (requests execute in order), name an experience the catalog
    does not have, or a request names samples of an experience learned after it arrives."""
    _check_arrivals(requests, catalog, after)
    owner: dict[int, int] = {}
    out = []
    for k, request in enumerate(requests):
        if not isinstance(request, ForgetRequest):
            raise ValueError(f"schedule entry {k} is a {type(request).__name__}, not a ForgetRequest")
        try:
            ids = named_ids(request, catalog)
        except ValueError as err:
            raise ValueError(f"forget request {k} ({request}): {err}") from None
        clash = [i for i in ids.tolist() if i in owner]
        if clash:
            first = owner[clash[0]]
            raise ValueError(
                f"forget requests {first} ({requests[first]}) and {k} ({request}) overlap in {len(clash)} sample ids, "
                f"e.g. {clash[:10]}; the requests of a schedule must be disjoint"
            )
        owner.update((i, k) for i in ids.tolist())
        out.append(ids)
        arrival = after[k] if after else None
        if arrival is not None:
            late = sorted(e for e in set(catalog.experiences_of(ids).tolist()) if e > arrival)
            if late:
                raise ValueError(
                    f"forget request {k} ({request}) arrives after experience {arrival} but names samples of "
                    f"experience(s) {late}, learned later"
                )
    if len(owner) >= len(catalog):
        raise ValueError(
            f"the {len(requests)} forget requests cover all {len(catalog)} learned samples; nothing would be retained"
        )
    return out


def _check_arrivals(requests: Sequence[ForgetRequest], catalog: SampleCatalog, after: Sequence[int | None]) -> None:
    if not after:
        return
    if len(after) != len(requests):
        raise ValueError(f"after gives {len(after)} arrival times for {len(requests)} forget requests")
    known = set(catalog.experiences.unique().tolist())
    unknown = [a for a in after if a is not None and a not in known]
    if unknown:
        raise ValueError(f"arrival experience(s) {unknown} are not in the stream (its experiences: {sorted(known)})")
    times = [math.inf if a is None else a for a in after]
    for k in range(1, len(times)):
        if times[k] < times[k - 1]:
            raise ValueError(
                f"forget request {k} arrives after experience {after[k]}, before request {k - 1} (after "
                f"{after[k - 1]}): requests execute in order"
            )


def make_schedule(
    catalog: SampleCatalog,
    k: int,
    *,
    kinds: Sequence[RequestKind] = ("samples",),
    samples_per_request: int = 10,
    seed: int = 0,
) -> Schedule:
    """Draw ``k`` disjoint forget requests from the learned samples, reproducibly from ``seed``.

    Request ``i`` has kind ``kinds[i % len(kinds)]``. Class and experience requests are drawn
    first (uniformly among the learned classes/experiences that share no sample with an earlier
    draw), then each sample request takes ``samples_per_request`` ids at random from the samples
    no other request names. ``ValueError`` if ``k`` disjoint requests cannot be drawn.
    """
    if k < 1:
        raise ValueError(f"a schedule needs k >= 1 requests, got {k}")
    bad = [kind for kind in kinds if kind not in _KINDS]
    if not kinds or bad:
        raise ValueError(f"kinds must be a non-empty subset of {_KINDS}, got {tuple(kinds)}")
    if samples_per_request < 1:
        raise ValueError(f"samples_per_request must be >= 1, got {samples_per_request}")
    if len(catalog) == 0:
        raise ValueError("the catalog is empty: nothing was learned to forget")
    g = torch.Generator().manual_seed(seed)
    plan = [kinds[i % len(kinds)] for i in range(k)]
    claimed = torch.zeros(len(catalog), dtype=torch.bool)
    requests: list[ForgetRequest | None] = [None] * k
    for i, kind in enumerate(plan):
        if kind != "samples":
            requests[i] = _draw_target(catalog, kind, claimed, g, i)
    free = torch.nonzero(~claimed).flatten()
    free = free[torch.randperm(len(free), generator=g)]
    for i, kind in enumerate(plan):
        if kind == "samples":
            if len(free) < samples_per_request:
                raise ValueError(
                    f"cannot draw forget request {i}: fewer than {samples_per_request} samples are left unrequested"
                )
            take, free = free[:samples_per_request], free[samples_per_request:]
            requests[i] = ForgetRequest.samples(catalog.ids[take.sort().values])
    drawn = cast(list[ForgetRequest], requests)  # every slot was drawn above
    schedule = Schedule(tuple(drawn), seed, tuple(kinds), samples_per_request)
    validate_schedule(schedule.requests, catalog)
    return schedule


def _draw_target(
    catalog: SampleCatalog, kind: RequestKind, claimed: Tensor, g: torch.Generator, i: int
) -> ForgetRequest:
    column = catalog.labels if kind == "class" else catalog.experiences
    targets = column.unique()
    for t in targets[torch.randperm(len(targets), generator=g)].tolist():
        rows = column == t
        if not bool((rows & claimed).any()):
            claimed |= rows
            return ForgetRequest.of_class(int(t)) if kind == "class" else ForgetRequest.of_experience(int(t))
    raise ValueError(f"cannot draw forget request {i}: every learned {kind} shares samples with an earlier request")
