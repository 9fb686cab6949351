"""Fit an AnalyticRecorder with DDP on 2 CPU processes (gloo) and save its statistics.

Usage: python ddp_analytic.py OUT.pt [DEVICES]. Run by tests/test_ddp.py in a subprocess,
because Lightning's "ddp" strategy relaunches the script itself for the other rank.
"""

import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from helpers import analytic_model, toy_dataset

from lightning_unlearn import AnalyticRecorder

warnings.filterwarnings("ignore")


def main(out: str, devices: int) -> None:
    ds = toy_dataset(n=203)  # odd: DistributedSampler pads one rank with a repeated sample
    model, recorder = analytic_model(), AnalyticRecorder(ridge=0.5)
    rows_here = []  # rows this rank's recorder computed features for and accumulated
    record = recorder._record
    recorder._record = lambda module, x, y, ids, out: (rows_here.append(len(ids)), record(module, x, y, ids, out))
    trainer = L.Trainer(
        strategy="ddp" if devices > 1 else "auto",
        accelerator="cpu",
        devices=devices,
        max_epochs=2,
        callbacks=[recorder],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(ds, batch_size=16, shuffle=True))
    state = recorder.state_dict()
    state["rank"] = trainer.global_rank
    state["rows_recorded_here"] = sum(rows_here)
    torch.save(state, out.replace(".pt", f".rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
