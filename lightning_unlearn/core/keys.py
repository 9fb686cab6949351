"""Method keys that were renamed: ledgers and checkpoints written before a rename still name the old key.

A ledger entry keeps the key it was written with (its hash covers it), so whatever reads an entry's method back
(redo, rollback, replay, the privacy accountant rebuilt from a ledger, a checkpoint's accountant states) reads it
through :func:`current_key`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["RETIRED_KEYS", "current_key"]

#: every retired method key and the key that replaced it ([CCL]'s two methods took the key of their paper)
RETIRED_KEYS: Mapping[str, str] = MappingProxyType({"hessian": "ccl_hessian", "gradient": "ccl_gradient"})


def current_key(method: str) -> str:
    """The key the method ``method`` has today: a retired key's successor, any other key as it is.

    Example::

        >>> from lightning_unlearn.core.keys import current_key
        >>> current_key("hessian"), current_key("ccl_hessian"), current_key("acu")
        ('ccl_hessian', 'ccl_hessian', 'acu')
    """
    return RETIRED_KEYS.get(method, method)
