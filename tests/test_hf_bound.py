"""HF's noise bound kept as a running sum ([HF] sum form of Eq. (56)) equals the bound re-summed over every
deleted sample, across a stream of requests, a failed (rolled-back) request, a resume and a new experience."""

import math

import pytest
import torch
from helpers_certified import blobs, fit_hf, sgd_model

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.unlearners import HFUnlearner

# float64 throughout; the running sum adds the terms in another order than the re-summation (and m * C_1
# instead of C_1 + ... + C_1): a few ulp per term over < 20 terms, far below 1e-12 relative
REL = 1e-12


def resummed(strategy: HFUnlearner) -> tuple[float, int]:
    """Reference: the per-sample bound (:func:`hf.per_sample_bound`) of every deleted sample, summed again one by
    one, as every request did before the running sum; and the number of deleted samples."""
    rec, c = strategy.recorder, strategy.constants()
    lrs = torch.tensor(rec.lrs, dtype=torch.float64)
    rho = hf.contraction_factor(lrs, c.strong_convexity, c.smoothness)
    occ_rows, occ_steps = rec.occurrences()
    deleted = (~rec.active[: rec.n_rows]).nonzero().flatten().tolist()
    total = 0.0
    for r in deleted:
        t1, t2 = hf.per_sample_bound(occ_steps[occ_rows == r], lrs, torch.tensor(rec.batch_sizes), c.grad_bound, rho)
        total += t1 + t2
    return total, len(deleted)


def check(strategy: HFUnlearner, ids: list[int]) -> None:
    bounds = strategy.forget(ForgetRequest.samples(ids)).certificate.bounds
    reference, n = resummed(strategy)
    assert bounds["deleted_total"] == n
    assert math.isclose(bounds["sensitivity"], reference, rel_tol=REL), (bounds["sensitivity"], reference)
    assert math.isclose(bounds["taylor_term"] + bounds["gradient_mismatch_term"], reference, rel_tol=REL)


def test_running_bound_equals_resummed_bound(monkeypatch):
    ds = blobs(96, seed=0)
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    fit_hf(model, ds, rec, epochs=3)
    strategy = HFUnlearner(model, rec, max_deletions=100, bound="paper", release=ReleaseConfig(noise=False))
    for ids in ([3], [17, 40], [5, 6, 7, 8]):
        check(strategy, ids)

    # a request that fails at its last stage (the ledger write) leaves the running bound as it was
    bound = strategy._bound

    def broken_append(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(strategy.ledger, "append", broken_append)
    rows = rec.A.clone()
    with pytest.raises(RuntimeError, match="disk full"):
        strategy.forget(ForgetRequest.samples([50, 51]))
    assert strategy._bound is bound and bound.deleted == 7
    assert torch.equal(rec.A, rows)  # the vectors are erased only once the ledger entry is written
    monkeypatch.undo()
    check(strategy, [50, 51])  # retried: counted once
    assert not rec.A[[rec.row_of[50], rec.row_of[51]]].any() and rec.A[rec.row_of[52]].any()

    # resume: the recorder restored from its state into a new one, a new strategy (the sum starts from the
    # recorder's deleted rows, then runs again)
    resumed, model2 = TrajectoryRecorder(dtype=torch.float64), sgd_model()
    resumed.load_state_dict(rec.state_dict())
    autodiff.set_flat_params(model2, autodiff.flat_params(model))
    strategy2 = HFUnlearner(model2, resumed, max_deletions=100, bound="paper", release=ReleaseConfig(noise=False))
    for ids in ([60], [61, 62, 63]):
        check(strategy2, ids)

    # a new experience changes the trajectory (every past term decays further): summed again, then running
    fit_hf(model2, blobs(32, seed=1, id_offset=1000), resumed, epochs=1)
    for ids in ([70], [1001, 1002]):
        check(strategy2, ids)
