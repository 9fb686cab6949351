"""Masked fine-tuning unlearning: retention-based masking (RBM) and forget-based masking (SalUn).

[RBM] Section 5 ([SalUn] for forget-based masking). One request runs:

1. the saliency gradient ``grad_w L(w; D)`` at the current weights ``w_o`` on the retained set
   (RBM, Eq. (9)) or on the samples to forget (SalUn, Eq. (6)), and its mask at the chosen
   sparsity (the paper uses 50%);
2. a short Lightning fit of Eq. (8): the loss on the samples to forget with random wrong labels
   plus ``alpha`` times the loss on the retained set, one mini-batch of each per step;
3. after every optimizer step, the weights outside the trainable mask are put back to ``w_o``, so
   the result is exactly Eq. (10) (RBM) or Eq. (7) (SalUn).

``L`` is the module's own training loss (or ``loss_fn`` for modules without their own
``training_step``), as for every training-based method (:mod:`lightning_unlearn.unlearners.baselines`).
The math lives in :mod:`lightning_unlearn.functional.rbm`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional.rbm import (
    MASKINGS,
    Masking,
    check_saliency_level,
    masked_update,
    mean_loss_gradient,
    saliency_mask,
    trainable_mask,
)
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo
from lightning_unlearn.unlearners.baselines import TRAINED, UNCERTIFIED, Batch, _Trained, rows


class MaskProjection(L.Callback):
    """Keeps the weights outside a trainable mask at their original values ``w_o`` during a fit.

    After every training batch each masked parameter becomes ``masked_update(w_o, w, trainable)``
    (Eq. (7)/(10)). Projecting the weights, rather than zeroing gradients, keeps the frozen
    weights exact under momentum and weight decay as well.
    """

    def __init__(self, module: nn.Module, trainable: dict[str, Tensor]) -> None:
        self.module, self.trainable = module, trainable
        self.original = {n: p.detach().clone() for n, p in module.named_parameters() if n in trainable}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                if name in self.trainable:
                    p.copy_(masked_update(self.original[name], p, self.trainable[name].to(p.device)))


class RBMUnlearner(_Trained):
    """Fine-tuning restricted by a weight-saliency mask ([RBM] Eqs. (6)-(10)).

    ``masking="retain"`` is RBM: weights salient for the *retained* data (``|grad L(w; D_r)|``
    among the largest ``1 - sparsity`` fraction, Eq. (9)) stay at ``w_o``, the rest are trained
    (Eq. (10)); Theorem 4.1 shows that keeping the features shared by retained and forgotten
    data preserves the remaining loss. ``masking="forget"`` is SalUn ([SalUn]): weights salient
    for the *forget* set are trained and the rest stay (Eqs. (6)-(7)).

    Both train Eq. (8): ``L(D_f, random wrong labels) + alpha L(D_r)``, each step one forget and
    one retained mini-batch (the forget loader cycles; an epoch is one pass over the retained
    set). ``L`` is the module's own training loss and optimizer if it trains itself, else mean
    ``loss_fn`` by SGD (see :mod:`lightning_unlearn.unlearners.baselines`). Needs the retained
    data (``train``, yielding ``(x, y, sample_id, ...)`` or dicts) and the samples to forget
    (``data`` of :meth:`forget`). Defaults follow Section 5.2: 10 epochs, sparsity 50%, and for
    plain modules SGD at lr 0.02 (RBM) or 0.013 (SalUn); ``alpha = 1`` [interp] (the paper does not
    state it). Masks cover parameters only: buffers (batch-norm statistics) follow the fit.
    Configure the Lightning ``Trainer`` with ``trainer_kwargs`` (devices, precision, callbacks,
    ...). The saliency gradient is taken with the module in eval mode [interp], so dropout does
    not make the mask random. Uncertified.

    Args:
        module: the model to unlearn, changed in place.
        recorder: the recorder that learned the stream (tracks learned and forgotten ids).
        train: the training data, for the retained set.
        masking: ``"retain"`` (RBM) or ``"forget"`` (SalUn).
        sparsity: fraction of all trainable weights that is *not* salient (the paper's 50%).
        threshold: the hard threshold ``gamma`` of Eqs. (6)/(9); if given, it replaces ``sparsity``.
        alpha: weight of the retained loss in Eq. (8).
        epochs, lr: fine-tuning length and step; ``lr=None`` keeps the module's own optimizer's
            rate, or takes the paper's per-masking SGD rate for plain modules.
        kwargs: ``momentum``, ``batch_size``, ``loss_fn``, ``seed``, ``trainer_kwargs``, ``ledger``
            (see :mod:`lightning_unlearn.unlearners.baselines`).

    Raises:
        ValueError: an unknown masking, a saliency level out of range, or ``alpha < 0``.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, IndexedDataset, RBMUnlearner, SampleRecorder,
        ...                                SupervisedClassifier)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 3)), SampleRecorder()
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> unlearn = RBMUnlearner(model, recorder, data, epochs=2, trainer_kwargs={"enable_progress_bar": False})
        >>> result = unlearn.forget(ForgetRequest.samples([3, 7]), data=data)  # the forget set is read from data
        >>> result.certificate.exact, result.certificate.certified  # a heuristic: no guarantee
        (False, False)
        >>> 0 < result.extra["trainable_fraction"] < 1  # only the weights outside the retained data's saliency mask
        True
    """

    reads_data = True
    needs_forget_data = True
    LEARNING_RATES: dict[str, float] = {"retain": 0.02, "forget": 0.013}

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        *,
        masking: Masking = "retain",
        sparsity: float = 0.5,
        threshold: float | None = None,
        alpha: float = 1.0,
        epochs: int = 10,
        **kwargs: Any,
    ) -> None:
        if masking not in MASKINGS:
            raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}")
        check_saliency_level(threshold=threshold, sparsity=sparsity)
        if not alpha >= 0:
            raise ValueError(f"the retained-loss weight alpha must be >= 0, got {alpha}")
        super().__init__(module, recorder, train, epochs=epochs, default_lr=self.LEARNING_RATES[masking], **kwargs)
        self.masking, self.sparsity, self.threshold, self.alpha = masking, float(sparsity), threshold, float(alpha)

    #: the registry entry of ``rbm`` (``masking="retain"``)
    method_info = MethodInfo(
        guarantee="none ([RBM] Thm. 4.1: keeps the remaining loss at 0 in the linear model)",
        assumptions=TRAINED + "; weights salient for the retained data stay",
        cost="one saliency gradient over the retained set, then `epochs` epochs over it per request",
        paper="RBM",
        fixed={"masking": "retain"},
    )
    #: the registry entry of ``salun`` (``masking="forget"``)
    salun_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED + "; only weights salient for the forget set train",
        cost="one saliency gradient over the forget set, then `epochs` epochs over the retained set per request",
        paper="SalUn",
        fixed={"masking": "forget"},
    )

    @classmethod
    def registry_entries(cls) -> dict[str, MethodInfo]:
        """``rbm`` and ``salun``: one key for each masking."""
        return {"rbm": cls.method_info, "salun": cls.salun_info}

    @property
    def method(self) -> str:  # type: ignore[override]
        return "rbm" if self.masking == "retain" else "salun"

    def objective(self, loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
        """Eq. (8)."""
        return loss(batch["forget"]) + self.alpha * loss(batch["retain"])

    def mask(self, saliency_data: Dataset, model: nn.Module) -> dict[str, Tensor]:
        """The trainable mask ``1 - m_r`` (RBM) or ``m_f`` (SalUn) of ``model`` (a copy of the module, not attached to a
        Trainer) from the saliency gradient of its loss on ``saliency_data``."""
        loss, keys = self.batch_loss(model), self.recorder.batch_keys
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        with eval_mode(model):
            batches = enumerate(DataLoader(saliency_data, batch_size=self.batch_size))
            gradients = mean_loss_gradient(params, ((loss(b, i), rows(b, keys)) for i, b in batches))
        level = {"sparsity": self.sparsity} if self.threshold is None else {"threshold": self.threshold}
        return trainable_mask(saliency_mask(gradients, **level), self.masking)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained, (forget, labels) = self.retained(ids), self.forget_set(ids, data)
        trainable = self.mask(retained if self.masking == "retain" else forget, work)
        loaders = {"retain": self.loader(retained), "forget": self.loader(self.relabelled(forget, labels), salt=1)}
        self.fit(work, CombinedLoader(loaders, mode="max_size_cycle"), callbacks=[MaskProjection(work, trainable)])
        n_trainable = sum(int(m.sum()) for m in trainable.values())
        n_weights = sum(m.numel() for m in trainable.values())
        return {
            "n_retained": len(retained),
            "masking": self.masking,
            "sparsity": self.sparsity,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "trainable_fraction": n_trainable / n_weights,
            "lr": self.lr,
        }
