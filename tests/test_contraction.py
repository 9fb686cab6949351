"""Contraction-based sensitivities ([derived], docs/certificates.md): the pure bounds against a direct recursion,
and the measured distance to the actual retrain below them across seeds (float64 logistic regression, retrain =
the same recipe and batches without the forgotten samples)."""

import copy
import math
from dataclasses import replace

import pytest
import torch
from helpers_certified import blobs, fit_hf, proximal_model, sgd_model, trainer, without
from torch.utils.data import DataLoader

from lightning_unlearn import ForgetRequest, ReleaseConfig, ReleaseRefused
from lightning_unlearn.callbacks import CCLHessianRecorder, SAFERecorder, TaskOptimality, TrajectoryRecorder
from lightning_unlearn.core.certificate import Certificate
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.functional.bounds import (
    ModelConstants,
    forgetting_chain,
    linear_model_constants,
    max_feature_norm,
    module_constants,
    newton_chain,
    sgd_bound,
)
from lightning_unlearn.unlearners import (
    CCLGradientUnlearner,
    CCLHessianUnlearner,
    HFUnlearner,
    SAFEUnlearner,
)

# float64 throughout: the bound and its direct recursion agree to rounding (a few ulp per step over < 500 steps)
REL = 1e-10


def direct(lrs, sizes, removed, c: ModelConstants, released_before: bool = False) -> tuple[float, float]:
    """The recursions of :func:`sgd_bound`'s docstring written out step by step: ``(D_T, E_T)``."""
    lam, M, G, K = c.strong_convexity, c.smoothness, c.grad_bound, c.hessian_lipschitz
    D = A = E = 0.0
    for eta, B, r in zip(lrs.tolist(), sizes.tolist(), removed.tolist()):
        k = B - r
        f_ret = max(abs(1 - eta * lam * k / B), abs(1 - eta * M * k / B))
        f = max(f_ret, abs(1 - eta * lam), abs(1 - eta * M))
        dtil = 2 * D if released_before else D
        coef = M - lam * k / B if K is None else min(M - lam * k / B, (r * M + k * K * dtil / 2) / B)
        E = f_ret * E + eta * coef * A
        D, A = f * D + eta * r * G / B, f * A + eta * r * G / B
    return D, E


@pytest.mark.parametrize("released_before", [False, True])
@pytest.mark.parametrize("hessian_lipschitz", [None, 40.0])
def test_sgd_bound_equals_the_direct_recursion(hessian_lipschitz, released_before):
    g = torch.Generator().manual_seed(0)
    T = 300
    c = ModelConstants(smoothness=6.0, grad_bound=3.0, strong_convexity=0.5, hessian_lipschitz=hessian_lipschitz)
    lrs = 0.3 * 0.995 ** torch.arange(T, dtype=torch.float64)  # a decaying schedule, always <= 2/(M + lambda)
    sizes = torch.full((T,), 8)
    sizes[19::20] = 3  # each epoch's short last batch
    removed = torch.minimum(torch.randint(0, 3, (T,), generator=g) * (torch.rand(T, generator=g) < 0.1), sizes)
    removed[50] = sizes[50]  # a batch forgotten whole: its retrained step does nothing
    bound = sgd_bound(lrs, sizes, removed, c, released_before=released_before)
    D, E = direct(lrs, sizes, removed, c, released_before)
    assert bound.divergence == pytest.approx(D, rel=REL) and bound.approximation == bound.divergence
    assert bound.second_order == pytest.approx(E, rel=REL)
    assert bound.sensitivity == min(2 * bound.divergence, bound.second_order)


def test_sgd_bound_of_one_occurrence_is_the_contracted_injection():
    """One removed sample at step t0 of a constant-rate run: ``D_T = (eta G/|B|) (1 - eta lambda)^(T - 1 - t0)``."""
    c = ModelConstants(smoothness=4.0, grad_bound=2.0, strong_convexity=0.25)
    T, t0, eta, B = 400, 123, 0.1, 16
    removed = torch.zeros(T, dtype=torch.long)
    removed[t0] = 1
    bound = sgd_bound(torch.full((T,), eta, dtype=torch.float64), torch.full((T,), B), removed, c)
    expected = eta * 2.0 / B * (1 - eta * 0.25) ** (T - 1 - t0)
    assert bound.divergence == pytest.approx(expected, rel=REL)
    assert math.isfinite(
        sgd_bound(torch.full((T,), 3.0, dtype=torch.float64), torch.full((T,), B), removed, c).divergence
    )


# -- HF: measured distance to the retrained trajectory ----------------------------------------------------------------
def replay_steps(model, rec: TrajectoryRecorder, theta, data: dict, removed: set[int], steps: range) -> torch.Tensor:
    """[HF] Eqs. (4)-(5) over ``steps``: the recorded batches and step sizes, the removed samples left out and each
    sum still divided by the recorded ``|B_t|``, from ``theta`` (an independent float64 loop over the batches)."""
    loss = autodiff.ModuleLoss(model, rec.l2)
    occ_rows, occ_steps = rec.occurrences()
    for t in steps:
        ids = [rec.row_ids[r] for r in occ_rows[occ_steps == t].tolist() if rec.row_ids[r] not in removed]
        if ids:
            x = torch.stack([data[i][0] for i in ids])
            y = torch.stack([data[i][1] for i in ids])
            theta = theta - rec.lrs[t] / rec.batch_sizes[t] * autodiff.per_sample_grads(loss, theta, x, y).sum(0)
    return theta


def table(*datasets) -> dict:
    return {int(i): (x, y) for ds in datasets for (x, y, i) in ds}


@pytest.mark.parametrize("seed", range(4))
def test_hf_distance_to_retrain_stays_below_the_contraction_bound(seed):
    ds = blobs(96, seed=seed)
    model = sgd_model(lr=0.1, l2=0.1)
    c = module_constants(model, [ds.dataset.tensors[0]])
    assert 0.1 <= c.max_lr  # the recipe meets the condition: the bound is a contraction
    rec = TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, ds, rec, epochs=4)
    w = autodiff.flat_params(model)
    strategy = HFUnlearner(model, rec, constants=c, release=ReleaseConfig(noise=False))
    forgotten: set[int] = set()
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(96, generator=g).tolist()
    for ids in (order[:1], order[1:5], order[5:6]):  # single, batched, single: the bound covers all so far
        cert = strategy.forget(ForgetRequest.samples(ids)).certificate
        forgotten |= set(ids)
        retrain = replay_steps(model, rec, w0, table(ds), forgotten, range(rec.n_steps))
        b = cert.bounds
        assert float((strategy.clean_parameters() - retrain).norm()) <= b["sensitivity"]
        assert float((w - retrain).norm()) <= b["divergence"]  # the retrained trajectory's distance, D_T
        assert float((strategy.clean_parameters() - w).norm()) <= b["approximation"]  # ||a^{-U}||, A_T
        assert b["sensitivity"] == b["contraction_sensitivity"] <= b["paper_sensitivity"]
        assert cert.recipe == "checked" and cert.constants == "bounded"
        assert any(a.startswith("checked: every recorded step size <= 2/(M + lambda)") for a in cert.assumptions)


def test_replay_sgd_is_the_recorded_sgd_and_the_reference_retrain():
    """:func:`hf.replay_sgd` (the tradeoff benchmark's same-batches retrain) over the recorded batches reproduces the
    fit (float64: 1e-12), and without some samples equals the step-by-step reference above."""
    ds = blobs(48, seed=2)
    model = sgd_model(lr=0.1, l2=0.1)
    rec = TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, ds, rec, epochs=2)
    data, loss = table(ds), autodiff.ModuleLoss(model, rec.l2)
    occ_rows, occ_steps = rec.occurrences()

    def batches(removed: set[int]) -> list:
        out = []
        for t in range(rec.n_steps):
            ids = [rec.row_ids[r] for r in occ_rows[occ_steps == t].tolist() if rec.row_ids[r] not in removed]
            out.append((torch.stack([data[i][0] for i in ids]), torch.stack([data[i][1] for i in ids])))
        return out

    full = hf.replay_sgd(loss, w0, batches(set()), rec.lrs, rec.batch_sizes)
    assert torch.allclose(full, autodiff.flat_params(model), rtol=0, atol=1e-12)
    less = hf.replay_sgd(loss, w0, batches({1, 2, 30}), rec.lrs, rec.batch_sizes)
    reference = replay_steps(model, rec, w0, data, {1, 2, 30}, range(rec.n_steps))
    assert torch.allclose(less, reference, rtol=0, atol=1e-12) and not torch.allclose(less, full)


def test_hf_bound_covers_training_continued_from_a_published_model():
    """Request, learn a new experience from the noised model, request again: the retrain reference takes the same
    published noise at the same step (the coupled reference of docs/certificates.md) and the bound still holds."""
    first, second = blobs(64, seed=5), blobs(32, seed=6, id_offset=1000)
    model = sgd_model(lr=0.1, l2=0.1)
    c = module_constants(model, [first.dataset.tensors[0], second.dataset.tensors[0]])
    rec = TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, first, rec, epochs=3)
    steps = rec.n_steps
    strategy = HFUnlearner(
        model, rec, constants=c, release=ReleaseConfig(epsilon=20.0, delta=1e-5, seed=7)
    )  # seeded: test only
    strategy.forget(ForgetRequest.samples([3, 9]))
    noise = autodiff.flat_params(model) - strategy.clean_parameters()
    assert float(noise.norm()) > 0
    fit_hf(model, second, rec, epochs=2)  # learning continues from the published (noised) model
    cert = strategy.forget(ForgetRequest.samples([20, 1005])).certificate
    removed, data = {3, 9, 20, 1005}, table(first, second)
    retrain = replay_steps(model, rec, w0, data, removed, range(steps)) + noise
    retrain = replay_steps(model, rec, retrain, data, removed, range(steps, rec.n_steps))
    assert float((strategy.clean_parameters() - retrain).norm()) <= cert.bounds["sensitivity"]
    assert any("training continued after an earlier release" in a for a in cert.assumptions)


def test_hf_step_size_above_the_condition_is_refused_and_the_recipe_named():
    ds = blobs(48, seed=1)
    model = sgd_model(lr=0.1, l2=0.1)
    rec = TrajectoryRecorder(dtype=torch.float64)
    fit_hf(model, ds, rec, epochs=1)
    c = linear_model_constants(12.0, 0.1)  # a larger feature norm: 2/(M + lambda) = 0.02751 < lr = 0.1
    weights = autodiff.flat_params(model)
    refusal = r"refuses a certified release: step size lr = 0.1 exceeds .* lr <= 0.02751 "
    with pytest.raises(ReleaseRefused, match=refusal):
        HFUnlearner(model, rec, constants=c).forget(ForgetRequest.samples([1]))
    assert torch.equal(autodiff.flat_params(model), weights) and not bool(rec.catalog.forgotten.any())
    with pytest.warns(UserWarning, match="not certified"):
        cert = (
            HFUnlearner(model, rec, constants=c, release=ReleaseConfig(noise=False))
            .forget(ForgetRequest.samples([1]))
            .certificate
        )
    assert cert.recipe == "unchecked" and not cert.certified
    assert any(a.startswith("FAILS: step size lr = 0.1") and "lr <= 0.02751 " in a for a in cert.assumptions)


# -- [CCL]: measured distance to the retrained chain of proximal tasks ------------------------------------------------
def fit_chain(tasks, callbacks) -> object:
    model = proximal_model()
    for k, ds in enumerate(tasks):
        for cb in callbacks:
            if isinstance(cb, CCLHessianRecorder):
                cb.experience = k
        trainer(callbacks, max_epochs=2).fit(model, DataLoader(ds, batch_size=len(ds)))
    return model


@pytest.mark.parametrize("seed", range(3))
def test_ccl_distances_to_retrain_stay_below_the_contraction_bounds(seed):
    """Three proximal tasks solved by L-BFGS (residual <= 1e-5, checked); four samples of the middle task, then the
    whole first task, forgotten; each method's internal model against the chain retrained on what is left."""
    tasks = [blobs(60, seed=10 * seed + k, shift=0.3 * k, id_offset=100 * k) for k in range(3)]
    norm = max(max_feature_norm(torch.nn.Identity(), [ds.dataset.tensors[0]]) for ds in tasks)
    c = linear_model_constants(norm, 0.05)  # [CCL]'s first anchor w_0 = 0: init_norm 0
    rec, check = CCLHessianRecorder(hessian="exact", store_sample_gradients=True), TaskOptimality(1e-5)
    model = fit_chain(tasks, [rec, check])
    assert check.problem(3) is None
    U = [101, 107, 115, 130]
    requests = (
        (ForgetRequest.samples(U), [tasks[0], without(tasks[1], set(U)), tasks[2]]),
        (ForgetRequest.of_experience(0), [without(tasks[1], set(U)), tasks[2]]),
    )
    for cls in (CCLGradientUnlearner, CCLHessianUnlearner):
        strategy = cls(
            copy.deepcopy(model), copy.deepcopy(rec), constants=c, optimality=check, release=ReleaseConfig(noise=False)
        )
        for request, kept in requests:
            cert = strategy.forget(request).certificate
            ref_check = TaskOptimality(1e-5)
            retrain = autodiff.flat_params(fit_chain(kept, [ref_check]))
            assert ref_check.problem(len(kept)) is None
            # the retrain itself is within len(kept) * tau/(mu + lambda) of the exact retrained chain
            slack = len(kept) * 1e-5 / (0.05 + 1.0)
            gap = float((strategy.clean_parameters() - retrain).norm())
            assert gap <= cert.bounds["sensitivity"] + slack, (cls.__name__, gap, cert.bounds["sensitivity"])
            assert cert.recipe == "checked" and any(
                a.startswith("checked: every task solved") for a in cert.assumptions
            )
            assert cert.bounds["sensitivity"] == cert.bounds["contraction_sensitivity"]


def test_chain_bounds_of_one_partial_task_are_the_strong_convexity_terms():
    c = linear_model_constants(3.0, 0.5)
    lam, tol, n, m = 2.0, 1e-6, 50, 5
    kappa, q = 0.5 + lam, m / (n - m)
    assert forgetting_chain([n], [m], [0.0], c, lam, tol) == [
        pytest.approx(2 * m * c.data_lipschitz / (n * kappa) + tol / kappa, rel=1e-14)
    ]
    # first order (no K): the Newton step's gradient bound times the spread of the inverses, plus the residual
    first = q * (2 * c.data_lipschitz + tol) * (1 / kappa - 1 / (c.smoothness + lam)) + (1 + q) * tol / kappa
    assert newton_chain([n], [m], [0.0], replace(c, hessian_lipschitz=None), lam, tol) == pytest.approx(
        first, rel=1e-14
    )
    assert newton_chain([n], [m], [0.0], c, lam, tol) <= first  # the second-order form can only tighten it


# -- [SAFE]: the served step from w_0 against the SGD retrain ---------------------------------------------------------
def test_safe_contraction_bound_covers_the_retrained_sgd_recipe():
    ds = blobs(96, seed=3)
    model = sgd_model(lr=0.1, l2=0.1)
    c = module_constants(model, [ds.dataset.tensors[0]])
    rec, srec = TrajectoryRecorder(dtype=torch.float64), SAFERecorder(3, seed=0)
    w0 = autodiff.flat_params(model).clone()
    loader = DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([rec, srec], max_epochs=4).fit(model, loader)
    forgotten: set[int] = set()
    certified = SAFEUnlearner(
        copy.deepcopy(model),
        copy.deepcopy(srec),
        constants=c,
        trajectory=rec,
        release=ReleaseConfig(epsilon=1.0, delta=1e-5),
    )
    plain = SAFEUnlearner(copy.deepcopy(model), copy.deepcopy(srec))  # the same step without noise
    for ids in ([4, 8], [15]):
        cert = certified.forget(ForgetRequest.samples(ids), data=ds).certificate
        plain.forget(ForgetRequest.samples(ids), data=ds)
        forgotten |= set(ids)
        retrain = replay_steps(model, rec, w0, table(ds), forgotten, range(rec.n_steps))
        served = autodiff.flat_params(plain.module)
        assert float((served - retrain).norm()) <= cert.bounds["sensitivity"]
        assert cert.bounds["sensitivity"] == pytest.approx(cert.bounds["divergence"] + cert.bounds["step_size"])
        assert cert.bounds["sensitivity"] < 2 * cert.bounds["W"]  # far below Theorem 2(iii)'s 2W here
        assert cert.certified and cert.recipe == "checked"


def test_certificates_of_old_ledger_entries_load_without_assumptions():
    old = Certificate(method="hf", exact=False, epsilon=1.0, delta=1e-5, sigma=2.0, constants="bounded").to_dict()
    del old["assumptions"]
    assert Certificate.from_dict(old).assumptions == [] and Certificate.from_dict(old).certified
