"""Baseline unlearners: retraining from scratch, fine-tuning, NegGrad, NegGrad+, random labels.

These are the methods users compare against ([ACU] Section 4.1 and App. E.3). Except for
:class:`RetrainUnlearner` (the gold standard, exact by construction) they are uncertified
heuristics: their :class:`Certificate` has ``exact=False`` and no ``epsilon``.

**How they train** (the contract of :mod:`lightning_unlearn.contract`). Each request trains a
copy of the module in one short, seeded Lightning fit and then swaps the copy's parameters *and
buffers* (batch-norm statistics included) into the module. The objective is written with the
module's loss on one batch, ``L(batch)``:

* a module that trains itself (:func:`~lightning_unlearn.contract.trains_itself`: a
  ``LightningModule`` with automatic optimization and its own ``configure_optimizers``) is
  trained with its own ``training_step`` (``L`` is its training loss, label smoothing,
  regularisers and all) and its own optimizer and schedulers; ``lr``, if given, replaces the
  learning rate of every parameter group (refused when the module configures a scheduler);
* any other module (a plain ``nn.Module``, or manual optimization as in
  :class:`~lightning_unlearn.models.AnalyticClassifier`) is trained on
  ``L = mean loss_fn(module(x), y)`` (default: cross-entropy) by SGD with ``lr`` and ``momentum``.

Batches are the training data's own items (tuples or dicts); the samples to forget are read from
``data`` in its own format, relabelled with :func:`~lightning_unlearn.contract.with_target`.
A batch of a single sample is run with the module's batch-norm layers in eval mode (running
statistics): train-mode batch norm cannot normalise one sample [interp].

============ ====== ============ =========================================================
method       epochs lr (plain)   objective per step
============ ====== ============ =========================================================
finetune     10     0.1          ``L(retained batch)``
neggrad      1      0.1          ``-L(forget batch)`` (gradient ascent)
neggrad_plus 10     0.1          ``0.95 L(retained) - 0.05 L(forget)`` (Kurmanji et al.)
randomlabel  10     0.1          ``L(batch)`` over retained + forget samples with random wrong labels
============ ====== ============ =========================================================

App. E.3 names 10/5/10/10 epochs at lr 1e-2 (fine-tune) and 1e-3 (the others) for SGD. On
the analytic head those rates forget a class of the digits harness, but leave it at 57-87%
accuracy on the tests' tiny stream (with as many steps per epoch); at 0.1 both end at 0-19%
(retraining: 0%), so 0.1 is the plain-module rate [interp]. NegGrad runs one epoch [interp]: at
two or more epochs of lr 0.1, or five of a module's own SGD at 0.05, gradient ascent collapsed
the digits model to 12% retained accuracy. ``benchmarks/forgetting_defaults.py`` measures the
defaults against retraining. A module with its own optimizer keeps its own learning rate unless
``lr`` is given. The batch size defaults to 256 (App. E.1).
Strategies that need the retained data take the training data in their constructor; the retained
set is every learned, not yet forgotten sample (the recorder's catalog) minus the request.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.contract import (
    BatchKeys,
    LossFn,
    resolve_loss_fn,
    training_loss,
    trains_itself,
    unpack_batch,
    with_target,
)
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.modes import eval_mode, module_device, module_input
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning, status
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, Unlearner, UnlearningUpdate

#: the registry's assumptions of every method that trains a copy of the module
TRAINED = "a copy trained through the module's own training_step and optimizer"
#: the registry's guarantee of an uncertified method
UNCERTIFIED = "none (no bound on the distance to retraining)"

Batch = Any
#: the module's loss on one batch (with its index), ``L(batch)`` of the module docstring
BatchLoss = Callable[[Batch, int], Tensor]
_QUIET = {
    **QUIET_TRAINER,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@contextmanager
def norms_in_eval(module: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Run the block with the module's batch-norm layers that are in train mode switched to eval mode."""
    layers = [m for m in module.modules() if isinstance(m, _BATCH_NORMS) and m.training] if enabled else []
    for m in layers:
        m.eval()
    try:
        yield
    finally:
        for m in layers:
            m.train()


def rows(batch: Batch, keys: BatchKeys | None) -> int:
    """Number of samples in a batch (tuple or dict)."""
    return len(unpack_batch(batch, keys)[1])


def _set_training_step(module: L.LightningModule, step: Callable[[Batch, int], Any]) -> None:
    """Give this one instance its own ``training_step`` (its class, and so other instances, keep theirs)."""
    module.training_step = step  # type: ignore[method-assign]  # a deliberate per-instance override


class _Objective(L.LightningModule):
    """Trains a module that has no training recipe of its own on ``objective`` with SGD."""

    def __init__(self, model: nn.Module, objective: BatchLoss, lr: float, momentum: float) -> None:
        super().__init__()
        self.model = model
        self._objective, self._lr, self._momentum = objective, lr, momentum

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._objective(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=self._lr, momentum=self._momentum)


class _LearningRate(L.Callback):
    """Sets the learning rate of every parameter group of the module's own optimizers at fit start."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.lr_scheduler_configs:
            raise ValueError(
                f"lr={self.lr} would replace the learning rate of {type(pl_module).__name__}'s optimizer, but it also "
                "configures a scheduler: pass lr=None to unlearn with the module's own optimizer and schedule"
            )
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = self.lr


class EpochCounter(L.Callback):
    """Holds the 0-based epoch of the running fit (set at each epoch's start), for objectives that change per epoch."""

    def __init__(self) -> None:
        self.epoch = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epoch = trainer.current_epoch


class _Relabelled(Dataset):
    """Items of ``dataset`` (tuples or dicts) with their targets replaced by ``labels``, row by row."""

    def __init__(self, dataset: Dataset, labels: Tensor, keys: BatchKeys | None) -> None:
        self.dataset, self.labels, self.keys = dataset, labels, keys

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Any:
        return with_target(self.dataset[i], int(self.labels[i]), self.keys)


def trained_weights(work: nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers of a trained copy, by name (the update of a training-based method)."""
    return {**dict(work.named_parameters()), **dict(work.named_buffers())}


def id_rows(data: Dataset, keys: BatchKeys | None = None) -> dict[int, int]:
    """Row of every sample id in a dataset of tuples or dicts with sample ids (read from ``.ids`` if it has them)."""
    ids = getattr(data, "ids", None)
    if isinstance(ids, Tensor):
        return {int(i): r for r, i in enumerate(ids.tolist())}
    all_ids = [unpack_batch(b, keys)[2] for b in DataLoader(data, batch_size=512)]
    return {int(i): r for r, i in enumerate(torch.cat(all_ids).tolist())} if all_ids else {}


def _item_format(item: Any) -> Any:
    return tuple(sorted(item)) if isinstance(item, Mapping) else len(item)


class _Prefix(Dataset):
    """The first ``n`` elements of each tuple item of ``dataset`` (e.g. ``(x, y, id, task)`` as ``(x, y, id)``)."""

    def __init__(self, dataset: Dataset, n: int) -> None:
        self.dataset, self.n = dataset, n

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return tuple(self.dataset[i])[: self.n]


class _Trained(Unlearner):
    """Shared machinery: hyperparameters, the retained and forget sets, the objective and one seeded fit per request."""

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset | None,
        *,
        epochs: int,
        default_lr: float,
        lr: float | None = None,
        momentum: float = 0.0,
        batch_size: int = 256,
        loss_fn: LossFn | None = None,
        seed: int = 0,
        trainer_kwargs: Mapping[str, Any] | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger)
        name = type(self).__name__
        if epochs < 1 or batch_size < 1:
            raise ValueError(f"{name} needs epochs >= 1 and batch_size >= 1, got {epochs} and {batch_size}")
        if (lr is not None and not lr > 0) or momentum < 0:
            raise ValueError(f"{name} needs lr > 0 and momentum >= 0, got lr={lr}, momentum={momentum}")
        self.trains_itself = trains_itself(module)
        if self.trains_itself and (momentum or loss_fn is not None):
            raise ValueError(
                f"{type(module).__name__} trains with its own training_step and configure_optimizers: "
                "momentum and loss_fn "
                "apply only to modules without them (set them in the module)"
            )
        self.loss_fn = resolve_loss_fn(module, loss_fn)
        self.train_data = train
        #: ``None``: the module's own optimizer's learning rate
        self.lr = lr if lr is not None or self.trains_itself else default_lr
        self.epochs, self.momentum, self.batch_size, self.seed = (
            int(epochs),
            float(momentum),
            int(batch_size),
            int(seed),
        )
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self._rows = id_rows(train, recorder.batch_keys) if train is not None else {}

    # -- data ------------------------------------------------------------------------------------
    def retained(self, forget_ids: Tensor) -> Subset:
        """The learned, not yet forgotten samples outside ``forget_ids``, from the training data."""
        active = self.catalog.active_ids()
        keep = active[~torch.isin(active, forget_ids)].tolist()
        if not keep:
            raise ValueError(
                f"{self.method}: no retained samples would be left; it cannot train on an empty retained set"
            )
        missing = [i for i in keep if i not in self._rows]
        train = self.train_data
        if missing or train is None:  # without training data every retained id is missing
            raise ValueError(
                f"{self.method}: the training data lacks {len(missing)} retained sample ids, e.g. {missing[:10]}"
            )
        return Subset(train, [self._rows[i] for i in keep])

    def forget_set(self, ids: Tensor, data: ForgetData) -> tuple[Subset, Tensor]:
        """The samples to forget as items of ``data`` (its format), checked against the learned ones; their labels."""
        _, labels = self.forget_samples(ids, data)  # refuses data=None
        dataset = cast(Dataset, data.dataset if isinstance(data, DataLoader) else data)
        where = id_rows(dataset, self.recorder.batch_keys)
        return Subset(dataset, [where[i] for i in ids.tolist()]), labels

    def relabelled(self, forget: Dataset, labels: Tensor) -> Dataset:
        """The samples to forget, each with a uniformly drawn *wrong* label ``y' != y`` (seeded per request)."""
        x = unpack_batch(default_collate([forget[0]]), self.recorder.batch_keys)[0]
        with torch.no_grad(), eval_mode(self.module):
            n_classes = int(self.module(module_input(self.module, x)).shape[-1])
        if n_classes < 2:
            raise ValueError(f"{self.method} needs at least 2 classes to draw a wrong label")
        g = torch.Generator().manual_seed(self.seed + len(self.history))
        return _Relabelled(
            forget,
            (labels + torch.randint(1, n_classes, labels.shape, generator=g)) % n_classes,
            self.recorder.batch_keys,
        )

    def loader(self, dataset: Dataset, salt: int = 0) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed + len(self.history) + salt)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, generator=generator)

    # -- training --------------------------------------------------------------------------------
    def batch_loss(self, model: nn.Module) -> BatchLoss:
        """``L(batch)``: the model's own training loss or mean ``loss_fn``; batch norm in eval for one sample. A batch
        from a loader outside a ``Trainer`` (saliency, influence) is moved to the model's device first."""
        keys = self.recorder.batch_keys

        def loss(batch: Batch, batch_idx: int) -> Tensor:
            batch = move_data_to_device(batch, module_device(model))
            x, y, _ = unpack_batch(batch, keys)
            with norms_in_eval(model, len(y) == 1):
                if self.trains_itself:
                    return training_loss(cast(L.LightningModule, model), batch, batch_idx)  # trains_itself
                return self.loss_fn(model(x), y).mean()

        return loss

    def objective(self, loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
        """The unlearning objective of one step, from the module's loss ``loss(batch)``."""
        return loss(batch)

    def fit(
        self,
        work: nn.Module,
        loaders: Any,
        callbacks: Sequence[L.Callback] = (),
        objective: Callable[[Callable[[Batch], Tensor], Batch], Tensor] | None = None,
    ) -> None:
        """Train ``work`` (a copy of the module) in place: ``epochs`` epochs of ``objective`` (default
        :meth:`objective`; global RNG kept)."""
        batch_loss = self.batch_loss(work)
        objective = objective or self.objective

        def step(batch: Batch, batch_idx: int) -> Tensor:
            value = objective(lambda b: batch_loss(b, batch_idx), batch)
            if not torch.isfinite(value):
                raise ValueError(
                    f"unlearning loss became {float(value.detach())}; lower the learning rate or the number of epochs"
                )
            return value

        extra: list[L.Callback] = []
        if self.trains_itself:
            model = cast(L.LightningModule, work)  # trains_itself(module): a LightningModule with its own recipe
            _set_training_step(model, step)  # this copy trains on the objective, through its own loss and optimizer
            extra = [_LearningRate(self.lr)] if self.lr is not None else []
        else:
            model = _Objective(work, step, cast(float, self.lr), self.momentum)  # default_lr when not trains_itself
        every = [*self.trainer_kwargs.get("callbacks", []), *extra, *callbacks]
        status(f"{self.method}: request {len(self.history) + 1}: training a copy for {self.epochs} epoch(s)")
        with quiet_lightning(), torch.random.fork_rng():
            trainer = L.Trainer(**{**_QUIET, "max_epochs": self.epochs, **self.trainer_kwargs, "callbacks": every})
            torch.manual_seed(self.seed)
            trainer.fit(model, loaders)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        work = copy.deepcopy(self.module)
        extra = self._train(work, ids, data)
        return UnlearningUpdate(
            Certificate(method=self.method, exact=False),
            weights=trained_weights(work),
            extra={"n_forgotten": int(ids.numel()), "epochs": self.epochs, **extra},
        )

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        """Train ``work`` (a copy of the module) to forget ``ids``; return numbers for the result."""
        raise NotImplementedError


class FinetuneUnlearner(_Trained):
    """Fine-tune on the retained set so that catastrophic forgetting erodes the forget set ([ACU] App. E.3).

    Needs the retained data: pass the training data (yielding ``(x, y, sample_id, ...)`` or dicts)
    as ``train``. Defaults: 10 epochs; plain modules lr 0.1 (see the module docstring). Uncertified.
    """

    method = "finetune"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED,
        cost="`epochs` epochs over the retained set per request",
        paper="ACU",
    )

    def __init__(
        self, module: nn.Module, recorder: RecorderCallback, train: Dataset, *, epochs: int = 10, **kwargs: Any
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, default_lr=0.1, **kwargs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained = self.retained(ids)
        self.fit(work, self.loader(retained))
        return {"n_retained": len(retained)}


class NegGradUnlearner(_Trained):
    """Gradient ascent on the forget set: minimise ``-L`` on the samples to forget ([ACU] App. E.3).

    Needs only the samples to forget (``data`` of :meth:`forget`), never the retained data.
    Defaults: 1 epoch; plain modules lr 0.1. Uncertified; the loss is unbounded below, so more
    epochs or a large lr destroy the model (the run stops with ``ValueError`` if it diverges).
    """

    method = "neggrad"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED + "; the loss is unbounded below (a diverging run stops)",
        cost="`epochs` epochs of gradient ascent over the forget set per request",
        paper="ACU",
    )
    reads_data = True
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: RecorderCallback, *, epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(module, recorder, None, epochs=epochs, default_lr=0.1, **kwargs)

    def objective(self, loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
        return -loss(batch)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        forget, _ = self.forget_set(ids, data)
        self.fit(work, self.loader(forget))
        return {}


class NegGradPlusUnlearner(_Trained):
    """NegGrad+ ([SCRUB]): ``alpha L_retain - (1 - alpha) L_forget``.

    Each step takes one retained and one forget mini-batch (the forget loader cycles; an epoch
    is one pass over the retained set). Needs the retained data (``train``) and the samples to
    forget (``data``). Defaults: 10 epochs, ``alpha = 0.95`` (App. E.3); plain modules lr 0.1.
    Uncertified.
    """

    method = "neggrad_plus"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED,
        cost="`epochs` epochs over the retained set, a forget batch beside each retained batch",
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
        alpha: float = 0.95,
        **kwargs: Any,
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, default_lr=0.1, **kwargs)
        if not 0 <= alpha <= 1:
            raise ValueError(f"NegGrad+ weighting factor alpha must lie in [0, 1], got {alpha}")
        self.alpha = float(alpha)

    def objective(self, loss: Callable[[Batch], Tensor], batch: Batch) -> Tensor:
        return self.alpha * loss(batch["retain"]) - (1 - self.alpha) * loss(batch["forget"])

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained, (forget, _) = self.retained(ids), self.forget_set(ids, data)
        loaders = CombinedLoader(
            {"retain": self.loader(retained), "forget": self.loader(forget, salt=1)}, mode="max_size_cycle"
        )
        self.fit(work, loaders)
        return {"n_retained": len(retained), "alpha": self.alpha}


class RandomLabelUnlearner(_Trained):
    """Train on the retained set plus the forget set relabelled at random ([ACU] App. E.3).

    Every sample to forget gets a uniformly drawn *wrong* label (seeded), and the module is
    trained on retained and relabelled samples together, shuffled into the same batches: the samples
    to forget are taken as items of the training data when it holds them (one format in every batch),
    else as items of ``data``; tuples of two lengths (e.g. training items ``(x, y, id)``, forget items
    ``(x, y, id, task)``) are batched as their common prefix. Needs the retained data (``train``) and the
    samples to forget (``data``, checked against what was learned). Defaults: 10 epochs; plain modules
    lr 0.1. Uncertified.

    Raises:
        ValueError: the samples to forget are not in the training data and ``data`` yields items of another
            kind (dicts against tuples, or other keys).
    """

    method = "randomlabel"
    method_info = MethodInfo(
        guarantee=UNCERTIFIED,
        assumptions=TRAINED + "; training and forget items of one format",
        cost="`epochs` epochs over the retained set plus the relabelled forget set per request",
        paper="ACU",
    )
    reads_data = True
    needs_forget_data = True

    def __init__(
        self, module: nn.Module, recorder: RecorderCallback, train: Dataset, *, epochs: int = 10, **kwargs: Any
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, default_lr=0.1, **kwargs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        (forget, labels), retained = self.forget_set(ids, data), self.retained(ids)
        if self.train_data is not None and all(int(i) in self._rows for i in ids.tolist()):
            forget = Subset(self.train_data, [self._rows[int(i)] for i in ids.tolist()])
        formats = _item_format(retained[0]), _item_format(forget[0])
        if formats[0] != formats[1] and not all(isinstance(f, int) for f in formats):
            raise ValueError(
                f"{self.method} batches retained and forget samples together: the training data and data must yield "
                f"items of one kind, got {formats[0]} and {formats[1]}"
            )
        parts: list[Dataset] = [retained, forget]
        if formats[0] != formats[1]:  # tuples of two lengths: both as their common prefix (x, y, sample_id, ...)
            parts = [_Prefix(part, min(cast(int, f) for f in formats)) for part in parts]
        self.fit(work, self.loader(ConcatDataset([parts[0], self.relabelled(parts[1], labels)])))
        return {"n_retained": len(retained)}


class RetrainUnlearner(Unlearner):
    """The gold standard: reset the module to its initial weights and retrain on the retained data.

    Needs the retained data: pass the training data (yielding ``(x, y, sample_id, ...)``) as
    ``train``, and the module's weights before it learned anything as ``initial_state``. The
    recipe replays the continual run on what is retained: one Lightning fit per learned
    experience, in order, on its retained samples, with ``trainer_kwargs`` (epochs, devices, ...)
    and a loader shuffled by a generator seeded with ``seed + experience``, so two retrains of
    the same retained set give the same weights. ``fit_callbacks`` builds fresh callbacks for each
    retrain (shared by its experiences), e.g. ``lambda: [AnalyticRecorder(ridge)]`` to refit an
    analytic head: for ACU this is the ridge solution on the retained set (eq. 8).

    This strategy's own ``recorder`` only tracks which samples are learned and forgotten (use a
    :class:`SampleRecorder`). The module is a ``LightningModule`` retrained with its own
    ``training_step`` and optimizer; a batch of a single sample runs with batch norm in eval mode
    (see the module docstring). Exact by construction, and the slowest method by far.

    Args:
        module: the ``LightningModule`` to retrain, changed in place.
        recorder: tracks the learned and forgotten ids (a :class:`SampleRecorder`).
        train: the training data, yielding ``(x, y, sample_id, ...)`` or dicts.
        initial_state: the module's ``state_dict`` before it learned anything.
        fit_callbacks: makes the callbacks of each retrain.
        trainer_kwargs: the ``Trainer`` options of each fit (default one epoch).
        batch_size: the retraining batch size.
        seed: seeds each experience's fit and shuffling (``seed + experience``).
        ledger: see :class:`~lightning_unlearn.unlearners.base.Unlearner`.

    Raises:
        TypeError: ``module`` is not a ``LightningModule`` (it has no recipe to replay).
        ValueError: ``initial_state`` does not name the module's tensors.

    Example::

        >>> import copy
        >>> import lightning as L
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> from lightning_unlearn import (ForgetRequest, IndexedDataset, RetrainUnlearner, SampleRecorder,
        ...                                SupervisedClassifier)
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> model, recorder = SupervisedClassifier(torch.nn.Linear(4, 3)), SampleRecorder()
        >>> initial = copy.deepcopy(model.state_dict())
        >>> L.Trainer(max_epochs=1, callbacks=[recorder], logger=False, enable_checkpointing=False,
        ...           enable_progress_bar=False, enable_model_summary=False).fit(model, DataLoader(data, batch_size=8))
        >>> unlearn = RetrainUnlearner(model, recorder, data, initial, trainer_kwargs={"enable_progress_bar": False})
        >>> result = unlearn.forget(ForgetRequest.samples([3, 7]))  # one fit on the 30 retained samples
        >>> result.certificate.exact, len(recorder.catalog.active_ids())
        (True, 30)
    """

    method = "retrain"
    method_info = MethodInfo(
        guarantee="exact by construction (the gold standard)",
        assumptions="the initial weights and the retained data are kept",
        cost="the whole continual recipe replayed on the retained data, per request",
    )

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset,
        initial_state: Mapping[str, Tensor],
        *,
        fit_callbacks: Callable[[], list[L.Callback]] = list,
        trainer_kwargs: Mapping[str, Any] | None = None,
        batch_size: int = 64,
        seed: int = 0,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger)
        if not isinstance(module, L.LightningModule):
            raise TypeError(
                f"retrain replays the module's own training: it needs a LightningModule, got {type(module).__name__}"
            )
        self.module: L.LightningModule = module
        expected = set(module.state_dict())
        if set(initial_state) != expected:
            raise ValueError(
                f"initial_state keys differ from the module's: {sorted(set(initial_state) ^ expected)[:5]}"
            )
        self.train_data = train
        self.initial_state = {k: v.detach().clone() for k, v in initial_state.items()}
        self.fit_callbacks = fit_callbacks
        self.trainer_kwargs = {"max_epochs": 1, **(trainer_kwargs or {})}
        self.batch_size, self.seed = int(batch_size), int(seed)
        self._rows = id_rows(train, recorder.batch_keys)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        active = self.catalog.active_ids()
        keep = active[~torch.isin(active, ids)]
        missing = [i for i in keep.tolist() if i not in self._rows]
        if missing:
            raise ValueError(
                f"retrain: the training data lacks {len(missing)} retained sample ids, e.g. {missing[:10]}"
            )
        work = copy.deepcopy(self.module)
        work.load_state_dict(self.initial_state)
        if trains_itself(work):
            _set_training_step(work, self._one_sample_safe(work))
        callbacks = list(self.fit_callbacks())
        experiences = self.catalog.experiences_of(keep)
        status(f"retrain: request {len(self.history) + 1}: retraining from scratch on {keep.numel()} samples")
        for e in experiences.unique().tolist():
            rows = [self._rows[i] for i in keep[experiences == e].tolist()]
            for c in callbacks:
                if isinstance(c, RecorderCallback):
                    c.experience = int(e)
            loader = DataLoader(
                Subset(self.train_data, rows),
                batch_size=self.batch_size,
                shuffle=True,
                generator=torch.Generator().manual_seed(self.seed + int(e)),
            )
            with quiet_lightning(), torch.random.fork_rng():
                torch.manual_seed(self.seed + int(e))
                L.Trainer(**{**_QUIET, **self.trainer_kwargs, "callbacks": callbacks}).fit(work, loader)
        certificate = Certificate(
            method=self.method, exact=True, statement="retrained from scratch on the retained data"
        )
        return UnlearningUpdate(
            certificate,
            weights=trained_weights(work),
            extra={"n_forgotten": int(ids.numel()), "n_retained": int(keep.numel())},
        )

    def _one_sample_safe(self, work: L.LightningModule) -> Callable[[Batch, int], Any]:
        """The module's own ``training_step``, run with batch norm in eval mode on a batch of one sample."""

        def step(batch: Batch, batch_idx: int) -> Any:
            with norms_in_eval(work, rows(batch, self.recorder.batch_keys) == 1):
                return type(work).training_step(work, batch, batch_idx)

        return step
