"""lightning-unlearn: continual learning with certified and exact unlearning for PyTorch Lightning.

The names a user needs are exported here: every unlearner and every recorder callback, the
requests, certificates, ledger and catalog they exchange, the library's model classes and the data helpers.
They are imported lazily (PEP 562), each module on first use, so ``import lightning_unlearn`` costs no torch
and no Lightning import until a name is used. Avalanche integration lives in :mod:`lightning_unlearn.avalanche`
(imported on demand: Avalanche is slow to import). The evaluation harness and the ``lightning-unlearn`` command are
a separate distribution, ``lightning-unlearn-bench`` (:mod:`lightning_unlearn_bench`), which this package never imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: every exported name, by the module defining it (``tests/test_exports.py`` checks that the subpackages' strategies,
#: recorders and core types are all exported, and that this table, ``__all__`` and the type-checking imports agree)
_EXPORTS = {
    "callbacks": (
        "AnalyticRecorder",
        "FrozenFeatureRecorder",
        "CCLHessianRecorder",
        "HessianSumRecorder",
        "ProximalRegularizer",
        "RecorderCallback",
        "SampleRecorder",
        "SISABackbone",
        "SlicedBackbone",
        "SoftmaxHeadRecorder",
        "SAFERecorder",
        "CCLRecorder",
        "TaskOptimality",
        "TrajectoryRecorder",
    ),
    "contract": ("BatchKeys",),
    "core": (
        "Certificate",
        "ForgetRequest",
        "Ledger",
        "LedgerEntry",
        "LedgerError",
        "LedgerReport",
        "ReleaseRefused",
        "SampleCatalog",
        "UnlearningResult",
        "UnlearningState",
    ),
    "data": (
        "IndexedDataset",
        "select_by_ids",
    ),
    "models": (
        "AnalyticClassifier",
        "AnalyticHead",
        "AnalyticHeadModule",
        "ProximalClassifier",
        "RandomExpansion",
        "SupervisedClassifier",
    ),
    "privacy": ("ReleaseConfig",),
    "unlearners": (
        "ACUUnlearner",
        "CertifiedRemovalUnlearner",
        "ErasurePendingError",
        "FinetuneUnlearner",
        "CCLGradientUnlearner",
        "CCLHessianUnlearner",
        "HFUnlearner",
        "InfinitesimalJackknifeUnlearner",
        "L1SparseUnlearner",
        "MaskProjection",
        "NegGradPlusUnlearner",
        "NegGradUnlearner",
        "NewtonStepUnlearner",
        "NoisyFinetuneUnlearner",
        "RandomLabelUnlearner",
        "RBMUnlearner",
        "ResolveUnlearner",
        "RetrainUnlearner",
        "SCRUBUnlearner",
        "SISAUnlearner",
        "SlicedResolveUnlearner",
        "SAFEUnlearner",
        "Unlearner",
        "WoodFisherUnlearner",
        "MethodInfo",
        "available_unlearners",
        "method_info",
        "unlearner_class",
    ),
    "warnings": ("UnlearningWarning",),
}
_MODULE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "ACUUnlearner",
    "AnalyticClassifier",
    "AnalyticHead",
    "AnalyticHeadModule",
    "AnalyticRecorder",
    "BatchKeys",
    "Certificate",
    "CertifiedRemovalUnlearner",
    "ErasurePendingError",
    "FinetuneUnlearner",
    "ForgetRequest",
    "FrozenFeatureRecorder",
    "CCLGradientUnlearner",
    "CCLHessianUnlearner",
    "CCLHessianRecorder",
    "HessianSumRecorder",
    "HFUnlearner",
    "IndexedDataset",
    "InfinitesimalJackknifeUnlearner",
    "L1SparseUnlearner",
    "Ledger",
    "LedgerEntry",
    "LedgerError",
    "LedgerReport",
    "MaskProjection",
    "MethodInfo",
    "NegGradPlusUnlearner",
    "NegGradUnlearner",
    "NewtonStepUnlearner",
    "NoisyFinetuneUnlearner",
    "ProximalClassifier",
    "ProximalRegularizer",
    "RandomExpansion",
    "RandomLabelUnlearner",
    "RBMUnlearner",
    "RecorderCallback",
    "ReleaseConfig",
    "ReleaseRefused",
    "ResolveUnlearner",
    "RetrainUnlearner",
    "SampleCatalog",
    "SampleRecorder",
    "SCRUBUnlearner",
    "select_by_ids",
    "SISABackbone",
    "SISAUnlearner",
    "SlicedBackbone",
    "SlicedResolveUnlearner",
    "SoftmaxHeadRecorder",
    "SAFERecorder",
    "SAFEUnlearner",
    "SupervisedClassifier",
    "CCLRecorder",
    "TaskOptimality",
    "TrajectoryRecorder",
    "UnlearningResult",
    "UnlearningState",
    "Unlearner",
    "UnlearningWarning",
    "available_unlearners",
    "method_info",
    "unlearner_class",
    "WoodFisherUnlearner",
]

if TYPE_CHECKING:
    from lightning_unlearn.callbacks import (
        AnalyticRecorder,
        CCLHessianRecorder,
        CCLRecorder,
        FrozenFeatureRecorder,
        HessianSumRecorder,
        ProximalRegularizer,
        RecorderCallback,
        SAFERecorder,
        SampleRecorder,
        SISABackbone,
        SlicedBackbone,
        SoftmaxHeadRecorder,
        TaskOptimality,
        TrajectoryRecorder,
    )
    from lightning_unlearn.contract import BatchKeys
    from lightning_unlearn.core import (
        Certificate,
        ForgetRequest,
        Ledger,
        LedgerEntry,
        LedgerError,
        LedgerReport,
        ReleaseRefused,
        SampleCatalog,
        UnlearningResult,
        UnlearningState,
    )
    from lightning_unlearn.data import IndexedDataset, select_by_ids
    from lightning_unlearn.models import (
        AnalyticClassifier,
        AnalyticHead,
        AnalyticHeadModule,
        ProximalClassifier,
        RandomExpansion,
        SupervisedClassifier,
    )
    from lightning_unlearn.privacy import ReleaseConfig
    from lightning_unlearn.unlearners import (
        ACUUnlearner,
        CCLGradientUnlearner,
        CCLHessianUnlearner,
        CertifiedRemovalUnlearner,
        ErasurePendingError,
        FinetuneUnlearner,
        HFUnlearner,
        InfinitesimalJackknifeUnlearner,
        L1SparseUnlearner,
        MaskProjection,
        MethodInfo,
        NegGradPlusUnlearner,
        NegGradUnlearner,
        NewtonStepUnlearner,
        NoisyFinetuneUnlearner,
        RandomLabelUnlearner,
        RBMUnlearner,
        ResolveUnlearner,
        RetrainUnlearner,
        SAFEUnlearner,
        SCRUBUnlearner,
        SISAUnlearner,
        SlicedResolveUnlearner,
        Unlearner,
        WoodFisherUnlearner,
        available_unlearners,
        method_info,
        unlearner_class,
    )
    from lightning_unlearn.warnings import UnlearningWarning


def __getattr__(name: str) -> Any:
    """``lightning_unlearn.ACUUnlearner`` imports :mod:`lightning_unlearn.unlearners` (and torch) only then."""
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
