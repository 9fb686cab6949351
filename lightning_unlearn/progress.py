"""Progress of long steps: a bar or a one-line status on stderr, and no Lightning banners from internal fits.

Long steps (recording passes, Hessian estimation, training-based requests, the harness) report
through :func:`progress` (a ``tqdm`` bar over an iterable) or :func:`status` (one line). Both write
to stderr, on rank zero only, and only when enabled: by default when stderr is a terminal; the
environment variable ``LIGHTNING_UNLEARN_PROGRESS`` turns them on (``1``) or off (``0``) everywhere,
and an explicit ``enabled=`` wins over both.

Fits the library runs inside a request (a baseline training a copy, a retrain) run in
:func:`quiet_lightning`: the info lines Lightning logs per ``Trainer`` ("GPU available: ...",
"`Trainer.fit` stopped: ...", tips) are dropped there; its warnings are not.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from lightning.fabric.utilities.rank_zero import rank_zero_only
from tqdm.auto import tqdm

#: Trainer options of the library's internal fits: no logger, checkpoints, model summary or Lightning progress bar
QUIET_TRAINER: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "enable_progress_bar": False,
}

#: environment variable that turns progress output on (``1``) or off (``0``)
ENV = "LIGHTNING_UNLEARN_PROGRESS"
#: the loggers Lightning's per-Trainer info lines go through
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")

T = TypeVar("T")


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether to show progress: never off rank zero; else ``enabled`` if given, else :data:`ENV`, else a TTY.

    Raises:
        ValueError: :data:`ENV` holds something other than ``1/true/on/yes`` or ``0/false/off/no``.
    """
    if getattr(rank_zero_only, "rank", 0) != 0:
        return False
    if enabled is not None:
        return enabled
    env = os.environ.get(ENV, "").strip().lower()
    if env and env not in _ON + _OFF:
        raise ValueError(f"{ENV} must be one of {_ON + _OFF}, got {os.environ[ENV]!r}")
    return env in _ON if env else sys.stderr.isatty()


def progress(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool | None = None,
) -> Any:
    """A ``tqdm`` bar on stderr over ``iterable`` (or updated by hand), cleared when done; inert when disabled."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=not progress_enabled(enabled),
    )


def status(message: str, enabled: bool | None = None) -> None:
    """Write ``message`` as one line on stderr (above any open bar), when progress is enabled."""
    if progress_enabled(enabled):
        tqdm.write(message, file=sys.stderr)


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Drop Lightning's info-level log lines (the banners of every ``Trainer``) inside the block; keep warnings."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
