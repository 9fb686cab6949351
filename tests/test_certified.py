"""[CCL]: CCLHessianRecorder / CCLRecorder and the Hessian- and gradient-based certified strategies."""

import math

import pytest
import torch
from helpers_certified import (
    N_CLASSES,
    blobs,
    cl_tasks,
    fit_tasks,
    proximal_model,
    recorded,
    same_state,
    trainer,
    user_model,
    without,
)
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import CCLHessianRecorder, CCLRecorder, ProximalRegularizer
from lightning_unlearn.functional import autodiff, ccl
from lightning_unlearn.models import ProximalClassifier, SupervisedClassifier
from lightning_unlearn.privacy import analytic_sigma
from lightning_unlearn.unlearners import CCLGradientUnlearner, CCLHessianUnlearner

EPS, DELTA = 1.0, 1e-5
TASKS = cl_tasks()


@pytest.fixture(scope="module")
def trained():
    rec = CCLHessianRecorder(store_sample_gradients=True)
    model = fit_tasks(TASKS, rec)
    return model, rec


def copy_of(trained):
    model, rec = trained
    m2 = fit_tasks([], model=None)
    m2.load_state_dict(model.state_dict())
    r2 = CCLHessianRecorder(store_sample_gradients=True)
    r2.load_state_dict(rec.state_dict())
    return m2, r2


def test_recorded_tasks_follow_the_chain(trained):
    model, rec = trained
    assert rec.experience_ids == [0, 1, 2] and rec.sizes == [60, 60, 60]
    assert torch.count_nonzero(rec.starts[0]) == 0  # w_0 = 0
    for i in (1, 2):
        assert torch.equal(rec.starts[i], rec.ends[i - 1])  # each task is anchored at the previous solution
    assert torch.equal(rec.ends[-1], autodiff.flat_params(model))
    assert rec.hessians[0].shape == (21, 21) and torch.allclose(rec.hessians[0], rec.hessians[0].T)
    assert torch.linalg.eigvalsh(rec.hessians[0]).min() >= 0.05 - 1e-9  # the l2 ridge: mu = l2
    assert max(rec.stationarity) < 1e-6  # L-BFGS solved each task of Eq. (1) exactly
    # the estimated smoothness M: the largest |eigenvalue| over the tasks' Hessians, by power iteration (never above
    # it: ||H v|| <= |lambda_max| for a unit v, float64 rounding aside; converged to 1e-9 in its 100 steps here)
    top = max(float(torch.linalg.eigvalsh(H).abs().max()) for H in rec.hessians)
    # each task's Hessian (the Gauss-Newton product of the linear model) equals autograd's mean Hessian at its end
    loss = rec.module_loss(model)
    for task, H, end in zip(TASKS, rec.hessians, rec.ends):
        x, y = task.dataset.tensors
        assert torch.allclose(H, ccl.dense_hessian(loss, end, x, y), rtol=0, atol=1e-12)
    assert top * (1 - 1e-9) <= rec.smoothness <= top * (1 + 1e-12)


def test_task_level_newton_closer_to_retrain_and_within_bound(trained):
    model, rec = copy_of(trained)
    w = autodiff.flat_params(model)
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[1], TASKS[2]]))
    strategy = CCLHessianUnlearner(model, rec, release=ReleaseConfig(epsilon=EPS, delta=DELTA))
    cert = strategy.forget(ForgetRequest.of_experience(0)).certificate
    original, approx = float((w - w_retrain).norm()), float((strategy.clean_parameters() - w_retrain).norm())
    # tolerance: the Newton correction of Eq. (13) is >= 5x closer to retraining than the original model
    assert approx <= 0.2 * original, (approx, original)
    assert approx <= cert.bounds["sensitivity"]
    # deleting a middle task later: Eq. (13) with a previous unlearning time
    w_retrain2 = autodiff.flat_params(fit_tasks([TASKS[2]]))
    before = float((strategy.clean_parameters() - w_retrain2).norm())
    strategy.forget(ForgetRequest.of_experience(1))
    assert float((strategy.clean_parameters() - w_retrain2).norm()) <= 0.2 * before


def test_gradient_strategy_keeps_weights_within_natural_forgetting_bound(trained):
    model, rec = copy_of(trained)
    w = autodiff.flat_params(model)
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[1], TASKS[2]]))
    strategy = CCLGradientUnlearner(model, rec, bound="paper", release=ReleaseConfig(epsilon=EPS, delta=DELTA, seed=0))
    cert = strategy.forget(ForgetRequest.of_experience(0)).certificate
    assert torch.equal(strategy.clean_parameters(), w)  # Alg. 1: the internal model is not modified
    assert float((w - w_retrain).norm()) <= cert.bounds["sensitivity"]  # Theorem 4.1
    # sigma computed independently: gamma^NF = (L/lambda) rho^kappa, kappa = 2 retained tasks after task 0
    L, lam, mu = rec.lipschitz, 1.0, 0.05
    rho = lam / (mu + lam)
    gamma = L / lam * rho**2
    assert cert.bounds["sensitivity"] == pytest.approx(gamma, rel=1e-12)
    assert cert.sigma == pytest.approx(analytic_sigma(gamma, EPS, DELTA), rel=1e-12)
    noise = autodiff.flat_params(model) - w
    assert torch.allclose(
        noise, cert.sigma * torch.randn(w.shape, generator=torch.Generator().manual_seed(0), dtype=w.dtype)
    )


def test_hessian_sigma_matches_formula(trained):
    model, rec = copy_of(trained)
    cert = (
        CCLHessianUnlearner(
            model, rec, lipschitz=2.0, smoothness=3.0, bound="paper", release=ReleaseConfig(epsilon=EPS, delta=DELTA)
        )
        .forget(ForgetRequest.of_experience(0))
        .certificate
    )
    lam, mu, L, M = 1.0, 0.05, 2.0, 3.0
    rho, kappa = lam / (mu + lam), 2
    gamma = kappa * rho**kappa * (M - mu) / (mu + lam) * L / lam  # gamma^H, one deleted task
    assert cert.bounds["sensitivity"] == pytest.approx(gamma, rel=1e-12)
    assert cert.sigma == pytest.approx(analytic_sigma(gamma, EPS, DELTA), rel=1e-12)
    assert cert.bounds["sigma_classical"] == pytest.approx(
        gamma * math.sqrt(2 * math.log(1.25 / DELTA)) / EPS, rel=1e-12
    )


def test_sample_level_newton_from_stored_gradients_and_from_data(trained):
    U = [101, 105, 110, 150]
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[0], without(TASKS[1], set(U)), TASKS[2]]))
    model, rec = copy_of(trained)
    w = autodiff.flat_params(model)
    stored = CCLHessianUnlearner(model, rec, release=ReleaseConfig(noise=False))
    stored.forget(ForgetRequest.samples(U))
    model2, rec2 = copy_of(trained)
    rec2.sample_grads = {}
    from_data = CCLHessianUnlearner(model2, rec2, release=ReleaseConfig(noise=False))
    from_data.forget(ForgetRequest.samples(U), data=ConcatDataset(TASKS))
    assert torch.allclose(stored.clean_parameters(), from_data.clean_parameters(), atol=1e-12)
    original, approx = float((w - w_retrain).norm()), float((stored.clean_parameters() - w_retrain).norm())
    assert approx <= 0.2 * original, (approx, original)  # tolerance: >= 5x closer than the original model
    # the running gradient sum makes a second request on the same task consistent
    w_retrain2 = autodiff.flat_params(fit_tasks([TASKS[0], without(TASKS[1], set(U) | {120, 121}), TASKS[2]]))
    stored.forget(ForgetRequest.samples([120, 121]))
    assert float((stored.clean_parameters() - w_retrain2).norm()) <= 0.2 * float((w - w_retrain2).norm())


def test_each_recorded_hessian_is_factorised_once_per_strategy(trained, monkeypatch):
    """A dense Cholesky costs O(d^3) (seconds at d = 7,850, MNIST's linear model): a strategy factorises each task's
    recorded Hessian once, not once per request, and again when the recorder holds new Hessians (a loaded state);
    the results are those of a strategy built anew for every request."""
    calls = []
    factorise = ccl.inverse_solver
    monkeypatch.setattr(ccl, "inverse_solver", lambda *a: calls.append(a) or factorise(*a))
    requests = [[101], [105, 205], [110]]
    model, rec = copy_of(trained)
    strategy = CCLHessianUnlearner(model, rec, release=ReleaseConfig(noise=False))
    for ids in requests:
        strategy.forget(ForgetRequest.samples(ids))
    assert len(calls) == 3  # one per recorded task, for three requests on partially forgotten tasks
    model2, rec2 = copy_of(trained)
    for ids in requests:  # uncached: a new strategy (and its factorisations) per request
        CCLHessianUnlearner(model2, rec2, release=ReleaseConfig(noise=False)).forget(ForgetRequest.samples(ids))
    assert len(calls) == 3 + 3 * 3
    assert torch.equal(strategy.clean_parameters(), autodiff.flat_params(model2))
    rec.load_state_dict(rec.state_dict())  # new Hessian tensors: factorised again
    strategy.forget(ForgetRequest.samples([120]))
    assert len(calls) == 3 + 9 + 3


def test_a_partially_deleted_task_costs_one_solve():
    """A solve with ``H_i + lambda I`` reads its ``d^2``-float factor (most of a request's time at d = 7,850): a
    partially deleted task's transport and Newton step share one, ``(H_i + lambda I)^{-1} (lambda e + r_i)``, which
    is the recursion written out with both, to rounding."""
    g = torch.Generator().manual_seed(0)
    d, lam, n, m, f64 = 6, 0.7, 20, 3, torch.float64
    A = torch.randn(d, d, generator=g, dtype=f64)
    start0, end0, start1, end1, grad_sum, noise = torch.randn(6, d, generator=g, dtype=f64)
    inverse = torch.linalg.inv(A @ A.T / d + (0.1 + lam) * torch.eye(d, dtype=f64))  # (H + lambda I)^{-1}
    calls = []

    def solve(v):
        calls.append(v)
        return inverse @ v

    status = [ccl.TaskStatus(n=10, m=0), ccl.TaskStatus(n=n, m=m)]
    current = end1 + noise  # published after the last task
    e = ccl.hessian_correction(status, [start0, start1], [end0, end1], current, [solve, solve], [None, grad_sum], lam)
    assert len(calls) == 2  # one per task (the kept task's transport; the partial task's transport and step)
    e0 = lam * inverse @ -start0  # P_0 (0 - D_{-1}), D_{-1} = start_0 - w_0
    step = inverse @ (grad_sum / (n - m) - m / (n - m) * lam * (start1 - end1))  # delta_1
    expected = lam * inverse @ (e0 - (start1 - end0)) + step - (current - end1)
    assert torch.allclose(e, expected, rtol=0, atol=100 * torch.finfo(f64).eps * float(expected.norm()))


def test_checkpoint_roundtrip(tmp_path):
    rec = CCLHessianRecorder(store_sample_gradients=True)
    model = fit_tasks(TASKS[:1], rec)
    tr = trainer([rec], max_epochs=1)
    rec.experience = 1
    tr.fit(model, DataLoader(TASKS[1], batch_size=60))
    tr.save_checkpoint(tmp_path / "cl.ckpt")
    restored = CCLHessianRecorder(store_sample_gradients=True)
    restored.load_from_checkpoint(tmp_path / "cl.ckpt")
    assert same_state(recorded(restored), recorded(rec)) and len(restored.sample_grads) == 120
    state = rec.state_dict()
    state["hessians"] = None
    with pytest.raises(ValueError, match="Hessians"):
        CCLHessianRecorder().load_state_dict(state)


def test_bad_input_changes_nothing(trained):
    model, rec = copy_of(trained)
    strategy = CCLHessianUnlearner(model, rec)
    strategy.forget(ForgetRequest.of_experience(2))
    rec.sample_grads = {}
    w, stats, n_ledger = autodiff.flat_params(model), recorded(rec), len(strategy.ledger)
    cases = [
        (ForgetRequest.of_experience(2), "already been forgotten", None),
        (ForgetRequest.of_experience(7), "never learned", None),
        (ForgetRequest.samples([201]), "already forgotten", None),
        (ForgetRequest.samples([5, 9999]), "unknown", None),
        (ForgetRequest.samples([5]), "needs the samples", None),
        (ForgetRequest.samples([5]), "lacks", TASKS[1]),
    ]
    for request, msg, data in cases:
        with pytest.raises(ValueError, match=msg):
            strategy.forget(request, data=data)
        assert (
            torch.equal(autodiff.flat_params(model), w)
            and same_state(recorded(rec), stats)
            and len(strategy.ledger) == n_ledger
        )
    wider = ProximalClassifier(nn.Linear(6, 4).double(), l2=0.05)
    with pytest.raises(ValueError, match="trainable parameters"):
        CCLHessianUnlearner(wider, rec).forget(ForgetRequest.of_experience(0))
    assert same_state(recorded(rec), stats) and int(rec.catalog.forgotten.sum()) == 60


def test_task_delta_recorder_needs_the_proximal_regulariser_and_diagonal_mode_runs():
    with pytest.warns(UserWarning, match="not solved exactly"):  # one SGD epoch is far from the minimiser
        sgd = ProximalClassifier(nn.Linear(6, 3).double(), lr=0.01, l2=0.05)
        trainer([CCLHessianRecorder()]).fit(sgd, DataLoader(TASKS[0], batch_size=20))
    plain = SupervisedClassifier(nn.Linear(6, 3).double(), lr=0.1, l2=0.1)
    with pytest.raises(ValueError, match="ProximalClassifier"):
        trainer([CCLRecorder()]).fit(plain, DataLoader(TASKS[0], batch_size=20))
    rec = CCLHessianRecorder(hessian="diagonal", n_probes=256)
    model = fit_tasks(TASKS[:2], rec)
    assert rec.hessians[0].shape == (21,) and bool((rec.hessians[0] >= 0.05).all())
    deltas = CCLRecorder()
    delta_model = fit_tasks(TASKS[:2], deltas)
    assert torch.allclose(deltas.deltas[1], rec.deltas[1]) and deltas.sizes == [60, 60]
    w_delta = autodiff.flat_params(delta_model)
    with pytest.raises(ValueError, match="lipschitz"):  # a CCLRecorder estimates no constants
        CCLGradientUnlearner(delta_model, deltas).forget(ForgetRequest.of_experience(0))
    assert torch.equal(autodiff.flat_params(delta_model), w_delta) and not bool(deltas.catalog.forgotten.any())
    cert = (
        CCLGradientUnlearner(delta_model, deltas, lipschitz=2.0, smoothness=3.0, bound="paper")
        .forget(ForgetRequest.of_experience(0))
        .certificate
    )
    assert cert.bounds["sensitivity"] == pytest.approx(2.0 / 1.0 * (1.0 / 1.05), rel=1e-12)  # (L/lambda) rho^1
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[1]]))
    w = autodiff.flat_params(model)
    strategy = CCLHessianUnlearner(model, rec, release=ReleaseConfig(noise=False))
    strategy.forget(ForgetRequest.of_experience(0))
    # a diagonal Hessian is only an approximation: closer than the original, with a loose tolerance
    assert float((strategy.clean_parameters() - w_retrain).norm()) < float((w - w_retrain).norm())


def test_requests_between_experiences_follow_the_recorded_chain():
    """Alg. 2 over time: forget task 0 after 2 tasks, continue from the internal model, forget task 1 after task 2."""
    rec = CCLHessianRecorder()
    model = fit_tasks(TASKS[:2], rec)
    strategy = CCLHessianUnlearner(model, rec, release=ReleaseConfig(seed=0))
    first = strategy.forget(ForgetRequest.of_experience(0)).certificate
    assert first.bounds["chain_term"] == 0.0
    strategy.restore_internal()  # Alg. 2: the next task starts from the noise-free internal model
    internal = strategy.clean_parameters()
    rec.experience = 2
    trainer([rec], max_epochs=2).fit(model, DataLoader(TASKS[2], batch_size=60))
    w = autodiff.flat_params(model)
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[2]]))
    cert = (
        CCLHessianUnlearner(model, rec, release=ReleaseConfig(noise=False))
        .forget(ForgetRequest.of_experience(1))
        .certificate
    )
    assert torch.equal(rec.starts[2], internal)
    gap = float((rec.starts[2] - rec.ends[1]).norm())  # the first correction, measured from the chain
    lam, mu, M = 1.0, 0.05, rec.smoothness
    rho = lam / (mu + lam)
    assert cert.bounds["chain_term"] == pytest.approx(
        1 * rho * (M - mu) / (mu + lam) * gap, rel=1e-12
    )  # kappa = 1 (task 2)
    final = autodiff.flat_params(model)  # noise disabled: the published model is the internal one
    assert float((final - w_retrain).norm()) <= 0.2 * float((w - w_retrain).norm())


def test_lowrank_lanczos_hessian_of_full_rank_equals_exact(trained):
    model, exact = copy_of(trained)
    lowrank = CCLHessianRecorder(hessian="lowrank", rank=21)
    fit_tasks(TASKS, lowrank)
    values, vectors = lowrank.hessians[0]["values"], lowrank.hessians[0]["vectors"]
    # the Krylov space stops at the distinct eigenvalues; the rest of the spectrum of softmax-LR is the
    # ridge l2 (the class-shift null space), which is exactly the floor the approximation gives it
    approx = vectors @ torch.diag(values) @ vectors.T + 0.05 * (
        torch.eye(21, dtype=vectors.dtype) - vectors @ vectors.T
    )
    assert torch.allclose(approx, exact.hessians[0], atol=1e-8)
    a = CCLHessianUnlearner(model, exact, release=ReleaseConfig(noise=False))
    a.forget(ForgetRequest.of_experience(0))
    m2 = fit_tasks([], model=None)
    m2.load_state_dict(trained[0].state_dict())
    b = CCLHessianUnlearner(m2, lowrank, release=ReleaseConfig(noise=False))
    b.forget(ForgetRequest.of_experience(0))
    assert torch.allclose(a.clean_parameters(), b.clean_parameters(), atol=1e-8)
    small = CCLHessianRecorder(hessian="lowrank", rank=4)
    fit_tasks(TASKS[:1], small)
    assert small.hessians[0]["vectors"].shape == (21, 4)
    restored = CCLHessianRecorder(hessian="lowrank", rank=4)
    restored.load_state_dict(small.state_dict())
    assert torch.equal(restored.hessians[0]["vectors"], small.hessians[0]["vectors"])


# -- bring your own model -------------------------------------------------------------------------------
def fit_user_tasks(tasks: list, recorder: CCLHessianRecorder | None = None, in_loss: bool = False):
    """A user module (own training_step: CE; SGD with weight_decay = mu = 0.05) plus a ProximalRegularizer
    callback (lambda = 1), each task solved by full-batch gradient descent run to convergence: the task
    objective's curvature lies in [mu + lambda, M + lambda] = [1.05, 2.64] here, so lr 0.5 contracts the
    error by at most 0.48 per step, 0.48^30 ~ 3e-10 (float64)."""
    reg = ProximalRegularizer(1.0, in_loss=in_loss)
    model = user_model(lr=0.5, weight_decay=0.05, penalty=reg.penalty if in_loss else None)
    for k, ds in enumerate(tasks):
        callbacks = [reg] + ([recorder] if recorder is not None else [])
        if recorder is not None:
            recorder.experience = k
        trainer(callbacks, max_epochs=30).fit(model, DataLoader(ds, batch_size=len(ds)))
    return model, reg


def test_hessian_and_gradient_methods_on_a_user_module_with_a_proximal_callback():
    rec = CCLHessianRecorder(store_sample_gradients=True)
    model, reg = fit_user_tasks(TASKS, rec)
    assert (rec.reg_lambda, rec.l2) == (1.0, 0.05) and reg.tasks_learned == 3  # from the callback and the optimizer
    assert max(rec.stationarity) < 1e-7 and torch.equal(rec.starts[1], rec.ends[0])
    assert torch.count_nonzero(rec.starts[0]) == 0
    # the same minimisers as the library's L-BFGS convenience class (Eq. (1) is strongly convex), which
    # therefore serves as the retraining reference below
    reference = CCLHessianRecorder()
    fit_tasks(TASKS, reference)
    assert torch.allclose(rec.ends[2], reference.ends[2], atol=1e-7)
    assert torch.allclose(rec.hessians[2], reference.hessians[2], atol=1e-7)
    snapshot, recorded_state = {k: v.clone() for k, v in model.state_dict().items()}, rec.state_dict()
    w = autodiff.flat_params(model)
    w_retrain0 = autodiff.flat_params(fit_tasks([TASKS[1], TASKS[2]]))
    strategy = CCLHessianUnlearner(model, rec, release=ReleaseConfig(epsilon=EPS, delta=DELTA))
    cert = strategy.forget(ForgetRequest.of_experience(0)).certificate
    approx = float((strategy.clean_parameters() - w_retrain0).norm())
    assert approx <= 0.2 * float((w - w_retrain0).norm()) and approx <= cert.bounds["sensitivity"]
    # sample level, from the stored gradients
    U = [101, 105, 110, 150]
    w_retrain = autodiff.flat_params(fit_tasks([TASKS[0], without(TASKS[1], set(U)), TASKS[2]]))
    model.load_state_dict(snapshot)
    rec2 = CCLHessianRecorder(store_sample_gradients=True)
    rec2.load_state_dict(recorded_state)
    sample_level = CCLHessianUnlearner(model, rec2, release=ReleaseConfig(noise=False))
    sample_level.forget(ForgetRequest.samples(U))
    assert float((sample_level.clean_parameters() - w_retrain).norm()) <= 0.2 * float((w - w_retrain).norm())
    # [CCL] Alg. 1 on the same recorder: weights kept, Theorem 4.1 bound
    model.load_state_dict(snapshot)
    rec3 = CCLHessianRecorder()
    rec3.load_state_dict(recorded_state)
    gradient = (
        CCLGradientUnlearner(model, rec3, release=ReleaseConfig(noise=False))
        .forget(ForgetRequest.of_experience(0))
        .certificate
    )
    assert float((w - w_retrain0).norm()) <= gradient.bounds["sensitivity"]


def test_proximal_penalty_in_the_loss_and_refusals():
    rec = CCLRecorder()
    model, reg = fit_user_tasks(TASKS[:1], rec, in_loss=True)  # the module adds reg.penalty itself
    assert rec.sizes == [60] and reg.tasks_learned == 1
    forgot = user_model(lr=0.5, weight_decay=0.05)  # in_loss=True declared, but the loss lacks the penalty
    with pytest.raises(ValueError, match=r"mean loss_fn \+ penalty = [0-9.]+, training loss = [0-9.]+"):
        trainer([ProximalRegularizer(1.0, in_loss=True), CCLRecorder()]).fit(forgot, DataLoader(TASKS[0], 60))
    with pytest.raises(ValueError, match="ProximalRegularizer"):
        trainer([CCLRecorder()]).fit(user_model(), DataLoader(TASKS[0], batch_size=60))
    with pytest.raises(ValueError, match="loss_fn disagrees with UserModule.training_step"):
        smoothed = user_model(smoothing=0.1)
        trainer([ProximalRegularizer(1.0), CCLRecorder()]).fit(smoothed, DataLoader(TASKS[0], batch_size=60))


class _WithTaskLabel(torch.utils.data.Dataset):
    """``(x, y, sample_id, 0)`` items, as an Avalanche experience yields them."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return (*self.ds[i], 0)


def _paper_solve(task, anchor, l2, lam):
    """Eq. (1) for a linear softmax model on flat ``[W, b]`` (``autodiff.flat_params`` order), by Newton's method."""
    x, y = task.dataset.tensors
    n_out = N_CLASSES

    def loss(w):
        W, b = w[: n_out * x.shape[1]].reshape(n_out, -1), w[n_out * x.shape[1] :]
        return nn.functional.cross_entropy(x @ W.T + b, y) + 0.5 * l2 * w.pow(2).sum()

    def objective(w):
        return loss(w) + 0.5 * lam * (w - anchor).pow(2).sum()

    w = anchor.clone()
    for _ in range(30):  # Newton's method converges quadratically: a handful of steps reach rounding
        g = torch.func.grad(objective)(w)
        if float(g.norm()) < 1e-13:
            break
        w = w - torch.linalg.solve(torch.func.hessian(objective)(w), g)
    return w, torch.func.hessian(loss)(w)  # H_t: the mean Hessian of l at the solution


def test_requests_inside_the_stream_match_alg2_run_by_hand():
    """[CCL] Alg. 2 with requests arriving mid-stream (1-based tasks: {1} after task 2, {3} after task 4 as
    Lemma 5.4's well-ordered case, then {2} after task 5, which disrupts it; task 6 learned after), noise-free.

    The reference is the algorithm run by hand in float64: each task solved by Newton's method from the model the
    previous step left (post-forget after a request), ``Delta_t = w_{t-1} - w_t``, ``H_t`` at ``w_t`` (Alg. 2 line
    5), and at each request ``w <- w + Delta-bar_t`` of Eq. (13), with every product over the tasks not deleted by
    then (``i not in S_<=t``, as the proof's Eq. (26) and Lemma 5.4's Eq. (29); Alg. 2's display writes ``S_t`` in
    the first product, which differs only when a task deleted earlier lies between s and t, as here for s = 2).
    """
    from types import SimpleNamespace

    from lightning_unlearn.avalanche import fit_stream

    l2, lam, T = 0.05, 1.0, 6
    tasks = [blobs(40, seed=k, shift=0.3 * k, id_offset=100 * k) for k in range(T)]
    arrivals = {2: {1}, 4: {3}, 5: {2}}  # t_i -> S_{t_i}, 1-based as in the paper

    model = proximal_model(l2=l2, reg_lambda=lam)
    rec = CCLHessianRecorder()
    strategy = CCLHessianUnlearner(model, rec, lipschitz=1.0, smoothness=1.0, release=ReleaseConfig(noise=False))
    internal = {}
    stream = [SimpleNamespace(current_experience=k, dataset=_WithTaskLabel(ds)) for k, ds in enumerate(tasks)]
    fit_stream(
        model,
        stream,
        callbacks=[rec],
        trainer_kwargs={"max_epochs": 2, "enable_progress_bar": False},
        batch_size=40,
        unlearning=strategy,
        requests={
            t - 1: [ForgetRequest.samples(torch.cat([tasks[s - 1].ids for s in S]))] for t, S in arrivals.items()
        },
        after_experience=lambda exp, trainer, done: internal.update(
            {exp.current_experience + 1: strategy.clean_parameters()} if done else {}
        ),
    )

    d = autodiff.flat_params(model).numel()
    eye = torch.eye(d, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64)  # w_0 = 0 (the first task's anchor)
    delta, P, dbar, deleted, by_hand, hessians = {}, {}, {}, set(), {}, []

    def product(a, t, excluded):  # prod_{i=a+1, i not in excluded}^t P_i, the latest task leftmost
        M = eye
        for i in range(a + 1, t + 1):
            M = M if i in excluded else P[i] @ M
        return M

    for t in range(1, T + 1):
        w_t, H = _paper_solve(tasks[t - 1], w, l2, lam)
        delta[t], P[t], w = w - w_t, lam * torch.linalg.inv(H + lam * eye), w_t
        if t in arrivals:
            now = deleted | arrivals[t]
            dbar[t] = (
                sum(product(s, t, now) @ delta[s] for s in arrivals[t])
                + sum((product(s, t, now) @ delta[s] for s in deleted), torch.zeros(d, dtype=torch.float64))
                - sum(
                    (product(tau, t, now) @ dbar[tau] for tau in dbar if tau < t), torch.zeros(d, dtype=torch.float64)
                )
            )
            w, deleted, by_hand[t] = w + dbar[t], now, w + dbar[t]
        hessians.append(H)

    # tolerance (first order): the hand-run solves each task to rounding (Newton), the library's L-BFGS to the
    # recorded gradient residual r_t, so its w_t is off by <= r_t / (mu + lambda) (Eq. (1) is (mu + lambda)-strongly
    # convex); Eq. (13) sums at most T Delta's and Delta-bar's, each a difference of two solutions, through products
    # of P_i of norm <= rho < 1. An index-set or ordering error would move the result by O(||Delta||) ~ 1e-1.
    tol = 2 * T * max(rec.stationarity) / (l2 + lam)
    assert tol < 1e-5
    for t in range(1, T + 1):  # H_t measured at each w_t of the chain that continued from the post-forget model
        assert torch.allclose(rec.hessians[t - 1], hessians[t - 1], atol=tol, rtol=0)
    for t in arrivals:
        assert torch.allclose(internal[t], by_hand[t], atol=tol, rtol=0), (t, float((internal[t] - by_hand[t]).norm()))
    assert torch.allclose(rec.starts[2], by_hand[2], atol=tol, rtol=0)  # task 3 learned from the post-forget model
    assert torch.allclose(autodiff.flat_params(model), w, atol=tol, rtol=0)  # and the end of the stream (T = 6)
    retrain = torch.zeros(d, dtype=torch.float64)
    for t in (4, 5, 6):
        retrain = _paper_solve(tasks[t - 1], retrain, l2, lam)[0]
    plain = torch.zeros(d, dtype=torch.float64)
    for t in range(1, T + 1):
        plain = _paper_solve(tasks[t - 1], plain, l2, lam)[0]
    # second-order accurate: >= 5x closer to retraining than continual learning without unlearning
    assert float((w - retrain).norm()) <= 0.2 * float((plain - retrain).norm())


def test_publish_without_a_request_releases_the_internal_model_at_the_bound_of_that_time():
    """[CCL] Alg. 2 lines 13-15: after a request, a later time t publishes ``w_t + N(0, sigma_t^2 I)``, sigma_t
    calibrated on gamma^H of the tasks as they stand at t (task 0 deleted, two kept tasks after it)."""
    rec = CCLHessianRecorder()
    model = fit_tasks(TASKS[:2], rec)
    strategy = CCLHessianUnlearner(
        model, rec, lipschitz=2.0, smoothness=3.0, bound="paper", release=ReleaseConfig(epsilon=EPS, delta=DELTA)
    )
    with pytest.raises(ValueError, match="nothing is forgotten yet"):
        strategy.publish()
    assert len(strategy.accountant) == 0 and torch.equal(autodiff.flat_params(model), rec.ends[-1])  # nothing changed
    strategy.forget(ForgetRequest.of_experience(0))
    strategy.restore_internal()
    rec.experience = 2
    trainer([rec], max_epochs=2).fit(model, DataLoader(TASKS[2], batch_size=60))
    internal = autodiff.flat_params(model).clone()
    cert = strategy.publish()
    lam, mu, L, M = 1.0, 0.05, 2.0, 3.0
    rho, ratio = lam / (mu + lam), (M - mu) / (mu + lam)
    gap = float((rec.starts[2] - rec.ends[1]).norm())  # the request's correction, transported by task 2
    gamma = 2 * rho**2 * ratio * L / lam + 1 * rho * ratio * gap
    assert cert.bounds["sensitivity"] == pytest.approx(gamma, rel=1e-12)
    assert cert.sigma == pytest.approx(analytic_sigma(gamma, EPS, DELTA), rel=1e-12)
    assert len(strategy.accountant) == 2
    assert rec.unlearning_state.privacy["ccl_hessian"] == strategy.accountant.state_dict()
    assert float((autodiff.flat_params(model) - internal).norm()) > 0  # the module holds the published (noised) model
    assert torch.equal(strategy.clean_parameters(), internal)  # the next task starts from w_t itself
    assert len(strategy.ledger) == 1  # a publication forgets nothing: no ledger entry


def test_task_optimality_reads_a_user_modules_own_loss_and_its_proximal_callback():
    """No objective() method needed: the residual is the gradient of the module's training loss (its training_step)
    plus the callback's proximal penalty (applied as a gradient) plus the optimizer's weight decay, here at the
    first task's anchor w_0 = 0, computed independently in float64 (agreement to summation order, ~1e-15)."""
    from lightning_unlearn.callbacks import TaskOptimality

    x, y, _ = next(iter(DataLoader(TASKS[0], batch_size=len(TASKS[0]))))
    fits = []
    for epochs in (30, 1):
        check, model = TaskOptimality(1e-6), user_model(lr=0.5, weight_decay=0.05)
        trainer([ProximalRegularizer(1.0), check], max_epochs=epochs).fit(model, DataLoader(TASKS[0], len(TASKS[0])))
        w = [p for p in model.parameters()]
        objective = nn.functional.cross_entropy(model(x), y) + 0.5 * (1.0 + 0.05) * sum(p.pow(2).sum() for p in w)
        expected = torch.cat([g.flatten() for g in torch.autograd.grad(objective, w)]).norm()
        assert check.residuals[0] == pytest.approx(float(expected), rel=1e-12, abs=1e-15)
        fits.append(check)
    assert fits[0].problem(1) is None and "gradient residual" in fits[1].problem(1)  # solved vs one epoch
