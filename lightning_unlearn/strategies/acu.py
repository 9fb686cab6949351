"""`ACUStrategy`: exact continual unlearning of an analytic head (ACU, Tang et al.)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.analytic import AnalyticRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.data import select_by_ids
from lightning_unlearn.functional import acu
from lightning_unlearn.strategies.base import ForgetData, UnlearningStrategy


class ACUStrategy(UnlearningStrategy):
    """Exact forgetting by the recursive Woodbury update of eq. (5) and eq. (6).

    Needs only the samples to forget (their features and labels), never the retained data.
    Sample-, class- and experience-level requests are all a forget set of sample ids.
    Theorem 1: the result equals the ridge solution recomputed on the retained set.
    """

    method = "acu"
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: AnalyticRecorder, ledger: Ledger | None = None) -> None:
        super().__init__(module, recorder, ledger)
        self.recorder: AnalyticRecorder = recorder

    def _forget(self, ids: Tensor, data: ForgetData) -> tuple[Certificate, dict[str, Any]]:
        rec = self.recorder
        x, y = select_by_ids(data, ids)
        labels = self._labels_checked(ids, y)
        F = rec.features(self.module, x).cpu()
        Y = acu.one_hot(labels, rec.Q.shape[1], rec.dtype)
        T, W = acu.forget(rec.T, rec.W, F, Y)  # eq. (5), eq. (6)
        # commit (nothing above touched the recorder)
        rec.R, rec.Q = rec.R - F.T @ F, rec.Q - F.T @ Y
        rec.T, rec.W = T, W
        rec.write_head(self.module)
        certificate = Certificate(
            method=self.method,
            exact=True,
            statement="ACU Theorem 1: W_i equals the ridge solution (eq. 8) on the retained set",
        )
        return certificate, {"n_forgotten": int(ids.numel())}
