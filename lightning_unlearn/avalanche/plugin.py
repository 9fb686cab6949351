"""`UnlearningPlugin`: recording and scheduled forgetting inside Avalanche's own training strategies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metric_results import MetricValue
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from lightning_unlearn.avalanche.benchmarks import require_sample_ids
from lightning_unlearn.avalanche.stream import (
    RequestsByExperience,
    check_unlearning,
    restore_internal,
)
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.data import unpack_batch
from lightning_unlearn.reporting import result_metrics
from lightning_unlearn.strategies.base import (
    ForgetData,
    UnlearningResult,
    UnlearningStrategy,
)


class UnlearningPlugin(SupervisedPlugin):
    """Adds recording (and forget requests between experiences) to an Avalanche training strategy
    (``Naive``, ``EWC``, ``Replay``, ...)::

        strategy = Naive(model, optimizer, criterion, plugins=[UnlearningPlugin(recorder, unlearning, requests)])

    (``strategy`` here is Avalanche's training strategy, what learns the stream; ``unlearning``
    is the :class:`UnlearningStrategy` that executes the forget requests.)

    Avalanche hooks used, per experience:

    * ``before_training`` and ``before_training_exp``: a certified unlearning strategy's noise-free
      internal model is restored (``restore_internal``; in ``before_training`` too, so that plugins
      listed earlier, e.g. one anchoring a regulariser, already see it).
    * ``before_training_exp``: the experience's items must carry sample ids
      (``(x, y, sample_id, task_label)``, e.g. from :func:`class_incremental_benchmark`);
      a module with ``start_task()`` (:class:`ProximalClassifier`) anchors its regulariser;
      the recorder begins the experience (a per-step recorder also checks the optimizer).
    * ``before_update`` (``w_t``, before the optimizer step): a per-step recorder
      (:class:`TrajectoryRecorder`, anything with ``before_step``) runs its recursion.
    * ``after_training_iteration``: other recorders record the batch (first epoch only unless
      they record every epoch). Samples replayed from earlier experiences (``Replay``) are not
      recorded again; a batch holding a forgotten sample is refused.
    * ``after_training_exp``: the recorder commits the experience; ``end_task()`` of the module;
      a recorder with ``anchor_on`` (:class:`StreamingRecorder`) takes its anchor pass over the
      experience; the requests ``requests[k]`` run (forget data: the experiences seen so far),
      each result's :func:`lightning_unlearn.reporting.result_metrics` is published to the
      Avalanche strategy's ``EvaluationPlugin`` (at ``x = clock.train_iterations``; its loggers receive them
      in the same hook), and forgotten samples are removed from replay buffers.

    The Avalanche strategy's criterion and optimizer must be the loss the recorder assumes (see
    :mod:`lightning_unlearn.contract`: e.g. for :class:`ProximalClassifier` and the [CCL] recorders,
    ``lambda out, y: cross_entropy(out, y) + model.regularizer.penalty(model)``; for HF, cross-entropy and
    ``SGD(weight_decay=l2)``). With an
    :class:`AnalyticRecorder`, the closed-form head it writes replaces whatever the optimizer did
    to ``model.head``; give the Avalanche strategy an optimizer over ``model.head.parameters()`` with ``lr=0``.

    Args:
        recorder: the recorder (also the ``unlearning`` strategy's recorder).
        unlearning: executes the requests; it must forget from the model the Avalanche strategy trains.
        requests: forget requests per experience (by ``current_experience``).
        anchor_batch_size: batch size of a recorder's anchor pass.

    Raises:
        ValueError: requests without an unlearning strategy, one with another recorder, or a certified
            one lacking its constants (here, before any training).
    """

    def __init__(
        self,
        recorder: RecorderCallback,
        unlearning: UnlearningStrategy | None = None,
        requests: RequestsByExperience | None = None,
        *,
        anchor_batch_size: int = 256,
    ) -> None:
        super().__init__()
        check_unlearning(unlearning, requests)
        if unlearning is not None and unlearning.recorder is not recorder:
            raise ValueError(
                f"the unlearning strategy forgets with another recorder than this plugin's {type(recorder).__name__}"
            )
        self.recorder = recorder
        self.unlearning = unlearning
        self.requests = requests or {}
        self.anchor_batch_size = int(anchor_batch_size)
        self.results: list[UnlearningResult] = []
        self._seen: list[Dataset] = []
        self._per_step = callable(getattr(recorder, "before_step", None))

    # -- Avalanche hooks -------------------------------------------------------------------------
    def before_training(self, strategy: Any, **kwargs: Any) -> None:
        restore_internal(self.unlearning)  # before any plugin's before_training_exp (e.g. one anchoring a regulariser)

    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        model, k = strategy.model, strategy.experience.current_experience
        if self.unlearning is not None and self.unlearning.module is not model:
            raise ValueError(
                "the Avalanche strategy trains another model than the one the unlearning strategy forgets from"
            )
        require_sample_ids(strategy.experience.dataset, k)
        self._purge_replay(strategy)
        restore_internal(self.unlearning)
        if callable(getattr(model, "start_task", None)):
            model.start_task()
        if self._per_step:
            self.recorder.check_optimizer(strategy.optimizer)  # type: ignore[attr-defined]
        self.recorder.experience = k
        self.recorder.begin_experience(model)

    def before_update(self, strategy: Any, **kwargs: Any) -> None:
        if not self._per_step:
            return
        x, y, ids = self._batch(strategy)
        if self._learned_before(ids).any():
            raise ValueError(
                f"{type(self.recorder).__name__} follows each sample's own SGD steps: batches replaying samples of "
                "earlier experiences (Replay) are not supported"
            )
        lr = float(strategy.optimizer.param_groups[0]["lr"])
        self.recorder.before_step(strategy.model, x, y, ids, lr)  # type: ignore[attr-defined]

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if self._per_step or (strategy.clock.train_exp_epochs > 0 and not self.recorder.records_every_epoch):
            return
        x, y, ids = self._batch(strategy)
        new = (~self._learned_before(ids)).nonzero().flatten()
        if new.numel():
            self.recorder.record(strategy.model, x[new], y[new], ids[new])

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        model, experience = strategy.model, strategy.experience
        self.recorder.end_experience(model)
        if callable(getattr(model, "end_task", None)):
            model.end_task()
        anchor = getattr(self.recorder, "anchor_on", None)
        if callable(anchor):
            anchor(model, self._batches(experience.dataset, _device(model)), strategy.clock.train_iterations)
        self._seen.append(experience.dataset)
        if self.unlearning is not None:
            self._execute(strategy, self.unlearning, experience.current_experience)
        self._purge_replay(strategy)

    # -- helpers ---------------------------------------------------------------------------------
    def _execute(self, strategy: Any, unlearning: UnlearningStrategy, experience: int) -> None:
        """Run the experience's requests (forget data: the experiences seen so far) and publish each result."""
        data: ForgetData = ConcatDataset(self._seen) if unlearning.reads_data else None
        for request in self.requests.get(experience, ()):
            result = unlearning.forget(request, data)
            self.results.append(result)
            self._publish(strategy, result)

    def _batch(self, strategy: Any) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, ids)`` of the current mini-batch (Avalanche appends the task label); forgotten ids refused."""
        x, y, ids = unpack_batch(list(strategy.mbatch[:-1]))
        forgotten = self._forgotten(ids)
        if forgotten.any():
            raise ValueError(
                f"a training batch holds forgotten sample ids {ids[forgotten][:10].tolist()}: remove them from the data"
            )
        return x, y, ids

    def _learned_before(self, ids: Tensor) -> Tensor:
        """Mask of ids the catalog already holds from an earlier experience (replayed samples)."""
        catalog = self.recorder.catalog
        known = torch.tensor([int(i) in catalog for i in ids.tolist()], dtype=torch.bool)
        if known.any():
            known[known.clone()] = catalog.experiences_of(ids.cpu()[known]) != self.recorder.experience
        return known.to(ids.device)

    def _forgotten(self, ids: Tensor) -> Tensor:
        catalog = self.recorder.catalog
        known = torch.tensor([int(i) in catalog for i in ids.tolist()], dtype=torch.bool)
        if known.any():
            known[known.clone()] = catalog.forgotten[catalog.rows(ids.cpu()[known])]
        return known

    def _batches(self, dataset: Dataset, device: torch.device) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for batch in DataLoader(dataset, batch_size=self.anchor_batch_size):
            yield tuple(t.to(device) for t in unpack_batch(list(batch[:-1])))  # type: ignore[misc]

    def _publish(self, strategy: Any, result: UnlearningResult) -> None:
        """Hand the request's metrics to the Avalanche strategy's EvaluationPlugin, which passes them to its loggers."""
        evaluator = getattr(strategy, "evaluator", None)
        if evaluator is None or not evaluator.active:
            return
        for name, value in result_metrics(result).items():
            evaluator.publish_metric_value(MetricValue(self, name, value, strategy.clock.train_iterations))

    def _purge_replay(self, strategy: Any) -> None:
        """Remove forgotten samples from the exemplar buffers of the Avalanche strategy's replay plugins."""
        if not int(self.recorder.catalog.forgotten.sum()):
            return
        for plugin in strategy.plugins:
            policy = getattr(plugin, "storage_policy", None)
            if policy is None:
                continue
            groups = list(policy.buffer_groups.values()) if hasattr(policy, "buffer_groups") else [policy]
            for group in groups:
                drop = self._forgotten(self._ids_of(group.buffer))
                if drop.any():
                    group.buffer = group.buffer.subset((~drop).nonzero().flatten().tolist())

    def _ids_of(self, dataset: Any) -> Tensor:
        """Sample ids of an Avalanche dataset (items ``(x, y, sample_id, task)``)."""
        if not len(dataset):
            return torch.zeros(0, dtype=torch.long)
        return torch.cat(
            [unpack_batch(list(b[:-1]))[2] for b in DataLoader(dataset, batch_size=self.anchor_batch_size)]
        )


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
