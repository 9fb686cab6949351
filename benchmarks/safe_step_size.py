"""Benchmark: why SAFE at the paper's K = 2.5 breaks safe-table1's bundled MNIST model, measured (issue 21.3).

safe-table1's bundled MNIST recipe (mnist-5k's 4,000 training digits, ``cnn2fc`` of width 16, plain SGD at lr 0.05,
batch 32, the config's epochs), fitted once with a :class:`SAFERecorder`; then 20 rounds of 27 random digits
(the config's request set) with :class:`SAFEUnlearner` at several settings, each from a copy of the fitted
model and recorder. SAFE's step ([SAFE] Eq. (27)) has the fixed length ``gamma = sqrt(||w_0||)/(K sqrt(T))``
whatever the gradient, so ``K`` sets how far every round moves from ``w_0``; ``forget_weight=0`` steps along the
retention gradient alone. Prints, per setting, the step length and the mean over the rounds of the retained,
forgotten and test accuracy (the model at ``w_0`` first); writes ``safe_step_size.csv`` to the given directory
(default ``benchmarks/results``). One thread (small convolutions on a shared machine).

    python benchmarks/safe_step_size.py [OUT_DIR]
"""

from __future__ import annotations

import copy
import csv
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import ForgetRequest
from lightning_unlearn.callbacks import SAFERecorder
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import QUIET_TRAINER
from lightning_unlearn.unlearners import SAFEUnlearner
from lightning_unlearn_bench.datasets import MNIST5k
from lightning_unlearn_bench.papers import get_config
from lightning_unlearn_bench.repro.models import classifier

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

#: the settings compared: the paper's K = 2.5 and the rest of its MNIST grid (App. B.5), and the retention step alone
SETTINGS: tuple[dict[str, Any], ...] = (
    {"lr_constant": 2.5},
    {"lr_constant": 5.0},
    {"lr_constant": 10.0},
    {"lr_constant": 2.5, "forget_weight": 0.0},
)


def accuracies(model: torch.nn.Module, x: Tensor, y: Tensor, test: tuple[Tensor, Tensor]) -> tuple[Tensor, float]:
    """Per-sample correctness on the training digits and the test accuracy."""
    model.eval()
    with torch.no_grad():
        right = model(x).argmax(1) == y
        test_acc = (model(test[0]).argmax(1) == test[1]).double().mean().item()
    return right, test_acc


def main(out: Path) -> None:
    torch.set_num_threads(1)
    setup = next(s for s in get_config("safe-table1").setups if s.label == "MNIST")
    scale, requests, entry = setup.bundled, setup.bundled.requests[0], setup.methods[0]  # type: ignore[union-attr]
    train, test = MNIST5k(train=True), MNIST5k(train=False)
    x, y = train.tensors
    data = IndexedDataset(TensorDataset(x, y), ids=torch.arange(len(y)))
    torch.manual_seed(0)
    model = SupervisedClassifier(classifier(scale.model, 10, (1, 28, 28), scale.width), lr=scale.lr)
    recorder = SAFERecorder(num_classes=10, seed=0)
    t0 = time.process_time()
    loader = DataLoader(data, batch_size=scale.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    L.Trainer(max_epochs=scale.epochs, callbacks=[recorder], **QUIET_TRAINER).fit(model, loader)
    right, test_acc = accuracies(model, x, y, test.tensors)
    w0 = float(torch.cat([p.detach().flatten() for p in model.parameters()]).norm())
    anchor = {"w0_norm": w0, "w0_RA": right.double().mean().item(), "w0_TA": test_acc}
    print(
        f"{scale.model} width {scale.width}, {scale.epochs} epochs of SGD at lr {scale.lr:g}, batch {scale.batch_size}"
    )
    print(", ".join(f"{key} {val:.4g}" for key, val in anchor.items()), f"({time.process_time() - t0:.0f} s CPU)")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    k, per = requests.k, requests.per_request or 1
    rows = []
    for setting in SETTINGS:
        options = {**entry.options, **setting}
        module, rec = copy.deepcopy(model), SAFERecorder(num_classes=10, seed=0)
        rec.load_state_dict(recorder.state_dict())
        strategy = SAFEUnlearner(module, rec, **options)
        forgot = torch.zeros(len(y), dtype=torch.bool)
        sums, step = [0.0, 0.0, 0.0], float("nan")
        for t in range(k):
            ids = order[t * per : (t + 1) * per]
            step = float(strategy.forget(ForgetRequest.samples(ids), data).extra["step_size"])
            forgot[ids] = True
            right, test_acc = accuracies(module, x, y, test.tensors)
            accs = (right[~forgot].double().mean().item(), right[forgot].double().mean().item(), test_acc)
            sums = [s + a / k for s, a in zip(sums, accs, strict=True)]
        row = {
            "K": options["lr_constant"],
            "forget_weight": options["forget_weight"],
            "T": options["expected_rounds"],
            "step_size": step,
            "RA": sums[0],
            "FA": sums[1],
            "TA": sums[2],
        }
        rows.append(row)
        print(", ".join(f"{key} {val:.4g}" for key, val in row.items()), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "safe_step_size.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*anchor, *rows[0]])
        writer.writeheader()
        writer.writerows({**anchor, **row} for row in rows)
    print("wrote", path)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"))
