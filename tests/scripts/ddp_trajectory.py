"""Fit a TrajectoryRecorder (HF), a SAFERecorder (SAFE), a HessianSumRecorder ([NS]) and a CCLHessianRecorder
([CCL]) with DDP on 2 CPU processes (gloo), save their states.

Usage: python ddp_trajectory.py OUT.pt [DEVICES]. Run by tests/test_certified_ddp.py in a subprocess
(Lightning's "ddp" strategy relaunches this script for the other rank). With DEVICES=2 each rank
loads every other sample of each global batch (per-rank batch 8, Lightning's sampler replaced by
``range(rank, n, 2)``), which is the same global batch as one process with batch 16 over
``range(n)``, so the SGD trajectories are identical.
"""

import os
import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from helpers_certified import blobs, cl_tasks, proximal_model, sgd_model  # noqa: E402

from lightning_unlearn import ForgetRequest, ReleaseConfig  # noqa: E402
from lightning_unlearn.callbacks import (  # noqa: E402
    CCLHessianRecorder,
    HessianSumRecorder,
    SAFERecorder,
    TrajectoryRecorder,
)
from lightning_unlearn.functional import autodiff  # noqa: E402
from lightning_unlearn.unlearners import HFUnlearner  # noqa: E402

warnings.filterwarnings("ignore")


def trainer(devices: int, callbacks: list, epochs: int) -> L.Trainer:
    return L.Trainer(
        strategy="ddp" if devices > 1 else "auto",
        accelerator="cpu",
        devices=devices,
        max_epochs=epochs,
        callbacks=callbacks,
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def loader(ds, devices: int) -> DataLoader:
    rank = int(os.environ.get("LOCAL_RANK", 0))  # set by Lightning for the relaunched rank
    return DataLoader(ds, batch_size=16 // devices, sampler=list(range(rank, len(ds), devices)))


def count_rows(recorder) -> list[int]:
    """Counts the rows the recorder's ``_record`` receives on this rank (its own samples under DDP)."""
    seen: list[int] = []
    record = recorder._record
    recorder._record = lambda module, x, y, ids, out: (seen.append(len(x)), record(module, x, y, ids, out))
    return seen


def restored_shard(tr: L.Trainer, mapped: TrajectoryRecorder, ckpt: str) -> bool:
    """Save a checkpoint (every rank), close the memory-mapped recorder and restore its state into a new one:
    whether this rank reopened its own file with the same rows."""
    tr.save_checkpoint(ckpt)
    rows = mapped.A[: mapped.n_local].clone()
    key, path = mapped.state_key, mapped.path
    mapped.close()
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["callbacks"][key]
    restored = TrajectoryRecorder(dtype=torch.float32, store="mmap", path=path, capacity=96)
    restored.load_state_dict(state)
    same = torch.equal(restored.A[: restored.n_local], rows) and torch.equal(restored._slot, mapped._slot)
    restored.close()
    return same


def main(out: str, devices: int) -> None:
    traj = TrajectoryRecorder(dtype=torch.float64)
    mapped = TrajectoryRecorder(dtype=torch.float32, store="mmap", path=out.replace(".pt", ".rows"), capacity=96)
    stream = SAFERecorder(num_classes=3, proj_dim=4)
    stream_rows = count_rows(stream)
    hsum = HessianSumRecorder()
    hsum_rows = count_rows(hsum)
    model = sgd_model()
    tr = trainer(devices, [traj, mapped, stream, hsum], epochs=2)
    tr.fit(model, loader(blobs(96, seed=0), devices))
    restored = restored_shard(tr, mapped, out.replace(".pt", ".ckpt"))
    owned = traj._slot >= 0  # the vectors this rank holds, by id
    shard = {
        "ids": torch.tensor(traj.row_ids)[owned],
        "rows": traj.A[traj._slot[owned]].clone(),
        "memory_bytes": traj.memory_bytes(),
    }
    traj_state = {k: traj.state_dict()[k] for k in ("row_ids", "lrs", "batch_sizes", "occ_rows", "occ_steps")}
    # an HF request executed by every rank: without noise (compared with one process), then with noise drawn
    # from OS entropy (every rank must publish the same model)
    strategy = HFUnlearner(model, traj, max_deletions=10, release=ReleaseConfig(noise=False))
    clean = strategy.forget(ForgetRequest.samples([3, 50, 77]))
    published_clean = autodiff.flat_params(model)
    noised = HFUnlearner(model, traj, max_deletions=10, release=ReleaseConfig(sigma_override=0.01)).forget(
        ForgetRequest.samples([10])
    )
    published_noised = autodiff.flat_params(model)
    hess = CCLHessianRecorder()
    hess_rows = count_rows(hess)
    model = proximal_model()
    model.optimizer_name = "sgd"  # L-BFGS line searches would differ between ranks
    for k, ds in enumerate(cl_tasks(n=48)[:2]):
        hess.experience = k
        trainer(devices, [hess], epochs=3).fit(model, loader(ds, devices))
    rank = tr.global_rank
    torch.save(
        {
            "trajectory": traj_state,
            "shard": shard,
            "restored": restored,
            "published_clean": published_clean,
            "update_norm": clean.extra["update_norm"],
            "published_noised": published_noised,
            "noise_norm": noised.extra["noise_norm"],
            "streaming": stream.state_dict(),
            "streaming_rows": sum(stream_rows),
            "hessian_sum": hsum.state_dict(),
            "hessian_sum_rows": sum(hsum_rows),
            "hessian": hess.state_dict(),
            "hessian_rows": sum(hess_rows),
        },
        out.replace(".pt", f".rank{rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
