"""Method-independent building blocks: what to forget, what was learned, what was proved, what was done."""

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger, LedgerEntry, LedgerError, LedgerReport
from lightning_unlearn.core.refusal import ReleaseRefused
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.core.state import UnlearningState

__all__ = [
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
]
