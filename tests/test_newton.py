"""[NS] and [IJ] ([HF] Eqs. (15), (16)): the functional updates, their noise bounds, the recorder and the strategies.

Exactness is checked in float64 on a small L2-regularised softmax regression solved to its minimiser
by full-batch L-BFGS (gradient norm below 1e-12), against formulas computed independently with
``torch.autograd.functional.hessian``; "1e-10" tolerances are float64 rounding over a 21 x 21 solve.
"""

import math

import pytest
import torch
from helpers_certified import D_IN, N_CLASSES, blobs, recorded, same_state, sgd_model, trainer, without
from torch import nn
from torch.autograd.functional import hessian
from torch.utils.data import ConcatDataset, DataLoader

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import HessianSumRecorder
from lightning_unlearn.functional import autodiff, newton
from lightning_unlearn.functional.bounds import linear_model_constants
from lightning_unlearn.privacy import analytic_sigma
from lightning_unlearn.unlearners import InfinitesimalJackknifeUnlearner, NewtonStepUnlearner

N, K, L2 = 60, N_CLASSES, 0.1


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(N) % K
    x = torch.randn(K, D_IN, generator=g, dtype=torch.float64)[y] + torch.randn(
        N, D_IN, generator=g, dtype=torch.float64
    )
    return x, y


def objective(module: nn.Module, x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``sum_i CE_i + (l2/2) n ||theta||^2``: the SUM of the per-sample losses, written out independently."""
    out = torch.func.functional_call(module, autodiff.unflatten(theta, autodiff.param_spec(module)), (x,))
    return nn.functional.cross_entropy(out, y, reduction="sum") + 0.5 * L2 * len(x) * theta.pow(2).sum()


def minimiser(x: torch.Tensor, y: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Linear(D_IN, K).double()
    theta = autodiff.flat_params(module).requires_grad_(True)
    opt = torch.optim.LBFGS([theta], lr=1, max_iter=500, tolerance_grad=1e-14, tolerance_change=0, history_size=50)

    def closure():
        opt.zero_grad()
        loss = objective(module, x, y, theta) / len(x)
        loss.backward()
        return loss

    opt.step(closure)
    theta = theta.detach()
    grad = torch.autograd.grad(objective(module, x, y, theta.requires_grad_(True)), theta)[0]
    assert float(grad.norm()) / len(x) < 1e-12  # the exact minimiser [NS] assumes
    autodiff.set_flat_params(module, theta)
    return module, theta.detach()


@pytest.fixture(scope="module")
def problem():
    x, y = data()
    module, theta = minimiser(x, y)
    forget = torch.tensor([0, 5, 7])
    keep = torch.tensor([i for i in range(N) if i not in forget.tolist()])
    _, retrained = minimiser(x[keep], y[keep])
    return module, theta, x, y, forget, keep, retrained


def independent_hessian(module, x, y, theta):
    return hessian(lambda t: objective(module, x, y, t), theta)


def test_hessian_sum_matches_autograd(problem):
    module, theta, x, y, *_ = problem
    loss = autodiff.ModuleLoss(module, L2)
    got = newton.hessian_sum(loss, theta, x, y, chunk_size=16)
    assert torch.allclose(got, independent_hessian(module, x, y, theta), atol=1e-10)
    assert torch.count_nonzero(newton.hessian_sum(loss, theta, x[:0], y[:0])) == 0


@pytest.mark.parametrize("damping", [0.0, 0.01])
def test_newton_step_is_eq15_and_moves_towards_retraining(problem, damping):
    module, theta, x, y, forget, keep, retrained = problem
    loss = autodiff.ModuleLoss(module, L2)
    H_all = newton.hessian_sum(loss, theta, x, y)
    H_u = newton.hessian_sum(loss, theta, x[forget], y[forget])
    G = autodiff.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    solve = newton.newton_step(H_all - H_u, len(keep), G, damping)
    step = solve.step
    assert solve.definite and solve.iterations == 0  # no preconditioner: the direct (Cholesky) solve
    # Eq. (15) written out: w + 1/(n-m) (1/(n-m) sum_{retained} H_i + c I)^{-1} sum_U grad l(w; u)
    n_m = len(keep)
    H_ret = independent_hessian(module, x[keep], y[keep], theta)
    # at the full-data minimiser the forgotten gradients sum to minus the retained ones
    t = theta.clone().requires_grad_(True)
    G_ind = -torch.autograd.grad(objective(module, x[keep], y[keep], t), t)[0]
    expected = torch.linalg.solve(H_ret / n_m + damping * torch.eye(len(theta), dtype=theta.dtype), G_ind) / n_m
    assert torch.allclose(step, expected, atol=1e-10)
    original = float((theta - retrained).norm())
    unlearned = float((theta + step - retrained).norm())
    assert unlearned < 0.1 * original, (unlearned, original)  # one Newton step: quadratically closer


def test_gauss_newton_sum_is_the_hessian_of_an_affine_module_only(problem):
    module, theta, x, y, *_ = problem
    loss = autodiff.ModuleLoss(module, L2)
    got = newton.gauss_newton_sum(loss, theta, x, y)  # a linear model: its output is affine in theta
    assert got is not None and torch.allclose(got, independent_hessian(module, x, y, theta), atol=1e-10)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(D_IN, 6), nn.Tanh(), nn.Linear(6, K)).double()  # not affine: J^T S J is not H
    theta_mlp = autodiff.flat_params(mlp)
    mlp_loss = autodiff.ModuleLoss(mlp, L2)
    assert newton.gauss_newton_sum(mlp_loss, theta_mlp, x[:4], y[:4]) is None
    exact = hessian(lambda t: objective(mlp, x[:4], y[:4], t), theta_mlp)  # hessian_sum falls back to HVPs
    assert torch.allclose(newton.hessian_sum(mlp_loss, theta_mlp, x[:4], y[:4]), exact, atol=1e-10)


def test_preconditioned_newton_step_is_the_dense_solve_request_after_request(problem):
    """[NS] over 30 one-sample requests (m up to n/2): conjugate gradients preconditioned by the full damped inverse
    give the dense solve of Eq. (15) to float64 rounding (relative 1e-10: a few hundred ulp through the condition
    number of a 21 x 21 system), each from the previous step."""
    module, theta, x, y, *_ = problem
    loss = autodiff.ModuleLoss(module, L2)
    H = newton.hessian_sum(loss, theta, x, y)
    inverse, definite = newton.jackknife_inverse(H, N, 0.01)
    assert definite
    grads = autodiff.per_sample_grads(loss, theta, x, y)
    retained, G, step = H.clone(), torch.zeros_like(theta), None
    for m in range(1, N // 2 + 1):
        u = m - 1
        retained -= newton.hessian_sum(loss, theta, x[u : u + 1], y[u : u + 1])
        G += grads[u]
        solve = newton.newton_step(retained, N - m, G, 0.01, inverse, step)
        dense = torch.linalg.solve(retained + 0.01 * (N - m) * torch.eye(len(theta), dtype=theta.dtype), G)
        assert solve.iterations > 0 and solve.definite is None  # CG: definiteness not checked
        assert float((solve.step - dense).norm()) <= 1e-10 * float(dense.norm()), m
        step = solve.step


def test_newton_step_falls_back_to_the_factorisation(problem, monkeypatch):
    module, theta, x, y, forget, keep, _ = problem
    loss = autodiff.ModuleLoss(module, L2)
    H = newton.hessian_sum(loss, theta, x, y)
    inverse, _ = newton.jackknife_inverse(H, N, 0.01)
    H_ret = newton.hessian_sum(loss, theta, x[keep], y[keep])
    G = autodiff.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    direct = newton.newton_step(H_ret, len(keep), G, 0.01)
    monkeypatch.setattr(newton, "MAX_CG_ITERATIONS", 1)  # too few iterations: the factorisation instead
    fallback = newton.newton_step(H_ret, len(keep), G, 0.01, inverse)
    assert fallback.iterations == 0 and fallback.definite and torch.equal(fallback.step, direct.step)
    indefinite = -torch.eye(len(theta), dtype=theta.dtype)  # CG meets negative curvature: LU, flagged
    solve = newton.newton_step(indefinite, 10, G, 0.01, inverse)
    assert solve.iterations == 0 and solve.definite is False
    assert torch.allclose(solve.step, G / (-1 + 0.01 * 10), atol=1e-12)


def test_newton_step_within_its_noise_bound(problem):
    module, theta, x, y, forget, keep, retrained = problem
    loss = autodiff.ModuleLoss(module, L2)
    H_ret = newton.hessian_sum(loss, theta, x[keep], y[keep])
    G = autodiff.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    feature_norm = float(x.norm(dim=1).max())
    c = linear_model_constants(feature_norm, L2)
    M = newton.hessian_lipschitz_bound(feature_norm)
    for damping in (0.0, 0.01):
        gap = float((theta + newton.newton_step(H_ret, len(keep), G, damping).step - retrained).norm())
        bound = newton.newton_sensitivity(len(forget), N, c.grad_bound, L2, M, damping)
        assert gap <= bound["sensitivity"]
        inverse, _ = newton.jackknife_inverse(newton.hessian_sum(loss, theta, x, y), N, damping)
        gap_ij = float((theta + newton.jackknife_step(inverse, N, G) - retrained).norm())
        assert (
            gap_ij
            <= newton.jackknife_sensitivity(len(forget), N, c.grad_bound, c.smoothness, L2, M, damping)["sensitivity"]
        )


def test_jackknife_is_eq16(problem):
    module, theta, x, y, forget, *_ = problem
    loss = autodiff.ModuleLoss(module, L2)
    inverse, _ = newton.jackknife_inverse(newton.hessian_sum(loss, theta, x, y), N, 0.01)
    G = autodiff.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    H = independent_hessian(module, x, y, theta)
    expected = torch.linalg.solve(H / N + 0.01 * torch.eye(len(theta), dtype=theta.dtype), G) / N
    assert torch.allclose(newton.jackknife_step(inverse, N, G), expected, atol=1e-10)


def test_sensitivities_written_out():
    m, n, L, beta, lam, M, c = 3, 60, 2.0, 5.0, 0.1, 4.0, 0.01
    ns = newton.newton_sensitivity(m, n, L, lam, M, c)
    assert ns["taylor_term"] == pytest.approx(2 * M * m**2 * L**2 / (lam**3 * n**2), rel=1e-14)
    assert ns["damping_term"] == pytest.approx(c * m * L / ((n - m) * lam * (lam + c)), rel=1e-14)
    ij = newton.jackknife_sensitivity(m, n, L, beta, lam, M, c)
    assert ij["hessian_term"] == pytest.approx(m**2 * beta * L / (lam**2 * n * (n - m)), rel=1e-14)
    assert ij["sensitivity"] == pytest.approx(
        ns["taylor_term"] + ij["hessian_term"] + c * m * L / (n * lam * (lam + c))
    )
    assert math.isinf(newton.newton_sensitivity(31, 60, L, lam, M, c)["sensitivity"])  # m > n/2: outside the lemma
    assert math.isinf(newton.jackknife_sensitivity(1, 60, L, beta, 0.0, M, c)["sensitivity"])  # no strong convexity


def test_hessian_lipschitz_bound_holds_on_random_pairs():
    g = torch.Generator().manual_seed(1)
    module = nn.Linear(5, 4).double()
    loss = autodiff.ModuleLoss(module, 0.0)
    x = torch.randn(5, dtype=torch.float64, generator=g) * 3
    y = torch.tensor(2)
    M = newton.hessian_lipschitz_bound(float(x.norm()))
    for _ in range(20):
        a = torch.randn(24, dtype=torch.float64, generator=g)
        b = a + torch.randn(24, dtype=torch.float64, generator=g) * 0.3
        Ha, Hb = (newton.hessian_sum(loss, t, x[None], y[None]) for t in (a, b))
        assert float(torch.linalg.matrix_norm(Ha - Hb, ord=2)) <= M * float((a - b).norm())


def test_dense_memory_refused_naming_d():
    with pytest.raises(ValueError, match=r"d = 11,000,000 parameters need 450,760\.[0-9]+ GiB"):
        newton.check_dense(11_000_000, torch.float32, 2**33, "NS")
    newton.check_dense(100, torch.float64, 2**20, "NS")  # 80,000 bytes: fine


def test_indefinite_damped_hessian_is_solved_and_flagged():
    H = torch.diag(torch.tensor([-1.0, 2.0], dtype=torch.float64))  # curvature -1 below -damping
    x, definite = newton.solve_damped(H, 0.01, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert not definite and torch.allclose(x, torch.tensor([1 / -0.99, 1 / 2.01], dtype=torch.float64))
    with pytest.raises(ValueError, match="singular"):
        newton.solve_damped(-0.01 * torch.eye(2, dtype=torch.float64), 0.01, torch.ones(2, dtype=torch.float64))


# -- the recorder and the strategies on a Lightning fit ----------------------------------------------------
LR_FIT, EPOCHS, STEPS, FORGET = 0.5, 20, 10, [3, 10, 17]


def fit_lr(ds, *recorders):
    """Full-batch gradient descent on the L2-regularised softmax regression, near its minimiser: 200 steps, each
    epoch yielding the whole set STEPS times (the recorder skips ids it has seen in the fit)."""
    model = sgd_model(lr=LR_FIT, l2=L2)
    loader = DataLoader(ConcatDataset([ds] * STEPS), batch_size=len(ds))
    trainer(list(recorders), max_epochs=EPOCHS).fit(model, loader)
    return model


@pytest.fixture(scope="module")
def lightning_fit():
    ds = blobs(N, seed=0)
    recorders = {form: HessianSumRecorder(form=form) for form in ("hessian", "inverse")}
    model = fit_lr(ds, *recorders.values())  # one fit, both recorders
    retrained = autodiff.flat_params(fit_lr(without(ds, set(FORGET))))
    return ds, model, recorders, retrained


def fresh(lightning_fit, form):
    ds, trained, recorders, _ = lightning_fit
    model = sgd_model(lr=LR_FIT, l2=L2)
    model.load_state_dict(trained.state_dict())
    rec = HessianSumRecorder(form=form)
    rec.load_state_dict(recorders[form].state_dict())  # the state_dict round trip
    return ds, model, rec


def eq15_16(ds, theta, forget, form, damping=0.01):
    """[HF] Eqs. (15)/(16) written out with autograd Hessians of the per-sample losses at the recorded model."""
    x, y = ds.dataset.tensors
    module = nn.Linear(D_IN, N_CLASSES).double()
    gone = torch.tensor([i in forget for i in ds.ids.tolist()])
    t = theta.clone().requires_grad_(True)
    G = torch.autograd.grad(objective(module, x[gone], y[gone], t), t)[0]
    n = len(x) if form == "inverse" else int((~gone).sum())
    H = independent_hessian(module, x if form == "inverse" else x[~gone], y if form == "inverse" else y[~gone], theta)
    return theta + torch.linalg.solve(H / n + damping * torch.eye(len(theta), dtype=theta.dtype), G) / n


@pytest.mark.parametrize("form", ["hessian", "inverse"])
def test_strategy_is_its_equation_and_moves_towards_retraining(lightning_fit, form):
    ds, model, rec = fresh(lightning_fit, form)
    retrained = lightning_fit[3]
    assert rec.stationarity < rec.tolerance and rec.n == N and rec.l2 == L2  # GD reached the minimiser [NS] assumes
    original = autodiff.flat_params(model)
    cls = NewtonStepUnlearner if form == "hessian" else InfinitesimalJackknifeUnlearner
    strategy = cls(model, rec, release=ReleaseConfig(noise=False))
    result = strategy.forget(ForgetRequest.samples(FORGET), data=ds)
    expected = eq15_16(ds, original, set(FORGET), form)
    # float64 rounding of a 21 x 21 solve; the published model is the clean one without noise
    assert torch.allclose(autodiff.flat_params(model), expected, atol=1e-10)
    assert torch.equal(autodiff.flat_params(model), strategy.clean_parameters())
    before, after = float((original - retrained).norm()), float((expected - retrained).norm())
    # damping 0.01 next to lambda = 0.1 alone shifts the step by about c/(lambda + c) = 9%
    assert after < 0.3 * before, (after, before)
    assert not result.certificate.certified and result.certificate.epsilon is None  # noise off: not certified


@pytest.mark.parametrize("form", ["hessian", "inverse"])
def test_requests_one_by_one_equal_one_batch(lightning_fit, form):
    cls = NewtonStepUnlearner if form == "hessian" else InfinitesimalJackknifeUnlearner
    ds, m1, r1 = fresh(lightning_fit, form)
    s1 = cls(m1, r1, release=ReleaseConfig(noise=False))
    for i in FORGET:
        s1.forget(ForgetRequest.samples([i]), data=ds)
    ds, m2, r2 = fresh(lightning_fit, form)
    cls(m2, r2, release=ReleaseConfig(noise=False)).forget(ForgetRequest.samples(FORGET), data=ds)
    # every request recomputes the step from w for all samples forgotten so far: float64 rounding only
    assert torch.allclose(autodiff.flat_params(m1), autodiff.flat_params(m2), atol=1e-12)
    assert torch.allclose(r1.matrix, r2.matrix, atol=1e-10)


@pytest.mark.parametrize("form", ["hessian", "inverse"])
def test_bad_input_changes_nothing(lightning_fit, form):
    cls = NewtonStepUnlearner if form == "hessian" else InfinitesimalJackknifeUnlearner
    ds, model, rec = fresh(lightning_fit, form)
    strategy = cls(model, rec, release=ReleaseConfig(noise=False))
    strategy.forget(ForgetRequest.samples([FORGET[0]]), data=ds)
    weights, state, grad_sum = autodiff.flat_params(model), recorded(rec), strategy._grad_sum.clone()
    for request, match in (
        (ForgetRequest.samples([10_000]), "10000"),
        (ForgetRequest.samples([FORGET[0]]), "already"),
    ):
        with pytest.raises(ValueError, match=match):
            strategy.forget(request, data=ds)
    with pytest.raises(ValueError, match="needs the samples"):
        strategy.forget(ForgetRequest.samples([FORGET[1]]))
    wrong = blobs(N, seed=5)  # same ids, other inputs
    with pytest.raises(ValueError):
        strategy.forget(ForgetRequest.samples([FORGET[1]]), data=wrong)
    assert torch.equal(autodiff.flat_params(model), weights) and same_state(recorded(rec), state)
    assert torch.equal(strategy._grad_sum, grad_sum) and len(strategy.ledger) == 1
    with pytest.raises(ValueError, match="forgotten without this"):  # a new strategy cannot recover their gradients
        cls(model, rec, release=ReleaseConfig(noise=False)).forget(ForgetRequest.samples([FORGET[1]]), data=ds)


def test_ns_reuses_the_previous_matrix_and_a_failed_commit_changes_nothing(lightning_fit, monkeypatch):
    ds, model, rec = fresh(lightning_fit, "hessian")
    strategy = NewtonStepUnlearner(model, rec, release=ReleaseConfig(noise=False))
    first = rec.matrix  # no d x d tensor is allocated per request: the previous matrix is the next one's buffer
    strategy.forget(ForgetRequest.samples([FORGET[0]]), data=ds)
    second = rec.matrix
    weights, state = autodiff.flat_params(model), recorded(rec)
    monkeypatch.setattr(strategy.ledger, "append", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        strategy.forget(ForgetRequest.samples([FORGET[1]]), data=ds)
    assert (
        rec.matrix is second and same_state(recorded(rec), state) and torch.equal(autodiff.flat_params(model), weights)
    )
    monkeypatch.undo()
    strategy.forget(ForgetRequest.samples([FORGET[1]]), data=ds)
    assert rec.matrix is first  # the request wrote into the matrix the recorder held before the last one
    trained = autodiff.flat_params(fresh(lightning_fit, "hessian")[1])
    expected = eq15_16(ds, trained, set(FORGET[:2]), "hessian")
    assert torch.allclose(autodiff.flat_params(model), expected, atol=1e-10)


def test_noise_std_is_the_stated_formula(lightning_fit):
    ds, model, rec = fresh(lightning_fit, "hessian")
    x = ds.dataset.tensors[0]
    feature_norm = float(x.norm(dim=1).max())
    c = linear_model_constants(feature_norm, L2)
    M = newton.hessian_lipschitz_bound(feature_norm)
    eps, delta = 1.0, 1e-5
    strategy = NewtonStepUnlearner(
        model, rec, constants=c, hessian_lipschitz=M, release=ReleaseConfig(epsilon=eps, delta=delta, seed=0)
    )
    cert = strategy.forget(ForgetRequest.samples(FORGET[:2]), data=ds).certificate
    m = 2  # [NS] Alg. 2 written out, plus the damping term
    gamma = 2 * M * m**2 * c.grad_bound**2 / (L2**3 * N**2) + 0.01 * m * c.grad_bound / ((N - m) * L2 * (L2 + 0.01))
    assert cert.bounds["sensitivity"] == pytest.approx(gamma, rel=1e-12)
    assert cert.sigma == pytest.approx(analytic_sigma(gamma, eps, delta), rel=1e-12)
    assert cert.bounds["sigma_classical"] == pytest.approx(gamma * math.sqrt(2 * math.log(1.25 / delta)) / eps)
    noise = autodiff.flat_params(model) - strategy.clean_parameters()
    assert float(noise.norm()) > 0 and cert.constants == "bounded" and cert.recipe == "checked"
    assert cert.seeded and not cert.certified  # seeded noise is never a certificate


def test_certified_release_needs_the_hessian_lipschitz_constant(lightning_fit):
    ds, model, rec = fresh(lightning_fit, "inverse")
    weights = autodiff.flat_params(model)
    strategy = InfinitesimalJackknifeUnlearner(model, rec, release=ReleaseConfig(epsilon=1.0, delta=1e-5))
    with pytest.raises(ValueError, match="hessian_lipschitz is not given"):
        strategy.forget(ForgetRequest.samples([3]), data=ds)
    assert torch.equal(autodiff.flat_params(model), weights) and len(strategy.ledger) == 0


def test_recorder_refusals(lightning_fit):
    ds = lightning_fit[0]
    with pytest.raises(ValueError, match=r"d = 21 parameters need 0\.00 GiB"):
        fit_lr(ds, HessianSumRecorder(max_bytes=100))
    rec = HessianSumRecorder()
    with pytest.raises(ValueError, match="lacks recorded statistics"):
        rec.load_state_dict({**lightning_fit[2]["hessian"].state_dict(), "matrix": None})
    with pytest.raises(ValueError, match="needs a HessianSumRecorder"):
        NewtonStepUnlearner(sgd_model(), lightning_fit[2]["inverse"])
    _, model, rec = fresh(lightning_fit, "hessian")
    with pytest.raises(ValueError, match="records one training set"):
        trainer([rec], max_epochs=1).fit(model, DataLoader(ds, batch_size=len(ds)))
