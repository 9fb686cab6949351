"""Recorders under DDP: 1 vs 2 CPU processes (gloo), time and per-rank statistics memory (issue 11 benchmark).

For each recorder (ACU's :class:`~lightning_unlearn.AnalyticRecorder`, SAFE's
:class:`~lightning_unlearn.callbacks.SAFERecorder`, [CCL]'s
:class:`~lightning_unlearn.callbacks.CCLHessianRecorder`, HF's
:class:`~lightning_unlearn.callbacks.TrajectoryRecorder`) and for a plain fit without recorder, one fit of
one epoch on synthetic data (same global batch in both runs: the per-rank batch is halved with 2 processes),
run once with ``devices=1`` and once with ``strategy="ddp", devices=2``. Reported per run:

* ``fit s``: wall time from ``on_train_start`` to the end of ``on_train_end`` (after the recorders' end-of-fit
  work: SAFE's anchor pass, [CCL]'s Hessian), slowest rank; process launch and setup left out;
* ``stats MB/rank``: bytes of the tensors in the recorder's ``state_dict`` on rank 0, less the sample catalog
  (ids, labels, fingerprints: the same on every rank by design), i.e. what a rank keeps (HF: its own vectors);
* ``held MB/rank``: the inputs a recorder holds until the end of the experience ([CCL]: its Hessian is
  evaluated at the task's solution; before sharding every rank held all of them).

Every process runs one intra-op thread (what Lightning sets for 2 DDP processes on 2 cores), so the 2-process
run has twice the cores of the 1-process one; the machine is shared with other jobs, so the times are single,
noisy runs (the memory columns are exact).

    python benchmarks/ddp.py [RECORDER ...]   # e.g. HF; default: all
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

RECORDERS = ("plain", "ACU", "SAFE", "[CCL]", "HF")
N_SAMPLES, BATCH, N_FEATURES, N_CLASSES = 512, 32, 32, 10


def nbytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def worker(name: str, devices: int, out: str) -> None:
    """One fit on this rank (Lightning's DDP launcher runs this same command for the other rank)."""
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_unlearn import AnalyticRecorder
    from lightning_unlearn.callbacks import CCLHessianRecorder, SAFERecorder, TrajectoryRecorder
    from lightning_unlearn.data import IndexedDataset
    from lightning_unlearn.models import AnalyticClassifier, ProximalClassifier, SupervisedClassifier, mlp_backbone
    from lightning_unlearn.progress import QUIET_TRAINER

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    torch.set_num_threads(1)  # one thread per process in both runs (Lightning sets it so for DDP on 2 cores)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, N_CLASSES, (N_SAMPLES,), generator=g)
    x = torch.randn(N_SAMPLES, N_FEATURES, generator=g) + nn.functional.one_hot(y, N_FEATURES).float() * 2
    L.seed_everything(0, verbose=False)
    held = [0]
    if name == "ACU":
        model: L.LightningModule = AnalyticClassifier(mlp_backbone(N_FEATURES, 64, 64), 64, N_CLASSES, 1024, seed=0)
        recorder: Any = AnalyticRecorder(ridge=1.0)
    elif name == "[CCL]":
        net = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.Tanh(), nn.Linear(16, N_CLASSES))
        model = ProximalClassifier(net, lr=0.1, l2=0.01, reg_lambda=1.0, optimizer="sgd")
        recorder = CCLHessianRecorder(hessian="exact", chunk_size=128)
        commit = recorder._commit

        def measured_commit(module: nn.Module) -> None:
            held[0] = sum(nbytes(t) for t in recorder._x + recorder._y)
            commit(module)

        recorder._commit = measured_commit  # type: ignore[method-assign]
    else:
        net = nn.Sequential(nn.Linear(N_FEATURES, 64), nn.Tanh(), nn.Linear(64, N_CLASSES))
        model = SupervisedClassifier(net, lr=0.05, l2=0.01)
        recorder = {
            "SAFE": lambda: SAFERecorder(num_classes=N_CLASSES, proj_dim=16),
            "HF": lambda: TrajectoryRecorder(track=range(0, N_SAMPLES, 2)),
            "plain": lambda: None,
        }[name]()
    clock: dict[str, float] = {}

    class Clock(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            clock["start"] = time.perf_counter()

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            clock["end"] = time.perf_counter()

    callbacks = ([recorder] if recorder is not None else []) + [Clock()]
    trainer = L.Trainer(
        strategy="ddp" if devices > 1 else "auto",
        accelerator="cpu",
        devices=devices,
        max_epochs=1,
        callbacks=callbacks,
        **QUIET_TRAINER,
    )
    data = IndexedDataset(TensorDataset(x, y))
    trainer.fit(model, DataLoader(data, batch_size=BATCH // devices, shuffle=True))
    stats = 0
    if recorder is not None:
        state = recorder.state_dict()
        stats = nbytes(state) - nbytes(state["catalog"])
        if isinstance(recorder, TrajectoryRecorder):  # a DDP state holds no in-memory shard: count this rank's rows
            stats += recorder.memory_bytes() - nbytes(state["A"])
    result = {"seconds": clock["end"] - clock["start"], "stats": stats, "held": held[0]}
    Path(f"{out}.rank{trainer.global_rank}.json").write_text(json.dumps(result))


def run(name: str, devices: int, tmp: Path) -> dict[str, float]:
    out = tmp / f"{name.strip('[]')}-{devices}"
    subprocess.run(
        [sys.executable, __file__, "--worker", name, str(devices), str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=1800,
    )
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(devices)]
    return {
        "seconds": max(r["seconds"] for r in ranks),
        "stats": ranks[0]["stats"] / 2**20,
        "held": ranks[0]["held"] / 2**20,
    }


def main(names: list[str]) -> None:
    import tempfile

    header = (
        f"{'recorder':9} {'fit s 1p':>9} {'fit s 2p':>9} {'2p/1p':>6} {'stats MB/rank 1p':>17} "
        f"{'2p':>9} {'2p/1p':>6} {'held MB/rank 1p':>16} {'2p':>7}"
    )
    print(f"{N_SAMPLES} samples, global batch {BATCH}, one epoch; 1 process vs DDP over 2 (gloo, CPU)")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or RECORDERS:
            one, two = run(name, 1, Path(tmp)), run(name, 2, Path(tmp))
            mem_ratio = f"{two['stats'] / one['stats']:6.2f}" if one["stats"] else f"{'-':>6}"
            print(
                f"{name:9} {one['seconds']:9.2f} {two['seconds']:9.2f} {two['seconds'] / one['seconds']:6.2f} "
                f"{one['stats']:17.3f} {two['stats']:9.3f} {mem_ratio} {one['held']:16.3f} {two['held']:7.3f}",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main(sys.argv[1:])
