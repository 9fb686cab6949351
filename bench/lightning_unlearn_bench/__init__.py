"""The bench: every unlearning method through one continual-unlearning protocol ([ACU] Section 4.1).

A distribution of its own, ``lightning-unlearn-bench`` (``bench/`` in the repository), built on ``lightning-unlearn``,
which never imports it: the evaluation harness, the papers' tables and the ``lightning-unlearn`` command.

* :mod:`~lightning_unlearn_bench.types`: :class:`BenchmarkInfo`, :class:`Method`, :class:`Built`;
* :mod:`~lightning_unlearn_bench.loop`: :func:`evaluate` (learn, forget, compare with the gold standard);
* :mod:`~lightning_unlearn_bench.report`: :class:`Report` (rows, Table 1 summary, CSVs, text table);
* :mod:`~lightning_unlearn_bench.plot`: the accuracies figure;
* :mod:`~lightning_unlearn_bench.digits`: the bundled digits benchmark;
* :mod:`~lightning_unlearn_bench.datasets`: the standard benchmarks and [HF]'s face datasets from files on disk;
* :mod:`~lightning_unlearn_bench.models`: models by name (:func:`build_model`), [ACU]'s pre-trained backbone;
* :mod:`~lightning_unlearn_bench.fake_data`: tiny datasets in each real on-disk format, for tests;
* :mod:`~lightning_unlearn_bench.families`: model families and their gold standards;
* :mod:`~lightning_unlearn_bench.spec`: a method, an unlearner class on model families (:class:`MethodSpec`);
* :mod:`~lightning_unlearn_bench.methods`: the built-in methods;
* :mod:`~lightning_unlearn_bench.registry`: names to methods (:func:`get_method`, :func:`unlearner`);
* :mod:`~lightning_unlearn_bench.own`: your own module and data against retraining (:func:`compare_with_retrain`);
* :mod:`~lightning_unlearn_bench.papers` and ``configs/*.yaml``: the papers' tables as reproduction configs;
* :mod:`~lightning_unlearn_bench.repro`: reproduction runs (:func:`~lightning_unlearn_bench.repro.run_config`);
* :mod:`~lightning_unlearn_bench.tradeoff`: the privacy-utility benchmark (``lightning-unlearn tradeoff``);
* :mod:`~lightning_unlearn_bench.cli` and ``__main__``: the ``lightning-unlearn`` command (also
  ``python -m lightning_unlearn_bench``).

Names are imported from here lazily (each module on first use): reading a config imports no harness module
that needs torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: every public name of the package, by the module defining it
_EXPORTS = {
    "datasets": (
        "BENCHMARKS",
        "DatasetNotFoundError",
        "Splits",
        "benchmark_info",
        "load_benchmark",
        "load_splits",
    ),
    "digits": (
        "digits_benchmark",
        "digits_splits",
    ),
    "families": (
        "FAMILIES",
        "reference",
        "retrain_method",
    ),
    "loop": ("evaluate",),
    "own": (
        "DatasetPair",
        "compare_with_retrain",
    ),
    "models": (
        "MODELS",
        "backbone_of",
        "build_model",
        "pretrain_backbone",
    ),
    "registry": (
        "available_methods",
        "get_method",
        "method_spec",
        "register",
        "unlearner",
    ),
    "spec": ("MethodSpec",),
    "report": (
        "TABLE1",
        "Report",
        "format_table",
    ),
    "types": (
        "BenchmarkInfo",
        "Built",
        "Method",
        "describe_benchmark",
    ),
}
_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "BENCHMARKS",
    "BenchmarkInfo",
    "Built",
    "DatasetNotFoundError",
    "DatasetPair",
    "FAMILIES",
    "MODELS",
    "Method",
    "MethodSpec",
    "Report",
    "Splits",
    "TABLE1",
    "available_methods",
    "backbone_of",
    "benchmark_info",
    "build_model",
    "compare_with_retrain",
    "describe_benchmark",
    "digits_benchmark",
    "digits_splits",
    "evaluate",
    "format_table",
    "get_method",
    "load_benchmark",
    "load_splits",
    "method_spec",
    "pretrain_backbone",
    "reference",
    "register",
    "retrain_method",
    "unlearner",
]

if TYPE_CHECKING:
    from lightning_unlearn_bench.datasets import (
        BENCHMARKS,
        DatasetNotFoundError,
        Splits,
        benchmark_info,
        load_benchmark,
        load_splits,
    )
    from lightning_unlearn_bench.digits import digits_benchmark, digits_splits
    from lightning_unlearn_bench.families import FAMILIES, reference, retrain_method
    from lightning_unlearn_bench.loop import evaluate
    from lightning_unlearn_bench.models import MODELS, backbone_of, build_model, pretrain_backbone
    from lightning_unlearn_bench.own import DatasetPair, compare_with_retrain
    from lightning_unlearn_bench.registry import available_methods, get_method, method_spec, register, unlearner
    from lightning_unlearn_bench.report import TABLE1, Report, format_table
    from lightning_unlearn_bench.spec import MethodSpec
    from lightning_unlearn_bench.types import BenchmarkInfo, Built, Method, describe_benchmark


def __getattr__(name: str) -> Any:
    """``from lightning_unlearn_bench import evaluate`` imports :mod:`.loop` (and torch) only then."""
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
