"""`SampleRecorder`: records only which samples were learned (the sample catalog)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_unlearn.callbacks.base import RecorderCallback


class SampleRecorder(RecorderCallback):
    """A recorder that keeps the catalog of learned sample ids, labels and experiences, nothing else.

    The baselines (retraining, fine-tuning, NegGrad, NegGrad+, random labels) record no
    method-specific statistics, but a forget request is still resolved against what the model
    actually learned (:meth:`SampleCatalog.resolve`): a request for a class never learned, or for
    ids already forgotten, fails before anything changes. Add it to the Trainer's callbacks.
    Under DDP only ids, labels and fingerprints are gathered.
    """

    gathers_inputs = False

    def _record(self, module: torch.nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        return None  # the base class stages ids and labels; there is nothing else to record

    def _commit(self, module: torch.nn.Module) -> None:
        return None
