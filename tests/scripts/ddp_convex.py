"""Fit a SoftmaxHeadRecorder with DDP on 2 CPU processes (gloo), forget, and save what each rank holds.

Usage: python ddp_convex.py OUT.pt [DEVICES]. Run by tests/test_convex.py in a subprocess, because Lightning's
"ddp" strategy relaunches the script itself for the other rank.
"""

import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from helpers import N_CLASSES, N_FEATURES, toy_dataset

from lightning_unlearn import ForgetRequest, ResolveUnlearner, SoftmaxHeadRecorder
from lightning_unlearn.functional import convex

warnings.filterwarnings("ignore")


class Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(N_FEATURES, N_CLASSES)
        self.automatic_optimization = False

    def forward(self, x):
        return self.head(x)

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def rows(recorder: SoftmaxHeadRecorder) -> dict:
    return {k: getattr(recorder, k).clone() for k in ("feature_rows", "labels", "row_ids", "W")}


def main(out: str, devices: int) -> None:
    ds = toy_dataset(n=203)  # odd: DistributedSampler pads one rank with a repeated sample
    model, recorder = Linear(), SoftmaxHeadRecorder(0.05, radius=1e-5)
    trainer = L.Trainer(
        strategy="ddp" if devices > 1 else "auto",
        accelerator="cpu",
        devices=devices,
        max_epochs=1,
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(ds, batch_size=16, shuffle=True))
    fitted = rows(recorder)
    # the float32 gradient over the ranks' rows against the float64 one, and its rounding bound (R = devices)
    p64 = recorder.problem()
    p32 = convex.SoftmaxProblem(p64.features.float(), p64.labels, N_CLASSES, p64.l2, ranks=p64.ranks)
    W = recorder.solved_head + 0.3 * torch.randn(recorder.solved_head.shape, generator=torch.Generator().manual_seed(0))
    W = recorder.broadcast_from_rank0(W.double())
    float32 = {
        "error": float((convex.gradient(W.float(), p32).double() - convex.gradient(W, p64)).norm()),
        "bound": convex.gradient_error_bound(W.float(), p32),
    }
    result = ResolveUnlearner(model, recorder).forget(ForgetRequest.samples([0, 5, 202]))
    torch.save(
        {
            "fitted": fitted,
            "after": rows(recorder),
            "saved": recorder.state_dict(),  # rank 0: every row; rank 1: its own, marked
            "published": {k: v.clone() for k, v in model.state_dict().items()},
            "extra": result.extra,
            "float32": float32,
            "world": recorder.world_size,
        },
        out.replace(".pt", f".rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
