"""Avalanche integration: benchmarks with sample ids, a Lightning loop over a stream, and a plugin.

* :func:`class_incremental_benchmark`: an Avalanche benchmark whose items carry sample ids;
* :func:`fit_stream`: learn an Avalanche ``train_stream`` with Lightning, one fit per experience;
* :class:`UnlearningPlugin`: recording and forget requests inside Avalanche's own training strategies.

Importing this package imports Avalanche (slow: ~5-15 s); the rest of the library does not.
"""

from lightning_unlearn.avalanche.benchmarks import (
    class_incremental_benchmark,
    require_sample_ids,
)
from lightning_unlearn.avalanche.plugin import UnlearningPlugin
from lightning_unlearn.avalanche.stream import RequestsByExperience, fit_stream

__all__ = [
    "RequestsByExperience",
    "UnlearningPlugin",
    "class_incremental_benchmark",
    "fit_stream",
    "require_sample_ids",
]
