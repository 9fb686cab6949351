"""WoodFisher influence unlearning ([WoodFisher], as [Sparse]'s comparisons use it; the authors' ``wfisher``,
``unlearn/Wfisher.py``, github.com/OPTML-Group/Unlearn-Sparse), one of the baselines of ACU's Table 1.

:class:`WoodFisherUnlearner` trains nothing: one influence-function step ``w <- w + alpha F^{-1} v`` with the
WoodFisher inverse of the retained data's empirical Fisher. The math lives in
:mod:`lightning_unlearn.functional.woodfisher`.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.contract import LossFn
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.functional.rbm import mean_loss_gradient
from lightning_unlearn.functional.woodfisher import influence_direction, woodfisher_inverse_product
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.baselines import UNCERTIFIED, _Trained, rows


class WoodFisherUnlearner(_Trained):
    """WoodFisher influence unlearning ([WoodFisher], as [Sparse]'s code uses it): ``w <- w + alpha F^{-1} v``.

    One request computes, on a copy of the module in eval mode [the authors' ``model.eval()``] and
    with its own training loss ``L``:

    1. the mean loss gradients ``g_f`` on the samples to forget and ``g_r`` on the retained set, and
       ``v = (n_f / n)(g_f - g_r)`` (:func:`~lightning_unlearn.functional.woodfisher.influence_direction`);
    2. the per-sample gradients of ``n_samples`` retained samples (drawn without replacement, seeded;
       the authors take the first 1000 in loader order [interp]) and ``F^{-1} v`` for their dampened
       empirical Fisher ``F = dampening I + (1/N) sum g g^T``, by the exact Sherman-Morrison recursion
       (:func:`~lightning_unlearn.functional.woodfisher.woodfisher_inverse_product`);
    3. ``w + alpha F^{-1} v`` for every trainable parameter; buffers (batch-norm statistics) stay.

    The default ``alpha = 1`` [derived] is the Newton step on the retained loss with ``F`` for its
    Hessian (see ``influence_direction``); the authors tune ``alpha`` (their default: 0.2). On a
    cross-entropy-trained digits MLP it took a forgotten class from 88-96% to 0-9% (retraining: 0%) at
    a cost of 2-5 points of retained accuracy (``tests/test_table1_baselines.py``,
    ``benchmarks/table1_baselines.py``). A head that was not
    trained on the cross-entropy (the analytic family's ridge head) is far from the stationary point
    the step assumes: there ``alpha = 1`` destroyed the model and 0.1 matched retraining
    (``benchmarks/table1_baselines.py``). The recursion runs in the parameters' precision (float32 at
    least); memory is ``n_samples d`` such floats for ``d`` trainable parameters, time
    ``O(n_samples^2 d)``: lower ``n_samples`` for large models. Needs the
    retained data (``train``) and the samples to forget (``data``). Uncertified.

    Args:
        module: the model to unlearn, changed in place.
        recorder: the recorder that learned the stream (tracks learned and forgotten ids).
        train: the training data, for the retained set.
        alpha: the step (the authors' ``--alpha``).
        dampening: ``lambda`` of the Fisher (the authors' recursion starts from the identity: 1).
        n_samples: retained samples whose gradients build the Fisher (the authors' 1000).
        batch_size, loss_fn, seed, ledger: see :mod:`lightning_unlearn.unlearners.baselines`.

    Raises:
        ValueError: ``alpha <= 0``, ``dampening <= 0`` or ``n_samples < 1``.
    """

    method = "woodfisher"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions="one influence step w + alpha F^-1 v, F the dampened empirical Fisher of retained gradients",
        cost="gradients over the forget and retained sets and n_samples per-sample gradients, O(n_samples^2 d)",
        paper="Sparse, WoodFisher",
    )
    reads_data = True
    needs_forget_data = True

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        *,
        alpha: float = 1.0,
        dampening: float = 1.0,
        n_samples: int = 1000,
        batch_size: int = 256,
        loss_fn: LossFn | None = None,
        seed: int = 0,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(
            module,
            recorder,
            train,
            epochs=1,
            default_lr=1.0,
            batch_size=batch_size,
            loss_fn=loss_fn,
            seed=seed,
            ledger=ledger,
        )
        if not (alpha > 0 and dampening > 0) or n_samples < 1:
            raise ValueError(
                f"WoodFisher needs alpha > 0, dampening > 0 and n_samples >= 1, got alpha={alpha}, "
                f"dampening={dampening}, n_samples={n_samples}"
            )
        self.alpha, self.dampening, self.n_samples = float(alpha), float(dampening), int(n_samples)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        retained, (forget, _) = self.retained(ids), self.forget_set(ids, data)
        work = copy.deepcopy(self.module)
        params = {n: p for n, p in work.named_parameters() if p.requires_grad}
        loss, keys = self.batch_loss(work), self.recorder.batch_keys

        def mean_gradient(dataset: Dataset) -> Tensor:
            batches = enumerate(DataLoader(dataset, batch_size=self.batch_size))
            gradients = mean_loss_gradient(params, ((loss(b, i), rows(b, keys)) for i, b in batches))
            return torch.cat([g.flatten() for g in gradients.values()])

        g = torch.Generator().manual_seed(self.seed + len(self.history))
        chosen = torch.randperm(len(retained), generator=g)[: self.n_samples].tolist()
        dtype = torch.promote_types(torch.float32, next(iter(params.values())).dtype)
        with eval_mode(work):
            v = influence_direction(mean_gradient(forget), mean_gradient(retained), len(forget), len(retained))
            per_sample = torch.empty(len(chosen), v.numel(), dtype=dtype, device=v.device)
            for k, r in enumerate(chosen):
                per_sample[k] = mean_gradient(Subset(retained, [r]))
        inverse = woodfisher_inverse_product(per_sample, v.to(dtype), self.dampening, overwrite=True)
        step = self.alpha * inverse.double()
        if not torch.isfinite(step).all():
            raise ValueError(f"{self.method}: the update is not finite; raise the dampening or lower alpha")
        weights, start = {}, 0
        for name, p in params.items():
            weights[name] = (p.detach().double() + step[start : start + p.numel()].view_as(p)).to(p.dtype)
            start += p.numel()
        extra = {
            "n_forgotten": int(ids.numel()),
            "n_retained": len(retained),
            "n_fisher_samples": len(chosen),
            "alpha": self.alpha,
            "step_norm": float(step.norm()),
        }
        return UnlearningUpdate(Certificate(method=self.method, exact=False), weights=weights, extra=extra)
