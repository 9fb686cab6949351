"""Evaluation harness: every unlearning method through one continual-unlearning protocol ([ACU] Section 4.1).

* :mod:`~lightning_unlearn.harness.types`: :class:`BenchmarkInfo`, :class:`Method`, :class:`Built`;
* :mod:`~lightning_unlearn.harness.loop`: :func:`evaluate` (learn, forget, compare with the gold standard);
* :mod:`~lightning_unlearn.harness.report`: :class:`Report` (rows, Table 1 summary, CSVs, text table);
* :mod:`~lightning_unlearn.harness.plot`: the accuracies figure;
* :mod:`~lightning_unlearn.harness.digits`: the bundled digits benchmark;
* :mod:`~lightning_unlearn.harness.datasets`: the standard benchmarks and [HF]'s face datasets from files on disk;
* :mod:`~lightning_unlearn.harness.models`: models by name (:func:`build_model`), [ACU]'s pre-trained backbone;
* :mod:`~lightning_unlearn.harness.fake_data`: tiny datasets in each real on-disk format, for tests;
* :mod:`~lightning_unlearn.harness.families`: model families and their gold standards;
* :mod:`~lightning_unlearn.harness.registry`: names to strategy classes (:class:`MethodSpec`, :func:`get_method`);
* :mod:`~lightning_unlearn.harness.methods`: the built-in registrations.
"""

from lightning_unlearn.harness import methods as _methods  # noqa: F401  (registers the built-in methods)
from lightning_unlearn.harness.datasets import (
    BENCHMARKS,
    DatasetNotFoundError,
    Splits,
    benchmark_info,
    load_benchmark,
    load_splits,
)
from lightning_unlearn.harness.digits import digits_benchmark, digits_splits
from lightning_unlearn.harness.families import FAMILIES, reference, retrain_method
from lightning_unlearn.harness.loop import evaluate
from lightning_unlearn.harness.models import MODELS, backbone_of, build_model, pretrain_backbone
from lightning_unlearn.harness.registry import (
    MethodSpec,
    available_methods,
    get_method,
    method_spec,
    register,
)
from lightning_unlearn.harness.report import TABLE1, Report, format_table
from lightning_unlearn.harness.types import (
    BenchmarkInfo,
    Built,
    Method,
    describe_benchmark,
)

__all__ = [
    "BENCHMARKS",
    "MODELS",
    "DatasetNotFoundError",
    "Splits",
    "backbone_of",
    "benchmark_info",
    "build_model",
    "load_benchmark",
    "load_splits",
    "pretrain_backbone",
    "FAMILIES",
    "TABLE1",
    "BenchmarkInfo",
    "Built",
    "Method",
    "MethodSpec",
    "Report",
    "available_methods",
    "describe_benchmark",
    "digits_benchmark",
    "digits_splits",
    "evaluate",
    "format_table",
    "get_method",
    "method_spec",
    "reference",
    "register",
    "retrain_method",
]
