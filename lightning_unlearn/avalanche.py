"""Avalanche integration: benchmarks with sample ids, a Lightning loop over a stream, and a plugin.

Importing this module imports Avalanche (slow: ~5-15 s); the rest of the package does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning as L
from avalanche.benchmarks import nc_benchmark
from avalanche.core import SupervisedPlugin
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import IndexedDataset, unpack_batch
from lightning_unlearn.strategies.base import UnlearningResult, UnlearningStrategy

Schedule = Mapping[int, Sequence[ForgetRequest]]


def class_incremental_benchmark(
    x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, n_experiences: int, seed: int = 0, fixed_class_order: Sequence[int] | None = None
) -> Any:
    """An Avalanche class-incremental benchmark (``nc_benchmark``) from in-memory tensors.

    Training items are ``(x, y, sample_id, task)`` with ``sample_id`` the row of ``x_train``;
    test items ``(x, y, row, task)``. No download.
    """
    train = IndexedDataset(TensorDataset(x_train, y_train))
    test = IndexedDataset(TensorDataset(x_test, y_test))
    return nc_benchmark(
        train, test, n_experiences=n_experiences, task_labels=False, seed=seed, fixed_class_order=fixed_class_order
    )


def _recorders(callbacks: Iterable[L.Callback]) -> list[RecorderCallback]:
    return [c for c in callbacks if isinstance(c, RecorderCallback)]


def fit_stream(
    module: L.LightningModule,
    stream: Iterable[Any],
    *,
    callbacks: Sequence[L.Callback],
    trainer_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 64,
    strategy: UnlearningStrategy | None = None,
    schedule: Schedule | None = None,
    after_experience: Callable[[Any, L.Trainer, list[UnlearningResult]], None] | None = None,
) -> list[UnlearningResult]:
    """Learn an Avalanche ``train_stream`` with Lightning, one ``Trainer.fit`` per experience.

    The same callback objects are handed to every experience's ``Trainer``, so recorders keep
    their statistics across experiences. After experience ``k`` the requests ``schedule[k]``
    are executed with ``strategy`` (their forget data is the experiences seen so far), then
    ``after_experience(experience, trainer, results)`` is called.
    """
    if schedule and strategy is None:
        raise ValueError("a forget schedule needs an UnlearningStrategy to execute it")
    kwargs = {"max_epochs": 1, "logger": False, "enable_checkpointing": False, "enable_model_summary": False, **(trainer_kwargs or {})}
    seen: list[Dataset] = []
    results: list[UnlearningResult] = []
    for experience in stream:
        k = experience.current_experience
        for recorder in _recorders(callbacks):
            recorder.experience = k
        trainer = L.Trainer(callbacks=list(callbacks), **kwargs)
        trainer.fit(module, DataLoader(experience.dataset, batch_size=batch_size, shuffle=True))
        seen.append(experience.dataset)
        done = [strategy.forget(r, ConcatDataset(seen) if strategy.reads_data else None) for r in (schedule or {}).get(k, ())]  # type: ignore[union-attr]
        results.extend(done)
        if after_experience is not None:
            after_experience(experience, trainer, done)
    return results


class UnlearningPlugin(SupervisedPlugin):
    """Adds recording (and scheduled forgetting) to an existing Avalanche strategy in one line::

        strategy = Naive(model, optimizer, criterion, plugins=[UnlearningPlugin(recorder)])

    The recorder sees every training mini-batch (items must carry sample ids, e.g. built with
    :func:`class_incremental_benchmark`) and commits at the end of each experience. With an
    :class:`AnalyticRecorder`, the closed-form head it writes replaces whatever the optimizer did
    to ``model.head``; give the strategy an optimizer over ``model.head.parameters()`` only.
    With ``unlearning`` and ``schedule``, the requests of experience ``k`` run right after it.
    """

    def __init__(self, recorder: RecorderCallback, unlearning: UnlearningStrategy | None = None, schedule: Schedule | None = None) -> None:
        super().__init__()
        if schedule and unlearning is None:
            raise ValueError("a forget schedule needs an UnlearningStrategy to execute it")
        self.recorder = recorder
        self.unlearning = unlearning
        self.schedule = schedule or {}
        self.results: list[UnlearningResult] = []
        self._seen: list[Dataset] = []

    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.recorder.experience = strategy.experience.current_experience
        self.recorder.begin_experience(strategy.model)

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if strategy.clock.train_exp_epochs > 0 and not self.recorder.records_every_epoch:
            return
        x, y, ids = unpack_batch(strategy.mbatch, self.recorder.batch_keys)
        self.recorder.record(strategy.model, x, y, ids)

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        self.recorder.end_experience(strategy.model)
        self._seen.append(strategy.experience.dataset)
        for request in self.schedule.get(strategy.experience.current_experience, ()):
            self.results.append(self.unlearning.forget(request, ConcatDataset(self._seen) if self.unlearning.reads_data else None))  # type: ignore[union-attr]
