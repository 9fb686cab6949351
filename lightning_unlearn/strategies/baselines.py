"""Baseline unlearning strategies: retraining from scratch, fine-tuning, NegGrad, NegGrad+, random labels.

These are the methods users compare against (ACU paper, Section 4.1 and App. E.3). Except for
:class:`RetrainStrategy` (the gold standard, exact by construction) they are uncertified
heuristics: their :class:`Certificate` has ``exact=False`` and no ``epsilon``. Each trains with
a short Lightning ``Trainer.fit`` on an objective built around the module (the module's own
``training_step`` is not used), with plain SGD. Defaults are the App. E.3 settings:

============ ======= ====== ==========================================================
method       epochs  lr     data and loss
============ ======= ====== ==========================================================
finetune     10      1e-2   retained set, cross-entropy
neggrad      5       1e-3   forget set, minus cross-entropy (gradient ascent)
neggrad_plus 10      1e-3   both: ``0.95 CE_retain - 0.05 CE_forget`` (Kurmanji et al.)
randomlabel  10      1e-3   retained set + forget set with random wrong labels, CE
============ ======= ====== ==========================================================

E.3 names only epochs and learning rate; momentum defaults to 0 and the batch size to 256
(the batch size of App. E.1). Strategies that need the retained data take the training data in
their constructor and say so; the retained set is every learned, not yet forgotten sample
(the recorder's catalog) minus the request.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.data import unpack_batch
from lightning_unlearn.strategies.base import ForgetData, UnlearningStrategy, UnlearningUpdate

Batch = Any
LossFn = Callable[[nn.Module, Batch], Tensor]
_QUIET = {"logger": False, "enable_checkpointing": False, "enable_model_summary": False, "enable_progress_bar": False}


class _XY(Dataset):
    """Items ``(x, y)`` of a dataset yielding ``(x, y, id, ...)`` (so datasets of any arity concatenate)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        item = self.dataset[i]
        return item[0], item[1]


class _Objective(L.LightningModule):
    """Trains ``model`` in place on ``loss(model, batch)`` with SGD; used by every trained baseline."""

    def __init__(self, model: nn.Module, loss: LossFn, lr: float, momentum: float) -> None:
        super().__init__()
        self.model = model
        self._loss, self._lr, self._momentum = loss, lr, momentum

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = self._loss(self.model, batch)
        if not torch.isfinite(loss):
            raise ValueError(f"unlearning loss became {float(loss)}; lower the learning rate or the number of epochs")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=self._lr, momentum=self._momentum)


def _ce(model: nn.Module, xy: Batch) -> Tensor:
    return nn.functional.cross_entropy(model(xy[0]).float(), torch.as_tensor(xy[1]).long())


def trained_weights(work: nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers of a trained copy, by name (the update of a training-based method)."""
    return {**dict(work.named_parameters()), **dict(work.named_buffers())}


def id_rows(data: Dataset) -> dict[int, int]:
    """Row of every sample id in a dataset yielding ``(x, y, id, ...)`` (read from ``.ids`` if it has them)."""
    ids = getattr(data, "ids", None)
    if isinstance(ids, Tensor):
        return {int(i): r for r, i in enumerate(ids.tolist())}
    all_ids = [unpack_batch(b)[2] for b in DataLoader(data, batch_size=512)]
    return {int(i): r for r, i in enumerate(torch.cat(all_ids).tolist())} if all_ids else {}


class _Trained(UnlearningStrategy):
    """Shared machinery: hyperparameters, the retained set, and one seeded Lightning fit per request."""

    def __init__(
        self,
        module: nn.Module,
        recorder: RecorderCallback,
        train: Dataset | None,
        *,
        epochs: int,
        lr: float,
        momentum: float = 0.0,
        batch_size: int = 256,
        seed: int = 0,
        trainer_kwargs: Mapping[str, Any] | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger)
        if epochs < 1 or batch_size < 1:
            raise ValueError(f"{type(self).__name__} needs epochs >= 1 and batch_size >= 1, got {epochs} and {batch_size}")
        if not lr > 0 or momentum < 0:
            raise ValueError(f"{type(self).__name__} needs lr > 0 and momentum >= 0, got lr={lr}, momentum={momentum}")
        self.train_data = train
        self.epochs, self.lr, self.momentum, self.batch_size, self.seed = int(epochs), float(lr), float(momentum), int(batch_size), int(seed)
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self._rows = id_rows(train) if train is not None else {}

    def retained(self, forget_ids: Tensor) -> Dataset:
        """The learned, not yet forgotten samples outside ``forget_ids``, from the training data."""
        active = self.catalog.active_ids()
        keep = active[~torch.isin(active, forget_ids)].tolist()
        if not keep:
            raise ValueError(f"{self.method}: no retained samples would be left; it cannot train on an empty retained set")
        missing = [i for i in keep if i not in self._rows]
        if missing:
            raise ValueError(f"{self.method}: the training data lacks {len(missing)} retained sample ids, e.g. {missing[:10]}")
        return Subset(self.train_data, [self._rows[i] for i in keep])  # type: ignore[arg-type]

    def forget_set(self, ids: Tensor, data: ForgetData) -> TensorDataset:
        """``(x, y)`` of the samples to forget, checked against what was learned."""
        return TensorDataset(*self.forget_samples(ids, data))

    def relabelled(self, forget: TensorDataset) -> TensorDataset:
        """The samples to forget, each with a uniformly drawn *wrong* label ``y' != y`` (seeded per request)."""
        x, y = forget.tensors
        with torch.no_grad():
            n_classes = int(self.module(x[:1]).shape[-1])
        if n_classes < 2:
            raise ValueError(f"{self.method} needs at least 2 classes to draw a wrong label")
        g = torch.Generator().manual_seed(self.seed + len(self.history))
        return TensorDataset(x, (y + torch.randint(1, n_classes, y.shape, generator=g)) % n_classes)

    def loader(self, dataset: Dataset, salt: int = 0) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed + len(self.history) + salt)
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=True, generator=generator)

    def fit(self, model: nn.Module, loss: LossFn, loaders: Any, callbacks: Sequence[L.Callback] = ()) -> None:
        """Train ``model`` in place for ``epochs`` epochs on ``loss`` (global RNG state left untouched)."""
        extra = [*self.trainer_kwargs.get("callbacks", []), *callbacks]
        trainer = L.Trainer(**{**_QUIET, "max_epochs": self.epochs, **self.trainer_kwargs, "callbacks": extra})
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            trainer.fit(_Objective(model, loss, self.lr, self.momentum), loaders)

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


class FinetuneStrategy(_Trained):
    """Fine-tune on the retained set so that catastrophic forgetting erodes the forget set (App. E.3, [17]).

    Needs the retained data: pass the training data (yielding ``(x, y, sample_id, ...)``) as
    ``train``. Defaults: 10 epochs, lr 1e-2 (App. E.3). Uncertified.
    """

    method = "finetune"

    def __init__(self, module: nn.Module, recorder: RecorderCallback, train: Dataset, *, epochs: int = 10, lr: float = 1e-2, **kwargs: Any) -> None:
        super().__init__(module, recorder, train, epochs=epochs, lr=lr, **kwargs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained = self.retained(ids)
        self.fit(work, _ce, self.loader(_XY(retained)))
        return {"n_retained": len(retained)}


class NegGradStrategy(_Trained):
    """Gradient ascent on the forget set: minimise ``-CE`` on the samples to forget (App. E.3, [23]).

    Needs only the samples to forget (``data`` of :meth:`forget`), never the retained data.
    Defaults: 5 epochs, lr 1e-3 (App. E.3). Uncertified; the loss is unbounded below, so many
    epochs or a large lr destroy the model (the run stops with ``ValueError`` if it diverges).
    """

    method = "neggrad"
    reads_data = True
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: RecorderCallback, *, epochs: int = 5, lr: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(module, recorder, None, epochs=epochs, lr=lr, **kwargs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        self.fit(work, lambda model, xy: -_ce(model, xy), self.loader(self.forget_set(ids, data)))
        return {}


class NegGradPlusStrategy(_Trained):
    """NegGrad+ (Kurmanji et al., SCRUB paper): ``alpha CE_retain - (1 - alpha) CE_forget``.

    Each step takes one retained and one forget mini-batch (the forget loader cycles; an epoch
    is one pass over the retained set). Needs the retained data (``train``) and the samples to
    forget (``data``). Defaults: 10 epochs, lr 1e-3, ``alpha = 0.95`` (App. E.3). Uncertified.
    """

    method = "neggrad_plus"
    reads_data = True
    needs_forget_data = True

    def __init__(
        self, module: nn.Module, recorder: RecorderCallback, train: Dataset, *, epochs: int = 10, lr: float = 1e-3, alpha: float = 0.95, **kwargs: Any
    ) -> None:
        super().__init__(module, recorder, train, epochs=epochs, lr=lr, **kwargs)
        if not 0 <= alpha <= 1:
            raise ValueError(f"NegGrad+ weighting factor alpha must lie in [0, 1], got {alpha}")
        self.alpha = float(alpha)

    def _loss(self, model: nn.Module, batch: dict[str, Batch]) -> Tensor:
        return self.alpha * _ce(model, batch["retain"]) - (1 - self.alpha) * _ce(model, batch["forget"])

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        retained, forget = self.retained(ids), self.forget_set(ids, data)
        loaders = CombinedLoader({"retain": self.loader(_XY(retained)), "forget": self.loader(forget, salt=1)}, mode="max_size_cycle")
        self.fit(work, self._loss, loaders)
        return {"n_retained": len(retained), "alpha": self.alpha}


class RandomLabelStrategy(_Trained):
    """Train on the retained set plus the forget set relabelled at random (App. E.3, [56]).

    Every sample to forget gets a uniformly drawn *wrong* label (seeded), and the module is
    trained with cross-entropy on retained and relabelled samples together. Needs the retained
    data (``train``) and the samples to forget (``data``). Defaults: 10 epochs, lr 1e-3
    (App. E.3). Uncertified.
    """

    method = "randomlabel"
    reads_data = True
    needs_forget_data = True

    def __init__(self, module: nn.Module, recorder: RecorderCallback, train: Dataset, *, epochs: int = 10, lr: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(module, recorder, train, epochs=epochs, lr=lr, **kwargs)

    def _train(self, work: nn.Module, ids: Tensor, data: ForgetData) -> dict[str, Any]:
        forget, retained = self.forget_set(ids, data), self.retained(ids)
        self.fit(work, _ce, self.loader(ConcatDataset([_XY(retained), self.relabelled(forget)])))
        return {"n_retained": len(retained)}


class RetrainStrategy(UnlearningStrategy):
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
    :class:`SampleRecorder`). Exact by construction, and the slowest method by far.
    """

    method = "retrain"

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
        expected = set(module.state_dict())
        if set(initial_state) != expected:
            raise ValueError(f"initial_state keys differ from the module's: {sorted(set(initial_state) ^ expected)[:5]}")
        self.train_data = train
        self.initial_state = {k: v.detach().clone() for k, v in initial_state.items()}
        self.fit_callbacks = fit_callbacks
        self.trainer_kwargs = {"max_epochs": 1, **(trainer_kwargs or {})}
        self.batch_size, self.seed = int(batch_size), int(seed)
        self._rows = id_rows(train)

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        active = self.catalog.active_ids()
        keep = active[~torch.isin(active, ids)]
        missing = [i for i in keep.tolist() if i not in self._rows]
        if missing:
            raise ValueError(f"retrain: the training data lacks {len(missing)} retained sample ids, e.g. {missing[:10]}")
        work = copy.deepcopy(self.module)
        work.load_state_dict(self.initial_state)
        callbacks = list(self.fit_callbacks())
        experiences = self.catalog.experiences_of(keep)
        for e in experiences.unique().tolist():
            rows = [self._rows[i] for i in keep[experiences == e].tolist()]
            for c in callbacks:
                if isinstance(c, RecorderCallback):
                    c.experience = int(e)
            loader = DataLoader(
                Subset(self.train_data, rows), batch_size=self.batch_size, shuffle=True, generator=torch.Generator().manual_seed(self.seed + int(e))
            )
            with torch.random.fork_rng():
                torch.manual_seed(self.seed + int(e))
                L.Trainer(**{**_QUIET, **self.trainer_kwargs, "callbacks": callbacks}).fit(work, loader)
        certificate = Certificate(method=self.method, exact=True, statement="retrained from scratch on the retained data")
        return UnlearningUpdate(certificate, weights=trained_weights(work), extra={"n_forgotten": int(ids.numel()), "n_retained": int(keep.numel())})
