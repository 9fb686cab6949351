"""Small deterministic data and models shared by the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import AnalyticClassifier, AnalyticRecorder, IndexedDataset
from lightning_unlearn.models import mlp_backbone

N_FEATURES, N_CLASSES = 12, 4


def toy_tensors(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs, one per class, so that accuracies are well above chance."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % N_CLASSES
    centers = torch.randn(N_CLASSES, N_FEATURES, generator=torch.Generator().manual_seed(123)) * 2
    return centers[y] + torch.randn(n, N_FEATURES, generator=g), y


def toy_dataset(n: int = 400, seed: int = 0, id_offset: int = 0) -> IndexedDataset:
    x, y = toy_tensors(n, seed)
    return IndexedDataset(TensorDataset(x, y), ids=torch.arange(n) + id_offset)


def analytic_model(expansion_dim: int = 48) -> AnalyticClassifier:
    torch.manual_seed(7)
    return AnalyticClassifier(mlp_backbone(N_FEATURES, 32, 16), 16, N_CLASSES, expansion_dim=expansion_dim, seed=3)


def quiet_trainer(callbacks: list[L.Callback], **kwargs) -> L.Trainer:
    opts = dict(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    return L.Trainer(callbacks=callbacks, **{**opts, **kwargs})


def fit_analytic(
    datasets: list, ridge: float = 0.5, batch_size: int = 32, **trainer_kwargs
) -> tuple[AnalyticClassifier, AnalyticRecorder]:
    """Learn each dataset as one experience with an AnalyticRecorder."""
    model, recorder = analytic_model(), AnalyticRecorder(ridge=ridge)
    for ds in datasets:
        quiet_trainer([recorder], **trainer_kwargs).fit(model, DataLoader(ds, batch_size=batch_size, shuffle=True))
    return model, recorder


def run_script(script: Path, out: Path, devices: int) -> None:
    """Run a DDP test script (``tests/scripts``) as its own process: ``script out devices``."""
    subprocess.run(
        [sys.executable, str(script), str(out), str(devices)],
        check=True,
        cwd=out.parent,
        capture_output=True,
        timeout=300,
    )


def run_cli_script(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a test script (``tests/scripts``) that drives the CLI as its own process; its output as text."""
    return subprocess.run(
        [sys.executable, str(script), *args], check=True, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def ddp_repro_config():
    """[ACU] Table 1's first smoke setup with ACU and fine-tuning, its backbone left untrained (pre-training is an SGD
    fit, which a second process changes: each step averages two half batches), plus [HF]'s MIA-L column (offline
    LiRA: the reference forgets on copies of itself): the config tests/test_repro_ddp.py runs on one and two
    processes."""
    from dataclasses import replace

    from lightning_unlearn_bench.papers import get_config
    from lightning_unlearn_bench.repro import Requests

    acu = get_config("acu-table1")
    setup = acu.setups[0]
    requests = (Requests("K=2", k=2, fraction=0.2),)
    smoke = replace(setup.smoke, pretrain_epochs=0, n_experiences=2, requests=requests)
    setup = replace(setup, smoke=smoke, methods=setup.methods[:2])
    columns = (*acu.columns, "MIA-L")
    return replace(acu, name="acu-ddp", columns=columns, setups=(setup,), smoke_setups=1)
