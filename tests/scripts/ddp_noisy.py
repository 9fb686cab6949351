"""Fit a user-style CNN with BatchNorm under DDP (2 CPU processes, gloo), then let both ranks execute one
noisy_finetune request, and save what each rank published.

Usage: python ddp_noisy.py OUT.pt [DEVICES]. Run by tests/test_noisy_ddp.py in a subprocess.
"""

import sys
import warnings

import lightning as L
import torch
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from test_noisy import KEYS, Images, UserCNN

from lightning_unlearn import ForgetRequest, IndexedDataset
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner

warnings.filterwarnings("ignore")


def main(out: str, devices: int) -> None:
    torch.manual_seed(0)
    train = IndexedDataset(Images(64))
    model, recorder = UserCNN(), SampleRecorder(batch_keys=KEYS)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
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
    trainer.fit(model, DataLoader(train, batch_size=16, shuffle=True))
    strategy = NoisyFinetuneUnlearner(model, recorder, train, center=initial, steps=3, batch_size=16, radius=2.0)
    result = strategy.forget(ForgetRequest.of_class(1))
    torch.save(
        {
            "params": parameters_to_vector(model.parameters()).detach(),
            "running_mean": model.features[1].running_mean.clone(),
            "forgotten": recorder.catalog.forgotten.clone(),
            "extra": {k: v for k, v in result.extra.items() if isinstance(v, (int, float))},
            "epsilon_total": result.certificate.accounting["epsilon_total"],
            "sigma": result.certificate.sigma,
        },
        out.replace(".pt", f".rank{trainer.global_rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
