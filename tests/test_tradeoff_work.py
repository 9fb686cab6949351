"""The tradeoff table does each method's work once (issue 29, item 5: the mnist-5k default run took over 25 min and
11 GB, and its HF release at epsilon = 1 was refused): HF's recorder keeps vectors for the samples the schedule forgets
only (one Hessian-vector product per tracked sample and SGD step was the fit's cost), its same-batches retrain is the
one the full recorder's batches give, the [CCL] rows share the recorded Hessians (``d^2`` floats each) instead of
copying them per epsilon, and the recipe's step size meets the HF rows' contraction bound, rounding included."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff
from lightning_unlearn.functional.bounds import module_constants
from lightning_unlearn_bench import tradeoff


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian classes in 4 dimensions (class c centred on 2 e_c), float64."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return torch.randn(n, 4, generator=g, dtype=torch.float64) + 2 * torch.eye(4, dtype=torch.float64)[y], y


def test_hf_tracks_the_forgotten_samples_and_ccl_copies_share_the_hessians(monkeypatch):
    (x, y), (xt, yt) = blobs(80, 0), blobs(40, 1)
    data = IndexedDataset(TensorDataset(x, y)), TensorDataset(xt, yt)
    recorders, same_batches = [], []
    make, replay = tradeoff.unlearner, tradeoff._retrain_same_batches

    def spy_unlearner(name, module, recorder, **kwargs):
        recorders.append((name, recorder))
        return make(name, module, recorder, **kwargs)

    def spy_replay(setup, rec, steps):
        same_batches.append((rec, steps))
        return replay(setup, rec, steps)

    monkeypatch.setattr(tradeoff, "unlearner", spy_unlearner)
    monkeypatch.setattr(tradeoff, "_retrain_same_batches", spy_replay)
    rows, setup = tradeoff.run_tradeoff(
        (1.0,),
        methods=("hf", "ccl_hessian", "ccl_gradient"),
        epochs=2,
        batch_size=8,
        fraction=0.1,
        data=data,
        log=print,
    )
    assert {r["method"] for r in rows} >= {"hf", "ccl_hessian", "ccl_gradient", "retrain[sgd,same batches]"}
    # the recipe's step size sits at the contraction bound 2/(M + lambda) here: computed from the same rounded-up
    # feature norm as the HF rows' constants, it meets their bound and the release at epsilon = 1 is certified
    assert setup.recipe.lr == module_constants(setup.linear(), [setup.x]).max_lr
    assert [r["certified"] for r in rows if r["method"] == "hf"] == [False, True]
    hf_recorders = [r for name, r in recorders if name == "hf"]
    assert len(hf_recorders) == 2  # epsilon = inf and 1
    forgotten = sorted(setup.forget_ids.tolist())
    assert all(sorted(r.row_ids) == forgotten and r.n_rows == setup.m for r in hf_recorders)
    # the same-batches retrain over the logged batches is the one the occurrences of a recorder tracking every
    # sample give (the construction before the log): the same fit, seeded alike, replayed with all vectors
    rec, steps = same_batches[0]
    full = TrajectoryRecorder(dtype=torch.float64)
    model = setup.linear()
    tradeoff._trainer([full], 2, {}).fit(model, setup.loader(setup.x, setup.y))
    occ_rows, occ_steps = full.occurrences()
    ids = torch.tensor(full.row_ids)[occ_rows]
    assert [ids[occ_steps == t].tolist() for t in range(full.n_steps)] == [s.tolist() for s in steps]
    assert full.lrs == rec.lrs and full.batch_sizes == rec.batch_sizes
    # the [CCL] rows: every strategy's recorder holds the very Hessians recorded once (no d x d copy per row)
    ccl = [r for name, r in recorders if name in ("ccl_hessian", "ccl_gradient")]
    assert len(ccl) == 4 and len({id(r) for r in ccl}) == 4  # a copy per row: their catalogs change apart
    assert all(r.hessians[0] is ccl[0].hessians[0] for r in ccl)
    assert torch.equal(
        autodiff.flat_params(replay(setup, full, steps)), autodiff.flat_params(replay(setup, rec, steps))
    )
