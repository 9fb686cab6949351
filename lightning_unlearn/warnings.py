"""The library's own warning category, shown on rank 0 only and once per cause.

Python shows a warning once per text and place, but forgets what it showed whenever any code changes the
warning filters (Lightning and ``contract`` do, around every fit), and a text that carries the numbers of
one request or one task (an exceeded capacity, a task's stationarity) differs every time: both made the
same warning repeat on every experience or request. :func:`warn` keeps its own registry instead: a
warning is shown the first time its cause arises in the process (the cause is the text itself unless the
caller names one). Filters still decide: a warning ignored by a filter is not shown, and an ``always`` or
``error`` filter (``-W error::lightning_unlearn.warnings.UnlearningWarning``, ``pytest.warns``) sees every
occurrence.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable

from lightning.pytorch.utilities.rank_zero import rank_zero_warn


class UnlearningWarning(UserWarning):
    """An assumption of a method visibly fails, or a result is weaker than asked (e.g. a certificate
    built on estimated constants). Filter with ``-W error::lightning_unlearn.warnings.UnlearningWarning``."""


#: the causes warned about so far in this process (:func:`warn`)
_warned: set[Hashable] = set()


def _every_occurrence(message: str) -> bool:
    """Whether the first filter that applies to an :class:`UnlearningWarning` with this text, wherever it is
    raised, asks for every occurrence (``always``, ``error``). Filters naming a module or line are skipped:
    they cannot be matched before the warning is raised, and the warning still passes through them."""
    for action, text, category, module, lineno in warnings.filters:
        if module is None and not lineno and issubclass(UnlearningWarning, category):
            if text is None or text.match(message):
                return action in ("always", "error")
    return getattr(warnings, "defaultaction", "default") in ("always", "error")


def warn(message: str, stacklevel: int = 5, *, cause: Hashable | None = None) -> None:
    """Warn on rank 0 only (``rank_zero_warn``: N ranks print one line), as :class:`UnlearningWarning`.

    Args:
        message: the text; say what fails and what the user can do about it.
        stacklevel: as :func:`warnings.warn`'s, counted through Lightning's rank-zero wrappers: 5 (the default)
            names the line that calls this function, 6 its caller.
        cause: what the user can fix, when ``message`` carries numbers that change from one occurrence to the
            next (e.g. ``("hf deletion capacity", capacity)``); default: ``message``. The warning is shown once
            per process for its cause unless a filter asks for every occurrence; a message with a named
            cause says that later occurrences are not repeated and where to read them.
    """
    key = message if cause is None else cause
    if key in _warned and not _every_occurrence(message):
        return
    _warned.add(key)
    rank_zero_warn(message, category=UnlearningWarning, stacklevel=stacklevel)
