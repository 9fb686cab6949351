"""A request set as a :class:`~lightning_unlearn.schedule.Schedule`, and a config entry as a harness :class:`Method`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.schedule import Schedule, make_schedule, validate_schedule
from lightning_unlearn_bench.registry import method_spec, trainer_options, with_trainer
from lightning_unlearn_bench.repro.schema import SCHEDULED, Entry, Requests
from lightning_unlearn_bench.types import BenchmarkInfo, Method


def make_requests(requests: Requests, info: BenchmarkInfo, seed: int) -> Schedule:
    """The :class:`Schedule` of a request set on ``info``'s stream.

    Raises:
        ValueError: an unknown kind, a task the stream does not have, requests that cannot be drawn, or
            arrival times (``after``) that are not one per task request, or arrive before a task they name.
    """
    catalog = info.catalog()
    if requests.after and requests.kind != "tasks":
        raise ValueError(f"request set {requests.label!r}: arrival times (after=) need kind='tasks'")
    if requests.kind == "tasks":
        reqs = []
        for tasks in (*requests.tasks, tuple(requests.after)):
            missing = [t for t in tasks if not bool((info.experiences == t - 1).any())]
            if missing:
                raise ValueError(f"request set {requests.label!r}: tasks {missing} are not in the stream")
        for tasks in requests.tasks:
            rows = torch.isin(info.experiences, torch.tensor([t - 1 for t in tasks]))
            reqs.append(ForgetRequest.samples(info.ids[rows].sort().values))
        after = tuple(t - 1 for t in requests.after)
        try:
            validate_schedule(reqs, catalog, after)
        except ValueError as err:  # experiences are 0-based: name the tasks as the config does
            raise ValueError(
                f"request set {requests.label!r} (tasks and after= 1-based, experiences 0-based): {err}"
            ) from None
        return Schedule(tuple(reqs), None, ("samples",), after=after)
    if requests.kind == "class":
        return make_schedule(catalog, requests.k, kinds=("class",), seed=seed)
    if requests.kind != "samples":
        raise ValueError(f"request kind must be samples, class or tasks; got {requests.kind!r}")
    n = requests.per_request or max(1, round((requests.fraction or 0.25) * len(catalog) / requests.k))
    return make_schedule(catalog, requests.k, kinds=("samples",), samples_per_request=n, seed=seed)


def make_method(
    entry: Entry,
    options: Mapping[str, Any],
    trainer_kwargs: Mapping[str, Any],
    scheduled: Sequence[int] | None = None,
) -> Method:
    """The harness :class:`Method` of an entry; ``trainer_kwargs`` (e.g. ``accelerator``) reach every ``Trainer``
    of its continual learning, of its reference's retraining and of its own unlearning.

    The option ``track=SCHEDULED`` (a recorder's, e.g. ``hf``'s) becomes the ids the request set forgets,
    ``scheduled``: the schedule is drawn before anything is learned, so a recorder of per-sample statistics
    keeps only the rows the requests will read.

    Raises:
        ValueError: ``track=SCHEDULED`` without ``scheduled``, or an option the method does not take.
    """
    spec = method_spec(entry.name)
    if entry.relax_families:
        spec = replace(spec, families=(*spec.families, "supervised"), context=None)
    opts = dict(options)
    if opts.get("track") == SCHEDULED:
        if scheduled is None:
            raise ValueError(f"{entry.name} ({entry.paper_row}): track={SCHEDULED!r} needs the scheduled ids")
        opts["track"] = list(scheduled)
    return with_trainer(spec.method(**trainer_options(spec, opts, trainer_kwargs)), trainer_kwargs)
