"""One logging step axis across the Trainers of a continual run (each experience is its own ``Trainer.fit``)."""

from __future__ import annotations

import lightning as L


def log_step(trainer: L.Trainer) -> int:
    """The step the trainer's next logged value gets (the count of optimizer steps its fits made)."""
    # Lightning keeps this count, and logs training metrics at it, in the fit loop's epoch loop
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_log_step(trainer: L.Trainer, step: int) -> None:
    """Make ``trainer`` log from ``step`` on (a fresh Trainer starts at 0): a stream of fits continues one axis."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = int(step)


def continue_log_step(previous: L.Trainer | None, trainer: L.Trainer) -> None:
    """A new Trainer logging to the same logger objects as ``previous`` (the next experience of a
    continual run) continues its step axis instead of restarting at 0."""
    if previous is None or previous is trainer or not trainer.loggers:
        return
    if {id(lg) for lg in trainer.loggers} & {id(lg) for lg in previous.loggers}:
        set_log_step(trainer, max(log_step(trainer), log_step(previous)))
