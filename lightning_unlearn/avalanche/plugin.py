"""`UnlearningPlugin`: recording and scheduled forgetting inside Avalanche's own training strategies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from avalanche.core import SupervisedPlugin
from avalanche.evaluation.metric_results import MetricValue
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from torch.utils.hooks import RemovableHandle

from lightning_unlearn.avalanche.benchmarks import items_with_ids
from lightning_unlearn.avalanche.minibatch import REPLAYED, IdsOffTheBatch, ids_in_items
from lightning_unlearn.avalanche.replay import drop_forgotten
from lightning_unlearn.avalanche.stream import (
    RequestsByExperience,
    check_unlearning,
    restore_internal,
)
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.frozen import FrozenFeatureRecorder
from lightning_unlearn.data import unpack_batch
from lightning_unlearn.reporting import result_metrics
from lightning_unlearn.unlearners.base import (
    ForgetData,
    Unlearner,
    UnlearningResult,
)


class UnlearningPlugin(SupervisedPlugin):
    """Adds recording, and forget requests between experiences, to an Avalanche training strategy (``Naive``,
    ``EWC``, ``Replay``, ``DER``, ...): ``Naive(model, optimizer, criterion, plugins=[UnlearningPlugin(...)])``.

    The experiences' datasets carry sample ids as Avalanche's data attribute ``sample_id``
    (:func:`~lightning_unlearn.avalanche.benchmark_with_sample_ids`); items and mini-batches stay ``(x, y, t)``.
    After each experience the recorder commits it and the experience's requests run, each result appended to
    :attr:`results` and published to the strategy's ``EvaluationPlugin``; forgotten samples leave the replay buffers,
    and a training batch holding one is refused. The strategy's criterion and optimizer must be the loss the
    recorder assumes (:mod:`lightning_unlearn.contract`); a head the recorder solves on a frozen backbone keeps the
    strategy's own optimizer (no step moves the head, the backbone stays in eval mode). List it before other
    plugins that read mini-batches in ``before_training_iteration``.
    Hooks, replay buffers and solved heads: docs/avalanche.md.

    Args:
        recorder: the recorder (also the ``unlearning`` unlearner's recorder).
        unlearning: the :class:`Unlearner` that executes the requests; it must forget from the model the Avalanche
            strategy trains. ``None``: record only.
        requests: forget requests per experience, keyed by ``current_experience`` (forget data: the experiences
            seen so far).
        anchor_batch_size: batch size of a recorder's anchor pass (:class:`SAFERecorder`); default 256.

    Raises:
        ValueError: If there are requests without an unlearner, the unlearner has another recorder, or a certified
            one lacks its constants (here, before any training); while training, see docs/avalanche.md.

    Example::

        >>> from torch import nn
        >>> from lightning_unlearn import ForgetRequest
        >>> from lightning_unlearn.avalanche import UnlearningPlugin
        >>> from lightning_unlearn.callbacks import SAFERecorder
        >>> from lightning_unlearn.unlearners import SAFEUnlearner
        >>> model, recorder = nn.Linear(4, 2), SAFERecorder(num_classes=2)
        >>> requests = {1: [ForgetRequest.of_class(0)]}  # after the second experience
        >>> plugin = UnlearningPlugin(recorder, SAFEUnlearner(model, recorder), requests)
        >>> plugin.results  # one UnlearningResult per executed request
        []
        >>> UnlearningPlugin(recorder, requests=requests)
        Traceback (most recent call last):
        ...
        ValueError: forget requests need an Unlearner to execute them
    """

    def __init__(
        self,
        recorder: RecorderCallback,
        unlearning: Unlearner | None = None,
        requests: RequestsByExperience | None = None,
        *,
        anchor_batch_size: int = 256,
    ) -> None:
        super().__init__()
        check_unlearning(unlearning, requests)
        if unlearning is not None and unlearning.recorder is not recorder:
            raise ValueError(
                f"the unlearner forgets with another recorder than this plugin's {type(recorder).__name__}"
            )
        self.recorder = recorder
        self.unlearning = unlearning
        self.requests = requests or {}
        self.anchor_batch_size = int(anchor_batch_size)
        self.results: list[UnlearningResult] = []
        self._seen: list[Dataset] = []
        self._per_step = callable(getattr(recorder, "before_step", None))
        self._width = 0  # columns of a training batch with its ids
        self._loader: IdsOffTheBatch | None = None
        self._batch: tuple[Tensor, Tensor, Tensor] | None = None
        self._fixed: list[nn.Module] = []  # kept in eval mode (a frozen backbone)
        self._solved: list[Tensor] = []  # written by the recorder only (a solved head's parameters)
        self._hooks: list[RemovableHandle] = []

    # -- Avalanche hooks -------------------------------------------------------------------------
    def before_training(self, strategy: Any, **kwargs: Any) -> None:
        restore_internal(self.unlearning)  # before any plugin's before_training_exp (e.g. one anchoring a regulariser)
        self._purge_replay(strategy)
        self._remove_hooks()  # those left by a train() that raised
        model = strategy.model
        self._fixed, self._solved = _solved_head(self.recorder, model)
        self._fix_modes()
        if isinstance(self.recorder, FrozenFeatureRecorder):
            self._hooks = [model.register_forward_pre_hook(self._fix_modes), model.register_forward_hook(_leaf_output)]

    def after_train_dataset_adaptation(self, strategy: Any, **kwargs: Any) -> None:
        model = strategy.model
        if self.unlearning is not None and self.unlearning.module is not model:
            raise ValueError("the Avalanche strategy trains another model than the one the unlearner forgets from")
        experience = strategy.experience.dataset
        if not len(experience):
            raise ValueError(f"experience {strategy.experience.current_experience} has no training samples")
        strategy.adapted_dataset = ids_in_items(strategy.adapted_dataset)
        self._width = len(experience[0]) + 1
        self._purge_replay(strategy)

    def before_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        model = strategy.model
        restore_internal(self.unlearning)
        if callable(getattr(model, "start_task", None)):
            model.start_task()
        if self._per_step:
            self.recorder.check_optimizer(strategy.optimizer)  # type: ignore[attr-defined]
        self.recorder.experience = strategy.experience.current_experience
        self.recorder.begin_experience(model)

    def before_training_epoch(self, strategy: Any, **kwargs: Any) -> None:
        if strategy.dataloader is not self._loader:  # a loader built for this experience (ours, Replay's, ...)
            self._loader = IdsOffTheBatch(strategy.dataloader, self._width)
            strategy.dataloader = self._loader

    def before_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if self._loader is None or self._loader.ids is None:
            raise ValueError(
                f"UnlearningPlugin: {type(strategy).__name__} did not draw its training batch from strategy.dataloader "
                "(which the plugin wraps in before_training_epoch to read the batch's sample ids); not supported"
            )
        ids = self._loader.ids.to(strategy.mb_y.device)
        new = ids != REPLAYED
        forgotten = self._forgotten(ids[new])
        if forgotten.any():
            raise ValueError(
                f"a training batch holds forgotten sample ids {ids[new][forgotten][:10].tolist()}: "
                "remove them from the data"
            )
        self._batch = strategy.mb_x, strategy.mb_y, ids

    def before_update(self, strategy: Any, **kwargs: Any) -> None:
        for p in self._solved:
            p.grad = None  # the optimizer skips it (no step, momentum or weight decay)
        if not self._per_step:
            return
        x, y, ids = self._current()
        if (ids == REPLAYED).any() or len(strategy.mb_x) != len(ids):
            raise ValueError(
                f"{type(self.recorder).__name__} follows each sample's own SGD steps: batches replaying samples of "
                "earlier experiences (Replay, DER) are not supported"
            )
        lr = float(strategy.optimizer.param_groups[0]["lr"])
        self.recorder.before_step(strategy.model, x, y, ids, lr)  # type: ignore[attr-defined]

    def after_training_iteration(self, strategy: Any, **kwargs: Any) -> None:
        if self._per_step or (strategy.clock.train_exp_epochs > 0 and not self.recorder.records_every_epoch):
            return
        x, y, ids = self._current()
        new = (ids != REPLAYED).nonzero().flatten()
        if new.numel():
            self.recorder.record(strategy.model, x[new], y[new], ids[new])

    def after_training_exp(self, strategy: Any, **kwargs: Any) -> None:
        model, experience = strategy.model, strategy.experience
        self._loader = self._batch = None
        self.recorder.end_experience(model)
        if callable(getattr(model, "end_task", None)):
            model.end_task()
        data = items_with_ids(experience.dataset)
        anchor = getattr(self.recorder, "anchor_on", None)
        if callable(anchor):
            anchor(model, self._batches(data, _device(model)), strategy.clock.train_iterations)
        self._seen.append(data)
        if self.unlearning is not None:
            self._execute(strategy, self.unlearning, experience.current_experience)
        self._purge_replay(strategy)

    def after_training(self, strategy: Any, **kwargs: Any) -> None:
        self._purge_replay(strategy)
        self._remove_hooks()
        self._fix_modes()  # after EWC's importance pass and DER's logits pass put the model in train mode

    # -- helpers ---------------------------------------------------------------------------------
    def _fix_modes(self, *hook_args: Any) -> None:
        """The modules the recorder requires unchanged in eval mode (also a forward pre-hook: ``hook_args``)."""
        for module in self._fixed:
            module.eval()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _execute(self, strategy: Any, unlearning: Unlearner, experience: int) -> None:
        """Run the experience's requests (forget data: the experiences seen so far) and publish each result."""
        data: ForgetData = ConcatDataset(self._seen) if unlearning.reads_data else None
        for request in self.requests.get(experience, ()):
            result = unlearning.forget(request, data)
            self.results.append(result)
            self._publish(strategy, result)

    def _current(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(x, y, ids)`` of the current mini-batch as the loader gave it (before a strategy changed ``mbatch``)."""
        if self._batch is None:
            raise ValueError("UnlearningPlugin: a training iteration ran without before_training_iteration")
        return self._batch

    def _forgotten(self, ids: Tensor) -> Tensor:
        """Mask of the ids the catalog marks forgotten."""
        catalog = self.recorder.catalog
        known = torch.tensor([int(i) in catalog for i in ids.tolist()], dtype=torch.bool)
        if known.any():
            known[known.clone()] = catalog.forgotten[catalog.rows(ids.cpu()[known])]
        return known.to(ids.device)

    def _batches(self, dataset: Dataset, device: torch.device) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for batch in DataLoader(dataset, batch_size=self.anchor_batch_size):
            yield tuple(t.to(device) for t in unpack_batch(batch))  # type: ignore[misc]

    def _publish(self, strategy: Any, result: UnlearningResult) -> None:
        """Hand the request's metrics to the Avalanche strategy's EvaluationPlugin, which passes them to its loggers."""
        evaluator = getattr(strategy, "evaluator", None)
        if evaluator is None or not evaluator.active:
            return
        for name, value in result_metrics(result).items():
            evaluator.publish_metric_value(MetricValue(self, name, value, strategy.clock.train_iterations))

    def _purge_replay(self, strategy: Any) -> None:
        """Remove forgotten samples from the exemplar buffers of the Avalanche strategy and its plugins."""
        if int(self.recorder.catalog.forgotten.sum()):
            drop_forgotten([strategy, *strategy.plugins], lambda ids: self._forgotten(ids).cpu())


def _solved_head(recorder: RecorderCallback, model: nn.Module) -> tuple[list[nn.Module], list[Tensor]]:
    """For a recorder that solves a head on a frozen backbone (a :class:`FrozenFeatureRecorder`): the modules whose
    parameters and buffers it requires unchanged (its ``backbone``; without one, every module outside the head), and
    the head's parameters, which only the recorder writes. Nothing for other recorders.

    Raises:
        ValueError: the model lacks the recorder's head or backbone.
    """
    if not isinstance(recorder, FrozenFeatureRecorder):
        return [], []
    head = recorder.head_of(model)
    if recorder.backbone is not None:
        fixed = [recorder.backbone_of(model)]
    else:
        fixed = [m for m in model.modules() if not any(sub is head for sub in m.modules())]
    return fixed, [p for p in (head.weight, head.bias) if p is not None]


def _leaf_output(module: nn.Module, args: Any, output: Any) -> Tensor | None:
    """Forward hook: with gradients enabled, the floating output of a model of which no parameter takes a gradient,
    detached as a leaf that takes one (the same tensor's values); other outputs unchanged (``None``)."""
    if (
        isinstance(output, Tensor)
        and output.is_floating_point()
        and torch.is_grad_enabled()
        and not output.requires_grad
        and not any(p.requires_grad for p in module.parameters())
    ):
        return output.detach().requires_grad_()
    return None


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
