"""Running a config: every setup's request sets through the harness, tables and files at the end."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.harness.loop import evaluate
from lightning_unlearn.harness.registry import available_methods
from lightning_unlearn.harness.report import Report
from lightning_unlearn.harness.repro.columns import comparison_rows
from lightning_unlearn.harness.repro.data import build_info
from lightning_unlearn.harness.repro.figures import plot_lambda_sweep
from lightning_unlearn.harness.repro.methods import make_method, make_requests
from lightning_unlearn.harness.repro.outputs import _slug, write_setup
from lightning_unlearn.harness.repro.schema import ReproConfig, Scale, Setup
from lightning_unlearn.harness.repro.tables import ReproResult, SetupResult, format_comparison, summary_markdown
from lightning_unlearn.harness.types import BenchmarkInfo, Method
from lightning_unlearn.progress import QUIET_TRAINER, progress, quiet_lightning
from lightning_unlearn.schedule import Schedule, validate_schedule

#: shadow models of the offline [LiRA] attack behind "MIA-L" (each a retrain on a random half of the retained data)
LIRA_SHADOWS = 4


class _Nothing(L.LightningModule):
    """One parameter that learns nothing (step size 0): the fit of :func:`start_ranks`."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return (self.w * batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def start_ranks(trainer_kwargs: Mapping[str, Any]) -> None:
    """With several devices, launch the other ranks and join their process group now (unless a fit did), by a
    one-step fit of nothing.

    Lightning starts them at a run's first fit, which would then count their start-up (seconds: each imports
    everything) into a method's fit time or its unlearning time. With one device nothing happens.
    """
    with quiet_lightning():
        trainer = L.Trainer(**{**QUIET_TRAINER, **trainer_kwargs, "max_steps": 1})
        if trainer.world_size > 1 and not torch.distributed.is_initialized():
            trainer.fit(_Nothing(), DataLoader(TensorDataset(torch.ones(trainer.world_size, 1)), batch_size=1))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def is_global_zero() -> bool:
    """Whether this process is global rank 0 of a multi-device launch, or not part of one: the process that logs
    and writes.

    Lightning's launcher starts the other ranks with ``LOCAL_RANK`` (and ``NODE_RANK``) set, torchrun with
    ``RANK``, SLURM with ``SLURM_PROCID``, all before anything runs, so this holds from a run's first line.
    """
    return all(os.environ.get(key, "0") == "0" for key in ("RANK", "NODE_RANK", "LOCAL_RANK", "SLURM_PROCID"))


def run_config(
    config: ReproConfig,
    *,
    root: str | Path | None = None,
    smoke: bool = False,
    out: str | Path | None = None,
    seed: int = 0,
    trainer_kwargs: Mapping[str, Any] | None = None,
    setups: Sequence[str] | None = None,
    log: Callable[[str], None] = _log,
) -> ReproResult:
    """Run a reproduction config and compare with the paper (``smoke``: the first ``config.smoke_setups`` setups).

    One progress line per phase goes to ``log``. With ``out`` each setup writes into
    ``out/<setup>``: the harness's ``<K>_requests.csv``, ``<K>_summary.csv`` and ``<K>_accuracies.png``,
    plus ``paper_vs_ours.csv`` and ``paper_vs_ours.png``; ``out/summary.md`` holds every table.

    Args:
        config: what to run.
        root: the directory holding the datasets' files; without it a setup runs its ``bundled`` scale (the
            paper's protocol on ``mnist-5k``), and a setup without one is refused.
        smoke: the CPU smoke scale instead of the paper's: on the bundled digits, or with ``root`` on the
            paper's dataset (e.g. files of :func:`~lightning_unlearn.harness.fake_data.write_fake_dataset`).
        out: where to write the outputs (nothing written without it).
        seed: data split, request draw and model initialisation.
        trainer_kwargs: extra ``Trainer`` arguments for every fit (e.g. ``{"accelerator": "gpu", "devices": 2}``;
            requests and metrics run on the device each module was fitted on; with several devices Lightning's
            launcher runs the whole function on every rank (:func:`start_ranks`), requests run on all ranks
            together, and only rank 0 logs and writes).
        setups: labels of the setups to run (default: all at full scale).
        log: receives the progress lines.

    Raises:
        ValueError: an unknown setup label, dataset, model or method option, or (full scale, no ``root``) a
            chosen setup that has no ``bundled`` scale.
    """
    start = time.perf_counter()
    kwargs = dict(trainer_kwargs or {})
    # under a multi-device launch every rank runs this function; only global rank 0 writes and reports progress
    writer = is_global_zero()
    out = out if writer else None
    log = log if writer else (lambda _: None)
    chosen = list(config.setups[: config.smoke_setups] if smoke else config.setups)
    if setups is not None:
        unknown = sorted(set(setups) - {s.label for s in config.setups})
        if unknown:
            raise ValueError(f"{config.name}: no setup(s) {unknown}; its setups: {[s.label for s in config.setups]}")
        chosen = [s for s in config.setups if s.label in setups]
    if not smoke and root is None:
        need = [s.label for s in chosen if s.bundled is None]
        if need:
            free = {s.label: s.bundled.dataset for s in config.setups if s.bundled is not None}
            alone = f"; without it, --setups of {free} run on bundled data" if free else ""
            raise ValueError(f"{config.name}: setup(s) {need} read the paper's dataset from files: give --root{alone}")
    check_runnable(config, [(s, s.scale(smoke, root is not None)) for s in chosen])
    results, tables, paths = [], [], []
    for setup in chosen:
        scale = setup.scale(smoke, root is not None)
        result = _run_setup(config, setup, scale, root, seed, kwargs, log)
        results.append(result)
        tables += [format_comparison(config, result, label) for label in result.reports]
        if out is not None:
            t0 = time.perf_counter()
            paths += write_setup(config, result, Path(out) / _slug(setup.label))
            log(f"[{config.name}] {setup.label}: wrote outputs ({time.perf_counter() - t0:.1f} s)")
    elapsed = time.perf_counter() - start
    if out is not None:
        summary = Path(out) / "summary.md"
        summary.write_text(summary_markdown(config, results, smoke, elapsed))
        paths.append(summary)
        if config.name == "ccl-fig2":
            paths.append(plot_lambda_sweep(results, Path(out) / "fig2.png"))
    return ReproResult(config, smoke, results, tables, paths, elapsed)


def check_runnable(config: ReproConfig, runs: Sequence[tuple[Setup, Scale]]) -> None:
    """Refuse, before anything is trained, a run whose setups name an unknown dataset, model or method, or give a
    method an option it does not take (what a config file's schema cannot check without the registry).

    Raises:
        ValueError: naming the config, the setup and the scale's dataset, model or method entry.
    """
    from lightning_unlearn.harness import models
    from lightning_unlearn.harness.datasets import DATASETS
    from lightning_unlearn.harness.repro.models import MODELS

    for setup, scale in runs:
        at = f"{config.name}: setup {setup.label!r}"
        if scale.dataset != "digits" and scale.dataset not in DATASETS:
            raise ValueError(f"{at}: unknown dataset {scale.dataset!r}; one of digits, {', '.join(DATASETS)}")
        if scale.model not in (*MODELS, *models.MODELS):
            raise ValueError(f"{at}: unknown model {scale.model!r}; one of {', '.join((*MODELS, *models.MODELS))}")
        for entry in setup.methods:
            if scale.only is not None and entry.paper_row not in scale.only:
                continue
            if entry.name not in available_methods():
                raise ValueError(f"{at}: unknown method {entry.name!r}; registered: {', '.join(available_methods())}")
            try:
                make_method(entry, {**entry.options, **scale.options.get(entry.name, {})}, {}, scheduled=[])
            except ValueError as err:
                raise ValueError(f"{at}, {entry.paper_row}: {err}") from None


def _run_setup(
    config: ReproConfig,
    setup: Setup,
    scale: Scale,
    root: str | Path | None,
    seed: int,
    trainer_kwargs: Mapping[str, Any],
    log: Callable[[str], None],
) -> SetupResult:
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    info = build_info(setup, scale, root, seed, trainer_kwargs)  # imports Avalanche: before any process group
    start_ranks(trainer_kwargs)
    seconds["data"] = time.perf_counter() - t0
    n_test = len(info.test)  # type: ignore[arg-type]
    log(
        f"[{config.name}] {setup.label}: {scale.dataset}, {len(info.ids)} training samples in "
        f"{len(info.experiences.unique())} experience(s), {n_test} test samples, {scale.model} backbone"
        f"{' (pre-trained, frozen)' if scale.pretrain_epochs else ''} ({seconds['data']:.1f} s)"
    )
    entries = [e for e in setup.methods if scale.only is None or e.paper_row in scale.only]
    shadows = LIRA_SHADOWS if "MIA-L" in config.columns else 0
    reports: dict[str, Report] = {}
    for requests in scale.requests:
        t0 = time.perf_counter()
        schedule = make_requests(requests, info, seed)
        scheduled = torch.cat(validate_schedule(schedule.requests, info.catalog())).tolist()
        methods = [
            make_method(e, {**e.options, **scale.options.get(e.name, {})}, trainer_kwargs, scheduled) for e in entries
        ]
        reports[requests.label] = (
            evaluate(methods, info, schedule, shadows=shadows)
            if requests.compare == "each"
            else evaluate_last(methods, info, schedule, shadows=shadows)
        )
        seconds[requests.label] = time.perf_counter() - t0
        log(
            f"[{config.name}] {setup.label} {requests.label}: {len(methods)} method(s), {len(schedule)} request(s) "
            f"of {_removed(reports[requests.label])} samples in all "
            f"({seconds[requests.label]:.1f} s)"
        )
    rows = comparison_rows(config, setup, reports, entries)
    return SetupResult(setup, scale, reports, rows, seconds)


def _removed(report: Report) -> int:
    first = report.methods()[0]
    return sum(int(r["n_removed"]) for r in report.table(first))


def evaluate_last(methods: Sequence[Method], info: BenchmarkInfo, schedule: Schedule, *, shadows: int = 0) -> Report:
    """Like :func:`~lightning_unlearn.harness.evaluate`, compared with the reference only after the last request.

    Each method executes every request in order (its time is their total, ``n_requests`` of them); the
    reference retrains once, on what all of them leave (one request naming every removed id), which is the
    retrained model of the end state. For long streams of small requests ([HF]'s 20% of the samples deleted
    one at a time), where a retrain per request would cost more than the whole benchmark. Every row holds
    the costs of :func:`~lightning_unlearn.harness.loop.cost_fields`; with ``shadows`` (at least 2) each
    reference also makes that many offline-[LiRA] shadow models after its retrain and every row holds
    ``lira_auc``, forgotten vs test samples.

    Raises:
        ValueError: ``shadows`` of 1 or below 0, or a bad schedule.
    """
    from lightning_unlearn.harness import loop

    loop.check_shadows(shadows)
    if schedule.after:
        raise ValueError("compare='last' retrains once after the stream: it takes no arrival times (after=)")
    merged = Schedule((ForgetRequest.samples(torch.cat(validate_schedule(schedule.requests, info.catalog()))),))
    report = Report(schedule, [], [])
    bar = progress(desc="learn + forget", enabled=False)
    refs = {ref.name: ref for ref in (m.reference or m for m in methods)}
    runs = {name: loop._run(ref, info, merged, bar, shadows) for name, ref in refs.items()}
    for name, run in runs.items():
        module, result, catalog = run.steps[-1]
        report.reference_rows.append(
            {
                "method": f"{name} (reference)",
                "family": refs[name].family,
                **loop._request_fields(len(schedule) - 1, result),
                "n_requests": 1,
                **loop.cost_fields(run, run),
                **loop._metrics(module, None, info, catalog, shadows=run.shadows),
            }
        )
    for method in methods:
        ref_run = runs[(method.reference or method).name]
        run = loop._run(method, info, schedule, bar)
        module, result, catalog = run.steps[-1]
        fields = loop._request_fields(len(schedule) - 1, result)
        fields["time_s"] = sum(float(s[1].wall_time_s) for s in run.steps)
        fields["n_removed"] = sum(int(s[1].removed_ids.numel()) for s in run.steps)
        fields["n_requests"] = len(run.steps)
        report.rows.append(
            {
                "method": method.name,
                "family": method.family,
                "reference": f"{(method.reference or method).name} (reference)",
                **fields,
                **loop.cost_fields(run, ref_run),
                **loop._metrics(module, ref_run.steps[-1][0], info, catalog, shadows=ref_run.shadows),
            }
        )
    return report
