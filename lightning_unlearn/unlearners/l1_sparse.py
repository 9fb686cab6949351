"""l1-sparse fine-tuning ([Sparse]; the authors' ``FT_prune``, ``unlearn/FT.py`` ``FT_l1``,
github.com/OPTML-Group/Unlearn-Sparse), one of the baselines of ACU's Table 1.

:class:`L1SparseUnlearner` fine-tunes a copy of the module on the retained data with an L1 penalty whose
coefficient decays linearly over the epochs, through the module's own loss and optimizer like every training-based
method (:mod:`lightning_unlearn.unlearners.baselines`). The math lives in :mod:`lightning_unlearn.functional.l1_sparse`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.utils.data import Dataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.functional.l1_sparse import l1_coefficient, l1_norm
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo
from lightning_unlearn.unlearners.baselines import TRAINED, UNCERTIFIED, Batch, EpochCounter, _Trained


class L1SparseUnlearner(_Trained):
    """l1-sparse unlearning ([Sparse]): fine-tune on the retained set, minimising ``L(batch) + gamma_e ||w||_1``.

    ``gamma_e = gamma (1 - e / (epochs - no_l1_epochs))`` in epoch ``e`` (0-based) and 0 in the last
    ``no_l1_epochs`` epochs (:func:`~lightning_unlearn.functional.l1_sparse.l1_coefficient`, the authors'
    schedule); ``||w||_1`` sums over every trainable parameter, as their ``l1_regularization``. Needs
    the retained data (``train``); never reads the samples to forget. Defaults: 10 epochs and
    ``gamma = 5e-4`` [interp], ``no_l1_epochs = 0`` (the authors' README runs 10 epochs at lr 0.01 with
    momentum 0.9 and leaves ``gamma`` to the user; scripts running their code use 1e-4; the penalty's
    gradient ``gamma sign(w)`` does not depend on the data size); plain modules SGD at lr 0.1 like
    :class:`~lightning_unlearn.unlearners.baselines.FinetuneUnlearner`. Uncertified.

    Args:
        module: the model to unlearn, changed in place.
        recorder: the recorder that learned the stream (tracks learned and forgotten ids).
        train: the training data, for the retained set.
        epochs: fine-tuning epochs (the authors' ``unlearn_epochs``).
        gamma: the initial L1 coefficient (the authors' ``--alpha``).
        no_l1_epochs: final epochs without the penalty.
        kwargs: ``lr``, ``momentum``, ``batch_size``, ``loss_fn``, ``seed``, ``trainer_kwargs``, ``ledger``
            (see :mod:`lightning_unlearn.unlearners.baselines`).

    Raises:
        ValueError: ``gamma < 0`` or ``no_l1_epochs`` outside ``[0, epochs]``.
    """

    method = "l1_sparse"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED,
        cost="`epochs` epochs over the retained set with a decaying L1 penalty per request",
        paper="Sparse",
    )

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        *,
        epochs: int = 10,
        gamma: float = 5e-4,
        no_l1_epochs: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, default_lr=0.1, **kwargs)
        l1_coefficient(gamma, 0, self.epochs, no_l1_epochs)  # checks gamma and no_l1_epochs
        self.gamma, self.no_l1_epochs = float(gamma), int(no_l1_epochs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained = self.retained(ids)
        counter = EpochCounter()
        params = [p for p in work.parameters() if p.requires_grad]

        def objective(loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
            coefficient = l1_coefficient(self.gamma, counter.epoch, self.epochs, self.no_l1_epochs)
            return loss(batch) + coefficient * l1_norm(params) if coefficient else loss(batch)

        self.fit(work, self.loader(retained), callbacks=[counter], objective=objective)
        return {"n_retained": len(retained), "gamma": self.gamma}
