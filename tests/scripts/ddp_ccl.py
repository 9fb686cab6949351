"""Learn three tasks on a user's module (its own training_step and SGD, a ProximalRegularizer callback) with a
CCLHessianRecorder (factored Hessians, stored per-sample gradients) under DDP on 2 CPU processes (gloo), execute a
sample-level ccl_hessian request, reload the checkpoint on the same ranks, and save what each rank holds.

Usage: python ddp_ccl.py OUT.pt [DEVICES]. Run by tests/test_certified_ddp.py in a subprocess (Lightning's "ddp"
strategy relaunches this script for the other rank). With DEVICES=2 each rank loads every other sample of the task in
one batch (Lightning's sampler replaced by ``range(rank, n, 2)``): DDP's averaged gradient is the full-batch gradient
of one process, so both run the same gradient descent.
"""

import os
import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/..")
from helpers_certified import cl_tasks, recorded, same_state, user_model  # noqa: E402

from lightning_unlearn import ForgetRequest, ReleaseConfig  # noqa: E402
from lightning_unlearn.callbacks import CCLHessianRecorder, ProximalRegularizer  # noqa: E402
from lightning_unlearn.functional import autodiff, ccl  # noqa: E402
from lightning_unlearn.unlearners import CCLHessianUnlearner  # noqa: E402

warnings.filterwarnings("ignore")

REQUEST = [3, 101, 105, 110, 150]  # samples of tasks 0 and 1: two partially forgotten tasks


def recorder() -> CCLHessianRecorder:
    return CCLHessianRecorder(hessian="factored", store_sample_gradients=True)


def forget(model, rec: CCLHessianRecorder) -> dict:
    """The request with a calibrated release (noise drawn on rank 0): its noise-free model and certificate."""
    unlearner = CCLHessianUnlearner(model, rec, release=ReleaseConfig(epsilon=1.0, delta=1e-5))
    certificate = unlearner.forget(ForgetRequest.samples(REQUEST)).certificate
    return {
        "internal": unlearner.clean_parameters(),
        "published": autodiff.flat_params(model),
        "sigma": certificate.sigma,
        "bounds": dict(certificate.bounds),
    }


def refused(model, rec: CCLHessianRecorder, ids: list[int]) -> dict:
    """A request without data whose stored gradients are not each held once: its message, and whether the model,
    the recorder's state and the ledger are unchanged."""
    unlearner = CCLHessianUnlearner(model, rec, release=ReleaseConfig(noise=False))
    before, w = recorded(rec), autodiff.flat_params(model)
    try:
        unlearner.forget(ForgetRequest.samples(ids))
        message = None
    except ValueError as err:
        message = str(err)
    unchanged = same_state(recorded(rec), before) and torch.equal(autodiff.flat_params(model), w)
    return {"message": message, "unchanged": unchanged and not len(unlearner.ledger)}


def main(out: str, devices: int) -> None:
    rank = int(os.environ.get("LOCAL_RANK", 0))  # set by Lightning for the relaunched rank
    reg, rec = ProximalRegularizer(1.0), recorder()
    model = user_model(lr=0.5, weight_decay=0.05)  # mu = 0.05; 30 full-batch steps solve each task to ~1e-10
    for k, ds in enumerate(cl_tasks()):
        rec.experience = k
        tr = L.Trainer(
            strategy="ddp" if devices > 1 else "auto",
            accelerator="cpu",
            devices=devices,
            max_epochs=30,
            callbacks=[reg, rec],
            use_distributed_sampler=False,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        loader = DataLoader(ds, batch_size=len(ds) // devices, sampler=list(range(rank, len(ds), devices)))
        tr.fit(model, loader)
    ckpt = out.replace(".pt", ".ckpt")
    tr.save_checkpoint(ckpt)  # every rank builds it (the rows are gathered on rank 0), rank 0 writes it
    held = {
        "factor_rows": [len(H["factor"]) for H in rec.hessians],
        "sample_grad_ids": sorted(rec.sample_grads),
        "world": rec.world_size,
    }
    saved = rec.state_dict()  # rank 0: every row; rank 1: its own, marked
    # a transport of task 0 by CG on the sharded factor, and by the Woodbury fallback (it gathers the rows)
    v = torch.linspace(-1.0, 1.0, rec.ends[0].numel(), dtype=torch.float64)
    solves = {"cg": ccl.inverse_solver(rec.hessians[0], 0.05, 1.0, rec.shards)(v)}
    iterations, ccl.FACTORED_CG_ITERATIONS = ccl.FACTORED_CG_ITERATIONS, 0
    solves["woodbury"] = ccl.inverse_solver(rec.hessians[0], 0.05, 1.0, rec.shards)(v)
    ccl.FACTORED_CG_ITERATIONS = iterations
    # refused: a stored gradient that no rank holds, then one that two ranks hold
    bad = {}
    owner = 7 in rec.sample_grads
    kept = rec.sample_grads.pop(7) if owner else None
    bad["missing"] = refused(model, rec, [7, 8])
    if kept is not None:
        rec.sample_grads[7] = kept
    if devices > 1:
        copied = 8 not in rec.sample_grads
        if copied:
            rec.sample_grads[8] = torch.zeros_like(rec.ends[0])
        bad["twice"] = refused(model, rec, [7, 8])
        if copied:
            del rec.sample_grads[8]
    result = forget(model, rec)
    # the checkpoint reloaded on every rank (each keeps the rows i % R == rank of it) gives the same request
    tr.strategy.barrier()
    again, fresh = recorder().load_from_checkpoint(ckpt), user_model(lr=0.5, weight_decay=0.05)
    fresh.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"])
    reloaded = {"sample_grads": len(again.sample_grads), **forget(fresh, again)}
    torch.save(
        {"held": held, "saved": saved, "solves": solves, "bad": bad, "result": result, "reloaded": reloaded},
        out.replace(".pt", f".rank{rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
