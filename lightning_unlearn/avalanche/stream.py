"""`fit_stream`: learn an Avalanche stream with Lightning, one ``Trainer.fit`` per experience."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning as L
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from lightning_unlearn.avalanche.benchmarks import items_with_ids
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.progress import with_progress_bar
from lightning_unlearn.reporting import log_step, set_log_step
from lightning_unlearn.strategies.base import (
    ForgetData,
    UnlearningResult,
    UnlearningStrategy,
)

#: forget requests to execute right after experience ``k`` (its ``current_experience``), by ``k``
RequestsByExperience = Mapping[int, Sequence[ForgetRequest]]


def check_unlearning(unlearning: UnlearningStrategy | None, requests: RequestsByExperience | None) -> None:
    """Checks that need no training: requests have an unlearning strategy; it has its certificate's constants.

    Raises:
        ValueError: requests without an unlearning strategy, or a certified strategy that could not
            certify its first request (e.g. :class:`GradientCertifiedStrategy` on a
            :class:`TaskDeltaRecorder` without ``lipschitz=``/``smoothness=``).
    """
    if requests and unlearning is None:
        raise ValueError("forget requests need an UnlearningStrategy to execute them")
    require = getattr(unlearning, "require_constants", None)
    if callable(require):
        require()


def restore_internal(unlearning: UnlearningStrategy | None) -> None:
    """Before an experience: put a certified unlearning strategy's noise-free internal model back into the
    module ([CCL] Alg. 1-2 continue learning from it, not from the published noisy weights)."""
    restore = getattr(unlearning, "restore_internal", None)
    if callable(restore):
        restore()


def fit_stream(
    module: L.LightningModule,
    stream: Iterable[Any],
    *,
    callbacks: Sequence[L.Callback],
    trainer_kwargs: Mapping[str, Any] | None = None,
    batch_size: int = 64,
    unlearning: UnlearningStrategy | None = None,
    requests: RequestsByExperience | None = None,
    after_experience: Callable[[Any, L.Trainer, list[UnlearningResult]], None] | None = None,
) -> list[UnlearningResult]:
    """Learn an Avalanche ``train_stream`` with Lightning, one ``Trainer.fit`` per experience.

    The same callback objects (and loggers of ``trainer_kwargs["logger"]``) are handed to every
    experience's ``Trainer``, so recorders keep their statistics across experiences, and each
    Trainer logs from the step where the previous one stopped: one increasing step axis over
    the whole stream. Before each experience a certified unlearning strategy's internal model is
    restored (:func:`restore_internal`). After experience ``k`` the requests ``requests[k]`` are
    executed with ``unlearning`` (their forget data is the experiences seen so far); each is logged to the
    loggers at its own step (:func:`lightning_unlearn.reporting.log_to_trainer`). Then
    ``after_experience(experience, trainer, results)`` is called.

    Args:
        module: the LightningModule to train.
        stream: an Avalanche ``train_stream`` (experiences with ``current_experience`` and a
            ``dataset`` of ``(x, y, sample_id, task_label)`` items).
        callbacks: the recorder (and any other callbacks), shared by all experiences.
        trainer_kwargs: further ``Trainer`` arguments (default one epoch, no logger; progress through
            :func:`~lightning_unlearn.progress.progress_bar` unless they or ``callbacks`` decide it).
        batch_size: training batch size (shuffled loader).
        unlearning: executes the requests; its recorder must be among ``callbacks``.
        requests: forget requests per experience (by ``current_experience``).
        after_experience: called after each experience and its requests.

    Raises:
        ValueError: requests without an unlearning strategy, one whose recorder is not among the
            callbacks, a certified unlearning strategy lacking its constants (before any training), or an
            experience whose items carry no sample ids.
    """
    check_unlearning(unlearning, requests)
    if unlearning is not None and not any(c is unlearning.recorder for c in callbacks):
        raise ValueError(
            f"the unlearning strategy's {type(unlearning.recorder).__name__} is not among the callbacks: "
            "it would record nothing"
        )
    kwargs = {
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        **(trainer_kwargs or {}),
    }
    seen: list[Dataset] = []
    results: list[UnlearningResult] = []
    step = 0
    for experience in stream:
        k = experience.current_experience
        dataset = items_with_ids(experience.dataset)
        for recorder in (c for c in callbacks if isinstance(c, RecorderCallback)):
            recorder.experience = k
        restore_internal(unlearning)
        trainer = L.Trainer(callbacks=with_progress_bar(callbacks, kwargs), **kwargs)
        set_log_step(trainer, step)
        trainer.fit(module, DataLoader(dataset, batch_size=batch_size, shuffle=True))
        seen.append(dataset)
        data: ForgetData = ConcatDataset(seen) if unlearning is not None and unlearning.reads_data else None
        todo = (requests or {}).get(k, ())  # none without a strategy (check_unlearning)
        if todo:  # Lightning's teardown leaves the module on the CPU: the requests run where it was fitted
            module.to(trainer.strategy.root_device)
        done = [unlearning.forget(r, data) for r in todo] if unlearning is not None else []
        step = log_step(trainer)
        results.extend(done)
        if after_experience is not None:
            after_experience(experience, trainer, done)
    return results
