"""ACU is exact: after any sequence of requests, the head equals ridge retraining on the retained set."""

import pytest
import torch
from helpers import N_CLASSES, analytic_model, fit_analytic, toy_dataset, toy_tensors

from lightning_unlearn import ACUUnlearner, AnalyticRecorder, ForgetRequest, Ledger
from lightning_unlearn.functional import acu

# float64 throughout: a ridge solve's relative forward error is ~ eps * kappa, kappa = cond(R + gamma I) ~ 1e3 on
# this data (<= (tr R + gamma) / gamma ~ 1.5e3), so ACU and retraining agree to ~1e-13; the bound allows 500x that
REL_TOL = 1e-10


def retrained_head(model, recorder, x, y):
    """The gold standard: ridge solution recomputed from scratch on the retained samples (eq. 8)."""
    keep = recorder.catalog.active_ids()
    F = model.features(x[keep])
    return acu.ridge_solution(F.T @ F, F.T @ acu.one_hot(y[keep], N_CLASSES), recorder.ridge)[1]


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_sequence_of_requests_matches_retraining_from_scratch():
    experiences = [toy_dataset(100, seed=s, id_offset=100 * s) for s in range(3)]
    model, rec = fit_analytic(experiences)
    x = torch.cat([toy_tensors(100, s)[0] for s in range(3)])
    y = torch.cat([toy_tensors(100, s)[1] for s in range(3)])
    data = torch.utils.data.ConcatDataset(experiences)
    strategy = ACUUnlearner(model, rec)
    requests = [
        ForgetRequest.samples([0, 5, 17, 250]),
        ForgetRequest.of_class(2),
        ForgetRequest.samples(range(121, 160, 2)),  # odd ids: classes 1 and 3
        ForgetRequest.of_experience(0),
    ]
    paths = set()
    for request in requests:
        paths.add(strategy.forget(request, data).extra["path"])
        W_ref = retrained_head(model, rec, x, y)
        assert rel(rec.W, W_ref) <= REL_TOL
        assert rel(model.head.weight.detach().T, W_ref) <= REL_TOL  # applied in place to the module
    assert paths == {"woodbury", "resolve"}  # 4 samples by eq. (5)/(6); the class (75) by a re-solve
    # the retrained model and the unlearned one predict identically, so forget-set accuracy matches
    forgotten = rec.catalog.ids[rec.catalog.forgotten]
    feats = model.features(x[forgotten])
    assert torch.equal((feats @ rec.W).argmax(-1), (feats @ W_ref).argmax(-1))
    assert rec.catalog.n_active == 300 - int(rec.catalog.forgotten.sum())
    assert not bool(((rec.catalog.labels == 2) & ~rec.catalog.forgotten).any())


def test_one_experience_equals_five():
    """Continual learning == joint learning (ACU Appendix C, Lemma 4)."""
    parts = [toy_dataset(60, seed=s, id_offset=60 * s) for s in range(5)]
    _, rec5 = fit_analytic(parts)
    _, rec1 = fit_analytic([torch.utils.data.ConcatDataset(parts)])
    for name in ("R", "Q", "T", "W"):
        assert rel(getattr(rec5, name), getattr(rec1, name)) <= 1e-10, name
    assert sorted(rec5.catalog.experiences.unique().tolist()) == [0, 1, 2, 3, 4]


def test_functional_forget_large_block_and_single_sample():
    g = torch.Generator().manual_seed(0)
    F, labels = torch.randn(500, 64, generator=g, dtype=torch.float64), torch.randint(0, 5, (500,), generator=g)
    Y = acu.one_hot(labels, 5)
    T, W = acu.ridge_solution(F.T @ F, F.T @ Y, 2.0)
    for rows in (torch.arange(1), torch.arange(1, 201)):  # one sample, then a block of 200 > d_F
        T, W = acu.forget(T, W, F[rows], Y[rows])
    keep = torch.arange(201, 500)
    T_ref, W_ref = acu.ridge_solution(F[keep].T @ F[keep], F[keep].T @ Y[keep], 2.0)
    assert rel(W, W_ref) <= REL_TOL and rel(T, T_ref) <= REL_TOL


def test_forgetting_twice_via_the_math_is_caught():
    g = torch.Generator().manual_seed(1)
    F = torch.randn(20, 8, generator=g, dtype=torch.float64)
    Y = acu.one_hot(torch.zeros(20, dtype=torch.long), 2)
    T, W = acu.ridge_solution(F.T @ F, F.T @ Y, 1e-6)
    T, W = acu.forget(T, W, F, Y)
    try:
        acu.forget(T, W, F * 10, Y)
    except ValueError as err:
        assert "not positive definite" in str(err)
    else:  # pragma: no cover
        raise AssertionError("removing unlearned features must fail")


class FailingLedger(Ledger):
    """A ledger whose write fails (disk full), optionally after reading the recorder's statistics."""

    def __init__(self, read: AnalyticRecorder | None = None) -> None:
        super().__init__()
        self.read = read

    def append(self, result, module, recorder=None):
        if self.read is not None:
            self.read.T, self.read.R  # noqa: B018  (applies the held updates before the failure)
        raise OSError("disk full")


def statistics_of(rec):
    return {k: getattr(rec, k).clone() for k in "RQTW"}


def test_failed_commit_leaves_statistics_bit_identical_and_the_retry_is_exact():
    data = toy_dataset(120)
    model, rec = fit_analytic([data])
    ACUUnlearner(model, rec).forget(ForgetRequest.samples([7]), data)  # a committed request before
    before, head = statistics_of(rec), model.head.weight.detach().clone()
    with pytest.raises(OSError, match="disk full"):
        ACUUnlearner(model, rec, FailingLedger()).forget(ForgetRequest.samples([1, 2]), data)
    for k, v in before.items():
        assert torch.equal(getattr(rec, k), v), k  # the held rank-k update was dropped: bit for bit
    assert torch.equal(model.head.weight, head) and rec.catalog.n_active == 119
    result = ACUUnlearner(model, rec).forget(ForgetRequest.samples([1, 2]), data)
    assert result.extra["path"] == "woodbury"
    x, y = toy_tensors(120)
    assert rel(rec.W, retrained_head(model, rec, x, y)) <= REL_TOL


def test_undo_after_the_update_was_applied_takes_it_back_up_to_rounding():
    """If T and R (so Q) were read inside the commit, the undo takes the rank-k updates back (a few ulps)."""
    data = toy_dataset(120)
    model, rec = fit_analytic([data])
    before = statistics_of(rec)
    with pytest.raises(OSError, match="disk full"):
        ACUUnlearner(model, rec, FailingLedger(read=rec)).forget(ForgetRequest.samples([1, 2]), data)
    eps = torch.finfo(torch.float64).eps
    for k in "RQT":  # two roundings of |X| + |update| per entry; the update is below 1e3 |X| here
        scale = before[k].abs().max()
        assert float((getattr(rec, k) - before[k]).abs().max()) <= 4 * eps * 1e3 * scale, k
    assert torch.equal(rec.W, before["W"])
    assert rec.catalog.n_active == 120


def test_r_is_brought_up_to_date_lazily_and_held_rows_never_reach_the_state():
    data = toy_dataset(120)
    model, rec = fit_analytic([data])
    strategy = ACUUnlearner(model, rec)
    strategy.forget(ForgetRequest.samples([3, 4]), data)
    assert rec._pending_rows and rec._pending_targets and rec._pending_T is not None  # held, not yet applied
    state = rec.state_dict()
    assert not rec._pending_rows and not rec._pending_targets and rec._pending_T is None  # written up to date
    keep = rec.catalog.active_ids()
    x, y = toy_tensors(120)
    F = model.features(x[keep])
    assert rel(state["R"], F.T @ F) <= 1e-13  # float64 sums of 118 products, reordered
    Y = torch.nn.functional.one_hot(y[keep], state["Q"].shape[1]).to(F)
    assert rel(state["Q"], F.T @ Y) <= 1e-13
    assert set(state) >= {"R", "Q", "T", "W"}


def test_analytic_features_are_float64_and_do_not_depend_on_the_batch():
    """The frozen backbone runs in float64: a sample's features alone or in a batch of 64 agree to float64 rounding."""
    model = analytic_model()
    x, _ = toy_tensors(64)
    batch, alone = model.features(x), torch.cat([model.features(x[i : i + 1]) for i in range(64)])
    assert batch.dtype == torch.float64
    # a few float64 roundings through 3 layers of width <= 48: far below float32's 1e-7
    assert float((batch - alone).abs().max() / batch.abs().max()) <= 64 * torch.finfo(torch.float64).eps
