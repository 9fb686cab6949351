"""`fit_stream`: learn a stream of experiences with one Lightning ``Trainer``, one ``fit`` per experience."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from lightning_unlearn.avalanche.checkpoints import StreamPosition, resume_point
from lightning_unlearn.avalanche.experiences import (
    LoaderOptions,
    SamplerFactory,
    experience_number,
    training_data,
)
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.progress import with_progress_bar
from lightning_unlearn.unlearners.base import (
    ForgetData,
    Unlearner,
    UnlearningResult,
)

#: forget requests to execute right after experience ``k`` (its ``current_experience``), by ``k``
RequestsByExperience = Mapping[int, Sequence[ForgetRequest]]


def check_unlearning(unlearning: Unlearner | None, requests: RequestsByExperience | None) -> None:
    """Checks that need no training: requests have an unlearner; it has its certificate's constants.

    Raises:
        ValueError: requests without an unlearner, or a certified strategy that could not
            certify its first request (e.g. :class:`CCLGradientUnlearner` on a
            :class:`CCLRecorder` without ``lipschitz=``/``smoothness=``).
    """
    if requests and unlearning is None:
        raise ValueError("forget requests need an Unlearner to execute them")
    require = getattr(unlearning, "require_constants", None)
    if callable(require):
        require()


def restore_internal(unlearning: Unlearner | None) -> None:
    """Before an experience: put a certified unlearner's noise-free internal model back into the
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
    num_workers: int = 0,
    sampler: SamplerFactory | None = None,
    val_stream: Sequence[Any] | None = None,
    test_stream: Iterable[Any] | None = None,
    dirpath: str | Path | None = None,
    ckpt_path: str | Path | None = None,
    unlearning: Unlearner | None = None,
    requests: RequestsByExperience | None = None,
    after_experience: Callable[[Any, L.Trainer, list[UnlearningResult]], None] | None = None,
) -> list[UnlearningResult]:
    """Learn a stream of experiences with one Lightning ``Trainer``, one ``Trainer.fit`` per experience, and run the
    forget requests between them.

    An experience is an Avalanche experience, a dataset, a ``DataLoader`` or a ``LightningDataModule`` whose training
    items carry sample ids. Each is fitted for ``trainer_kwargs``' ``max_epochs`` with a fresh optimizer; recorders
    keep their statistics, and training, test and request metrics share one step axis. After experience ``k`` the
    requests ``requests[k]`` run, then ``test_stream`` is tested and the checkpoint ``dirpath/experience=k.ckpt`` is
    saved (the steps, their order and what a checkpoint holds: ``docs/avalanche.md``, "fit_stream, step by step").

    Args:
        module: the LightningModule to train.
        stream: the experiences, e.g. an Avalanche ``train_stream``.
        callbacks: the recorder (and any other callbacks).
        trainer_kwargs: further ``Trainer`` arguments (default one epoch per experience, no logger).
        batch_size, num_workers: the loaders made for experiences given as datasets, and for evaluation.
        sampler: makes the training sampler of a dataset experience (default: shuffling).
        val_stream: validation data per experience, aligned with ``stream``; the module needs a ``validation_step``.
        test_stream: data tested after each experience; the module needs a ``test_step``.
        dirpath: folder of the checkpoints saved after each experience.
        ckpt_path: a checkpoint of ``dirpath`` to resume the stream from (later experiences only are trained).
        unlearning: executes the requests; its recorder must be among ``callbacks``.
        requests: forget requests per experience (by experience number: ``current_experience``, else position).
        after_experience: called as ``after_experience(experience, trainer, results)`` after each experience.

    Returns:
        The results of the executed requests, in order.

    Raises:
        ValueError: requests without an unlearner, one whose recorder is not among the callbacks, a certified
            unlearner lacking its constants, validation or test data for a module without
            ``validation_step``/``test_step``, ``val_stream`` beside data-module experiences, a ``ckpt_path`` not
            saved by ``fit_stream`` (all before any training), or an experience whose data carry no sample ids.

    Example::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_unlearn import AnalyticClassifier, AnalyticRecorder, ForgetRequest, IndexedDataset
        >>> from lightning_unlearn.avalanche import fit_stream
        >>> from lightning_unlearn.unlearners import ACUUnlearner
        >>> data = IndexedDataset(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))))  # items (x, y, id)
        >>> stream = [torch.utils.data.Subset(data, range(0, 20)), torch.utils.data.Subset(data, range(20, 40))]
        >>> model = AnalyticClassifier(torch.nn.Linear(4, 8), backbone_dim=8, num_classes=3)
        >>> recorder = AnalyticRecorder(ridge=1.0)
        >>> results = fit_stream(model, stream, callbacks=[recorder], unlearning=ACUUnlearner(model, recorder),
        ...                      requests={1: [ForgetRequest.samples([3, 25])]},
        ...                      trainer_kwargs={"enable_progress_bar": False})
        >>> [(r.removed_ids.tolist(), r.certificate.exact) for r in results]
        [([3, 25], True)]
    """
    check_unlearning(unlearning, requests)
    if unlearning is not None and not any(c is unlearning.recorder for c in callbacks):
        raise ValueError(
            f"the unlearner's {type(unlearning.recorder).__name__} is not among the callbacks: it would record nothing"
        )
    for evaluation, hook in ((val_stream, "validation_step"), (test_stream, "test_step")):
        if evaluation is not None and not is_overridden(hook, module):
            raise ValueError(f"validation or test data were given, but {type(module).__name__} has no {hook}")
    resume = resume_point(ckpt_path) if ckpt_path is not None else None
    kwargs = {
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        **(trainer_kwargs or {}),
    }
    epochs, steps = int(kwargs["max_epochs"]), int(kwargs.get("max_steps", -1))
    options = LoaderOptions(batch_size, num_workers, sampler)
    tests = [options.evaluate(e) for e in test_stream] if test_stream is not None else None
    position = StreamPosition()
    trainer = L.Trainer(callbacks=with_progress_bar([*callbacks, position], kwargs), **kwargs)
    recorders = [c for c in callbacks if isinstance(c, RecorderCallback)]
    seen: list[Dataset] = []
    results: list[UnlearningResult] = []
    # Lightning 2.6 builds torch's deprecated LeafSpec in every fit, and torch warns (FutureWarning): nothing a user of
    # either can change, so that one warning is dropped over the stream; one filter for the whole stream, as a filter
    # per fit would make Python show Lightning's once-per-cause warnings again on every experience
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
        )
        for i, experience in enumerate(stream):
            k = experience_number(experience, i)
            if resume is not None and k <= resume[0]:  # learned (and its requests run) before the checkpoint
                seen.append(training_data(experience, k))
                continue
            if isinstance(experience, L.LightningDataModule) and val_stream is not None:
                raise ValueError(f"experience {k} is a LightningDataModule: its own val_dataloader validates it")
            for recorder in recorders:
                recorder.experience = k
            restore_internal(unlearning)
            epoch, step = (resume[1], resume[2]) if resume is not None else (trainer.current_epoch, trainer.global_step)
            trainer.fit_loop.max_epochs = epoch + epochs  # the same Trainer: each experience gets its own epochs
            trainer.fit_loop.epoch_loop.max_steps = step + steps if steps >= 0 else -1
            val = options.evaluate(val_stream[i]) if val_stream is not None else None
            if isinstance(experience, L.LightningDataModule):
                trainer.fit(module, datamodule=experience, ckpt_path=ckpt_path if resume is not None else None)
            else:
                loader = (
                    experience if isinstance(experience, DataLoader) else options.train(training_data(experience, k))
                )
                trainer.fit(module, loader, val, ckpt_path=ckpt_path if resume is not None else None)
            resume = None
            seen.append(training_data(experience, k, trainer))
            todo = (requests or {}).get(k, ())  # none without a strategy (check_unlearning)
            if todo:  # Lightning's teardown leaves the module on the CPU: the requests run where it was fitted
                module.to(trainer.strategy.root_device)
            data: ForgetData = ConcatDataset(seen) if unlearning is not None and unlearning.reads_data else None
            done = [unlearning.forget(r, data) for r in todo] if unlearning is not None else []
            results.extend(done)
            if tests is not None:
                trainer.test(module, dataloaders=tests, verbose=False)
            if dirpath is not None:
                position.save(trainer, Path(dirpath) / f"experience={k}.ckpt", k)
            if after_experience is not None:
                after_experience(experience, trainer, done)
    return results
