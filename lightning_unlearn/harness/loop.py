"""The harness loop ([ACU] Section 4.1, App. E.1-E.2): learn the stream, execute the requests, compare.

For each :class:`Method` the harness learns the benchmark's ``train_stream`` with
:func:`~lightning_unlearn.avalanche.fit_stream` (one Lightning fit per experience), then executes
the K requests of a :class:`~lightning_unlearn.schedule.Schedule` in order. After every request
the module is compared with its gold standard: the method's ``reference`` (a retrain-from-scratch
:class:`Method` of the same model family), run on its own through the same protocol. Per request
it records :func:`~lightning_unlearn.metrics.evaluate_unlearning` on the retained set, the union of
all forgotten sets (App. E.2) and the test set, plus the request's wall time
(:class:`~lightning_unlearn.harness.report.Report`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Subset

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.harness.report import Report
from lightning_unlearn.harness.types import BenchmarkInfo, Method
from lightning_unlearn.metrics import evaluate_unlearning
from lightning_unlearn.schedule import Schedule, validate_schedule


def evaluate(
    methods: Sequence[Method],
    info: BenchmarkInfo,
    schedule: Schedule,
    *,
    out_dir: str | Path | None = None,
    progress: bool = False,
) -> Report:
    """Run continual learning then the schedule's requests for every method; compare each with its reference.

    The schedule is validated against what the stream teaches before anything is trained
    (``ValueError`` naming the faulty request). Every run starts from ``info.seed`` (module
    initialisation and data order), with the global RNG state restored afterwards. With
    ``out_dir`` the report is written there (:meth:`Report.write`).
    """
    if not methods:
        raise ValueError("evaluate needs at least one Method")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique, got {names}")
    validate_schedule(schedule.requests, info.catalog())
    references = list({ref.name: ref for ref in (m.reference or m for m in methods)}.values())
    bar = _progress(
        len(references) + len(methods),
        len(info.experiences.unique()) + len(schedule),
        progress,
    )
    snapshots = {ref.name: _run(ref, info, schedule, bar) for ref in references}
    report = Report(schedule, [], [])
    for ref in references:
        report.reference_rows += [
            {
                "method": f"{ref.name} (reference)",
                "family": ref.family,
                **_request_fields(i, res),
                **_metrics(mod, None, info, cat),
            }
            for i, (mod, res, cat) in enumerate(snapshots[ref.name])
        ]
    for method in methods:
        ref_steps = snapshots[(method.reference or method).name]
        for i, (module, result, catalog) in enumerate(_run(method, info, schedule, bar)):
            ref_module, ref_result, _ = ref_steps[i]
            if not torch.equal(result.removed_ids.sort().values, ref_result.removed_ids.sort().values):
                raise ValueError(
                    f"{method.name} removed other samples than its reference {ref_result.request} did (request {i + 1})"
                )
            report.rows.append(
                {
                    "method": method.name,
                    "family": method.family,
                    "reference": f"{(method.reference or method).name} (reference)",
                    **_request_fields(i, result),
                    **_metrics(module, ref_module, info, catalog),
                }
            )
    bar.close()
    if out_dir is not None:
        report.write(out_dir, stem=f"k{len(schedule)}_")
    return report


def _run(
    method: Method, info: BenchmarkInfo, schedule: Schedule, bar: Any
) -> list[tuple[nn.Module, Any, SampleCatalog]]:
    """Learn the stream, then execute the requests; a copy of (module, result, catalog) after each."""
    from lightning_unlearn.avalanche import (
        fit_stream,  # imports Avalanche (slow); only when a run starts
    )

    with torch.random.fork_rng():
        torch.manual_seed(info.seed)
        built = method.build(info)
        kwargs = {"enable_progress_bar": False, **built.trainer_kwargs}
        fit_stream(
            built.module,
            info.benchmark.train_stream,
            callbacks=built.callbacks,
            trainer_kwargs=kwargs,
            batch_size=built.batch_size or info.batch_size,
            after_experience=lambda *_: bar.update(),
        )
        strategy = built.strategy()
        steps: list[tuple[nn.Module, Any, SampleCatalog]] = []
        for request in schedule:
            result = strategy.forget(request, info.train if strategy.reads_data else None)
            bar.update()
            steps.append((copy.deepcopy(built.module), result, copy.deepcopy(strategy.catalog)))
    return steps


def _request_fields(i: int, result: Any) -> dict[str, Any]:
    return {
        "request": i + 1,
        "kind": result.request.kind,
        "forget_request": _label(result.request),
        "n_removed": int(result.removed_ids.numel()),
        "removed_ids": " ".join(map(str, result.removed_ids.sort().values.tolist())),
        "time_s": result.wall_time_s,
        "certificate": _guarantee(result.certificate),
    }


def _label(request: ForgetRequest) -> str:
    """``samples[n]``, ``class=c`` or ``experience=e`` (the ids themselves are in ``removed_ids``, all of them)."""
    return f"samples[{len(request.sample_ids)}]" if request.kind == "samples" else str(request)


def _guarantee(certificate: Any) -> str:
    """``exact``, ``(eps, delta)`` or ``none``: what a request's certificate promises."""
    if certificate.exact:
        return "exact"
    return f"({certificate.epsilon:g},{certificate.delta:g})" if certificate.certified else "none"


def _metrics(
    module: nn.Module,
    reference: nn.Module | None,
    info: BenchmarkInfo,
    catalog: SampleCatalog,
) -> dict[str, float]:
    """App. E.2 metrics on the retained set, all samples forgotten so far, and the test set."""
    rows = {int(i): r for r, i in enumerate(info.ids.tolist())}
    retain = Subset(info.train, [rows[i] for i in catalog.active_ids().tolist()])
    forget = Subset(info.train, [rows[i] for i in catalog.ids[catalog.forgotten].tolist()])
    return evaluate_unlearning(
        module,
        retain=retain,
        forget=forget,
        test=info.test,
        num_classes=info.num_classes,
        reference=reference,
    )


def _progress(runs: int, steps_per_run: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=runs * steps_per_run,
        disable=not enabled,
        desc="learn + forget",
        unit="step",
    )
