"""Running a config: every setup's request sets through the harness, tables and files at the end."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn.core.interrupts import deferred_interrupts, stop_on_sigterm
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.progress import QUIET_TRAINER, progress, quiet_lightning
from lightning_unlearn.schedule import Schedule, validate_schedule
from lightning_unlearn_bench.loop import (
    ReferenceRun,
    evaluate_last,
    run_method,
    run_method_last,
    run_reference,
    run_reference_last,
)
from lightning_unlearn_bench.registry import available_methods
from lightning_unlearn_bench.report import Report
from lightning_unlearn_bench.repro import journal
from lightning_unlearn_bench.repro.columns import comparison_rows, refused_row
from lightning_unlearn_bench.repro.data import build_info
from lightning_unlearn_bench.repro.figures import plot_lambda_sweep
from lightning_unlearn_bench.repro.files import dump_config
from lightning_unlearn_bench.repro.journal import slug
from lightning_unlearn_bench.repro.methods import make_method, make_requests
from lightning_unlearn_bench.repro.outputs import write_setup
from lightning_unlearn_bench.repro.schema import Entry, ReproConfig, Requests, Scale, Setup
from lightning_unlearn_bench.repro.tables import ReproResult, SetupResult, format_comparison, summary_markdown
from lightning_unlearn_bench.types import BenchmarkInfo

__all__ = ["LIRA_SHADOWS", "check_runnable", "evaluate_last", "is_global_zero", "run_config", "start_ranks"]

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
    """A progress line on stderr, above any open progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(message, file=sys.stderr)


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
    resume: bool = False,
    progress: bool | None = None,
) -> ReproResult:
    """Run a reproduction config and compare with the paper (``smoke``: the first ``config.smoke_setups`` setups).

    A run is a list of rows, each one method of one setup's request set (its reference run with the first row
    that needs it). Each finished row goes to ``log`` as one line, with the rows left and an estimate of the
    time they take (this run's mean time per row), and with ``out`` it is written at once: its file
    (:mod:`~lightning_unlearn_bench.repro.journal`), then the setup's ``paper_vs_ours.csv`` and the harness's
    ``<K>_requests.csv`` / ``<K>_summary.csv`` so far, and ``out/summary.md``; the figures
    (``paper_vs_ours.png``, ``<K>_accuracies.png``) follow at the end of each setup. ``out/recipe.yaml`` is the
    config that ran (loadable as it is) headed by the run's seed, scale and Trainer arguments; every row carries
    its seed and its recipe's digest. On a terminal (``progress``; see
    :func:`~lightning_unlearn.progress.progress_enabled`) a bar per setup counts its rows and a bar per method
    its learning steps and requests.

    A method that refuses a certified release (:class:`~lightning_unlearn.core.refusal.ReleaseRefused`: an
    assumption of its guarantee fails under the recipe) makes a refused row, written and resumed as any other: no
    numbers, ``refused: <reason>`` in its guarantee (:attr:`ReproResult.refused` lists them), and the run goes on.
    Any other error stops the run, the rows finished so far on disk. So does SIGTERM (``kill``, ``timeout``, a
    batch scheduler), at once, inside a fit or not (:func:`~lightning_unlearn.core.interrupts.stop_on_sigterm`),
    except while a row's files are written, which finish first.

    Args:
        config: what to run.
        root: the directory holding the datasets' files; without it a setup runs its ``bundled`` scale (the
            paper's protocol on ``mnist-5k``), and a setup without one is refused.
        smoke: the CPU smoke scale instead of the paper's: on the bundled digits, or with ``root`` on the
            paper's dataset (e.g. files of :func:`~lightning_unlearn_bench.fake_data.write_fake_dataset`).
        out: where to write the outputs (nothing written without it).
        seed: data split, request draw and model initialisation.
        trainer_kwargs: extra ``Trainer`` arguments for every fit (e.g. ``{"accelerator": "gpu", "devices": 2}``;
            requests and metrics run on the device each module was fitted on; with several devices Lightning's
            launcher runs the whole function on every rank (:func:`start_ranks`), requests run on all ranks
            together, and only rank 0 logs and writes).
        setups: labels of the setups to run (default: all at full scale).
        log: receives the progress lines.
        resume: skip the rows ``out`` already holds whose recipe (and seed) are this run's; a row whose recipe
            changed runs again. A setup whose rows are all there loads no data.
        progress: show the bars (``None``: when stderr is a terminal).

    Raises:
        ValueError: an unknown setup label, dataset, model or method option, ``resume`` without ``out``, or
            (full scale, no ``root``) a chosen setup that has no ``bundled`` scale.
        SIGTERMException: (Lightning's, a ``SystemExit`` with status 143) SIGTERM arrived; the finished rows are
            on disk for ``resume``.
    """
    start = time.perf_counter()
    kwargs = dict(trainer_kwargs or {})
    if resume and out is None:
        raise ValueError("resume reads the finished rows of a run: give its output directory (out, --out)")
    # under a multi-device launch every rank runs this function; only global rank 0 writes and reports progress
    writer = is_global_zero()
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
    plan = [(setup, setup.scale(smoke, root is not None)) for setup in chosen]
    check_runnable(config, plan)
    run = _Run(
        config=config,
        out=Path(out) if out is not None else None,
        writer=writer,
        seed=seed,
        trainer_kwargs=kwargs,
        root=root,
        resume=resume,
        log=log,
        progress=progress,
        smoke=smoke,
        total=sum(len(journal.setup_keys(setup, scale)) for setup, scale in plan),
        start=start,
    )
    if run.out is not None and writer:
        run.out.mkdir(parents=True, exist_ok=True)
        (run.out / "recipe.yaml").write_text(_recipe_text(run, [s for s, _ in plan]))
    results: list[SetupResult] = []
    tables: list[str] = []
    paths: list[Path] = []
    with stop_on_sigterm():
        for setup, scale in plan:
            result = run.setup(setup, scale, results)
            results.append(result)
            tables += [format_comparison(config, result, label) for label in result.labels]
            if run.out is not None and writer:
                t0 = time.perf_counter()
                with deferred_interrupts():
                    paths += write_setup(config, result, run.out / slug(setup.label))
                log(f"[{config.name}] {setup.label}: wrote outputs ({time.perf_counter() - t0:.1f} s)")
    elapsed = time.perf_counter() - start
    if run.out is not None and writer:
        paths.append(run.write_summary(results, elapsed))
        paths.append(run.out / "recipe.yaml")
        if config.name == "ccl-fig2":
            paths.append(plot_lambda_sweep(results, run.out / "fig2.png"))
    return ReproResult(config, smoke, results, tables, paths, elapsed)


def _recipe_text(run: _Run, chosen: Sequence[Setup]) -> str:
    """``recipe.yaml``: the config that runs (its chosen setups), headed by the run's own settings as comments."""
    head = [
        f"# lightning-unlearn reproduce: {run.config.name}, {'smoke' if run.smoke else 'full'} scale",
        f"# seed: {run.seed}; root: {run.root}; trainer: {run.trainer_kwargs}; setups: {[s.label for s in chosen]}",
        "# rows: the scale each setup ran is its smoke scale, else full with --root, else bundled",
    ]
    return "\n".join(head) + "\n" + dump_config(replace(run.config, setups=tuple(chosen)))


def check_runnable(config: ReproConfig, runs: Sequence[tuple[Setup, Scale]]) -> None:
    """Refuse, before anything is trained, a run whose setups name an unknown dataset, model or method, or give a
    method an option it does not take (what a config file's schema cannot check without the registry).

    Raises:
        ValueError: naming the config, the setup and the scale's dataset, model or method entry.
    """
    from lightning_unlearn_bench import models
    from lightning_unlearn_bench.datasets import DATASETS
    from lightning_unlearn_bench.repro.models import MODELS

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


@dataclass
class _Run:
    """One call of :func:`run_config`: its settings, the rows finished so far and where they go."""

    config: ReproConfig
    out: Path | None
    writer: bool
    seed: int
    trainer_kwargs: dict[str, Any]
    root: str | Path | None
    resume: bool
    log: Callable[[str], None]
    progress: bool | None
    smoke: bool
    total: int
    start: float
    ran: list[float] = field(default_factory=list)  # seconds of each row run (not skipped) here
    finished: int = 0

    def setup(self, setup: Setup, scale: Scale, before: Sequence[SetupResult]) -> SetupResult:
        """Run (or, resuming, read) every row of ``setup`` at ``scale``; write each as it finishes."""
        config, name = self.config, self.config.name
        shadows = LIRA_SHADOWS if "MIA-L" in config.columns else 0
        keys = journal.setup_keys(setup, scale)
        recipes = {
            (r.label, e.paper_row): journal.recipe(scale, r, e, self.seed, self.trainer_kwargs, shadows)
            for r, e in keys
        }
        units: dict[tuple[str, str], journal.Unit] = {}
        if self.resume and self.out is not None:
            for (label, row), recipe in recipes.items():
                unit = journal.load(self.out, (setup.label, label, row))
                if unit is not None and unit.digest == journal.digest(recipe):
                    units[(label, row)] = unit
        seconds: dict[str, float] = {"data": 0.0}
        info = None
        if len(units) < len(keys):  # something to run: the data (all rows finished: none needed)
            t0 = time.perf_counter()
            info = build_info(setup, scale, self.root, self.seed, self.trainer_kwargs)  # imports Avalanche first
            start_ranks(self.trainer_kwargs)
            seconds["data"] = time.perf_counter() - t0
            self.log(
                f"[{name}] {setup.label}: {scale.dataset}, {len(info.ids)} training samples in "
                f"{len(info.experiences.unique())} experience(s), {len(info.test)} test samples, "  # type: ignore[arg-type]
                f"{scale.model} backbone{' (pre-trained, frozen)' if scale.pretrain_epochs else ''} "
                f"({seconds['data']:.1f} s)"
            )
        bar = progress(desc=setup.label, total=len(keys), unit="row", enabled=self.progress)
        for requests in scale.requests:
            schedule = make_requests(requests, info, self.seed) if info is not None else None
            refs: dict[str, ReferenceRun] = {}
            for req, entry in keys:
                if req is not requests:
                    continue
                unit = units.get((requests.label, entry.paper_row))
                if unit is not None:
                    done = "refused" if unit.refused is not None else "finished"
                    self.log(f"[{name}] {setup.label} {requests.label} {entry.paper_row}: {done} before (resumed)")
                else:
                    assert info is not None and schedule is not None  # noqa: S101 (built above when a row runs)
                    recipe = recipes[(requests.label, entry.paper_row)]
                    unit = self._row(setup, scale, requests, entry, info, schedule, refs, shadows, recipe)
                    units[(requests.label, entry.paper_row)] = unit
                self.finished += 1
                bar.update()
                seconds[requests.label] = seconds.get(requests.label, 0.0) + unit.seconds
                result = _result(config, setup, scale, keys, units, seconds)
                if self.out is not None and self.writer:
                    with deferred_interrupts():  # the CSVs and summary whole, then a SIGTERM or Ctrl-C stops
                        write_setup(config, result, self.out / slug(setup.label), figures=False)
                        self.write_summary([*before, result], time.perf_counter() - self.start)
        bar.close()
        return _result(config, setup, scale, keys, units, seconds)

    def _row(
        self,
        setup: Setup,
        scale: Scale,
        requests: Requests,
        entry: Entry,
        info: BenchmarkInfo,
        schedule: Schedule,
        refs: dict[str, ReferenceRun],
        shadows: int,
        recipe: dict[str, Any],
    ) -> journal.Unit:
        """Run one method on one request set (and its reference, the first time one needs it); save the row."""
        t0 = time.perf_counter()
        scheduled = torch.cat(validate_schedule(schedule.requests, info.catalog())).tolist()
        options = {**entry.options, **scale.options.get(entry.name, {})}
        method = make_method(entry, options, self.trainer_kwargs, scheduled)
        reference = method.reference or method
        last = requests.compare == "last"
        learn = len(info.experiences.unique())
        steps = learn + len(schedule)
        if reference.name not in refs:
            steps += learn + (1 if last else len(schedule)) + shadows
        bar = progress(desc=entry.paper_row, total=steps, unit="step", enabled=self.progress)
        rows: list[dict[str, Any]] = []
        end_rows: list[dict[str, Any]] = []
        refused = None
        try:
            if reference.name not in refs:
                runner = run_reference_last if last else run_reference
                refs[reference.name] = runner(reference, info, schedule, bar, shadows)
            ref = refs[reference.name]
            if last:
                rows = run_method_last(method, ref, info, schedule, bar)
            else:
                rows, end_rows = run_method(method, ref, info, schedule, bar)
        except ReleaseRefused as err:  # a finished row: the method's answer under this recipe (other errors stop)
            refused, rows, end_rows = str(err), [], []
        bar.close()
        # the row's Trainers, modules and recorders reference each other: free their tensors (a dense Hessian is
        # 0.5 GB at d = 7,850) now rather than whenever the cycle collector next runs, which counts objects, not bytes
        gc.collect()
        ref_run = refs.get(reference.name)
        digest = journal.digest(recipe)
        tag = {"paper_row": entry.paper_row, "seed": self.seed, "recipe": digest}
        unit = journal.Unit(
            setup=setup.label,
            requests=requests.label,
            paper_row=entry.paper_row,
            method=method.name,
            digest=digest,
            recipe=recipe,
            schedule=dataclasses.asdict(schedule),
            rows=[{**r, **tag} for r in rows],
            end_rows=[{**r, **tag} for r in end_rows],
            reference_rows=ref_run.rows if ref_run is not None else [],
            end_reference_rows=ref_run.end_rows if ref_run is not None else [],
            seconds=time.perf_counter() - t0,
            refused=refused,
        )
        if self.out is not None and self.writer:
            with deferred_interrupts():  # a SIGTERM or Ctrl-C now stops the run once the row is on disk
                journal.save(self.out, unit)
        self.ran.append(unit.seconds)
        left = self.total - self.finished - 1
        eta = f"; {left} row(s) left, ~{_duration(left * sum(self.ran) / len(self.ran))}" if left else ""
        at = f"[{self.config.name}] {setup.label} {requests.label} {entry.paper_row}"
        if refused is not None:
            self.log(f"{at}: refused ({unit.seconds:.1f} s): {refused.strip().splitlines()[0]}{eta}")
        else:
            removed = sum(int(r["n_removed"]) for r in rows)
            self.log(f"{at}: {len(schedule)} request(s) of {removed} samples in all ({unit.seconds:.1f} s){eta}")
        return unit

    def write_summary(self, results: Sequence[SetupResult], seconds: float) -> Path:
        assert self.out is not None  # noqa: S101 (called with an output directory only)
        path = self.out / "summary.md"
        text = summary_markdown(self.config, results, self.smoke, seconds, seed=self.seed)
        if self.finished < self.total:
            text += f"\nPartial: {self.finished} of {self.total} rows finished so far.\n"
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _result(
    config: ReproConfig,
    setup: Setup,
    scale: Scale,
    keys: Sequence[tuple[Requests, Entry]],
    units: Mapping[tuple[str, str], journal.Unit],
    seconds: dict[str, float],
) -> SetupResult:
    """A setup's result from its finished rows, in the order they run (a request set with none is left out; one whose
    methods all refused has their refused rows and no report), each request set's references last."""
    units = _distinct_methods(units)
    reports: dict[str, Report] = {}
    for requests in scale.requests:
        done = [units[(r.label, e.paper_row)] for r, e in keys if r is requests and (r.label, e.paper_row) in units]
        ran = [u for u in done if u.refused is None]
        if ran:
            reports[requests.label] = _report(ran)
    paper_rows = {u.method: u.paper_row for u in units.values() if u.refused is None}
    rows = comparison_rows(config, setup, reports, paper_rows)
    for u in units.values():
        if u.refused is not None:
            tag = {"seed": u.recipe["seed"], "recipe": u.digest}
            rows.append(refused_row(config, setup, u.requests, u.method, u.paper_row, u.refused, tag))
    order = {(r.label, e.paper_row): i for i, (r, e) in enumerate(keys)}
    sets = [r.label for r in scale.requests]
    rows.sort(key=lambda r: (sets.index(r["requests"]), r["reference"], order.get((r["requests"], r["paper_row"]), 0)))
    return SetupResult(setup, scale, reports, rows, dict(seconds))


def _distinct_methods(units: Mapping[tuple[str, str], journal.Unit]) -> dict[tuple[str, str], journal.Unit]:
    """``units`` with each method named once per request set in the tables: two paper rows that run one method at two
    settings (e.g. SAFE at two ``lr_constant``) are told apart by the options in which they differ,
    ``safe[lr_constant=2.5]`` and ``safe[lr_constant=10]`` (or by their paper row when only the scale differs)."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for key, unit in units.items():
        groups.setdefault((unit.requests, unit.method), []).append(key)
    out = dict(units)
    for (_, method), keys in groups.items():
        if len(keys) < 2:
            continue
        options = [{**units[k].recipe["entry"]["options"], **units[k].recipe["scale_options"]} for k in keys]
        differ = sorted({o for opts in options for o in opts if len({repr(p.get(o)) for p in options}) > 1})
        for key, opts in zip(keys, options, strict=True):
            unit = units[key]
            name = (
                f"{method}[{','.join(f'{o}={opts.get(o)}' for o in differ)}]"
                if differ
                else f"{method} ({unit.paper_row})"
            )
            out[key] = replace(
                unit,
                method=name,
                rows=[{**r, "method": name} for r in unit.rows],
                end_rows=[{**r, "method": name} for r in unit.end_rows],
            )
    return out


def _report(units: Sequence[journal.Unit]) -> Report:
    """The harness report of one request set from its finished rows (each reference's rows once)."""
    s = units[0].schedule
    requests = tuple(ForgetRequest(r["kind"], tuple(r["sample_ids"]), r["target"]) for r in s["requests"])
    schedule = Schedule(requests, s["seed"], tuple(s["kinds"]), s["samples_per_request"], tuple(s["after"]))
    report = Report(schedule, [], [])
    seen: set[str] = set()
    for unit in units:
        report.rows += unit.rows
        report.end_rows += unit.end_rows
        ref = unit.reference_rows[0]["method"]
        if ref not in seen:
            seen.add(ref)
            report.reference_rows += unit.reference_rows
            report.end_reference_rows += unit.end_reference_rows
    return report
