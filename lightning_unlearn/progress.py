"""Progress of long steps: a bar on a terminal, a line per stage in a pipe, and quiet internal fits.

This module alone decides how progress is shown (:func:`output_mode`): on rank zero only, as bars when
stderr is a terminal and as one line per stage when it is a pipe or a file; the environment variable
``LIGHTNING_UNLEARN_PROGRESS`` forces bars (``1``) or nothing (``0``) everywhere, and an explicit
``enabled=`` wins over both.

* Long steps of the library (recording passes, Hessian estimation, training-based requests, the
  harness) report through :func:`progress` (a ``tqdm`` bar over an iterable) or :func:`status` (one
  line above the bars); both write to stderr, on a terminal only.
* A Lightning ``Trainer`` shows a fit's progress through :func:`progress_bar`: Lightning's own bar on a
  terminal, and in a pipe :class:`StageLines`, one line when a fit, validation or test ends (Lightning's
  bar would write a carriage-return update per batch into the file).
* Fits the library runs inside a request (a baseline training a copy, a retrain) run in
  :func:`quiet_lightning`: the info lines Lightning logs per ``Trainer`` ("GPU available: ...",
  "`Trainer.fit` stopped: ...", tips) are dropped there, and so are the warnings of
  :data:`INTERNAL_FIT_WARNINGS`, which no user can act on in a fit they did not set up; other warnings
  are kept.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from time import perf_counter
from typing import Any, Literal, TypeVar

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
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
#: Lightning warnings that a fit the library runs internally raises whatever the user does, by message and
#: category: Lightning 2.6 builds torch's deprecated ``LeafSpec`` for every loader (torch >= 2.10 warns, and
#: 2.6.6 is the newest Lightning); an internal fit never validates, while the user's module may define
#: ``validation_step`` for their own fits; it trains the module in the modes the user left it in (their own
#: fits warn about modules in eval mode); and it builds its own loaders, whose workers no user sets
INTERNAL_FIT_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"You defined a `validation_step` but have no `val_dataloader`", UserWarning),
    (r"Found \d+ module\(s\) in eval mode at the start of training", UserWarning),
    (r"The '\w+' does not have many workers", UserWarning),
)

T = TypeVar("T")


def output_mode(enabled: bool | None = None) -> Literal["bars", "lines", "off"]:
    """How to show progress: ``"off"`` off rank zero; else ``"bars"`` or ``"off"`` as ``enabled`` says if given,
    else as :data:`ENV` says if set, else ``"bars"`` when stderr is a terminal and ``"lines"`` when it is not.

    Raises:
        ValueError: :data:`ENV` holds something other than ``1/true/on/yes`` or ``0/false/off/no``.
    """
    if getattr(rank_zero_only, "rank", 0) != 0:
        return "off"
    if enabled is not None:
        return "bars" if enabled else "off"
    env = os.environ.get(ENV, "").strip().lower()
    if env and env not in _ON + _OFF:
        raise ValueError(f"{ENV} must be one of {_ON + _OFF}, got {os.environ[ENV]!r}")
    if env:
        return "bars" if env in _ON else "off"
    return "bars" if sys.stderr.isatty() else "lines"


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether to show bars (:func:`output_mode` is ``"bars"``)."""
    return output_mode(enabled) == "bars"


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


class StageLines(ProgressBar):
    """A Lightning progress bar for a pipe or a file: one line on stderr when a fit, a validation or a test ends
    (``fit: 3 epoch(s), 51 steps, train_loss=0.214 (2.1 s)``), on global rank zero, nothing per batch."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled, self._start = True, perf_counter()

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _line(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        shown = {k: v for k, v in self.get_metrics(trainer, module).items() if k != "v_num"}  # the logger's version
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
        counts = f"{trainer.current_epoch} epoch(s), {trainer.global_step} steps" if stage == "fit" else ""
        detail = ", ".join(part for part in (counts, metrics) if part)
        print(f"{stage}: {detail} ({perf_counter() - self._start:.1f} s)", file=sys.stderr, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._line(trainer, pl_module, "fit")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:
            self._start = perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:  # a validation inside a fit is part of the fit's line
            self._line(trainer, pl_module, "validate")

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = perf_counter()

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._line(trainer, pl_module, "test")


def progress_bar(enabled: bool | None = None) -> ProgressBar:
    """The progress bar callback for a ``Trainer`` (keep ``enable_progress_bar`` at its default, ``True``), chosen
    by :func:`output_mode`: Lightning's ``TQDMProgressBar`` for ``"bars"``, else :class:`StageLines` (disabled
    for ``"off"``).

    Example::

        trainer = L.Trainer(max_epochs=30, callbacks=[progress_bar()])
    """
    mode = output_mode(enabled)
    if mode == "bars":
        return TQDMProgressBar()
    lines = StageLines()
    if mode == "off":
        lines.disable()
    return lines


def with_progress_bar(callbacks: Iterable[L.Callback], trainer_kwargs: Mapping[str, Any]) -> list[L.Callback]:
    """``callbacks`` plus :func:`progress_bar`, for a ``Trainer`` the library builds from a user's settings: unless
    they hold a ``ProgressBar`` already or ``trainer_kwargs`` set ``enable_progress_bar`` (the user decided)."""
    callbacks = list(callbacks)
    if "enable_progress_bar" in trainer_kwargs or any(isinstance(c, ProgressBar) for c in callbacks):
        return callbacks
    return [*callbacks, progress_bar()]


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """For fits the library runs internally: drop Lightning's info-level log lines (the banners of every
    ``Trainer``) and the warnings of :data:`INTERNAL_FIT_WARNINGS` inside the block; keep every other warning."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        with warnings.catch_warnings():
            for message, category in INTERNAL_FIT_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
