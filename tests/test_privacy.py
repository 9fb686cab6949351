"""Privacy analysis: [AGM] calibration, composition accounting against dp-accounting, secure noise,
closed-form constants of linear models, and their use by HFUnlearner (recipe guard, budget, checkpoints)."""

import copy
import math

import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from helpers_certified import D_IN, N_CLASSES, blobs, fit_hf, sgd_model
from scipy import integrate, stats
from torch import nn
from torch.func import grad, hessian, vmap

from lightning_unlearn import ForgetRequest, Ledger, ReleaseConfig, ReleaseRefused
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff
from lightning_unlearn.functional.bounds import linear_model_constants, module_constants
from lightning_unlearn.privacy import (
    PrivacyAccountant,
    Release,
    analytic_sigma,
    classical_sigma,
    gaussian_delta,
    gaussian_noise,
    noise,
    secure_gaussian,
)
from lightning_unlearn.privacy.analysis import gaussian_epsilon
from lightning_unlearn.unlearners import HFUnlearner

DELTA = 1e-5


# -- [AGM] calibration -------------------------------------------------------------------------------
def hockey_stick_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """delta(epsilon) = int max(0, p(x) - e^eps q(x)) dx for p = N(Delta, sigma^2), q = N(0, sigma^2),
    by numerical quadrature (independent of the closed form of [AGM] Theorem 8)."""
    p, q = stats.norm(sensitivity, sigma), stats.norm(0.0, sigma)
    # p > e^eps q  <=>  x > x0 (the likelihood ratio is increasing in x)
    x0 = sigma**2 * epsilon / sensitivity + sensitivity / 2
    value, _ = integrate.quad(
        lambda x: p.pdf(x) - math.exp(epsilon) * q.pdf(x), x0, x0 + 40 * sigma, epsabs=1e-15, epsrel=1e-10
    )
    return value


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0])
def test_analytic_sigma_satisfies_the_agm_condition_tightly(epsilon):
    sigma = analytic_sigma(2.0, epsilon, DELTA)
    # the condition holds (checked by quadrature, not by the formula used to calibrate) ...
    assert hockey_stick_delta(sigma, 2.0, epsilon) <= DELTA * (1 + 1e-6)
    # ... and a 0.1% smaller sigma violates it: the calibration is tight
    assert hockey_stick_delta(0.999 * sigma, 2.0, epsilon) > DELTA
    assert gaussian_delta(sigma, 2.0, epsilon) == pytest.approx(DELTA, rel=1e-8)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0])
def test_classical_formula_is_valid_but_looser_for_epsilon_at_most_one(epsilon):
    classical, analytic = classical_sigma(1.0, epsilon, DELTA), analytic_sigma(1.0, epsilon, DELTA)
    assert hockey_stick_delta(classical, 1.0, epsilon) <= DELTA
    assert analytic < classical


@pytest.mark.parametrize("mu", [1e3, 1e6, 2e6, 1e10, 1e100])
def test_gaussian_epsilon_of_a_tiny_noise_is_finite_and_about_mu_squared_over_two(mu):
    """A release whose noise is far below its sensitivity (an uncertified sigma_override): the accountant's epsilon
    is about mu^2/2 (the privacy loss's mean; its std mu is small beside it), never below the exact one, instead
    of an overflow."""
    z = stats.norm.isf(DELTA)
    epsilon = gaussian_epsilon(mu, DELTA)
    assert mu * mu / 2 <= epsilon <= mu * mu / 2 + mu * z * (1 + 1e-9)  # the tail bound is an upper bound
    if mu <= 1e6:  # bisection on the exact condition, which float64 still resolves here
        assert gaussian_delta(1.0, mu, epsilon) <= DELTA < gaussian_delta(1.0, mu, epsilon - mu)
    assert gaussian_epsilon(1e160, DELTA) == math.inf  # beyond the float range


def test_classical_formula_fails_for_large_epsilon():
    # documented: sqrt(2 ln(1.25/delta))/epsilon is not an (epsilon, delta) calibration beyond epsilon = 1
    assert hockey_stick_delta(classical_sigma(1.0, 10.0, DELTA), 1.0, 10.0) > DELTA


def test_calibration_rejects_bad_parameters():
    for eps, delta, sens in [
        (0.0, DELTA, 1.0),
        (math.inf, DELTA, 1.0),
        (1.0, 0.0, 1.0),
        (1.0, 1.0, 1.0),
        (1.0, DELTA, -1.0),
    ]:
        with pytest.raises(ValueError):
            analytic_sigma(sens, eps, delta)
    assert analytic_sigma(0.0, 1.0, DELTA) == 0.0


# -- accounting ----------------------------------------------------------------------------------------
def test_accountant_totals_equal_dp_accounting_called_directly():
    releases = [
        Release(sigma=3.0, sensitivity=1.0),
        Release(sigma=6.0, sensitivity=2.0),
        Release(sigma=2.0, sensitivity=1.0),
        Release(sigma=0.5, sensitivity=0.0),
    ]  # the last removed nothing: no privacy cost
    acc = PrivacyAccountant("pld")
    for r in releases:
        acc = acc.with_release(r)
    direct = pld_privacy_accountant.PLDAccountant()
    for z in (3.0, 3.0, 2.0):
        direct.compose(dp_event.GaussianDpEvent(noise_multiplier=z))
    assert acc.get_epsilon(DELTA) == pytest.approx(direct.get_epsilon(DELTA), rel=1e-3)
    rdp = PrivacyAccountant("rdp", acc.history)
    direct_rdp = rdp_privacy_accountant.RdpAccountant()
    direct_rdp.compose(dp_event.GaussianDpEvent(noise_multiplier=3.0), count=2)
    direct_rdp.compose(dp_event.GaussianDpEvent(noise_multiplier=2.0))
    assert rdp.get_epsilon(DELTA) == pytest.approx(direct_rdp.get_epsilon(DELTA), rel=1e-9)
    assert acc.totals(DELTA)["releases"] == 4


def test_one_analytic_release_spends_its_own_epsilon():
    sigma = analytic_sigma(1.0, 1.0, DELTA)
    acc = PrivacyAccountant().with_release(Release(sigma=sigma, sensitivity=1.0))
    # exact: the epsilon its sigma was calibrated for (sigma rounded up, so at most that epsilon)
    assert 1.0 - 1e-9 <= acc.get_epsilon(DELTA) <= 1.0


def test_noise_free_release_spends_everything_and_budget_refuses():
    acc = PrivacyAccountant().with_release(Release(sigma=0.0, sensitivity=1.0))
    assert acc.get_epsilon(DELTA) == math.inf
    assert PrivacyAccountant().get_epsilon(DELTA) == 0.0
    with pytest.raises(ValueError, match="budget"):
        acc.check_budget((10.0, DELTA))
    restored = PrivacyAccountant.from_state_dict(acc.state_dict())
    assert restored.history == acc.history and restored.mechanism == "pld"


# -- noise -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_secure_noise_is_standard_normal_and_never_repeats(dtype):
    z = secure_gaussian((200_001,), dtype).double()  # an odd count: Box-Muller's last pair is cut
    # mean within 5 standard errors, variance within 5 standard errors (sd of s^2 ~ sqrt(2/n))
    assert abs(float(z.mean())) < 5 / math.sqrt(len(z)) and abs(float(z.var()) - 1) < 5 * math.sqrt(2 / len(z))
    # the whole distribution: Kolmogorov-Smirnov against N(0, 1) (a correct generator fails with probability 1e-9),
    # of each half (the sines and the cosines of Box-Muller)
    for part in (z[:100_000], z[100_001:]):
        assert stats.kstest(part.numpy(), "norm").pvalue > 1e-9
    assert secure_gaussian((3, 4), torch.float32).shape == (3, 4) and secure_gaussian((0,)).numel() == 0
    assert not torch.equal(
        gaussian_noise((50,), 1.0, torch.float64, None, 0), gaussian_noise((50,), 1.0, torch.float64, None, 0)
    )
    seeded = gaussian_noise((50,), 2.0, torch.float64, 7, 3)
    assert torch.equal(seeded, 2.0 * torch.randn(50, generator=torch.Generator().manual_seed(10), dtype=torch.float64))


def test_secure_bytes_are_the_chacha20_keystream_of_the_os_key(monkeypatch):
    """Encrypted from zeros chunk by chunk (24 whole chunks and a partial one here), the bytes are RFC 8439's keystream
    for the key and nonce os.urandom gave."""
    key, nonce = bytes(range(32)), bytes(range(100, 116))
    given = iter([key, nonce])
    monkeypatch.setattr(noise.os, "urandom", lambda n: next(given))
    monkeypatch.setattr(noise, "_CHUNK", 4096)
    keystream = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(100_003))
    assert noise.secure_bytes(100_003) == keystream


# -- closed-form constants ---------------------------------------------------------------------------------
def per_sample_loss(theta, x, y, num_classes: int, l2: float, binary: bool):
    d = x.numel() + 1
    if binary:
        z = theta[: d - 1] @ x + theta[d - 1]
        ce = nn.functional.binary_cross_entropy_with_logits(z, y.double())
    else:
        W, b = theta[: num_classes * (d - 1)].view(num_classes, d - 1), theta[num_classes * (d - 1) :]
        ce = nn.functional.cross_entropy((W @ x + b).unsqueeze(0), y.view(1))
    return ce + 0.5 * l2 * theta.pow(2).sum()


@pytest.mark.parametrize("binary", [False, True])
def test_closed_form_bounds_dominate_exact_per_sample_hessians_and_gradients(binary):
    g = torch.Generator().manual_seed(0)
    n, d_in, k, l2 = 64, 5, (1 if binary else 4), 0.05
    x = 3 * torch.randn(n, d_in, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2 if binary else k, (n,), generator=g)
    c = linear_model_constants(float(x.norm(dim=1).max()), l2, binary=binary)
    dim = (d_in + 1) * k
    loss = lambda th, xi, yi: per_sample_loss(th, xi, yi, k, l2, binary)  # noqa: E731
    theta, eta, worst_m, worst_g, least = torch.zeros(dim, dtype=torch.float64), c.max_lr, 0.0, 0.0, math.inf
    for _ in range(60):  # full-batch gradient descent at the largest step size the recipe allows
        H = vmap(hessian(loss), in_dims=(None, 0, 0))(theta, x, y)
        eig = torch.linalg.eigvalsh(H)
        G = vmap(grad(loss), in_dims=(None, 0, 0))(theta, x, y)
        worst_m, least = max(worst_m, float(eig.max())), min(least, float(eig.min()))
        worst_g = max(worst_g, float(G.norm(dim=1).max()))
        theta = theta - eta * G.mean(0)
    # exact per-sample extremes within the closed-form bounds, up to eigvalsh's backward error (dim * eps * ||H||):
    # at theta = 0 a sigmoid's Hessian attains the bound exactly, so the computed maximum may sit above it by that
    eig_error = dim * torch.finfo(torch.float64).eps * worst_m
    assert worst_m <= c.smoothness + eig_error and least >= l2 - eig_error
    assert worst_g <= c.grad_bound
    assert float(theta.norm()) <= (c.grad_bound - c.grad_bound / 2) / l2 + 1e-9  # ||theta|| <= L_CE / l2
    # and not vacuous: the curvature bound is within a factor 3 of what training met
    assert c.smoothness <= 3 * worst_m


def test_module_constants_read_the_linear_head_and_refuse_deep_models():
    ds = blobs(40, seed=0)
    model = sgd_model(l2=0.1)
    c = module_constants(model, [ds.dataset.tensors[0]])
    r2 = float(ds.dataset.tensors[0].norm(dim=1).max()) ** 2 + 1
    assert c.smoothness == pytest.approx(r2 / 2 + 0.1) and c.kind == "bounded"
    deep = sgd_model(nn.Sequential(nn.Linear(D_IN, 8), nn.Tanh(), nn.Linear(8, N_CLASSES)).double())
    with pytest.raises(ValueError, match="linear model"):
        module_constants(deep, [ds.dataset.tensors[0]])


# -- HFUnlearner with bounded constants -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bounded():
    ds = blobs(64, seed=0)
    model = sgd_model(l2=0.5)
    c = module_constants(model, [ds.dataset.tensors[0]])
    model.lr = 0.9 * c.max_lr
    rec = TrajectoryRecorder(dtype=torch.float64)
    fit_hf(model, ds, rec, epochs=2)
    return model, rec, c


def copy_of(bounded):
    model, rec, c = bounded
    m2 = copy.deepcopy(model)
    r2 = TrajectoryRecorder(dtype=torch.float64)
    r2.load_state_dict(rec.state_dict())
    return m2, r2, c


def test_bounded_release_is_certified_and_reports_the_composition(bounded):
    model, rec, c = copy_of(bounded)
    strategy = HFUnlearner(model, rec, constants=c, release=ReleaseConfig(epsilon=1.0, delta=DELTA))
    first = strategy.forget(ForgetRequest.samples([3])).certificate
    second = strategy.forget(ForgetRequest.samples([4])).certificate
    assert first.certified and first.constants == "bounded" and first.recipe == "checked" and not first.seeded
    direct = pld_privacy_accountant.PLDAccountant()
    direct.compose(dp_event.GaussianDpEvent(noise_multiplier=second.sigma / second.bounds["sensitivity"]), count=2)
    assert second.accounting["releases"] == 2
    assert second.accounting["epsilon_total"] == pytest.approx(direct.get_epsilon(DELTA), rel=1e-3)
    assert second.accounting["epsilon_total"] > 1.2 and first.accounting["epsilon_total"] == pytest.approx(
        1.0, abs=1e-3
    )


def test_estimated_constants_are_not_certified(bounded):
    model, rec, _ = copy_of(bounded)
    cert = (
        HFUnlearner(model, rec, release=ReleaseConfig(epsilon=1.0, delta=DELTA))
        .forget(ForgetRequest.samples([3]))
        .certificate
    )
    assert cert.constants == "estimated" and not cert.certified and "estimated constants" in str(cert)


def test_two_releases_with_the_same_inputs_differ_and_a_seeded_one_reproduces(bounded):
    outs = []
    for seed in (None, None, 5, 5):
        model, rec, c = copy_of(bounded)
        cert = (
            HFUnlearner(model, rec, constants=c, release=ReleaseConfig(seed=seed))
            .forget(ForgetRequest.samples([7]))
            .certificate
        )
        outs.append((autodiff.flat_params(model), cert))
    assert not torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[2][0], outs[3][0])
    assert outs[2][1].seeded and not outs[2][1].certified and "seeded: not private" in str(outs[2][1])


def test_recipe_guard_refuses_a_step_size_above_two_over_m_plus_lambda(bounded):
    model, rec, c = copy_of(bounded)
    tight = type(c)(smoothness=c.smoothness * 10, grad_bound=c.grad_bound, strong_convexity=c.strong_convexity)
    strategy = HFUnlearner(model, rec, constants=tight)
    before = autodiff.flat_params(model)
    with pytest.raises(ValueError, match=r"lr = .* exceeds 2/\(M \+ lambda\).*M = .*lambda = 0.5"):
        strategy.forget(ForgetRequest.samples([3]))
    assert (
        torch.equal(autodiff.flat_params(model), before) and len(strategy.ledger) == 0 and len(strategy.accountant) == 0
    )


def test_budget_refusal_changes_nothing(bounded):
    model, rec, c = copy_of(bounded)
    strategy = HFUnlearner(model, rec, constants=c, release=ReleaseConfig(epsilon=1.0, delta=DELTA, budget=1.2))
    strategy.forget(ForgetRequest.samples([3]))
    weights, state, n_active = (
        autodiff.flat_params(model),
        copy.deepcopy(rec.state_dict()),
        len(strategy.catalog.active_ids()),
    )
    with pytest.raises(ReleaseRefused, match="privacy budget exceeded"):
        strategy.forget(ForgetRequest.samples([4]))  # two releases at epsilon = 1 compose to about 1.4 > 1.2
    assert torch.equal(autodiff.flat_params(model), weights) and len(strategy.catalog.active_ids()) == n_active
    assert len(strategy.accountant) == 1 and len(strategy.ledger) == 1
    assert torch.equal(rec.state_dict()["A"], state["A"]) and rec.unlearning_state.privacy == state["privacy"]


def test_accountant_survives_a_checkpoint_and_a_ledger(bounded, tmp_path):
    model, rec, c = copy_of(bounded)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    strategy = HFUnlearner(model, rec, constants=c, ledger=ledger)
    strategy.forget(ForgetRequest.samples([3]))
    strategy.forget(ForgetRequest.samples([4]))
    restored = TrajectoryRecorder(dtype=torch.float64)
    restored.load_state_dict(rec.state_dict())  # what a checkpoint holds
    again = HFUnlearner(copy.deepcopy(model), restored, constants=c)
    assert again.accountant.history == strategy.accountant.history and len(again.accountant) == 2
    fresh = TrajectoryRecorder(dtype=torch.float64)
    fresh.load_state_dict({**rec.state_dict(), "privacy": None})  # an older checkpoint: rebuilt from the ledger
    from_ledger = HFUnlearner(copy.deepcopy(model), fresh, constants=c, ledger=Ledger(tmp_path / "ledger.jsonl"))
    assert from_ledger.accountant.history == strategy.accountant.history


def test_composition_is_one_gaussian_release_at_any_noise_multiplier():
    """K Gaussian releases compose into one with mu = sqrt(sum 1/z^2) ([GDP] Cor. 3.3): 200 identical releases
    spend what one release of multiplier z/sqrt(200) spends; a tiny multiplier stays exact and below RDP's bound."""
    z = analytic_sigma(1.0, 1.0, DELTA)
    many = PrivacyAccountant("pld", tuple(Release(sigma=z, sensitivity=1.0) for _ in range(200)))
    one = PrivacyAccountant("pld", (Release(sigma=z / math.sqrt(200), sensitivity=1.0),))
    assert many.get_epsilon(DELTA) == pytest.approx(one.get_epsilon(DELTA), rel=1e-12)
    assert gaussian_delta(1.0, math.sqrt(200) / z, many.get_epsilon(DELTA)) <= DELTA  # Theorem 8 holds there
    tiny = PrivacyAccountant("pld").with_release(Release(sigma=1e-4, sensitivity=10.0))
    direct = rdp_privacy_accountant.RdpAccountant()
    direct.compose(dp_event.GaussianDpEvent(noise_multiplier=1e-5))
    exact = tiny.get_epsilon(DELTA)
    assert gaussian_delta(1e-4, 10.0, exact) <= DELTA < gaussian_delta(1e-4, 10.0, exact * (1 - 1e-9))
    assert tiny.totals(DELTA)["accountant"] == "pld" and exact < direct.get_epsilon(DELTA)


# -- [CCL] strategies: task optimality as the recipe condition ---------------------------------------------------
def fit_checked(max_epochs: int, tolerance: float):
    from helpers_certified import cl_tasks, proximal_model, trainer
    from torch.utils.data import DataLoader

    from lightning_unlearn.callbacks import CCLHessianRecorder, TaskOptimality

    tasks, model, rec, check = cl_tasks(40)[:2], proximal_model(), CCLHessianRecorder(), TaskOptimality(tolerance)
    c = linear_model_constants(max(float(t.dataset.tensors[0].norm(dim=1).max()) for t in tasks), model.l2)
    for k, ds in enumerate(tasks):
        rec.experience = k
        trainer([rec, check], max_epochs=max_epochs).fit(model, DataLoader(ds, batch_size=len(ds)))
    return model, rec, check, c


def test_continual_certified_release_needs_every_task_solved_to_tolerance():
    from lightning_unlearn.unlearners import CCLGradientUnlearner

    model, rec, check, c = fit_checked(max_epochs=2, tolerance=1e-6)
    assert max(check.residuals) <= 1e-6  # full-batch L-BFGS solves these tasks
    fresh = lambda: (copy.deepcopy(model), copy.deepcopy(rec))  # noqa: E731
    cert = (
        CCLGradientUnlearner(*fresh(), constants=c, optimality=check).forget(ForgetRequest.of_experience(0)).certificate
    )
    assert cert.certified and cert.recipe == "checked" and cert.constants == "bounded"
    unchecked = CCLGradientUnlearner(*fresh(), constants=c).forget(ForgetRequest.of_experience(0)).certificate
    assert unchecked.recipe == "unchecked" and not unchecked.certified
    check.residuals[1] = 1e-3  # as if the second task had stopped early
    strategy = CCLGradientUnlearner(*fresh(), constants=c, optimality=check)
    with pytest.raises(ValueError, match=r"task 1 was solved to a gradient residual 0.001 > tolerance 1e-06"):
        strategy.forget(ForgetRequest.of_experience(0))


# -- ReleaseConfig: the one owner of the release settings ---------------------------------------------
@pytest.mark.parametrize(
    "fields, message",
    [
        ({"epsilon": 0.0}, "epsilon must be positive and finite, got 0.0"),
        ({"delta": 1.0}, r"delta must lie in \(0, 1\), got 1.0"),
        ({"delta": None}, "takes epsilon and delta together; got epsilon=1.0, delta=None"),
        ({"epsilon": None, "delta": None, "budget": 2.0}, "budget= accounts"),
        ({"budget": -1.0}, "budget=-1.0: epsilon must be positive"),
        ({"budget": (1.0, 2.0)}, r"budget=\(1.0, 2.0\): delta must lie in"),
        ({"sigma_override": math.inf}, "sigma_override must be finite and >= 0, got inf"),
        ({"sigma_override": -0.1}, "sigma_override must be finite and >= 0, got -0.1"),
        ({"seed": 1.5}, "seed must be an integer or None, got 1.5"),
        ({"noise": "no"}, "noise must be True or False, got 'no'"),
        ({"accountant": "prv"}, "accountant must be one of \\('pld', 'rdp'\\), got 'prv'"),
    ],
)
def test_release_config_refuses_a_bad_field_naming_it(fields, message):
    with pytest.raises(ValueError, match=message):
        ReleaseConfig(**fields)


def test_release_config_defaults_are_each_unlearners_former_keyword_defaults():
    """The seven keywords' defaults before ReleaseConfig: 1.0, 1e-5, noise on, no override, OS entropy, no budget,
    PLD; noisy_finetune accounted with RDP and SAFE had no (epsilon, delta) target; each keeps its own."""
    from lightning_unlearn import (
        CCLGradientUnlearner,
        CCLHessianUnlearner,
        InfinitesimalJackknifeUnlearner,
        NewtonStepUnlearner,
        NoisyFinetuneUnlearner,
        ResolveUnlearner,
        SAFEUnlearner,
        SlicedResolveUnlearner,
    )

    assert (ReleaseConfig().epsilon, ReleaseConfig().delta, ReleaseConfig().noise) == (1.0, 1e-5, True)
    assert (ReleaseConfig().sigma_override, ReleaseConfig().seed, ReleaseConfig().budget) == (None, None, None)
    assert ReleaseConfig().accountant == "pld"
    same = (
        HFUnlearner,
        CCLHessianUnlearner,
        CCLGradientUnlearner,
        NewtonStepUnlearner,
        InfinitesimalJackknifeUnlearner,
        ResolveUnlearner,
        SlicedResolveUnlearner,
    )
    assert all(cls.default_release == ReleaseConfig() for cls in same)
    assert NoisyFinetuneUnlearner.default_release == ReleaseConfig(accountant="rdp")
    assert SAFEUnlearner.default_release == ReleaseConfig(epsilon=None, delta=None)


def test_release_config_example_runs_as_a_doctest():
    import doctest

    from lightning_unlearn.privacy import release

    failed, attempted = doctest.testmod(release, optionflags=doctest.ELLIPSIS)
    assert (failed, attempted) == (0, 4)


def test_an_unlearner_refuses_release_settings_that_are_not_a_release_config(bounded):
    model, rec, _ = bounded
    with pytest.raises(TypeError, match="hf release= takes a ReleaseConfig, got dict"):
        HFUnlearner(model, rec, release={"epsilon": 1.0})  # type: ignore[arg-type]
