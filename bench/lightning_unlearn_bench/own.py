"""The user's own module and data in the harness: every registered method compared with retraining *your* model.

:func:`compare_with_retrain` is the harness's protocol (:func:`~lightning_unlearn_bench.evaluate`) on a
``LightningModule`` of the user's: the module (a fresh one from ``module()`` for every run, the harness seeding
the RNG first, so every run starts from the same weights) learns the stream one Lightning fit per experience
with the method's recorder, the requests are executed, and after each one the module is compared with the gold
standard: a fresh module of the same factory retrained from scratch on the retained data with the same
recipe (:func:`~lightning_unlearn_bench.families.retrain_method`, one fit per experience again). The
report holds [ACU] Table 1's gaps to it (parameter L2 distance, retain/forget/test accuracy, MIA) and the
attacks next to retraining's::

    report = compare_with_retrain(MyModule, (IndexedDataset(train), test), ["finetune", "neggrad"], requests=5)
    print(report.format())

* :class:`DatasetPair`: a training and a test dataset as a ``LightningDataModule`` (``--data`` on the CLI);
* :func:`read_data`: a datamodule (or a dataset pair) read into memory, with the training items' sample ids;
* :func:`data_info`: the harness's :class:`BenchmarkInfo` of it: a class-incremental Avalanche stream;
* :func:`module_method`: a registered method on the user's module, with retraining it as its reference;
* :func:`compare_with_retrain`: all of it.

Model families (:mod:`~lightning_unlearn_bench.families`) do not apply: the strategy runs on the user's module
with its own ``training_step`` and optimizer, and a method's closed-form constants of the library's linear heads
are not computed, so a certified method's certificate rests on estimated constants (and says so) unless its
options give them (e.g. ``smoothness``, ``grad_bound``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.samples import SampleRecorder
from lightning_unlearn.contract import BatchKeys, unpack_batch
from lightning_unlearn.core.request import ForgetRequest
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.schedule import RequestKind, Schedule, make_schedule
from lightning_unlearn_bench.families import retrain_method
from lightning_unlearn_bench.loop import evaluate
from lightning_unlearn_bench.registry import method_spec, trainer_options, with_trainer
from lightning_unlearn_bench.report import Report
from lightning_unlearn_bench.types import BenchmarkInfo, Built, Method, describe_benchmark

#: a factory of the user's module: a class or a function taking no arguments
ModuleFactory = Callable[[], L.LightningModule]
#: the user's data: a LightningDataModule, or a (training, test) pair of datasets
Data = L.LightningDataModule | tuple[Dataset, Dataset]


class DatasetPair(L.LightningDataModule):
    """A training and a test dataset as a ``LightningDataModule``.

    Training items ``(x, y)`` get their row as sample id (:class:`IndexedDataset`); items that carry more must
    carry the sample id third (``(x, y, sample_id, ...)``, e.g. an :class:`IndexedDataset` with ids of your own).

    Args:
        train: the training data, learned as the stream.
        test: held-out data for the test accuracy.
        batch_size: the loaders' batch size (reading only; the harness's fits have their own).
    """

    def __init__(self, train: Dataset, test: Dataset, batch_size: int = 256) -> None:
        super().__init__()
        first = train[0]
        pair = isinstance(first, (list, tuple)) and len(first) == 2
        self.train, self.test, self.batch_size = (IndexedDataset(train) if pair else train), test, batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test, batch_size=self.batch_size)


def read_data(data: Data) -> tuple[IndexedDataset, TensorDataset]:
    """The training set (with its sample ids, in their order) and the test set of ``data``, read into memory.

    A datamodule is used as a Trainer would: ``prepare_data()``, ``setup("fit")`` and ``train_dataloader()``,
    then ``setup("test")`` and ``test_dataloader()`` (``val_dataloader()`` if it has no test loader). Training
    batches must be ``(x, y, sample_id, ...)`` tuples or dicts with a sample id (:mod:`lightning_unlearn.contract`);
    test batches ``(x, y, ...)`` or dicts. Random augmentations are drawn once, as the data is read.

    Raises:
        ValueError: training batches without sample ids, duplicate ids, or a datamodule without a test or
            validation loader.
    """
    module = data if isinstance(data, L.LightningDataModule) else DatasetPair(*data)
    module.prepare_data()
    module.setup("fit")
    xs, ys, ids = (torch.cat(t) for t in zip(*(unpack_batch(batch) for batch in module.train_dataloader())))
    order = ids.argsort()  # a shuffling loader's order is not the data's
    train = IndexedDataset(TensorDataset(xs[order], ys[order].long()), ids=ids[order])
    module.setup("test")
    hooks = [h for h in ("test_dataloader", "val_dataloader") if is_overridden(h, module, L.LightningDataModule)]
    if not hooks:
        raise ValueError(
            f"{type(module).__name__} has neither test_dataloader nor val_dataloader: the harness needs test data"
        )
    tx, ty = zip(*(_inputs_and_targets(b) for b in getattr(module, hooks[0])()))
    return train, TensorDataset(torch.cat(tx), torch.cat(ty).long())


def _inputs_and_targets(batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, Mapping):
        keys = BatchKeys()
        return batch[keys.key(batch, "input")], torch.as_tensor(batch[keys.key(batch, "target")])
    return batch[0], torch.as_tensor(batch[1])


def data_info(
    data: Data,
    *,
    experiences: int = 1,
    seed: int = 0,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 64,
) -> BenchmarkInfo:
    """``data`` as the harness's :class:`BenchmarkInfo`: its training set learned in ``experiences`` experiences of
    whole classes (Avalanche's class-incremental benchmark, the classes' order drawn from ``seed``), its test set.

    There is no pre-trained backbone: the families of the registry see the flattened inputs as features. ``epochs``,
    ``lr`` and ``batch_size`` are the continual recipe (a module of the user's brings its own optimizer).

    Raises:
        ValueError: see :func:`read_data`.
    """
    from lightning_unlearn.avalanche import benchmark_with_sample_ids  # imports Avalanche (slow)

    train, test = read_data(data)
    benchmark = benchmark_with_sample_ids(train, test, experiences, seed=seed)
    return describe_benchmark(benchmark, seed=seed, epochs=epochs, lr=lr, batch_size=batch_size)


def module_method(name: str, module: ModuleFactory, **options: Any) -> Method:
    """The registered method ``name`` on modules made by ``module()``, and its reference: retraining such a module.

    The method learns the stream with its recorder on the module (``module_recorder`` of its
    :class:`~lightning_unlearn_bench.spec.MethodSpec`, else its ``recorder``, else a
    :class:`SampleRecorder`), one fit of ``info.epochs`` epochs per experience, through the module's own
    ``training_step`` and optimizer. Its reference replays that recipe from the same initial weights on the
    retained data; a ``module_recorder`` learns part of the module itself (ACU's head), so that replay refits with a
    fresh one of the same options, and the reference is named ``retrain[<name>]``. ``retrain`` is the plain
    reference itself.

    Raises:
        ValueError: an unknown method, an option it does not take on a user's module (listing them), or a bad
            release.
    """
    spec = method_spec(name)
    own = spec.module_recorder
    recorder_options = dict(spec.module_recorder_options if own is not None else spec.recorder_options)
    valid = spec.strategy_options() | set(recorder_options)
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(
            f"method {name!r} on your module takes no option(s) {unknown}; its options there: {sorted(valid)}"
        )
    recorder_options.update({k: options.pop(k) for k in list(options) if k in recorder_options})
    options = spec.release_options(options)
    shared = spec.recorder

    def recorder(info: BenchmarkInfo) -> RecorderCallback:
        if own is not None:
            return own(**recorder_options)
        return shared(info, **recorder_options) if shared is not None else SampleRecorder()

    def recipe(info: BenchmarkInfo) -> dict[str, Any]:
        return {"max_epochs": info.epochs}

    reference = retrain_method(
        "retrain" if own is None else f"retrain[{name}]",
        lambda info: module(),
        recipe,
        refit=list if own is None else (lambda: [own(**recorder_options)]),
        family="own",
    )
    if name == "retrain":
        return reference

    def build(info: BenchmarkInfo) -> Built:
        net, rec = module(), recorder(info)
        return Built(net, [rec], lambda: spec.make_strategy(net, rec, info, options), recipe(info))

    return Method(name, build, reference=reference, family="own")


def compare_with_retrain(
    module: ModuleFactory,
    data: Data | BenchmarkInfo,
    methods: str | Sequence[str] = "finetune",
    requests: int | Schedule | Sequence[ForgetRequest] = 5,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    kinds: Sequence[RequestKind] = ("samples",),
    samples_per_request: int | None = None,
    experiences: int = 1,
    epochs: int = 1,
    batch_size: int = 64,
    trainer_kwargs: Mapping[str, Any] | None = None,
    shadows: int = 0,
    seed: int = 0,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
) -> Report:
    """Run ``methods`` on the user's module and compare each, after every request, with retraining the module.

    Args:
        module: makes the user's ``LightningModule`` (a class or a function taking no arguments); called once per
            run after the harness seeds the RNG, so the method's module and the retrained one start equal.
        data: a ``LightningDataModule`` yielding ``(x, y, sample_id)`` training items, a ``(train, test)`` pair of
            datasets (training items ``(x, y)`` get their row as id; see :class:`DatasetPair`), or a
            :class:`BenchmarkInfo`.
        methods: registered names (``lightning-unlearn methods``).
        requests: K, the number of seeded requests drawn from what the stream teaches; or the requests
            themselves (a :class:`Schedule` or :class:`ForgetRequest`\\ s, executed after the stream).
        options: per method, its options (:func:`module_method`).
        kinds: request kinds cycled over the K drawn requests (``samples``, ``class``, ``experience``).
        samples_per_request: the size of a drawn sample request (default: a quarter of the learned samples
            over the K requests, [ACU] App. E.1).
        experiences: class-incremental experiences the training set is split into.
        epochs: epochs of each experience's fit (the recipe retraining replays).
        batch_size: batch size of those fits.
        trainer_kwargs: further ``Trainer`` arguments of every fit (``accelerator``, ``devices``, ``precision``,
            ``logger``, ...): the continual ones, retraining's, and those of methods that train a copy.
        shadows: offline [LiRA] shadow models per reference (0: no LiRA).
        seed: the class order, the requests and every run's initialisation.
        out_dir: where :meth:`Report.write` writes the CSVs and plot.
        progress: show the progress bar (``None``: when stderr is a terminal).

    Raises:
        ValueError: an unknown method or option, options for a method not in ``methods``, bad data (see
            :func:`read_data`), or requests naming samples the stream does not teach.
    """
    names = [methods] if isinstance(methods, str) else list(methods)
    given = dict(options or {})
    stray = sorted(set(given) - set(names))
    if stray:
        raise ValueError(f"options given for {stray}, which are not among the methods {names}")
    trainer = dict(trainer_kwargs or {})
    runs = [
        with_trainer(module_method(n, module, **trainer_options(method_spec(n), given.get(n, {}), trainer)), trainer)
        for n in names
    ]
    info = (
        data
        if isinstance(data, BenchmarkInfo)
        else data_info(data, experiences=experiences, seed=seed, epochs=epochs, batch_size=batch_size)
    )
    schedule = _schedule(requests, info, kinds, samples_per_request, seed)
    return evaluate(runs, info, schedule, out_dir=out_dir, progress=progress, shadows=shadows)


def _schedule(
    requests: int | Schedule | Sequence[ForgetRequest],
    info: BenchmarkInfo,
    kinds: Sequence[RequestKind],
    samples_per_request: int | None,
    seed: int,
) -> Schedule:
    if isinstance(requests, Schedule):
        return requests
    if isinstance(requests, int):
        catalog = info.catalog()
        n = samples_per_request or max(1, len(catalog) // (4 * requests))
        return make_schedule(catalog, requests, kinds=tuple(kinds), samples_per_request=n, seed=seed)
    return Schedule(tuple(requests))
