"""Avalanche integration: sample ids as an Avalanche data attribute, a Lightning loop over a stream, and a plugin.

* :func:`with_sample_ids`, :func:`benchmark_with_sample_ids`: Avalanche datasets and benchmarks whose
  samples carry stable ids (Avalanche's items stay ``(x, y, task_label)``);
* :func:`fit_stream`: learn an Avalanche ``train_stream`` with Lightning, one fit per experience;
* :class:`UnlearningPlugin`: recording and forget requests inside Avalanche's own training strategies.

Importing this package imports Avalanche (slow: ~5-15 s); the rest of the library does not.
"""

from lightning_unlearn.avalanche import _quiet_import  # noqa: F401  (first: imports Avalanche, see there)
from lightning_unlearn.avalanche.benchmarks import (
    SAMPLE_ID,
    benchmark_with_sample_ids,
    items_with_ids,
    require_sample_ids,
    sample_ids,
    with_sample_ids,
)
from lightning_unlearn.avalanche.plugin import UnlearningPlugin
from lightning_unlearn.avalanche.stream import RequestsByExperience, fit_stream

__all__ = [
    "SAMPLE_ID",
    "RequestsByExperience",
    "UnlearningPlugin",
    "benchmark_with_sample_ids",
    "fit_stream",
    "items_with_ids",
    "require_sample_ids",
    "sample_ids",
    "with_sample_ids",
]
