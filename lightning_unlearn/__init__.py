"""lightning-unlearn: continual learning with certified and exact unlearning for PyTorch Lightning.

Avalanche integration lives in :mod:`lightning_unlearn.avalanche` (imported on demand: Avalanche
is slow to import).
"""

from lightning_unlearn.callbacks import (
    AnalyticRecorder,
    HessianRecorder,
    ProximalRegularizer,
    RecorderCallback,
    SoftmaxHeadRecorder,
    StreamingRecorder,
    TaskDeltaRecorder,
    TrajectoryRecorder,
)
from lightning_unlearn.core import Certificate, ForgetRequest, Ledger, LedgerEntry, SampleCatalog
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.models import (
    AnalyticClassifier,
    AnalyticHead,
    ProximalClassifier,
    RandomExpansion,
    SupervisedClassifier,
)
from lightning_unlearn.strategies import (
    ACUStrategy,
    CertifiedRemovalStrategy,
    GradientCertifiedStrategy,
    HessianCertifiedStrategy,
    HFStrategy,
    RBMStrategy,
    ResolveStrategy,
    StreamingStrategy,
    UnlearningResult,
    UnlearningStrategy,
)

__all__ = [
    "ACUStrategy",
    "AnalyticClassifier",
    "AnalyticHead",
    "AnalyticRecorder",
    "Certificate",
    "CertifiedRemovalStrategy",
    "ForgetRequest",
    "GradientCertifiedStrategy",
    "HFStrategy",
    "HessianCertifiedStrategy",
    "HessianRecorder",
    "IndexedDataset",
    "Ledger",
    "LedgerEntry",
    "ProximalClassifier",
    "ProximalRegularizer",
    "RandomExpansion",
    "RBMStrategy",
    "RecorderCallback",
    "ResolveStrategy",
    "SampleCatalog",
    "SoftmaxHeadRecorder",
    "StreamingRecorder",
    "StreamingStrategy",
    "SupervisedClassifier",
    "TaskDeltaRecorder",
    "TrajectoryRecorder",
    "UnlearningResult",
    "UnlearningStrategy",
]
__version__ = "0.1.0"
