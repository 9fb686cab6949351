"""Evaluation harness: one protocol over all unlearning methods (ACU paper, Section 4.1, App. E.1-E.2).

For each :class:`Method` the harness learns the benchmark's ``train_stream`` with
:func:`~lightning_unlearn.avalanche.fit_stream` (one Lightning fit per experience), then executes
the K requests of a :class:`~lightning_unlearn.schedule.Schedule` in order. After every request
the module is compared with its gold standard: the method's ``reference`` (a retrain-from-scratch
:class:`Method` of the same model family), run on its own through the same protocol. Per request
it records :func:`~lightning_unlearn.metrics.evaluate_unlearning` on the retained set, the union of
all forgotten sets (App. E.2) and the test set, plus the request's wall time; the summary is the
Table 1 row of each method: mean over requests of ``||theta - theta_retrain||``, of the retain,
forget and test accuracy gaps (percentage points) and of the MIA gap (a fraction), and the mean
time per request. :meth:`Report.write` saves both as CSV and plots the accuracies over requests.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import IndexedDataset, unpack_batch
from lightning_unlearn.metrics import evaluate_unlearning
from lightning_unlearn.schedule import Schedule, validate_schedule
from lightning_unlearn.strategies.base import UnlearningStrategy

#: summary columns (paper Table 1 plus time) and the per-request metric each averages, with its scale
TABLE1 = {
    "l2_to_retrain": ("l2_to_retrain", 1.0),
    "retain_gap_pp": ("retain_acc_gap", 100.0),
    "forget_gap_pp": ("forget_acc_gap", 100.0),
    "test_gap_pp": ("test_acc_gap", 100.0),
    "mia_gap": ("mia_gap", 1.0),
    "time_per_request_s": ("time_s", 1.0),
}


@dataclass(frozen=True)
class BenchmarkInfo:
    """What a method needs to build its model for a benchmark, and the data the harness evaluates on.

    ``train`` yields ``(x, y, sample_id)`` for every training sample of the stream; ``ids``,
    ``labels`` and ``experiences`` say what each experience teaches. ``backbone`` is a frozen
    pre-trained feature extractor (methods copy it) with output width ``backbone_dim``.
    ``epochs``, ``lr`` and ``batch_size`` are the continual-learning recipe of gradient-trained
    models (retraining replays it).
    """

    benchmark: Any
    train: IndexedDataset
    test: Dataset
    ids: Tensor
    labels: Tensor
    experiences: Tensor
    num_classes: int
    backbone: nn.Module
    backbone_dim: int
    seed: int = 0
    epochs: int = 1
    lr: float = 0.1
    batch_size: int = 64

    def catalog(self) -> SampleCatalog:
        """A fresh catalog of everything the stream teaches (nothing forgotten)."""
        cat = SampleCatalog()
        for e in self.experiences.unique().tolist():
            rows = self.experiences == e
            cat.add(self.ids[rows], self.labels[rows], int(e))
        return cat


def describe_benchmark(
    benchmark: Any,
    *,
    backbone: nn.Module | None = None,
    backbone_dim: int | None = None,
    seed: int = 0,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 64,
) -> BenchmarkInfo:
    """Read an Avalanche benchmark whose training items carry sample ids (e.g. built with
    :func:`~lightning_unlearn.avalanche.class_incremental_benchmark`) into a :class:`BenchmarkInfo`.

    Without a ``backbone`` the inputs themselves (flattened) are the features.
    """
    xs, ys, ids, exps = [], [], [], []
    for experience in benchmark.train_stream:
        for batch in DataLoader(experience.dataset, batch_size=1024):
            x, y, i = unpack_batch(batch)
            xs.append(x)
            ys.append(y.long())
            ids.append(i)
            exps.append(torch.full_like(i, experience.current_experience))
    test = [b for exp in benchmark.test_stream for b in DataLoader(exp.dataset, batch_size=1024)]
    x, y, i = torch.cat(xs), torch.cat(ys), torch.cat(ids)
    if backbone is None:
        backbone, backbone_dim = nn.Flatten(), int(x[0].numel())
    elif backbone_dim is None:
        raise ValueError("give the backbone's output width as backbone_dim")
    return BenchmarkInfo(
        benchmark=benchmark,
        train=IndexedDataset(TensorDataset(x, y), ids=i),
        test=TensorDataset(torch.cat([b[0] for b in test]), torch.cat([torch.as_tensor(b[1]) for b in test]).long()),
        ids=i,
        labels=y,
        experiences=torch.cat(exps),
        num_classes=int(benchmark.n_classes),
        backbone=backbone,
        backbone_dim=int(backbone_dim),  # type: ignore[arg-type]
        seed=seed,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
    )


@dataclass
class Built:
    """A method's model for one benchmark: the module, the callbacks that learn the stream with it
    (its recorder among them), the strategy factory (called after learning), and the Trainer
    options of its continual-learning fits (e.g. ``{"max_epochs": 5}``) and their batch size
    (``None``: the benchmark's ``batch_size``)."""

    module: L.LightningModule
    callbacks: list[L.Callback]
    strategy: Callable[[], UnlearningStrategy]
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None


@dataclass(frozen=True)
class Method:
    """A named unlearning method: ``build(info)`` makes a fresh :class:`Built` for a benchmark.

    ``reference`` is the gold standard it is measured against (retraining from scratch on the
    retained data, for the same model family); ``None`` means the method *is* its family's gold
    standard. The harness always runs the reference separately, so a retrain method is checked
    against an independent retrain. ``family`` names the model family the method runs on (e.g.
    ``"analytic"``); reports group and label methods by it.
    """

    name: str
    build: Callable[[BenchmarkInfo], Built]
    reference: Method | None = None
    family: str = "custom"


@dataclass
class Report:
    """Per-request metrics of every method (``rows``) and of the references (``reference_rows``).

    Each row holds the method, the request (counted from 1), its kind, size, wall time and
    guarantee, and the :func:`evaluate_unlearning` metrics after it (with the gaps to the reference).
    """

    schedule: Schedule
    rows: list[dict[str, Any]]
    reference_rows: list[dict[str, Any]]

    @property
    def k(self) -> int:
        return len(self.schedule)

    def methods(self) -> list[str]:
        return list(dict.fromkeys(r["method"] for r in self.rows))

    def table(self, method: str) -> list[dict[str, Any]]:
        """The per-request rows of one method."""
        return [r for r in self.rows if r["method"] == method]

    def summary(self) -> dict[str, dict[str, float]]:
        """Paper Table 1 row per method: mean over requests of each gap, and time per request."""
        out = {}
        for m in self.methods():
            rows = self.table(m)
            out[m] = {col: scale * sum(float(r[key]) for r in rows) / len(rows) for col, (key, scale) in TABLE1.items()}
        return out

    def family(self, method: str) -> str:
        """The model family ``method`` (or a reference, ``"<name> (reference)"``) ran on."""
        return next(r["family"] for r in self.rows + self.reference_rows if r["method"] == method)

    def format(self) -> str:
        """The summary as an aligned plain-text table."""
        head = ["method", "family", "dParams(L2)", "dRetain(pp)", "dForget(pp)", "dTest(pp)", "dMIA", "s/request", "guarantee"]
        body = [
            [m, self.family(m), *(f"{s[c]:.4g}" if c == "time_per_request_s" else f"{s[c]:.2f}" for c in TABLE1),
             self._guarantee(m)]
            for m, s in self.summary().items()
        ]
        title = f"K = {self.k} requests ({_describe(self.schedule)}); gaps to retraining from scratch"
        return format_table(head, body, title=title)

    def _guarantee(self, method: str) -> str:
        certs = {r["certificate"] for r in self.table(method)}
        return certs.pop() if len(certs) == 1 else "/".join(sorted(certs))

    def write(self, out_dir: str | Path, stem: str = "") -> list[Path]:
        """Write ``<stem>requests.csv`` (every row), ``<stem>summary.csv`` and ``<stem>accuracies.png``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{stem}requests.csv", out / f"{stem}summary.csv", out / f"{stem}accuracies.png"]
        _write_csv(paths[0], self.rows + self.reference_rows)
        _write_csv(paths[1], [{"method": m, "family": self.family(m), "k": self.k, **s} for m, s in self.summary().items()])
        self.plot(paths[2])
        return paths

    def plot(self, path: str | Path) -> None:
        """Retain, forget and test accuracy over the requests: one row of panels per gold standard.

        Each row shows one reference (retraining from scratch a model family) as a thick grey line
        and the methods measured against it with distinct colours, markers and line styles, dodged
        sideways so methods with equal accuracies stay visible; each row's legend sits right of it.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        keys = {"retain_acc": "retain accuracy", "forget_acc": "forget accuracy", "test_acc": "test accuracy"}
        refs = list(dict.fromkeys(r["reference"] for r in self.rows))
        fig = Figure(figsize=(10.5, 2.4 * len(refs) + 0.6), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(refs), len(keys), sharex=True, sharey="row", squeeze=False)
        for row, ref in enumerate(refs):
            methods = [m for m in self.methods() if self.table(m)[0]["reference"] == ref]
            ref_rows = [r for r in self.reference_rows if r["method"] == ref]
            width = 0.3 if len(methods) > 1 else 0.0
            for col, key in enumerate(keys):
                ax = axes[row, col]
                ax.plot([r["request"] for r in ref_rows], [r[key] for r in ref_rows], color="0.6", lw=4, alpha=0.6,
                        solid_capstyle="round", label=ref, zorder=1)
                for j, m in enumerate(methods):
                    rows = self.table(m)
                    shift = width * (j / (len(methods) - 1) - 0.5) if len(methods) > 1 else 0.0
                    ax.plot([r["request"] + shift for r in rows], [r[key] for r in rows], label=m, zorder=2,
                            color=_COLORS[j % len(_COLORS)], marker=_MARKERS[j % len(_MARKERS)],
                            linestyle=_LINESTYLES[j % len(_LINESTYLES)], lw=1.2, ms=5, mfc="white", mew=1.2)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
                ax.set_xlim(0.5, self.k + 0.5)
                ax.grid(True, color="0.9", lw=0.6)
                ax.set_axisbelow(True)
                if row == 0:
                    ax.set_title(keys[key])
                if row == len(refs) - 1:
                    ax.set_xlabel("forget request")
            axes[row, 0].set_ylabel(f"{self.family(ref)} family\naccuracy")
            handles, labels = axes[row, -1].get_legend_handles_labels()
            axes[row, -1].legend(handles, labels, loc="center left", bbox_to_anchor=(1.03, 0.5), fontsize=8, frameon=False)
        fig.suptitle(f"Continual unlearning: K = {self.k} forget requests ({_describe(self.schedule)})")
        fig.savefig(path, dpi=150)


#: a colour-blind-safe palette (Okabe-Ito), markers and line styles cycled per method of a family
_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


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
    bar = _progress(len(references) + len(methods), len(info.experiences.unique()) + len(schedule), progress)
    snapshots = {ref.name: _run(ref, info, schedule, bar) for ref in references}
    report = Report(schedule, [], [])
    for ref in references:
        report.reference_rows += [
            {"method": f"{ref.name} (reference)", "family": ref.family, **_request_fields(i, res),
             **_metrics(mod, None, info, cat)}
            for i, (mod, res, cat) in enumerate(snapshots[ref.name])
        ]
    for method in methods:
        ref_steps = snapshots[(method.reference or method).name]
        for i, (module, result, catalog) in enumerate(_run(method, info, schedule, bar)):
            ref_module, ref_result, _ = ref_steps[i]
            if not torch.equal(result.removed_ids.sort().values, ref_result.removed_ids.sort().values):
                raise ValueError(f"{method.name} removed other samples than its reference {ref_result.request} did (request {i + 1})")
            report.rows.append({"method": method.name, "family": method.family,
                                "reference": f"{(method.reference or method).name} (reference)", **_request_fields(i, result),
                                **_metrics(module, ref_module, info, catalog)})
    bar.close()
    if out_dir is not None:
        report.write(out_dir, stem=f"k{len(schedule)}_")
    return report


def _run(method: Method, info: BenchmarkInfo, schedule: Schedule, bar: Any) -> list[tuple[nn.Module, Any, SampleCatalog]]:
    """Learn the stream, then execute the requests; a copy of (module, result, catalog) after each."""
    from lightning_unlearn.avalanche import fit_stream  # imports Avalanche (slow); only when a run starts

    with torch.random.fork_rng():
        torch.manual_seed(info.seed)
        built = method.build(info)
        kwargs = {"enable_progress_bar": False, **built.trainer_kwargs}
        fit_stream(built.module, info.benchmark.train_stream, callbacks=built.callbacks, trainer_kwargs=kwargs,
                   batch_size=built.batch_size or info.batch_size, after_experience=lambda *_: bar.update())
        strategy = built.strategy()
        steps = []
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


def _metrics(module: nn.Module, reference: nn.Module | None, info: BenchmarkInfo, catalog: SampleCatalog) -> dict[str, float]:
    """App. E.2 metrics on the retained set, all samples forgotten so far, and the test set."""
    rows = {int(i): r for r, i in enumerate(info.ids.tolist())}
    retain = Subset(info.train, [rows[i] for i in catalog.active_ids().tolist()])
    forget = Subset(info.train, [rows[i] for i in catalog.ids[catalog.forgotten].tolist()])
    return evaluate_unlearning(module, retain=retain, forget=forget, test=info.test, num_classes=info.num_classes, reference=reference)


def _progress(runs: int, steps_per_run: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=runs * steps_per_run, disable=not enabled, desc="learn + forget", unit="step")


def _describe(schedule: Schedule) -> str:
    kinds = "/".join(dict.fromkeys(r.kind for r in schedule))
    seed = f", seed {schedule.seed}" if schedule.seed is not None else ""
    return f"{kinds}{seed}"


def format_table(head: Sequence[str], body: Sequence[Sequence[str]], title: str = "") -> str:
    """Columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(str(row[c])) for row in [head, *body]) for c in range(len(head))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(str(v).ljust(w) if c == 0 else str(v).rjust(w) for c, (v, w) in enumerate(zip(row, widths)))

    rule = "-" * len(line(head))
    return "\n".join([*([title] if title else []), line(head), rule, *(line(r) for r in body)])


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def digits_benchmark(
    n_experiences: int = 5, *, seed: int = 0, pretrain_epochs: int = 30, epochs: int = 5, lr: float = 0.05, batch_size: int = 64
) -> BenchmarkInfo:
    """scikit-learn's real handwritten digits (no download) as a class-incremental stream (ACU App. E.1).

    An MLP pre-trained for ``pretrain_epochs`` on the disjoint ``base`` split is the frozen
    backbone; the ``train`` split is learned in ``n_experiences`` experiences of whole classes.
    """
    from lightning_unlearn.avalanche import class_incremental_benchmark
    from lightning_unlearn.datasets import digits_splits
    from lightning_unlearn.models import SupervisedClassifier, mlp_backbone

    splits = digits_splits(seed=seed)
    (xb, yb), (x, y), (xt, yt) = splits["base"], splits["train"], splits["test"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        backbone = mlp_backbone(x.shape[1], 128, 64)
        net = nn.Sequential(backbone, nn.Linear(64, 10))
        trainer = L.Trainer(max_epochs=pretrain_epochs, logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
        trainer.fit(SupervisedClassifier(net, lr=0.1), DataLoader(TensorDataset(xb, yb), batch_size=32, shuffle=True))
    bm = class_incremental_benchmark(x, y, xt, yt, n_experiences=n_experiences, seed=seed)
    return describe_benchmark(bm, backbone=backbone.requires_grad_(False), backbone_dim=64, seed=seed, epochs=epochs, lr=lr, batch_size=batch_size)
