"""ACU is exact: after any sequence of requests, the head equals ridge retraining on the retained set."""

import torch
from helpers import N_CLASSES, fit_analytic, toy_dataset, toy_tensors

from lightning_unlearn import ACUStrategy, ForgetRequest
from lightning_unlearn.functional import acu

REL_TOL = 1e-8  # float64; observed ~1e-13


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
    strategy = ACUStrategy(model, rec)
    requests = [
        ForgetRequest.samples([0, 5, 17, 250]),
        ForgetRequest.of_class(2),
        ForgetRequest.samples(range(121, 160, 2)),  # odd ids: classes 1 and 3
        ForgetRequest.of_experience(0),
    ]
    for request in requests:
        strategy.forget(request, data)
        W_ref = retrained_head(model, rec, x, y)
        assert rel(rec.W, W_ref) <= REL_TOL
        assert rel(model.head.weight.T, W_ref) <= REL_TOL  # applied in place to the module
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
