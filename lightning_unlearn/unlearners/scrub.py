"""SCRUB: a student distilled from the original model, away from it on the forget set and towards it on the rest.

[SCRUB], following the authors' code (github.com/meghdadk/SCRUB:
``thirdparty/repdistiller/helper/loops.py`` ``train_distill`` and the notebooks' ``args``). The
student is a copy of the module (the original weights ``w^o``); the teacher is a frozen copy in
eval mode. Each epoch ``e`` of a request is

1. for the first ``msteps`` epochs only, one pass over the forget set of *max-steps*, minimising
   ``-d(x_f; w^o, w^u)`` (:func:`~lightning_unlearn.functional.scrub.distill_kl`);
2. one pass over the retained set of *min-steps*, minimising ``gamma L(batch) + alpha d(x_r; w^o, w^u)``,

with one optimizer (the module's own, or SGD for plain modules: see
:mod:`lightning_unlearn.unlearners.baselines`), as the authors do. ``L`` is the module's own training
loss. The math lives in :mod:`lightning_unlearn.functional.scrub`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.contract import BatchKeys, unpack_batch
from lightning_unlearn.functional.scrub import distill_kl, rewind_index
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo
from lightning_unlearn.unlearners.baselines import (
    TRAINED,
    UNCERTIFIED,
    Batch,
    EpochCounter,
    _Trained,
    norms_in_eval,
    trained_weights,
)


class _Alternating:
    """The batches of one SCRUB epoch: ``{"forget": b}`` for every forget batch while the epoch is below ``msteps``,
    then ``{"retain": b}`` for every retained batch (the epoch is read when the epoch's iteration starts)."""

    def __init__(self, forget: DataLoader, retain: DataLoader, msteps: int, counter: EpochCounter) -> None:
        self.forget, self.retain, self.msteps, self.counter = forget, retain, msteps, counter

    def __iter__(self) -> Iterator[dict[str, Batch]]:
        if self.counter.epoch < self.msteps:
            yield from ({"forget": b} for b in self.forget)
        yield from ({"retain": b} for b in self.retain)


def _inputs_targets(batch: Batch, keys: BatchKeys | None) -> tuple[Tensor, Tensor]:
    """``(x, y)`` of a tuple batch ``(x, y, ...)`` or a dict batch (sample ids not needed)."""
    if isinstance(batch, Mapping):
        k = keys or BatchKeys()
        return batch[k.key(batch, "input")], batch[k.key(batch, "target")]
    return batch[0], batch[1]


@torch.no_grad()
def _error(model: nn.Module, data: Dataset, keys: BatchKeys | None, batch_size: int) -> float:
    """Top-1 error of ``model`` in eval mode on ``data``."""
    wrong = total = 0
    device = next(model.parameters()).device
    with eval_mode(model):
        for batch in DataLoader(data, batch_size=batch_size):
            x, y = _inputs_targets(batch, keys)
            wrong += int((model(x.to(device)).argmax(-1).cpu() != torch.as_tensor(y).cpu()).sum())
            total += len(y)
    return wrong / total


class _Checkpoints(L.Callback):
    """SCRUB+R: after every epoch, the student's parameters and buffers and its error on the forget set."""

    def __init__(self, work: nn.Module, forget_error: Callable[[], float]) -> None:
        self.work, self.forget_error = work, forget_error
        self.states: list[dict[str, Tensor]] = []
        self.errors: list[float] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.states.append({k: v.detach().clone() for k, v in trained_weights(self.work).items()})
        self.errors.append(self.forget_error())


class SCRUBUnlearner(_Trained):
    """SCRUB ([SCRUB]): alternate max-steps on the forget set and min-steps on the retained set (see the module
    docstring); optionally SCRUB+R's rewinding.

    Needs the retained data (``train``, yielding ``(x, y, sample_id, ...)`` or dicts) and the samples
    to forget (``data`` of :meth:`forget`). The module's ``forward`` must return the logits (the KL
    terms read them); a min-step runs the student forward twice (its own ``training_step`` for
    ``L``, then the logits), so batch-norm statistics move twice per step [interp]. Defaults are the
    authors' small-scale CIFAR-10 settings (``small_scale_unlearning.ipynb``): 10 epochs, ``alpha=0.5``,
    ``gamma=1``, ``temperature=2``, except ``msteps`` [interp]: the authors stop the max-steps after 3
    of 10 epochs with Adam at lr 5e-4, whose normalised steps leave the teacher at once although the
    KL's gradient vanishes there; with a module's own SGD the min-only epochs then brought a
    forgotten digits class back to 63-85% (retraining: 0%), so by default every epoch has its
    max-pass (0%, retained accuracy within 2 points: ``tests/test_table1_baselines.py``). Plain
    modules train by SGD at lr 0.01 [interp] (on the digits harness's analytic head 0.01 forgets a
    class keeping 97% retained accuracy, 0.05 keeps 90%: ``benchmarks/table1_baselines.py``); a module
    with its own optimizer keeps its own rate and schedule. Uncertified.

    Args:
        module: the model to unlearn, changed in place.
        recorder: the recorder that learned the stream (tracks learned and forgotten ids).
        train: the training data, for the retained set.
        epochs: SCRUB epochs (the authors' ``sgda_epochs``).
        msteps: the first ``msteps`` epochs include a max-pass over the forget set (``None``: all).
        alpha: weight of the KL term on the retained set.
        gamma: weight of the task loss on the retained set.
        temperature: the distillation temperature ``T`` (the authors' ``kd_T``).
        rewind_data: held-out samples (no sample ids needed; tuples ``(x, y, ...)`` or dicts) for
            SCRUB+R: those of the forgotten samples' classes give the reference error (the final
            student's), and the request returns the epoch checkpoint whose forget-set error is
            closest to it. ``None`` (default): the final student, as plain SCRUB.
        kwargs: ``lr``, ``momentum``, ``batch_size``, ``loss_fn``, ``seed``, ``trainer_kwargs``, ``ledger``
            (see :mod:`lightning_unlearn.unlearners.baselines`).

    Raises:
        ValueError: ``msteps`` outside ``[0, epochs]``, ``alpha`` or ``gamma`` negative, ``temperature <= 0``.

    Example::

        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, IndexedDataset, SampleRecorder, SCRUBUnlearner,
        ...                                SupervisedClassifier)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 3)), SampleRecorder()
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> unlearn = SCRUBUnlearner(model, recorder, data, epochs=2, trainer_kwargs={"enable_progress_bar": False})
        >>> result = unlearn.forget(ForgetRequest.samples([3, 7]), data=data)  # the teacher: the model before
        >>> result.certificate.certified, result.extra["n_retained"]  # a heuristic distilled on the 30 retained
        (False, 30)
    """

    method = "scrub"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED + "; SCRUB+R rewinds with held-out rewind_data",
        assumptions=TRAINED + "; forward returns the logits",
        cost="`epochs` epochs per request: a max-pass over the forget set, a min-pass over the retained set",
        paper="SCRUB",
    )
    reads_data = True
    needs_forget_data = True

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        *,
        epochs: int = 10,
        msteps: int | None = None,
        alpha: float = 0.5,
        gamma: float = 1.0,
        temperature: float = 2.0,
        rewind_data: Dataset | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, default_lr=0.01, **kwargs)
        msteps = epochs if msteps is None else msteps
        if not 0 <= msteps <= epochs:
            raise ValueError(f"SCRUB's max-step epochs msteps must lie in [0, epochs={epochs}], got {msteps}")
        if not (alpha >= 0 and gamma >= 0):
            raise ValueError(f"SCRUB's weights alpha and gamma must be >= 0, got alpha={alpha}, gamma={gamma}")
        if not temperature > 0:
            raise ValueError(f"the distillation temperature must be > 0, got {temperature}")
        self.msteps, self.alpha, self.gamma, self.temperature = (
            int(msteps),
            float(alpha),
            float(gamma),
            float(temperature),
        )
        self.rewind_data = rewind_data

    def scrub_objective(
        self, student: nn.Module, teacher: nn.Module
    ) -> Callable[[Callable[[Batch], Tensor], Batch], Tensor]:
        """The loss of one step: ``-d`` on a forget batch (max-step), ``gamma L + alpha d`` on a retained batch."""
        keys = self.recorder.batch_keys

        def kl(batch: Batch) -> Tensor:
            x = unpack_batch(batch, keys)[0]
            with norms_in_eval(student, len(x) == 1):
                logits = student(x)
            with torch.no_grad():
                target = teacher.to(x.device)(x)  # the frozen copy follows the student onto the fit's device
            return distill_kl(logits, target, self.temperature)

        def objective(loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
            if "forget" in batch:
                return -kl(batch["forget"])
            return self.gamma * loss(batch["retain"]) + self.alpha * kl(batch["retain"])

        return objective

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained, (forget, labels) = self.retained(ids), self.forget_set(ids, data)
        teacher = copy.deepcopy(self.module).eval().requires_grad_(False)
        counter = EpochCounter()
        loaders = _Alternating(self.loader(forget, salt=1), self.loader(retained), self.msteps, counter)
        callbacks: list[L.Callback] = [counter]
        keys = self.recorder.batch_keys
        checkpoints, held_out = None, None
        if self.rewind_data is not None:
            held_out = self.held_out_like(labels, self.rewind_data)
            checkpoints = _Checkpoints(work, lambda: _error(work, forget, keys, self.batch_size))
            callbacks.append(checkpoints)
        self.fit(work, loaders, callbacks=callbacks, objective=self.scrub_objective(work, teacher))
        extra: dict[str, Any] = {"n_retained": len(retained), "msteps": self.msteps, "alpha": self.alpha}
        if checkpoints is not None and held_out is not None:
            extra.update(self._rewind(work, checkpoints, held_out))
        return extra

    def held_out_like(self, labels: Tensor, rewind_data: Dataset) -> Dataset:
        """The samples of ``rewind_data`` of the classes in ``labels`` (SCRUB+R's forget-validation set).

        Raises:
            ValueError: there are none.
        """
        classes, keys = labels.unique(), self.recorder.batch_keys
        rows = [
            i
            for i, batch in enumerate(DataLoader(rewind_data, batch_size=1))
            if bool(torch.isin(torch.as_tensor(_inputs_targets(batch, keys)[1]).cpu(), classes).any())
        ]
        if not rows:
            raise ValueError(
                f"{self.method}: rewind_data holds no sample of the forgotten classes {classes.tolist()}; "
                "rewinding needs held-out samples like the forgotten ones"
            )
        return Subset(rewind_data, rows)

    def _rewind(self, work: nn.Module, checkpoints: _Checkpoints, held_out: Dataset) -> dict[str, Any]:
        """Load the checkpoint SCRUB+R selects into ``work``; numbers for the result."""
        reference = _error(work, held_out, self.recorder.batch_keys, self.batch_size)
        chosen = rewind_index(checkpoints.errors, reference)
        targets = trained_weights(work)
        with torch.no_grad():
            for k, v in checkpoints.states[chosen].items():
                targets[k].data = v
        return {"rewound_to_epoch": chosen + 1, "rewind_reference_error": reference}
