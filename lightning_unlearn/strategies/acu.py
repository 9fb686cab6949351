"""`ACUStrategy`: exact continual unlearning of an analytic head (ACU, Tang et al.)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.analytic import AnalyticRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import acu
from lightning_unlearn.strategies.base import ForgetData, UnlearningStrategy, UnlearningUpdate


class ACUStrategy(UnlearningStrategy):
    """Exact forgetting by the recursive Woodbury update of eq. (5) and eq. (6).

    Needs only the samples to forget (their features and labels), never the retained data.
    Sample-, class- and experience-level requests are all a forget set of sample ids.
    Theorem 1: the result equals the ridge solution recomputed on the retained set.
    """

    method = "acu"
    reads_data = True
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: AnalyticRecorder, ledger: Ledger | None = None) -> None:
        super().__init__(module, recorder, ledger)
        self.recorder: AnalyticRecorder = recorder

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        x, labels = self.forget_samples(ids, data)
        F = rec.features(self.module, x).cpu()
        Y = acu.one_hot(labels, rec.Q.shape[1], rec.dtype)
        T, W = acu.forget(rec.T, rec.W, F, Y)  # eq. (5), eq. (6)
        head = rec.head_name(self.module)
        certificate = Certificate(
            method=self.method,
            exact=True,
            statement="ACU Theorem 1: W_i equals the ridge solution (eq. 8) on the retained set",
        )
        return UnlearningUpdate(
            certificate,
            weights={head: W.T},
            statistics={"R": rec.R - F.T @ F, "Q": rec.Q - F.T @ Y, "T": T, "W": W},
            extra={"n_forgotten": int(ids.numel())},
        )
