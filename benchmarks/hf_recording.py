"""Benchmark: HF recording overhead on a small CNN (a user LightningModule), and where the time goes.

[HF]'s recursion (Eq. (10)) applies ``(I - eta H_t)`` to every tracked vector at every SGD step, so
its cost per step is about one Hessian-vector product per tracked sample (plus per-sample
gradients of the tracked samples in the batch, and a power-iteration HVP for M). This prints,
for a CNN without BatchNorm (HF needs deterministic per-sample losses) on synthetic 16x16 images:

* plain fit time and TrajectoryRecorder fit time for K tracked samples, and their ratio;
* the recorder's time per step split into its parts, next to the time of one batched
  ``vmap`` HVP call over the K vectors and of one plain training step (forward + backward);
* the cost per tracked sample per step in units of one HVP (1.0 = nothing but the HVPs).

    python benchmarks/hf_recording.py
"""

from __future__ import annotations

import logging
import warnings
from time import perf_counter

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import hf

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
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
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


def main() -> None:
    torch.set_num_threads(2)
    plain, model = fit([])
    d = hf.flat_params(model).numel()
    steps = EPOCHS * (N // BATCH)
    print(f"HF recording on a small CNN: d = {d} parameters, N = {N}, batch {BATCH}, {steps} SGD steps, CPU")
    print(f"  plain fit: {plain:.2f} s")
    print(
        f"  {'K tracked':>9} | {'fit s':>7} | {'ratio':>6} | {'extra ms/step':>13} | {'K HVPs ms':>9} | "
        f"{'extra / K HVPs':>14}"
    )
    x, y = next(iter(DataLoader(data(), batch_size=BATCH)))[:2]
    theta = hf.flat_params(model)
    loss = hf.ModuleLoss(model, 1e-3)

    def plain_step() -> None:
        loss.mean(theta.clone().requires_grad_(True), x, y).backward()

    for k in (16, 64):
        rec = TrajectoryRecorder(track=range(k))
        seconds, _ = fit([rec])
        V = torch.randn(k, d)
        k_hvps = timed(lambda: hf.hvps(loss, theta, x, y, V))  # noqa: B023
        extra = (seconds - plain) / steps
        print(
            f"  {k:>9} | {seconds:7.2f} | {seconds / plain:6.1f} | {1e3 * extra:13.1f} | {1e3 * k_hvps:9.1f} | "
            f"{extra / k_hvps:14.2f}"
        )
    print(f"  one plain training step (forward + backward over the batch): {1e3 * timed(plain_step):.1f} ms")


if __name__ == "__main__":
    main()
