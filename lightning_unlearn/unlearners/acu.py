"""`ACUUnlearner`: exact continual unlearning of an analytic head [ACU]."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_unlearn.callbacks.acu import AnalyticRecorder, require_statistic
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional import acu
from lightning_unlearn.unlearners.base import (
    ForgetData,
    MethodInfo,
    Unlearner,
    UnlearningUpdate,
)


class ACUUnlearner(Unlearner):
    """Exact forgetting by the recursive Woodbury update of eq. (5) and eq. (6), or a re-solve for large requests.

    Needs only the samples to forget (their features and labels), never the retained data.
    Sample-, class- and experience-level requests are all a forget set of sample ids.
    Theorem 1: the result equals the ridge solution recomputed on the retained set.

    A request of ``k`` samples costs ``O(k d_F^2)`` through eq. (5)/(6) (the tracking matrix is
    updated in place at commit, see :meth:`AnalyticRecorder.apply_forget`); once ``k`` is a sizeable
    fraction of ``d_F`` re-solving eq. (8) from ``R - F^T F`` is cheaper and is used instead
    (:func:`~lightning_unlearn.functional.acu.woodbury_is_cheaper`). Both are exact.

    Args:
        module, recorder, ledger: see :class:`~lightning_unlearn.unlearners.base.Unlearner`.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ACUUnlearner, AnalyticClassifier, AnalyticRecorder, ForgetRequest,
        ...                                IndexedDataset)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = AnalyticClassifier(torch.nn.Linear(4, 8), 8, num_classes=3), AnalyticRecorder(ridge=1.0)
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> unlearn = ACUUnlearner(model, recorder)  # an in-memory Ledger(); Ledger("ledger.jsonl") keeps a file
        >>> result = unlearn.forget(ForgetRequest.samples([3, 7]), data=data)  # reads only samples 3 and 7
        >>> result.certificate.exact, result.removed_ids.tolist()  # W: the ridge solution on the 30 retained
        (True, [3, 7])
    """

    method = "acu"
    method_info = MethodInfo(
        guarantee="exact: the head equals ridge retraining on the retained set ([ACU] Thm. 1)",
        assumptions="a frozen backbone; the head is the ridge solution, which the recorder solves in closed form",
        cost="O(k d_F^2) per request of k samples by eq. (5)/(6), or an O(d_F^3) re-solve; recording O(n d_F^2)",
        paper="ACU",
    )
    reads_data = True
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: AnalyticRecorder, ledger: Ledger | None = None) -> None:
        super().__init__(module, recorder, ledger)
        self.recorder: AnalyticRecorder = recorder

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        rec = self.recorder
        head = rec.head_weights(self.module, require_statistic(rec.W, "W"))
        params = dict(self.module.named_parameters())
        changed = [k for k, v in head.items() if not torch.equal(params[k].detach(), v.to(params[k]))]
        if changed:
            raise ValueError(
                f"the module's head {changed} differs from the recorder's W: the module was changed after "
                "learning, or its weights and the recorder's statistics come from different runs"
            )
        x, labels = self.forget_samples(ids, data)
        F = rec.features(self.module, x)
        W0 = require_statistic(rec.W, "W")
        d_F, d_C = W0.shape
        Y = acu.one_hot(labels.to(F.device), d_C, rec.dtype)
        if acu.woodbury_is_cheaper(d_F, d_C, len(F)):
            FT, S, W = acu.forget_factors(require_statistic(rec.T, "T"), W0, F, Y)  # eq. (5), eq. (6)
            # R and Q lose F^T F and F^T Y when next read (neither is needed to forget)
            statistics = {"tracking_update": (FT, S), "forgotten_rows": F, "forgotten_targets": Y, "W": W}
            path = "woodbury"
        else:
            R0, Q0 = require_statistic(rec.R, "R"), require_statistic(rec.Q, "Q")
            R, Q, T, W = acu.resolve(R0, Q0, F, Y, rec.ridge)  # eq. (8)
            statistics = {"R": R, "Q": Q, "T": T, "W": W}
            path = "resolve"
        certificate = Certificate(
            method=self.method,
            exact=True,
            statement="ACU Theorem 1: W_i equals the ridge solution (eq. 8) on the retained set",
        )
        return UnlearningUpdate(
            certificate,
            weights=rec.head_weights(self.module, W),
            statistics=statistics,
            extra={"n_forgotten": int(ids.numel()), "path": path},
        )
