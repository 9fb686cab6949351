"""[NS] and [IJ] ([HF] Eqs. (15), (16)): the functional updates, their noise bounds, the recorder and the strategies.

Exactness is checked in float64 on a small L2-regularised softmax regression solved to its minimiser
by full-batch L-BFGS (gradient norm below 1e-12), against formulas computed independently with
``torch.autograd.functional.hessian``; "1e-10" tolerances are float64 rounding over a 27 x 27 solve.
"""

import math

import pytest
import torch
from torch import nn
from torch.autograd.functional import hessian

from lightning_unlearn.functional import hf
from lightning_unlearn.functional import newton as nt
from lightning_unlearn.functional.bounds import linear_model_constants

N, D_IN, K, L2 = 60, 8, 3, 0.1


def data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(N) % K
    x = torch.randn(K, D_IN, generator=g, dtype=torch.float64)[y] + torch.randn(
        N, D_IN, generator=g, dtype=torch.float64
    )
    return x, y


def objective(module: nn.Module, x: torch.Tensor, y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``sum_i CE_i + (l2/2) n ||theta||^2``: the SUM of the per-sample losses, written out independently."""
    out = torch.func.functional_call(module, hf.unflatten(theta, hf.param_spec(module)), (x,))
    return nn.functional.cross_entropy(out, y, reduction="sum") + 0.5 * L2 * len(x) * theta.pow(2).sum()


def minimiser(x: torch.Tensor, y: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Linear(D_IN, K).double()
    theta = hf.flat_params(module).requires_grad_(True)
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
    hf.set_flat_params(module, theta)
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
    loss = hf.ModuleLoss(module, L2)
    got = nt.hessian_sum(loss, theta, x, y, chunk_size=16)
    assert torch.allclose(got, independent_hessian(module, x, y, theta), atol=1e-10)
    assert torch.count_nonzero(nt.hessian_sum(loss, theta, x[:0], y[:0])) == 0


@pytest.mark.parametrize("damping", [0.0, 0.01])
def test_newton_step_is_eq15_and_moves_towards_retraining(problem, damping):
    module, theta, x, y, forget, keep, retrained = problem
    loss = hf.ModuleLoss(module, L2)
    H_all = nt.hessian_sum(loss, theta, x, y)
    H_u = nt.hessian_sum(loss, theta, x[forget], y[forget])
    G = hf.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    step = nt.newton_step(H_all - H_u, len(keep), G, damping)
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


def test_newton_step_within_its_noise_bound(problem):
    module, theta, x, y, forget, keep, retrained = problem
    loss = hf.ModuleLoss(module, L2)
    H_ret = nt.hessian_sum(loss, theta, x[keep], y[keep])
    G = hf.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    feature_norm = float(x.norm(dim=1).max())
    c = linear_model_constants(feature_norm, L2)
    M = nt.hessian_lipschitz_bound(feature_norm)
    for damping in (0.0, 0.01):
        gap = float((theta + nt.newton_step(H_ret, len(keep), G, damping) - retrained).norm())
        bound = nt.newton_sensitivity(len(forget), N, c.grad_bound, L2, M, damping)
        assert gap <= bound["sensitivity"]
        inverse = nt.jackknife_inverse(nt.hessian_sum(loss, theta, x, y), N, damping)
        gap_ij = float((theta + nt.jackknife_step(inverse, N, G) - retrained).norm())
        assert (
            gap_ij
            <= nt.jackknife_sensitivity(len(forget), N, c.grad_bound, c.smoothness, L2, M, damping)["sensitivity"]
        )


def test_jackknife_is_eq16(problem):
    module, theta, x, y, forget, *_ = problem
    loss = hf.ModuleLoss(module, L2)
    inverse = nt.jackknife_inverse(nt.hessian_sum(loss, theta, x, y), N, 0.01)
    G = hf.per_sample_grads(loss, theta, x[forget], y[forget]).sum(0)
    H = independent_hessian(module, x, y, theta)
    expected = torch.linalg.solve(H / N + 0.01 * torch.eye(len(theta), dtype=theta.dtype), G) / N
    assert torch.allclose(nt.jackknife_step(inverse, N, G), expected, atol=1e-10)


def test_sensitivities_written_out():
    m, n, L, beta, lam, M, c = 3, 60, 2.0, 5.0, 0.1, 4.0, 0.01
    ns = nt.newton_sensitivity(m, n, L, lam, M, c)
    assert ns["taylor_term"] == pytest.approx(2 * M * m**2 * L**2 / (lam**3 * n**2), rel=1e-14)
    assert ns["damping_term"] == pytest.approx(c * m * L / ((n - m) * lam * (lam + c)), rel=1e-14)
    ij = nt.jackknife_sensitivity(m, n, L, beta, lam, M, c)
    assert ij["hessian_term"] == pytest.approx(m**2 * beta * L / (lam**2 * n * (n - m)), rel=1e-14)
    assert ij["sensitivity"] == pytest.approx(
        ns["taylor_term"] + ij["hessian_term"] + c * m * L / (n * lam * (lam + c))
    )
    assert math.isinf(nt.newton_sensitivity(31, 60, L, lam, M, c)["sensitivity"])  # m > n/2: outside the lemma
    assert math.isinf(nt.jackknife_sensitivity(1, 60, L, beta, 0.0, M, c)["sensitivity"])  # no strong convexity


def test_hessian_lipschitz_bound_holds_on_random_pairs():
    g = torch.Generator().manual_seed(1)
    module = nn.Linear(5, 4).double()
    loss = hf.ModuleLoss(module, 0.0)
    x = torch.randn(5, dtype=torch.float64, generator=g) * 3
    y = torch.tensor(2)
    M = nt.hessian_lipschitz_bound(float(x.norm()))
    for _ in range(20):
        a = torch.randn(24, dtype=torch.float64, generator=g)
        b = a + torch.randn(24, dtype=torch.float64, generator=g) * 0.3
        Ha, Hb = (nt.hessian_sum(loss, t, x[None], y[None]) for t in (a, b))
        assert float(torch.linalg.matrix_norm(Ha - Hb, ord=2)) <= M * float((a - b).norm())


def test_dense_memory_refused_naming_d():
    with pytest.raises(ValueError, match=r"d = 11,000,000 parameters need 450,760\.[0-9]+ GiB"):
        nt.check_dense(11_000_000, torch.float32, 2**33, "NS")
    nt.check_dense(100, torch.float64, 2**20, "NS")  # 80,000 bytes: fine


def test_damped_hessian_not_positive_definite_is_refused():
    with pytest.raises(ValueError, match="smallest eigenvalue -0.99"):
        nt.damped_cholesky(-torch.eye(3, dtype=torch.float64), 0.01, "NS")
