"""SAFE streaming unlearning ([SAFE]): recorded statistics against direct recomputation, the round's step, noise,
state."""

import copy
import math

import pytest
import torch
from helpers_certified import D_IN, N_CLASSES, blobs, trainer
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_unlearn import ForgetRequest, ReleaseConfig
from lightning_unlearn.callbacks import SAFERecorder
from lightning_unlearn.functional import safe
from lightning_unlearn.metrics import accuracy
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.privacy import analytic_sigma
from lightning_unlearn.unlearners import SAFEUnlearner

N = 120


def mlp_model() -> SupervisedClassifier:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(D_IN, 16), nn.Tanh(), nn.Linear(16, N_CLASSES)).double()
    return SupervisedClassifier(net, lr=0.2)


def fit(model, ds, rec, epochs: int = 6, **kw):
    loader = DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([rec], max_epochs=epochs, **kw).fit(model, loader)


@pytest.fixture(scope="module")
def fitted():
    ds = blobs(N, seed=0)
    model, rec = mlp_model(), SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    fit(model, ds, rec)
    return ds, model, rec


def copies(fitted):
    ds, model, rec = fitted
    r2 = SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    r2.load_state_dict(rec.state_dict())
    return ds, copy.deepcopy(model), r2


def tensors(ds, ids=None):
    rows = range(len(ds)) if ids is None else [int(i) for i in ids]
    items = [ds[i] for i in rows]
    return torch.stack([it[0] for it in items]), torch.stack([torch.as_tensor(it[1]) for it in items]).long()


def direct_grad_sum(model, x, y):
    """sum_i grad CE(f(x_i; w), y_i) by plain autograd on the given data (the retraining-side quantity)."""
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return out


def at_w0(rec, model):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(rec.w0[n])
    return m


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def state_equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(state_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def test_anchor_statistics_equal_direct_computation_on_the_training_data(fitted):
    ds, model, rec = fitted
    x, y = tensors(ds)
    assert rec.n_anchor == rec.n_retained == N and rec.rounds == 0
    assert all(torch.equal(rec.w0[n], p.detach()) for n, p in model.named_parameters())
    direct = direct_grad_sum(model, x, y)
    for n in direct:  # Eq. (12)-(15): |D_0| grad R_0(w_0); float64, summation order only
        assert torch.allclose(rec.grad_sum[n], direct[n], rtol=1e-10, atol=1e-10), n
    assert math.isclose(
        float(rec.loss_sum), float(nn.functional.cross_entropy(model(x), y, reduction="sum")), rel_tol=1e-10
    )
    u = safe.project(x, rec.V)
    for c in range(N_CLASSES):  # Eq. (21): class mean and covariance of the projection
        uc = u[y == c]
        assert rec.counts[c] == len(uc)
        assert torch.allclose(rec.ref_mean[c], uc.mean(0), atol=1e-10)
        cov = torch.cov(uc.T)
        ridge = rec.ridge * torch.trace(cov) / cov.shape[0] * torch.eye(cov.shape[0], dtype=cov.dtype)
        assert torch.allclose(rec.ref_cov[c], cov + ridge, rtol=1e-9, atol=1e-9)


def test_a_round_updates_statistics_to_those_of_the_retained_data_without_seeing_it(fitted):
    ds, model, rec = copies(fitted)
    forget_ids = torch.tensor([3, 17, 40, 41, 99])
    only_forget = Subset(ds, forget_ids.tolist())  # the strategy is given nothing else
    SAFEUnlearner(model, rec, step_size=0.05).forget(ForgetRequest.samples(forget_ids), only_forget)
    keep = [i for i in range(N) if i not in set(forget_ids.tolist())]
    x, y = tensors(ds, keep)
    direct = direct_grad_sum(at_w0(rec, model), x, y)
    for n in direct:  # Eq. (15) kept as a sum: exactly the retained data's gradient at w_0
        assert torch.allclose(rec.grad_sum[n], direct[n], rtol=1e-10, atol=1e-10), n
    n, s1, s2 = safe.class_sums(safe.project(x, rec.V), y, N_CLASSES)  # Eq. (22)-(23) in exact (sum) form
    assert (
        torch.equal(rec.counts, n) and torch.allclose(rec.s1, s1, atol=1e-9) and torch.allclose(rec.s2, s2, atol=1e-8)
    )
    assert rec.n_retained == N - 5 and rec.rounds == 1 and rec.forget_ids.tolist() == forget_ids.tolist()


def test_each_round_is_one_normalised_step_of_size_gamma_from_w0(fitted):
    ds, model, rec = copies(fitted)
    w0 = flat(model).clone()
    K, T = 2.5, 20
    strategy = SAFEUnlearner(model, rec, lr_constant=K, expected_rounds=T)
    r1 = strategy.forget(ForgetRequest.samples([0, 1, 2]), ds)
    gamma = math.sqrt(float(w0.norm())) / (K * math.sqrt(T))  # Theorem 2's learning rate, W = ||w_0||
    assert math.isclose(r1.extra["step_size"], gamma, rel_tol=1e-12)
    assert math.isclose(float((flat(model) - w0).norm()), gamma, rel_tol=1e-9)  # Eq. (27) with b_t = 0
    r2 = strategy.forget(ForgetRequest.samples([5, 6]), ds)
    assert math.isclose(float((flat(model) - w0).norm()), gamma, rel_tol=1e-9)  # from w_0 again, not from w_1
    keep = [i for i in range(N) if i not in {0, 1, 2, 5, 6}]
    x, y = tensors(ds, keep)
    g_ret = torch.cat([g.flatten() for g in direct_grad_sum(at_w0(rec, model), x, y).values()]) / len(keep)
    assert math.isclose(r2.extra["grad_norm_retain"], float(g_ret.norm()), rel_tol=1e-9)
    assert r2.extra["round"] == 2 and r2.extra["n_forgotten_total"] == 5 and r2.extra["n_retained"] == N - 5
    assert math.isclose(r2.extra["theorem1_bound"], N_CLASSES * 5 / (N - 5) ** 1.5, rel_tol=1e-12)
    assert r2.extra["cumulative_surrogate_risk"] == pytest.approx(
        r1.extra["surrogate_risk"] + r2.extra["surrogate_risk"]
    )
    assert not r2.certificate.certified and len(strategy.ledger) == 2


def test_forgetting_a_class_drops_its_accuracy_and_keeps_the_others(fitted):
    ds, model, rec = copies(fitted)
    x, y = tensors(ds)
    gone = y == 1
    forget, retain = TensorDataset(x[gone], y[gone]), TensorDataset(x[~gone], y[~gone])
    assert accuracy(model, forget, N_CLASSES) > 0.8
    SAFEUnlearner(model, rec, step_size=2.0).forget(ForgetRequest.of_class(1), ds)
    assert accuracy(model, forget, N_CLASSES) < 0.1  # the pseudo-target gives an emptied class ~0 mass (Eq. (20))
    assert accuracy(model, retain, N_CLASSES) > 0.9


def test_theorem2_noise_is_calibrated_on_twice_the_weight_bound(fitted):
    eps, delta = 1.0, 1e-5
    _, plain_model, plain_rec = copies(fitted)
    ds, model, rec = copies(fitted)
    W = float(torch.cat([t.flatten() for t in rec.w0.values()]).norm())
    request = ForgetRequest.samples([7, 8])
    SAFEUnlearner(plain_model, plain_rec, step_size=0.1).forget(request, ds)
    noisy = SAFEUnlearner(model, rec, step_size=0.1, release=ReleaseConfig(epsilon=eps, delta=delta, seed=3))
    cert = noisy.forget(request, ds).certificate
    expected = analytic_sigma(2 * W, eps, delta)  # two models in the ball ||w|| <= W are at most 2W apart
    assert cert.epsilon == eps and cert.delta == delta and cert.seeded and cert.constants == "estimated"
    assert (
        not cert.certified
    )  # W = ||w_0|| is an assumption no later model is bound to respect, and the noise is seeded
    assert math.isclose(cert.sigma, expected, rel_tol=1e-12) and cert.bounds["W"] == pytest.approx(W)
    phi = W * math.sqrt(2 * math.log(1.25 / delta)) / eps  # phi_t of Theorem 2(iii), reported
    assert cert.bounds["sigma_classical_theorem2"] == pytest.approx(phi, rel=1e-12)
    b = flat(plain_model) - flat(model)  # w_t = w_0 - gamma g/||g|| - b_t
    assert abs(float(b.std()) / expected - 1) < 0.2  # 163 draws: the sample std is within 20 % w.p. > 0.999
    assert noisy.ledger[0].certificate["sigma"] == cert.sigma
    _, m3, r3 = copies(fitted)
    given = SAFEUnlearner(m3, r3, step_size=0.1, weight_bound=2 * W, release=ReleaseConfig(epsilon=eps, delta=delta))
    assert given.forget(request, ds).certificate.certified  # a stated W and OS-entropy noise


def test_state_survives_a_lightning_checkpoint_and_forgets_the_same(fitted, tmp_path):
    ds = blobs(N, seed=0)
    model, rec = mlp_model(), SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    fit(model, ds, rec)
    tr = trainer([rec])
    tr.strategy.connect(model)
    tr.save_checkpoint(tmp_path / "run.ckpt")
    restored = SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    restored.load_from_checkpoint(tmp_path / "run.ckpt")
    twin = copy.deepcopy(model)
    request = ForgetRequest.samples([10, 11, 12])
    SAFEUnlearner(model, rec, step_size=0.1).forget(request, ds)
    SAFEUnlearner(twin, restored, step_size=0.1).forget(request, ds)
    statistics = [
        {k: v for k, v in r.state_dict().items() if k != "ledger_anchor"} for r in (rec, restored)
    ]  # two ledgers
    assert torch.equal(flat(model), flat(twin)) and state_equal(*statistics)
    other = SAFERecorder(num_classes=N_CLASSES, proj_dim=8)
    with pytest.raises(ValueError, match=r"SAFERecorder with other settings \(proj_dim=4 there, 8 here\)"):
        other.load_from_checkpoint(tmp_path / "run.ckpt")


def test_a_later_experience_reanchors_and_keeps_the_earlier_gradient_sum():
    first, second = blobs(60, seed=0), blobs(60, seed=1, id_offset=1000)
    model, rec = mlp_model(), SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    fit(model, first, rec)
    g_first = direct_grad_sum(model, *tensors(first))  # at the first fit's w_0 (its data is gone afterwards)
    fit(model, second, rec)
    g_second = direct_grad_sum(model, *tensors(second))
    assert rec.n_anchor == 120 and rec.rounds == 0 and rec.catalog.experiences.unique().tolist() == [0, 1]
    for n in g_first:
        assert torch.allclose(rec.grad_sum[n], g_first[n] + g_second[n], rtol=1e-10, atol=1e-10), n


def test_bad_input_is_refused_and_changes_nothing(fitted):
    ds, model, rec = copies(fitted)
    strategy = SAFEUnlearner(model, rec)
    before, weights = copy.deepcopy(rec.state_dict()), flat(model).clone()
    x, y = tensors(ds)
    wrong_labels = Subset(blobs(N, seed=5), [0, 1])  # same ids 0, 1 with other labels
    cases = [
        (ForgetRequest.samples([1]), None, "needs the samples to forget"),
        (ForgetRequest.samples([1, 2]), Subset(ds, [1]), "lacks 1 requested sample ids"),
        (ForgetRequest.samples([999]), ds, "unknown sample ids"),
        (ForgetRequest.of_class(7), ds, "class 7 was never learned"),
        (ForgetRequest.of_experience(0), ds, "no retained sample"),
    ]
    if not torch.equal(tensors(wrong_labels)[1], y[:2]):
        cases.append((ForgetRequest.samples([0, 1]), wrong_labels, "labels differ from the learned labels"))
    for request, data, message in cases:
        with pytest.raises(ValueError, match=message):
            strategy.forget(request, data)
    strategy.forget(ForgetRequest.samples([4]), ds)
    with pytest.raises(ValueError, match="already forgotten"):
        strategy.forget(ForgetRequest.samples([4, 5]), ds)
    assert len(strategy.ledger) == 1 and rec.rounds == 1
    ds2, model2, rec2 = copies(fitted)
    strategy2 = SAFEUnlearner(model2, rec2)
    strategy2.recorder.V = torch.randn(D_IN + 1, 4, dtype=torch.float64)  # as if recorded on other inputs
    with pytest.raises(ValueError, match="features per sample but the recorded projection expects 7"):
        strategy2.forget(ForgetRequest.samples([1]), ds2)
    rec2.V = before["V"]
    assert state_equal(rec2.state_dict(), before) and torch.equal(flat(model2), weights) and len(strategy2.ledger) == 0


@pytest.mark.parametrize(
    "release, kwargs, message",
    [
        ({"epsilon": 1.0}, {}, "epsilon and delta together"),
        ({"epsilon": 1.0, "delta": 2.0}, {}, "delta must lie in \\(0, 1\\)"),
        ({"sigma_override": -0.1}, {}, "sigma_override must be finite and >= 0"),
        ({}, {"weight_bound": 0.0}, "must be positive"),
        ({}, {"forget_scope": "last"}, "forget_scope must be one of"),
    ],
)
def test_bad_options_are_refused(fitted, release, kwargs, message):
    _, model, rec = fitted
    with pytest.raises(ValueError, match=message):
        SAFEUnlearner(model, rec, release=ReleaseConfig(**{"epsilon": None, "delta": None, **release}), **kwargs)


def test_a_fixed_std_with_a_target_is_an_accounted_uncertified_release(fitted):
    """SAFE's release follows the shared ReleaseConfig: ``sigma_override`` with (epsilon, delta) publishes that std,
    accounted and not certified (as for every noised unlearner; it was refused before SAFE took a ReleaseConfig)."""
    ds, model, rec = copies(fitted)
    strategy = SAFEUnlearner(model, rec, step_size=0.1, release=ReleaseConfig(sigma_override=0.05))
    cert = strategy.forget(ForgetRequest.samples([7, 8]), ds).certificate
    assert not cert.certified and cert.epsilon is None and cert.sigma == 0.05
    assert "sigma_override" in cert.statement and cert.accounting["releases"] == 1 and len(strategy.accountant) == 1
