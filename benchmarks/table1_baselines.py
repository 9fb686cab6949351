"""SCRUB, l1-sparse and WoodFisher (the baselines of [ACU]'s Table 1 from [SCRUB] and [Sparse]) against retraining.

Two settings on scikit-learn's digits, one class request each:

* ``user``: a user's BatchNorm MLP (``SupervisedClassifier``, its own SGD at lr 0.1) trained jointly on the
  898 samples of the harness's train split for 6 epochs, as ``tests/test_table1_baselines.py``; the
  methods train through its own ``training_step`` and optimizer; retraining replays the recipe;
* a harness family (``analytic``: [ACU]'s protocol, or ``supervised``) on the digits stream of the harness
  (``digits_benchmark``: 5 class-incremental experiences, frozen MLP backbone).

Printed per method: accuracy on the forgotten samples, on the retained samples and on the test samples of the
retained classes after the request, next to the original model (before it) and retraining from scratch, and
the request's wall time. Every method runs with its defaults unless ``--options`` says otherwise.

    python benchmarks/table1_baselines.py [--families user,analytic] [--forget-class 3]
        [--methods scrub,l1_sparse,woodfisher,finetune] [--options '{"woodfisher": {"alpha": 0.1}}']
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from lightning_unlearn import ForgetRequest
from lightning_unlearn.avalanche import fit_stream
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.metrics import accuracy
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners import (
    FinetuneUnlearner,
    L1SparseUnlearner,
    RetrainUnlearner,
    SCRUBUnlearner,
    WoodFisherUnlearner,
)
from lightning_unlearn_bench import digits_benchmark, format_table, get_method
from lightning_unlearn_bench.types import BenchmarkInfo

METHODS = ("scrub", "l1_sparse", "woodfisher", "finetune")


def accuracies(module: Any, info: BenchmarkInfo, forget_class: int) -> tuple[float, float, float]:
    """Accuracy on the forgotten class's training samples, on the other training samples and on the test
    samples of the other classes."""
    forget = (info.labels == forget_class).nonzero().flatten().tolist()
    retain = (info.labels != forget_class).nonzero().flatten().tolist()
    test_labels = torch.tensor([int(info.test[i][1]) for i in range(len(info.test))])
    test = (test_labels != forget_class).nonzero().flatten().tolist()
    n = info.num_classes
    return (
        accuracy(module, Subset(info.train, forget), n),
        accuracy(module, Subset(info.train, retain), n),
        accuracy(module, Subset(info.test, test), n),
    )


def run(name: str, family: str, info: BenchmarkInfo, forget_class: int, options: dict[str, Any]) -> dict[str, Any]:
    """Learn the stream with method ``name``'s model, execute the class request; accuracies before and after."""
    if family == "user":
        return run_user(name, info, forget_class, options)
    method = get_method(name, family=family, **options)
    with torch.random.fork_rng():
        torch.manual_seed(info.seed)
        built = method.build(info)
        fit_stream(
            built.module,
            info.benchmark.train_stream,
            callbacks=built.callbacks,
            trainer_kwargs={"enable_progress_bar": False, **built.trainer_kwargs},
            batch_size=built.batch_size or info.batch_size,
        )
        before = accuracies(built.module, info, forget_class)
        strategy = built.strategy()
        start = time.perf_counter()
        strategy.forget(ForgetRequest.of_class(forget_class), info.train if strategy.reads_data else None)
        seconds = time.perf_counter() - start
    return {"before": before, "after": accuracies(built.module, info, forget_class), "seconds": seconds}


def run_user(name: str, info: BenchmarkInfo, forget_class: int, options: dict[str, Any]) -> dict[str, Any]:
    """The ``user`` setting: a BatchNorm MLP trained jointly by its own SGD; the method ``name`` by its class."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    model, rec = SupervisedClassifier(net, lr=0.1), SampleRecorder()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    L.Trainer(max_epochs=6, callbacks=[rec], **QUIET_TRAINER).fit(
        model, DataLoader(info.train, batch_size=64, shuffle=True)
    )
    before = accuracies(model, info, forget_class)
    trained = {"scrub": SCRUBUnlearner, "l1_sparse": L1SparseUnlearner, "finetune": FinetuneUnlearner}
    strategy: Any
    if name == "retrain":
        strategy = RetrainUnlearner(model, rec, info.train, initial, trainer_kwargs={"max_epochs": 6}, batch_size=64)
    elif name == "woodfisher":
        strategy = WoodFisherUnlearner(model, rec, info.train, **options)
    elif name in trained:
        strategy = trained[name](model, rec, info.train, **{"batch_size": 64, **options})
    else:
        raise ValueError(f"the user setting runs {sorted(trained)}, woodfisher and retrain, not {name!r}")
    start = time.perf_counter()
    strategy.forget(ForgetRequest.of_class(forget_class), info.train if strategy.reads_data else None)
    seconds = time.perf_counter() - start
    return {"before": before, "after": accuracies(model, info, forget_class), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="user,analytic")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--forget-class", type=int, default=3)
    parser.add_argument("--options", default="{}", help='JSON: per-method options, e.g. \'{"scrub": {"lr": 0.1}}\'')
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    options = json.loads(args.options)
    info = digits_benchmark()
    body = []
    for family in args.families.split(","):
        start = time.perf_counter()
        ref = run("retrain", family, info, args.forget_class, {})
        body.append(["original", family, *(f"{100 * a:.1f}" for a in ref["before"]), "-"])
        body.append(["retrain", family, *(f"{100 * a:.1f}" for a in ref["after"]), f"{ref['seconds']:.2f}"])
        for name in args.methods.split(","):
            row = run(name, family, info, args.forget_class, options.get(name, {}))
            body.append([name, family, *(f"{100 * a:.1f}" for a in row["after"]), f"{row['seconds']:.2f}"])
        print(f"[{family}: {time.perf_counter() - start:.0f} s]", flush=True)
    head = ["method", "family", "forget acc %", "retain acc %", "test acc % (retained classes)", "s / request"]
    print(format_table(head, body, title=f"digits stream, forget class {args.forget_class}, defaults unless --options"))


if __name__ == "__main__":
    main()
