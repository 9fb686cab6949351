"""Checkpoints between the experiences of ``fit_stream``, and where a resumed stream starts again.

A checkpoint saved after experience ``k`` (its requests and tests done) is a Lightning checkpoint of
the stream's one ``Trainer`` (``Trainer.save_checkpoint``): the module's weights, every callback's
state (the recorders' statistics and catalog) and the loops' counters (epoch and step, so that a
resumed stream logs on the same step axis). It holds no optimizer or scheduler state: every
experience starts with the fresh optimizer ``configure_optimizers`` makes, so ``Trainer.fit(ckpt_path=...)``
of the next experience restores nothing of the previous one's. :class:`StreamPosition`, a callback,
keeps the experience number in the checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch


class StreamPosition(L.Callback):
    """The last experience ``fit_stream`` finished (its requests included), in each checkpoint it saves."""

    def __init__(self) -> None:
        self.experience: int | None = None
        self._between = False

    def save(self, trainer: L.Trainer, path: Path, experience: int) -> None:
        """Save the trainer's checkpoint after ``experience``, without optimizer and scheduler states."""
        self.experience, self._between = experience, True
        try:
            trainer.save_checkpoint(path, weights_only=False)  # the callbacks' states: the recorders' statistics
        finally:
            self._between = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._between:  # the next experience's fit starts with a fresh optimizer, as in an uninterrupted stream
            checkpoint["optimizer_states"], checkpoint["lr_schedulers"] = [], []

    def state_dict(self) -> dict[str, Any]:
        return {"experience": self.experience}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.experience = state_dict.get("experience")


def resume_point(path: str | Path) -> tuple[int, int, int]:
    """``(experience, epoch, global_step)`` of a checkpoint ``fit_stream`` saved between experiences.

    Raises:
        ValueError: the file is not such a checkpoint.
    """
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    state = (ckpt.get("callbacks") or {}).get(StreamPosition.__qualname__) or {}
    if state.get("experience") is None:
        raise ValueError(
            f"{path} was not saved by fit_stream between experiences (no {StreamPosition.__qualname__} state); "
            "resume a stream from one of the checkpoints its dirpath= received"
        )
    return int(state["experience"]), int(ckpt["epoch"]), int(ckpt["global_step"])
