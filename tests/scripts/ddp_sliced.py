"""Train a SlicedBackbone, fit the certified head on its trunk with DDP on 2 CPU processes (gloo), forget a sample the
backbone saw (sliced_resolve), and save what each rank holds.

Usage: python ddp_sliced.py OUT.pt [DEVICES]. Run by tests/test_sliced.py in a subprocess, because Lightning's "ddp"
strategy relaunches the script itself for the other rank (which then trains the same stages in its own process).
"""

import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from test_sliced import L2, RADIUS, HeadModel, digits, sliced

from lightning_unlearn import ForgetRequest, SoftmaxHeadRecorder
from lightning_unlearn.unlearners.sliced import SlicedResolveUnlearner

warnings.filterwarnings("ignore")


def main(out: str, devices: int) -> None:
    torch.set_num_threads(1)  # the same kernels' reduction order in every process
    data = digits()
    backbone = sliced(data)
    model, recorder = HeadModel(backbone.module.trunk), SoftmaxHeadRecorder(L2, radius=RADIUS, backbone="trunk")
    model.automatic_optimization = False  # DDP refuses a training_step returning None under automatic optimization
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
    trainer.fit(model, DataLoader(data, batch_size=32))
    forgotten = int(backbone.slice_ids[1][0])
    result = SlicedResolveUnlearner(model, recorder, backbone).forget(ForgetRequest.samples([forgotten]), data=data)
    torch.save(
        {
            "forgotten": forgotten,
            "extra": {k: v for k, v in result.extra.items() if k != "backbone_seconds"},
            "backbone": backbone.module.state_dict(),
            "recorder": recorder.state_dict(),
            "published": {k: v.clone() for k, v in model.state_dict().items()},
        },
        out.replace(".pt", f".rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
