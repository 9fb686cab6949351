"""Method-independent building blocks: what to forget, what was learned, what was proved, what was done."""

from lightning_unlearn.core.catalog import SampleCatalog
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger, LedgerEntry
from lightning_unlearn.core.request import ForgetRequest

__all__ = ["Certificate", "ForgetRequest", "Ledger", "LedgerEntry", "SampleCatalog"]
