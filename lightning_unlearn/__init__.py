"""lightning-unlearn: continual learning with certified and exact unlearning for PyTorch Lightning."""

from lightning_unlearn.callbacks import AnalyticRecorder, RecorderCallback
from lightning_unlearn.core import Certificate, ForgetRequest, Ledger, LedgerEntry, SampleCatalog
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.models import AnalyticClassifier, RandomExpansion
from lightning_unlearn.strategies import ACUStrategy, UnlearningResult, UnlearningStrategy

__all__ = [
    "ACUStrategy",
    "AnalyticClassifier",
    "AnalyticRecorder",
    "Certificate",
    "ForgetRequest",
    "IndexedDataset",
    "Ledger",
    "LedgerEntry",
    "RandomExpansion",
    "RecorderCallback",
    "SampleCatalog",
    "UnlearningResult",
    "UnlearningStrategy",
]
__version__ = "0.1.0"
