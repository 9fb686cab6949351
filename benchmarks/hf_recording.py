"""Benchmark: HF recording cost per tracked sample per SGD step against one Hessian-vector product.

Part 1, a user's torchvision ``resnet18`` (11.2M parameters, BatchNorm in training mode, 32x32 inputs,
batch 64, CPU): step-level timings, interleaved and repeated (medians), of one plain training step,
ONE Hessian-vector product of the step's batch loss computed from scratch (forward + differentiable
backward + one double backward; and the forward-over-reverse ``jvp(grad)`` product for reference),
and :meth:`TrajectoryRecorder.before_step` with K tracked vectors (of which one sample is in the batch);
then ``(recorder step) / K`` in units of one HVP. As K grows the step's forward and differentiable
backward are shared and the cost per vector tends to one batched double backward.

Part 2, a small CNN:

[HF]'s recursion (Eq. (10)) applies ``(I - eta H_t)`` to every tracked vector at every SGD step, so
its cost per step is about one Hessian-vector product per tracked sample (plus per-sample
gradients of the tracked samples in the batch, and a power-iteration HVP for M). This prints,
for a CNN without BatchNorm (HF needs deterministic per-sample losses) on synthetic 16x16 images:

* plain fit time and TrajectoryRecorder fit time for K tracked samples, and their ratio;
* the recorder's time per step split into its parts, next to the time of one batched
  ``vmap`` HVP call over the K vectors and of one plain training step (forward + backward);
* the cost per tracked sample per step in units of one HVP (1.0 = nothing but the HVPs).

    python benchmarks/hf_recording.py [--repeats 3] [--skip-cnn]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings
from collections.abc import Callable
from time import perf_counter

import lightning as L
import torch
import torchvision
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.progress import QUIET_TRAINER

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
N, SIDE, CLASSES, BATCH, EPOCHS = 1024, 16, 10, 64, 1


class UserCNN(L.LightningModule):
    """Conv(1->8) -> ReLU -> Conv(8->16, stride 2) -> ReLU -> Linear: a user's module, own loss and optimizer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * (SIDE // 2) ** 2, CLASSES),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=1e-3)


def data() -> IndexedDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    x = torch.randn(N, 1, SIDE, SIDE, generator=g) + y[:, None, None, None] * 0.1
    return IndexedDataset(TensorDataset(x, y))


def fit(callbacks: list) -> tuple[float, UserCNN]:
    model = UserCNN()
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        callbacks=callbacks,
        **QUIET_TRAINER,
    )
    loader = DataLoader(data(), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(1))
    start = perf_counter()
    trainer.fit(model, loader)
    return perf_counter() - start, model


def timed(fn, repeat: int = 5) -> float:
    fn()
    start = perf_counter()
    for _ in range(repeat):
        fn()
    return (perf_counter() - start) / repeat


def resnet_steps(repeats: int) -> None:
    """Part 1: step-level costs on resnet18 (see the module docstring)."""
    L.seed_everything(0, verbose=False)
    net = torchvision.models.resnet18(num_classes=10).train()
    x, y = torch.rand(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, weight_decay=5e-4)
    theta = autodiff.flat_params(net)
    loss = autodiff.ModuleLoss(net, 5e-4)
    v = torch.randn(1, theta.numel())

    def plain_step() -> None:
        net.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()

    def one_hvp() -> None:
        hf.StepObjective(loss, theta, x, y).hvp(v)

    def recorder_step(k: int) -> Callable[[], None]:
        rec = TrajectoryRecorder(track=range(k), power_iters=0)
        rec.check_optimizer(opt, net)
        rec.begin_experience(net)
        ids = torch.arange(k - 1, k - 1 + BATCH)  # one tracked sample in this batch, k - 1 vectors from earlier
        rec.before_step(net, x[: k + 2], y[: k + 2], torch.arange(k + 2), 0.01)  # allocate k rows (small, untimed)
        return lambda: rec.before_step(net, x, y, ids, 0.01)

    ks = (1, 4)
    runs: dict[str, Callable[[], None]] = {"plain": plain_step, "hvp": one_hvp}
    runs.update({f"k{k}": recorder_step(k) for k in ks})
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved: load from other processes hits every column alike
        for name, run in runs.items():
            start = perf_counter()
            run()
            times[name].append(perf_counter() - start)
            print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    d = theta.numel()
    print(f"resnet18 (BatchNorm in training mode), d = {d:,}, batch {BATCH} of 32x32, CPU, median of {repeats}")
    print(f"  one plain training step (forward + backward)              : {1e3 * med['plain']:8.0f} ms")
    print(
        f"  ONE HVP from scratch (forward, create_graph, double back) : {1e3 * med['hvp']:8.0f} ms"
        f"   ({med['hvp'] / med['plain']:.2f} x plain step)"
    )
    print(f"  {'K tracked':>9} | {'recorder step ms':>16} | {'ms per vector':>13} | {'per vector / one HVP':>20}")
    for k in ks:
        t = med[f"k{k}"]
        print(f"  {k:>9} | {1e3 * t:16.0f} | {1e3 * t / k:13.0f} | {t / k / med['hvp']:20.2f}")
    print("  (a recorder step: one forward + differentiable backward, K vectors in one batched double backward,")
    print("   one leave-one-out gradient for the tracked sample in the batch; no power iteration here)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-cnn", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    resnet_steps(args.repeats)
    if args.skip_cnn:
        return
    plain, model = fit([])
    d = autodiff.flat_params(model).numel()
    steps = EPOCHS * (N // BATCH)
    print(f"HF recording on a small CNN: d = {d} parameters, N = {N}, batch {BATCH}, {steps} SGD steps, CPU")
    print(f"  plain fit: {plain:.2f} s")
    print(
        f"  {'K tracked':>9} | {'fit s':>7} | {'ratio':>6} | {'extra ms/step':>13} | {'K HVPs ms':>9} | "
        f"{'extra / K HVPs':>14}"
    )
    x, y = next(iter(DataLoader(data(), batch_size=BATCH)))[:2]
    theta = autodiff.flat_params(model)
    loss = autodiff.ModuleLoss(model, 1e-3)

    def plain_step() -> None:
        loss.mean(theta.clone().requires_grad_(True), x, y).backward()

    for k in (16, 64):
        rec = TrajectoryRecorder(track=range(k))
        seconds, _ = fit([rec])
        V = torch.randn(k, d)
        k_hvps = timed(lambda: autodiff.hvps(loss, theta, x, y, V))  # noqa: B023
        extra = (seconds - plain) / steps
        print(
            f"  {k:>9} | {seconds:7.2f} | {seconds / plain:6.1f} | {1e3 * extra:13.1f} | {1e3 * k_hvps:9.1f} | "
            f"{extra / k_hvps:14.2f}"
        )
    print(f"  one plain training step (forward + backward over the batch): {1e3 * timed(plain_step):.1f} ms")


if __name__ == "__main__":
    main()
