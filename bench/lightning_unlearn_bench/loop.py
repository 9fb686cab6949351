"""The harness loop ([ACU] Section 4.1, App. E.1-E.2): learn the stream, execute the requests, compare.

For each :class:`Method` the harness learns the benchmark's ``train_stream`` with
:func:`~lightning_unlearn.avalanche.fit_stream` (one Lightning fit per experience), then executes
the K requests of a :class:`~lightning_unlearn.schedule.Schedule` in order; a request with an arrival
time (:attr:`~lightning_unlearn.schedule.Schedule.after`) runs inside the stream right after its
experience, and learning continues from what it leaves ([CCL] Alg. 1-2). After every request
the module is compared with its gold standard: the method's ``reference`` (a retrain-from-scratch
:class:`Method` of the same model family), run on its own through the same protocol. Per request
it records :func:`~lightning_unlearn.metrics.evaluate_unlearning` on the retained set, the union of
all forgotten sets (App. E.2) and the test set, plus the request's wall time
(:class:`~lightning_unlearn_bench.report.Report`), and membership-inference attacks as AUCs
(MIA-U, [HF] Sec. 6; offline [LiRA]), each next to the same attack on the reference.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import Subset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.contract import attached_trainer
from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.metrics import evaluate_unlearning
from lightning_unlearn.progress import progress as progress_bar
from lightning_unlearn.progress import quiet_lightning
from lightning_unlearn.schedule import Schedule, validate_schedule
from lightning_unlearn.unlearners.base import Unlearner
from lightning_unlearn_bench.plot import write_report
from lightning_unlearn_bench.report import ATTACKS, Report
from lightning_unlearn_bench.types import BenchmarkInfo, Method


@dataclass
class _Run:
    """One method's run: its module before the requests (``None`` when requests interleave with learning),
    a copy of (module, result, catalog) after each request, the (module, catalog) at the end of the stream
    when tasks were learned after the last request, (for references) the LiRA shadow models of its family,
    the wall time of learning the stream with its recorder (requests inside it excluded) and the bytes of the
    statistics that recorder holds after it."""

    before: nn.Module | None
    steps: list[tuple[nn.Module, Any, SampleCatalog]]
    shadows: list[nn.Module] = field(default_factory=list)
    fit_s: float = 0.0
    storage_bytes: int = 0
    end: tuple[nn.Module, SampleCatalog] | None = None


def statistics_bytes(recorder: RecorderCallback) -> int:
    """Bytes of the statistics a recorder keeps for unlearning: its ``memory_bytes()`` where it has one
    (:class:`~lightning_unlearn.callbacks.hf.TrajectoryRecorder`: the tracked vectors), otherwise the
    tensors of its ``state_dict`` besides what every recorder keeps (the sample catalog, ledger anchor, privacy
    budget); 0 for a recorder of the catalog only. Under DDP a ``memory_bytes`` is this rank's share, summed over the
    ranks here (a collective: every rank calls this); the ``state_dict`` sums are already every rank's."""
    memory_bytes = getattr(recorder, "memory_bytes", None)
    if callable(memory_bytes):
        device = recorder._strategy.root_device if recorder._strategy is not None else None  # NCCL: on the GPU
        return int(recorder.sum_over_ranks(torch.tensor(int(memory_bytes()), dtype=torch.float64, device=device)))
    common = set(RecorderCallback.state_dict(recorder))
    return _tensor_bytes({k: v for k, v in recorder.state_dict().items() if k not in common})


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def cost_fields(run: _Run, reference: _Run) -> dict[str, float]:
    """A run's precomputation cost: ``fit_s`` (learning the stream with its recorder), ``precompute_s`` (that minus
    its reference's fit of the same recipe with a catalog-only recorder: the recorder's overhead, [HF] Table 2's
    "pre-computation runtime"; NaN for a recorder that keeps no statistics, whose difference is timing noise
    and which the paper marks "x") and ``storage_bytes`` (:func:`statistics_bytes` after learning)."""
    return {
        "fit_s": run.fit_s,
        "precompute_s": run.fit_s - reference.fit_s if run.storage_bytes else math.nan,
        "storage_bytes": run.storage_bytes,
    }


def evaluate(
    methods: Sequence[Method],
    info: BenchmarkInfo,
    schedule: Schedule,
    *,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
    shadows: int = 4,
) -> Report:
    """Run continual learning then the schedule's requests for every method; compare each with its reference.

    The schedule is validated against what the stream teaches before anything is trained
    (``ValueError`` naming the faulty request). Every run starts from ``info.seed`` (module
    initialisation and data order), with the global RNG state restored afterwards. With
    ``out_dir`` the report is written there (:func:`~lightning_unlearn_bench.plot.write_report`).
    ``progress`` shows one bar whose label names the phase (``None``: when stderr is a terminal,
    :func:`~lightning_unlearn.progress.progress_enabled`); the fits inside print no Lightning banners.

    When tasks are learned after the last request (requests arriving inside the stream), the report's
    ``end_rows`` and ``end_reference_rows`` compare the models at the end of the stream too ([CCL] Table 1
    reads them at ``T``).

    Besides the gaps to the reference, every row holds the attack AUCs of
    :data:`~lightning_unlearn_bench.report.ATTACKS`, each next to the same attack on the reference
    after the same request (``<name>_retrain``): MIA-U between
    the module before the requests and after this one, and offline [LiRA] with ``shadows`` shadow
    models per reference, each the reference's gold standard forgetting every sample the schedule
    forgets and a random half of the others (seeded): trained on neither the forgotten nor the test
    samples, as offline LiRA needs. ``shadows=0`` leaves LiRA out.

    Raises:
        ValueError: no methods, duplicate names, a bad schedule, ``shadows`` of 1 or below 0, or a method
            that removed other samples than its reference.
    """
    if not methods:
        raise ValueError("evaluate needs at least one Method")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique, got {names}")
    check_shadows(shadows)
    validate_schedule(schedule.requests, info.catalog(), schedule.after)
    references = list({ref.name: ref for ref in (m.reference or m for m in methods)}.values())
    steps_per_run = len(info.experiences.unique()) + len(schedule)
    total = (len(references) + len(methods)) * steps_per_run + len(references) * shadows
    bar = progress_bar(desc="learn + forget", total=total, unit="step", enabled=progress)
    refs = {ref.name: run_reference(ref, info, schedule, bar, shadows) for ref in references}
    report = Report(schedule, [], [])
    for ref in refs.values():
        report.reference_rows += ref.rows
        report.end_reference_rows += ref.end_rows
    for method in methods:
        rows, end_rows = run_method(method, refs[(method.reference or method).name], info, schedule, bar)
        report.rows += rows
        report.end_rows += end_rows
    bar.close()
    if out_dir is not None:
        write_report(report, out_dir, stem=f"k{len(schedule)}_")
    return report


@dataclass
class ReferenceRun:
    """A gold standard's run through a schedule and its report rows: one per request (``rows``) and, when tasks
    were learned after the last request, one at the end of the stream (``end_rows``)."""

    name: str
    run: _Run
    rows: list[dict[str, Any]]
    end_rows: list[dict[str, Any]]


def run_reference(ref: Method, info: BenchmarkInfo, schedule: Schedule, bar: Any, shadows: int = 0) -> ReferenceRun:
    """Run the gold standard ``ref`` through ``schedule`` (with ``shadows`` LiRA shadow models) and measure it."""
    run = _run(ref, info, schedule, bar, shadows)
    bar.set_description_str(f"{ref.name}: metrics and attacks")
    head = {"method": f"{ref.name} (reference)", "family": ref.family}
    rows = [
        {
            **head,
            **_request_fields(i, res),
            **cost_fields(run, run),
            **_metrics(mod, None, info, cat, run.before, run.shadows),
        }
        for i, (mod, res, cat) in enumerate(run.steps)
    ]
    end_rows = []
    if run.end is not None:
        module, catalog = run.end
        end_rows.append({**head, **_end_fields(run), **_metrics(module, None, info, catalog, None, run.shadows)})
    return ReferenceRun(head["method"], run, rows, end_rows)


def run_method(
    method: Method, ref: ReferenceRun, info: BenchmarkInfo, schedule: Schedule, bar: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``method`` through ``schedule`` and compare it with its reference's run after every request (and at the
    end of the stream): its per-request rows and end rows.

    Raises:
        ValueError: the method removed other samples than its reference.
    """
    ref_run = ref.run
    run = _run(method, info, schedule, bar, 0)
    bar.set_description_str(f"{method.name}: metrics and attacks")
    head = {"method": method.name, "family": method.family, "reference": ref.name}
    rows = []
    for i, (module, result, catalog) in enumerate(run.steps):
        ref_module, ref_result, _ = ref_run.steps[i]
        if not torch.equal(result.removed_ids.sort().values, ref_result.removed_ids.sort().values):
            raise ValueError(
                f"{method.name} removed other samples than its reference {ref_result.request} did (request {i + 1})"
            )
        metrics = _metrics(module, ref_module, info, catalog, run.before, ref_run.shadows)
        rows.append(
            {
                **head,
                **_request_fields(i, result),
                **cost_fields(run, ref_run),
                **_beside_reference(metrics, ref.rows[i]),
            }
        )
    end_rows = []
    if run.end is not None and ref_run.end is not None:
        metrics = _metrics(run.end[0], ref_run.end[0], info, run.end[1], None, ref_run.shadows)
        end_rows.append({**head, **_end_fields(run), **_beside_reference(metrics, ref.end_rows[0])})
    return rows, end_rows


def evaluate_last(methods: Sequence[Method], info: BenchmarkInfo, schedule: Schedule, *, shadows: int = 0) -> Report:
    """Like :func:`evaluate`, compared with the reference only after the last request.

    Each method executes every request in order (its time is their total, ``n_requests`` of them); the
    reference retrains once, on what all of them leave (one request naming every removed id), which is the
    retrained model of the end state. For long streams of small requests ([HF]'s 20% of the samples deleted
    one at a time), where a retrain per request would cost more than the whole benchmark. Every row holds
    the costs of :func:`cost_fields`; with ``shadows`` (at least 2) each reference also makes that many
    offline-[LiRA] shadow models after its retrain and every row holds ``lira_auc``, forgotten vs test samples.

    Raises:
        ValueError: ``shadows`` of 1 or below 0, or a bad schedule.
    """
    check_shadows(shadows)
    bar = progress_bar(desc="learn + forget", enabled=False)
    refs = {ref.name: ref for ref in (m.reference or m for m in methods)}
    runs = {name: run_reference_last(ref, info, schedule, bar, shadows) for name, ref in refs.items()}
    report = Report(schedule, [r for run in runs.values() for r in run.rows], [])
    for method in methods:
        report.rows += run_method_last(method, runs[(method.reference or method).name], info, schedule, bar)
    return report


def run_reference_last(
    ref: Method, info: BenchmarkInfo, schedule: Schedule, bar: Any, shadows: int = 0
) -> ReferenceRun:
    """:func:`evaluate_last`'s reference: ``ref`` retrained once on what all of ``schedule``'s requests leave.

    Raises:
        ValueError: a bad schedule, or one with arrival times (the reference retrains after the stream).
    """
    if schedule.after:
        raise ValueError("compare='last' retrains once after the stream: it takes no arrival times (after=)")
    merged = Schedule((ForgetRequest.samples(torch.cat(validate_schedule(schedule.requests, info.catalog()))),))
    run = _run(ref, info, merged, bar, shadows)
    module, result, catalog = run.steps[-1]
    row = {
        "method": f"{ref.name} (reference)",
        "family": ref.family,
        **_request_fields(len(schedule) - 1, result),
        "n_requests": 1,
        **cost_fields(run, run),
        **_metrics(module, None, info, catalog, shadows=run.shadows),
    }
    return ReferenceRun(row["method"], run, [row], [])


def run_method_last(
    method: Method, ref: ReferenceRun, info: BenchmarkInfo, schedule: Schedule, bar: Any
) -> list[dict[str, Any]]:
    """:func:`evaluate_last`'s row of ``method``: every request executed in order, compared with ``ref`` at the end."""
    run = _run(method, info, schedule, bar)
    module, result, catalog = run.steps[-1]
    fields = _request_fields(len(schedule) - 1, result)
    fields["time_s"] = sum(float(s[1].wall_time_s) for s in run.steps)
    fields["n_removed"] = sum(int(s[1].removed_ids.numel()) for s in run.steps)
    fields["n_requests"] = len(run.steps)
    row = {
        "method": method.name,
        "family": method.family,
        "reference": ref.name,
        **fields,
        **cost_fields(run, ref.run),
        **_metrics(module, ref.run.steps[-1][0], info, catalog, shadows=ref.run.shadows),
    }
    return [row]


def check_shadows(shadows: int) -> None:
    """``ValueError`` unless ``shadows`` is 0 (no LiRA) or at least 2 (offline [LiRA] fits a Gaussian to them)."""
    if shadows == 1 or shadows < 0:
        raise ValueError(f"offline LiRA needs shadows >= 2 (or 0 to leave it out), got {shadows}")


def _beside_reference(metrics: dict[str, float], reference_row: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with each attack AUC followed by the reference's on the same request (``<name>_retrain``)."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        out[key] = value
        if key in ATTACKS:
            out[f"{key}_retrain"] = reference_row[key]
    return out


def _run(method: Method, info: BenchmarkInfo, schedule: Schedule, bar: Any, shadows: int = 0) -> _Run:
    """Learn the stream, executing the requests that arrive inside it after their experience; then the others
    (and make ``shadows`` LiRA shadow models after them).

    Requests arriving after the same experience are snapshot once all of them ran. With requests inside the
    stream the strategy exists from the start, so :func:`~lightning_unlearn.avalanche.fit_stream` restores a
    certified strategy's internal model before each later experience, and at the end of the stream a strategy
    with a ``publish()`` (the [CCL] methods) releases the model it ends with, as the last request did.
    """
    from lightning_unlearn.avalanche import (
        fit_stream,  # imports Avalanche (slow); only when a run starts
    )

    last = int(info.experiences[-1])
    inside: dict[int, list[ForgetRequest]] = {}
    for i, request in enumerate(schedule):
        arrival = schedule.arrival(i)
        if arrival is not None and arrival != last:
            inside.setdefault(arrival, []).append(request)
    with torch.random.fork_rng(), quiet_lightning():
        torch.manual_seed(info.seed)
        bar.set_description_str(f"{method.name}: learning the stream")
        built = method.build(info)
        early = built.strategy() if inside else None
        steps: list[tuple[nn.Module, Any, SampleCatalog]] = []
        kwargs = {"enable_progress_bar": False, **built.trainer_kwargs}
        start = time.perf_counter()
        fitted_on: list[torch.device] = []

        def learned(experience: Any, trainer: L.Trainer, done: list[Any]) -> None:
            fitted_on.append(trainer.strategy.root_device)
            bar.update()
            if early is None:  # no requests inside the stream
                return
            for result in done:
                bar.update()
                steps.append((copy.deepcopy(built.module.to(fitted_on[-1])), result, copy.deepcopy(early.catalog)))

        fit_stream(
            built.module,
            info.benchmark.train_stream,
            callbacks=built.callbacks,
            trainer_kwargs=kwargs,
            batch_size=built.batch_size or info.batch_size,
            unlearning=early,
            requests=inside or None,
            after_experience=learned,
        )
        fit_s = time.perf_counter() - start - sum(float(step[1].wall_time_s) for step in steps)
        # Lightning's teardown leaves a fitted module on the CPU, its recorder's statistics where it was fitted
        # (e.g. this rank's GPU): the requests and the metrics run there, on the module brought back after every fit
        device = fitted_on[-1] if fitted_on else torch.device("cpu")
        before = None if inside else copy.deepcopy(built.module.to(device))
        strategy = early if early is not None else built.strategy()
        storage = statistics_bytes(strategy.recorder)  # after learning, before any request after the stream
        ended = bool(inside) and len(steps) == len(schedule)  # tasks were learned after the last request
        publish = getattr(strategy, "publish", None)
        if ended and callable(publish):
            publish()  # [CCL] Alg. 1-2 publish w_T with fresh noise once something is forgotten
        end = (copy.deepcopy(built.module.to(device)), copy.deepcopy(strategy.catalog)) if ended else None
        for i, request in enumerate(schedule.requests[len(steps) :], start=len(steps)):
            bar.set_description_str(f"{method.name}: request {i + 1}/{len(schedule)}")
            result = strategy.forget(request, info.train if strategy.reads_data else None)
            bar.update()
            steps.append((copy.deepcopy(built.module.to(device)), result, copy.deepcopy(strategy.catalog)))
        run = _Run(before, steps, fit_s=fit_s, storage_bytes=storage, end=end)
        for j in range(shadows):
            bar.set_description_str(f"{method.name}: LiRA shadow {j + 1}/{shadows}")
            run.shadows.append(_shadow(strategy, info, info.seed + j).to(device))
            bar.update()
    return run


def _shadow(strategy: Unlearner, info: BenchmarkInfo, seed: int) -> nn.Module:
    """An offline-LiRA shadow model: a copy of the gold standard ``strategy`` (after the schedule) forgetting a
    random half of the samples it retains, i.e. its recipe replayed on the other half [interp]. The recorder's last
    Trainer and its DDP strategy (process group, launcher: not copyable) are shared with the copy, not copied."""
    rec = strategy.recorder
    module = strategy.module
    trainer = attached_trainer(module) if isinstance(module, L.LightningModule) else None
    work = copy.deepcopy(strategy, {id(o): o for o in (rec.trainer, trainer, rec._strategy) if o is not None})
    active = work.catalog.active_ids().sort().values  # the catalog's order is the learning order (DDP interleaves)
    half = active[torch.randperm(len(active), generator=torch.Generator().manual_seed(seed))[: len(active) // 2]]
    work.forget(ForgetRequest.samples(half), info.train if work.reads_data else None)
    return work.module


def _request_fields(i: int, result: Any) -> dict[str, Any]:
    return {
        "request": i + 1,
        "kind": result.request.kind,
        "forget_request": _label(result.request),
        "n_removed": int(result.removed_ids.numel()),
        "removed_ids": " ".join(map(str, result.removed_ids.sort().values.tolist())),
        "time_s": result.wall_time_s,
        "certificate": _guarantee(result.certificate),
        **_noise_fields(result.certificate),
    }


def _noise_fields(certificate: Any) -> dict[str, float]:
    """The release's noise std ``sigma`` and the distance bound it is calibrated on (``sensitivity``, e.g. [HF]'s
    gamma): NaN when the certificate has none (exact or noise-free requests)."""
    sigma = certificate.sigma
    return {
        "sigma": math.nan if sigma is None else float(sigma),
        "sensitivity": float(certificate.bounds.get("sensitivity", math.nan)),
    }


def _end_fields(run: _Run) -> dict[str, Any]:
    """What an end-of-stream row says about the requests before it: their count, total size and total time."""
    results = [step[1] for step in run.steps]
    return {
        "after_request": len(results),
        "n_removed": sum(int(r.removed_ids.numel()) for r in results),
        "time_s": sum(float(r.wall_time_s) for r in results),
        "certificate": _guarantee(results[-1].certificate),
    }


def _label(request: ForgetRequest) -> str:
    """``samples[n]``, ``class=c`` or ``experience=e`` (the ids themselves are in ``removed_ids``, all of them)."""
    return f"samples[{len(request.sample_ids)}]" if request.kind == "samples" else str(request)


def _guarantee(certificate: Any) -> str:
    """``exact``, ``(eps,delta)``, ``uncertified-noise(sigma=...)`` or ``none``: what a request's certificate
    promises (:attr:`Certificate.guarantee`)."""
    return str(certificate.guarantee)


def _metrics(
    module: nn.Module,
    reference: nn.Module | None,
    info: BenchmarkInfo,
    catalog: SampleCatalog,
    before: nn.Module | None = None,
    shadows: Sequence[nn.Module] = (),
) -> dict[str, float]:
    """App. E.2 metrics on the retained set, all samples forgotten so far, and the test set; the attacks."""
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
        before=before,
        shadows=shadows,
    )
