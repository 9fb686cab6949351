"""HF ([HF]): TrajectoryRecorder statistics and HFUnlearner deletions against masked-gradient retraining."""

import math

import pytest
import torch
from helpers_certified import (
    D_IN,
    N_CLASSES,
    blobs,
    concat_indexed,
    fit_hf,
    recorded,
    replay,
    same_state,
    sgd_model,
    trainer,
    user_model,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig, ReleaseRefused
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.privacy import analytic_sigma
from lightning_unlearn.unlearners import HFUnlearner

EPS, DELTA = 0.5, 1e-5


@pytest.fixture(scope="module")
def fitted():
    ds = blobs(96, seed=0)
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, ds, rec)
    return ds, model, rec, w0


def fresh_copy(fitted):
    ds, model, rec, w0 = fitted
    m2 = sgd_model()
    autodiff.set_flat_params(m2, autodiff.flat_params(model))
    r2 = TrajectoryRecorder(dtype=torch.float64)
    r2.load_state_dict(rec.state_dict())
    return ds, m2, r2, w0


def test_replay_without_removal_reproduces_training(fitted):
    ds, model, rec, w0 = fitted
    assert torch.allclose(replay(model, rec, w0, ds, set()), autodiff.flat_params(model), atol=1e-12)


def test_deletion_closer_to_retrain_and_within_bound(fitted):
    ds, model, rec, w0 = fresh_copy(fitted)
    U = [3, 17, 40, 77]
    w, w_retrain = autodiff.flat_params(model), replay(model, rec, w0, ds, set(U))
    strategy = HFUnlearner(model, rec, release=ReleaseConfig(epsilon=EPS, delta=DELTA, seed=0))
    result = strategy.forget(ForgetRequest.samples(U))
    w_bar = strategy.clean_parameters()
    original, approx = float((w - w_retrain).norm()), float((w_bar - w_retrain).norm())
    # tolerance: HF's pre-noise weights are >= 10x closer to retraining than the original model
    assert approx <= 0.1 * original, (approx, original)
    assert approx <= result.certificate.bounds["sensitivity"]  # Theorem 4 bound (sum form of Eq. (56))
    assert not torch.allclose(autodiff.flat_params(model), w_bar)  # noise was published


def test_online_stream_equals_batch_deletion(fitted):
    U = [5, 6, 50]
    _, m_batch, r_batch, _ = fresh_copy(fitted)
    batch = HFUnlearner(m_batch, r_batch, release=ReleaseConfig(noise=False))
    batch.forget(ForgetRequest.samples(U))
    _, m_online, r_online, _ = fresh_copy(fitted)
    online = HFUnlearner(m_online, r_online, release=ReleaseConfig(noise=False))
    for u in U:
        result = online.forget(ForgetRequest.samples([u]))
    # Theorem 1: the sum of single approximators equals the batch approximator
    assert torch.allclose(online.clean_parameters(), batch.clean_parameters(), atol=1e-12)
    assert result.certificate.bounds["deleted_total"] == 3 and result.certificate.epsilon is None


def independent_gamma(rec: TrajectoryRecorder, ids: list[int]) -> float:
    """Sum form before Eq. (56) with q = 1 (constant step size), written out with Python loops."""
    T, eta, G = rec.n_steps, rec.lrs[0], rec.grad_max
    rho = max(max(abs(1 - lr * rec.l2), abs(1 - lr * rec.smoothness)) for lr in rec.lrs)
    c1 = 2 * eta**2 * G * sum(k * rho ** (T - 1 - k) for k in range(T))
    rows, steps = rec.occurrences()
    total = 0.0
    for u in ids:
        occ = steps[rows == rec.row_of[u]].tolist()
        total += c1 + sum(2 * eta * G / rec.batch_sizes[t] * rho ** (T - t - 1) for t in occ)
    return total


def test_sigma_matches_formula(fitted):
    ds, model, rec, w0 = fresh_copy(fitted)
    strategy = HFUnlearner(model, rec, bound="paper", release=ReleaseConfig(epsilon=EPS, delta=DELTA, seed=3))
    cert = strategy.forget(ForgetRequest.samples([1, 2])).certificate
    gamma = independent_gamma(rec, [1, 2])
    assert cert.bounds["sensitivity"] == pytest.approx(gamma, rel=1e-9)
    # calibrated by the analytic Gaussian mechanism; the papers' classical formula is reported beside it
    assert cert.sigma == pytest.approx(analytic_sigma(gamma, EPS, DELTA), rel=1e-12)
    assert cert.bounds["sigma_classical"] == pytest.approx(
        gamma * math.sqrt(2 * math.log(1.25 / DELTA)) / EPS, rel=1e-12
    )
    assert cert.seeded and not cert.certified  # a seeded release is reproducible, hence not private
    noise = autodiff.flat_params(model) - strategy.clean_parameters()
    expected = cert.sigma * torch.randn(noise.shape, generator=torch.Generator().manual_seed(3), dtype=noise.dtype)
    assert torch.allclose(noise, expected, rtol=1e-9, atol=1e-9)
    # a second request is calibrated on all 3 deletions so far
    cert2 = strategy.forget(ForgetRequest.samples([9])).certificate
    assert cert2.bounds["sensitivity"] == pytest.approx(independent_gamma(rec, [1, 2, 9]), rel=1e-9)


def test_analytic_gaussian_is_tight(fitted):
    ds, model, rec, _ = fresh_copy(fitted)
    cert = (
        HFUnlearner(model, rec, release=ReleaseConfig(epsilon=3.0, delta=DELTA))
        .forget(ForgetRequest.samples([4]))
        .certificate
    )
    s, sig, eps = cert.bounds["sensitivity"], cert.sigma, 3.0
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    achieved = phi(s / (2 * sig) - eps * sig / s) - math.exp(eps) * phi(-s / (2 * sig) - eps * sig / s)
    assert achieved == pytest.approx(DELTA, rel=1e-6)  # Balle & Wang (2018), Theorem 8, tight


def slow_recursion(model: nn.Module, rec: TrajectoryRecorder, w0: torch.Tensor, ds) -> torch.Tensor:
    """The recursion of Eq. (10) with one autograd HVP / gradient per sample and per step (no vmap)."""
    x_all, y_all = ds.dataset.tensors
    spec = autodiff.param_spec(model)

    def objective(theta, x, y):
        logits = torch.func.functional_call(model, autodiff.unflatten(theta, spec), (x,))
        return nn.functional.cross_entropy(logits, y) + 0.5 * rec.l2 * theta.pow(2).sum()

    A = torch.zeros(len(ds), w0.numel(), dtype=torch.float64)
    theta = w0.clone()
    rows, steps = rec.occurrences()
    for t in range(rec.n_steps):
        ids = [rec.row_ids[r] for r in rows[steps == t].tolist()]
        xb, yb, lr = x_all[ids], y_all[ids], rec.lrs[t]
        new = A.clone()
        for u in range(len(ds)):
            _, hv = torch.autograd.functional.hvp(lambda th, xb=xb, yb=yb: objective(th, xb, yb), theta, A[u])
            new[u] = A[u] - lr * hv
        for u in ids:
            th = theta.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(objective(th, x_all[u : u + 1], y_all[u : u + 1]), th)
            new[u] += lr / len(ids) * g
        th = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(objective(th, xb, yb), th)
        A, theta = new, theta - lr * g
    return A


@pytest.mark.parametrize(("hessian", "row_block"), [("hvp", 4096), ("dense", 4096), ("hvp", 5)])
def test_vmap_statistics_equal_slow_loop_on_tiny_mlp(hessian, row_block):
    ds = blobs(24, seed=2)
    net = nn.Sequential(nn.Linear(D_IN, 5), nn.Tanh(), nn.Linear(5, N_CLASSES)).double()
    model, rec = (
        sgd_model(net, lr=0.2, l2=0.01),
        TrajectoryRecorder(dtype=torch.float64, hessian=hessian, row_block=row_block),
    )
    w0 = fit_hf(model, ds, rec, epochs=2, batch_size=8)
    slow = slow_recursion(model, rec, w0, ds)
    fast = rec.A[[rec.row_of[i] for i in range(24)]]
    assert fast.abs().max() > 1e-3  # non-trivial statistics
    assert torch.allclose(fast, slow, rtol=1e-8, atol=1e-10)


def test_checkpoint_roundtrip_and_mmap_float16_store(tmp_path):
    ds = blobs(48, seed=1)
    model, rec = sgd_model(), TrajectoryRecorder()
    tr = trainer([rec], max_epochs=2, enable_checkpointing=True, default_root_dir=tmp_path)
    tr.fit(model, DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)))
    tr.save_checkpoint(tmp_path / "hf.ckpt")
    (epoch_end,) = (tmp_path / "checkpoints").glob("*.ckpt")  # saved by ModelCheckpoint inside the fit
    for path in (tmp_path / "hf.ckpt", epoch_end):
        restored = TrajectoryRecorder()
        restored.load_from_checkpoint(path)
        assert torch.equal(restored.A[: restored.n_rows], rec.A[: rec.n_rows]) and restored.lrs == rec.lrs
        assert sorted(restored.catalog.ids.tolist()) == sorted(rec.catalog.ids.tolist()) == list(range(48))
    assert same_state(recorded(restored), recorded(rec))

    mm = TrajectoryRecorder(dtype=torch.float16, store="mmap", path=tmp_path / "a.bin", capacity=64)
    trainer([mm], max_epochs=2).fit(
        sgd_model(), DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    )
    assert (tmp_path / "a.bin").stat().st_size == 64 * rec.A.shape[1] * 2
    assert mm.memory_bytes() == 48 * rec.A.shape[1] * 2
    assert torch.allclose(mm.A[:48].float(), rec.A[:48].float(), rtol=1e-2, atol=1e-3)  # float16 rounding

    empty = tmp_path / "empty.ckpt"
    tr2 = trainer([], max_epochs=1)
    tr2.fit(sgd_model(), DataLoader(ds, batch_size=16))
    tr2.save_checkpoint(empty)
    with pytest.raises(ValueError, match="holds no statistics"):
        TrajectoryRecorder().load_from_checkpoint(empty)
    state = rec.state_dict()
    state["A"] = None
    with pytest.raises(ValueError, match="lacks recorded statistics"):
        TrajectoryRecorder().load_state_dict(state)


def test_bad_input_changes_nothing(fitted):
    ds, model, rec, _ = fresh_copy(fitted)
    strategy = HFUnlearner(model, rec, capacity="error", max_deletions=3, release=ReleaseConfig(seed=0))
    strategy.forget(ForgetRequest.samples([0, 1]))
    before_w, before_stats, before_ledger = autodiff.flat_params(model), recorded(rec), len(strategy.ledger)
    bad = [([1], "already forgotten"), ([9999], "unknown"), ([2, 3], "capacity")]
    for ids, msg in bad:
        with pytest.raises(ValueError, match=msg):
            strategy.forget(ForgetRequest.samples(ids))
        assert torch.equal(autodiff.flat_params(model), before_w) and same_state(recorded(rec), before_stats)
        assert len(strategy.ledger) == before_ledger and int(rec.catalog.forgotten.sum()) == 2
    other = sgd_model(nn.Linear(D_IN, N_CLASSES + 1).double())
    with pytest.raises(ValueError, match="trainable parameters"):
        HFUnlearner(other, rec).forget(ForgetRequest.samples([2]))
    assert same_state(recorded(rec), before_stats) and int(rec.catalog.forgotten.sum()) == 2
    with pytest.warns(UserWarning, match="capacity exceeded"):
        HFUnlearner(model, rec, max_deletions=1).forget(ForgetRequest.samples([2]))


def test_untracked_samples_and_unsupported_training_are_errors():
    ds = blobs(32, seed=4)
    model, rec = sgd_model(), TrajectoryRecorder(track=range(16))
    fit_hf(model, ds, rec, epochs=1)
    assert rec.n_rows == 16 and len(rec.catalog) == 32
    w = autodiff.flat_params(model)
    with pytest.raises(ValueError, match="not tracked"):
        HFUnlearner(model, rec).forget(ForgetRequest.samples([20]))
    assert torch.equal(autodiff.flat_params(model), w) and not bool(rec.catalog.forgotten.any())
    late = TrajectoryRecorder(track=range(24, 32))  # the first batches hold no tracked sample
    trainer([late]).fit(sgd_model(), DataLoader(ds, batch_size=8))
    assert late.n_rows == 8 and late.n_steps == 4 and bool(late.A[:8].abs().sum(1).gt(0).all())
    with pytest.raises(ValueError, match="momentum"):
        momentum = sgd_model()
        momentum.momentum = 0.9
        fit_hf(momentum, ds, TrajectoryRecorder(), epochs=1)
    with pytest.raises(ValueError, match="Lightning callback"):
        rec.record(model, *ds.dataset.tensors, ds.ids)


def test_recursion_continues_across_experiences():
    """Two fits (experiences) on one recorder: an experience-0 sample forgotten after experience 1."""
    first, second = blobs(48, seed=5), blobs(48, seed=6, shift=0.5, id_offset=100)
    model, rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, first, rec, epochs=2)
    fit_hf(model, second, rec, epochs=2)
    assert rec.catalog.experiences.unique().tolist() == [0, 1] and rec.n_steps == 12
    both = concat_indexed(first, second)
    assert torch.allclose(replay(model, rec, w0, both, set()), autodiff.flat_params(model), atol=1e-12)
    w, w_retrain = autodiff.flat_params(model), replay(model, rec, w0, both, {7, 120})
    strategy = HFUnlearner(model, rec, release=ReleaseConfig(noise=False))
    strategy.forget(ForgetRequest.samples([7, 120]))
    assert float((strategy.clean_parameters() - w_retrain).norm()) <= 0.1 * float((w - w_retrain).norm())


def test_sum_form_bound_equals_closed_form_eq56_with_decaying_step():
    """With eta_t = eta q^t, |B| constant and u at step e B + b of every epoch, the sum form equals Eq. (56)."""
    eta, q, rho, G, B, E, bsz, b = 0.1, 0.97, 0.99, 3.0, 5, 4, 8, 2
    T = E * B
    lrs = eta * q ** torch.arange(T, dtype=torch.float64)
    occ = torch.tensor([e * B + b for e in range(E)])
    c1, c2 = hf.per_sample_bound(occ, lrs, torch.full((T,), bsz), G, rho)
    closed1 = 2 * eta**2 * G / (1 - q) * ((rho**T - q**T) / (rho - q) - (rho**T - q ** (2 * T)) / (rho - q**2))
    closed2 = 2 * eta * G / bsz * (rho**T - q**T) / (rho**B - q**B) * rho ** (B - b - 1) * q**b
    assert c1 == pytest.approx(closed1, rel=1e-10) and c2 == pytest.approx(closed2, rel=1e-10)


def test_gaussian_mechanism_rejects_bad_privacy_parameters(fitted):
    ds, model, rec, _ = fitted
    for eps, delta in ((0.0, 1e-5), (1.0, 0.0), (1.0, 1.5), (float("inf"), 1e-5)):
        with pytest.raises(ValueError, match="epsilon|delta"):
            HFUnlearner(model, rec, release=ReleaseConfig(epsilon=eps, delta=delta))


def test_sigma_override_is_reported_as_uncertified(fitted):
    ds, model, rec, _ = fresh_copy(fitted)
    strategy = HFUnlearner(model, rec, release=ReleaseConfig(sigma_override=0.01, seed=0))
    cert = strategy.forget(ForgetRequest.samples([8])).certificate
    assert cert.epsilon is None and not cert.certified and cert.sigma == 0.01 and cert.bounds["sigma_formula"] > 0.01
    noise = autodiff.flat_params(model) - strategy.clean_parameters()
    assert torch.allclose(
        noise, 0.01 * torch.randn(noise.shape, generator=torch.Generator().manual_seed(0), dtype=noise.dtype)
    )


# -- bring your own model -------------------------------------------------------------------------------
def test_user_module_with_its_own_loss_meets_the_exactness_tests():
    """A user LightningModule (own training_step with CE, SGD weight_decay as the ridge): same guarantees."""
    ds = blobs(96, seed=0)
    model, rec = user_model(lr=0.1, weight_decay=0.1), TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, ds, rec)
    assert rec.l2 == 0.1  # read from the optimizer
    assert torch.allclose(
        replay(model, rec, w0, ds, set()), autodiff.flat_params(model), atol=1e-12
    )  # float64 trajectory
    U = [3, 17, 40, 77]
    w, w_retrain = autodiff.flat_params(model), replay(model, rec, w0, ds, set(U))
    strategy = HFUnlearner(model, rec, release=ReleaseConfig(epsilon=EPS, delta=DELTA, seed=0))
    cert = strategy.forget(ForgetRequest.samples(U)).certificate
    approx = float((strategy.clean_parameters() - w_retrain).norm())
    assert approx <= 0.1 * float((w - w_retrain).norm()) and approx <= cert.bounds["sensitivity"]


def test_label_smoothed_training_loss_is_refused_at_fit_start():
    ds = blobs(32, seed=4)
    smoothed = user_model(smoothing=0.1)
    w = autodiff.flat_params(smoothed)
    with pytest.raises(
        ValueError,
        match=r"loss_fn disagrees with UserModule.training_step on a batch: "
        r"mean loss_fn = [0-9.]+, training loss = [0-9.]+",
    ):
        fit_hf(smoothed, ds, TrajectoryRecorder(), epochs=1)
    assert torch.equal(autodiff.flat_params(smoothed), w)  # refused before the first step
    # the per-sample form of the same loss is accepted, and the recursion follows it
    smooth_ce = lambda out, y: nn.functional.cross_entropy(out, y, label_smoothing=0.1, reduction="none")  # noqa: E731
    rec = TrajectoryRecorder(dtype=torch.float64, loss_fn=smooth_ce)
    fit_hf(user_model(smoothing=0.1), ds, rec, epochs=1)
    assert rec.n_steps == 2
    with pytest.raises(ValueError, match="momentum=0.9"):
        fit_hf(user_model(momentum=0.9), ds, TrajectoryRecorder(), epochs=1)


class _FrozenNormCNN(nn.Module):
    """Conv -> BatchNorm (kept in eval mode, the documented way to use BatchNorm with HF) -> tanh -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Linear(3 * 4 * 4, N_CLASSES)
        self.norm.eval()  # Lightning does not switch submodule modes at fit start: set it once, and keep it in train()

    def train(self, mode: bool = True) -> "_FrozenNormCNN":
        super().train(mode)
        self.norm.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.conv(x.view(-1, 1, 6, 6)))).flatten(1))


def cnn_data(n: int = 32) -> IndexedDataset:
    g = torch.Generator().manual_seed(8)
    y = torch.arange(n) % N_CLASSES
    x = torch.randn(n, 36, generator=g, dtype=torch.float64) + y[:, None].double()
    return IndexedDataset(TensorDataset(x, y), ids=torch.arange(n))


def test_cnn_forget_without_noise_reports_an_infinite_bound_instead_of_overflowing():
    """HF on a small user CNN; with a curvature that makes rho^T leave the float range (here forced by a
    smoothness override; on a trained CNN over a long trajectory the measured one does) noise=False still
    forgets and reports the infinite bound as uncertified, and a certified request is refused cleanly."""
    ds = cnn_data()
    torch.manual_seed(0)  # the CNN's initialisation (a smooth tanh net: HF's Taylor step needs no ReLU kinks)
    model = user_model(_FrozenNormCNN().double(), lr=0.05, weight_decay=0.01)
    rec = TrajectoryRecorder(dtype=torch.float64)
    w0 = fit_hf(model, ds, rec, epochs=2, batch_size=8)
    assert torch.allclose(replay(model, rec, w0, ds, set()), autodiff.flat_params(model), atol=1e-12)
    w, w_retrain = autodiff.flat_params(model), replay(model, rec, w0, ds, {5})
    strategy = HFUnlearner(
        model, rec, smoothness=1e60, bound="paper", release=ReleaseConfig(noise=False)
    )  # rho = lr M - 1 ~ 5e58: 1e410
    cert = strategy.forget(ForgetRequest.samples([5])).certificate
    assert cert.bounds["sensitivity"] == math.inf and cert.epsilon is None and "infinite" in cert.statement
    assert float((strategy.clean_parameters() - w_retrain).norm()) <= 0.1 * float((w - w_retrain).norm())
    refusal = r"refuses a certified release: step size lr = 0.05 exceeds 2/\(M \+ lambda\)"
    with pytest.raises(ReleaseRefused, match=refusal):
        HFUnlearner(model, rec, smoothness=1e60).forget(
            ForgetRequest.samples([6])
        )  # the recipe guard names lr, M, lambda


def test_bound_and_capacity_in_log_space_do_not_overflow():
    T = 2000
    lrs, sizes = torch.full((T,), 0.5, dtype=torch.float64), torch.full((T,), 8)
    c1, c2 = hf.per_sample_bound(torch.tensor([3, 1500]), lrs, sizes, 2.0, rho=3.0)  # 3^1999 ~ 1e954
    assert c1 == math.inf and c2 == math.inf
    assert hf.deletion_capacity(1.0, 1e-5, 0.5, 100, 3.0, T) == 0.0
    c1, c2 = hf.per_sample_bound(torch.tensor([3]), lrs[:10], sizes[:10], 2.0, rho=0.9)
    assert c1 == pytest.approx(2 * 0.25 * 2.0 * sum(k * 0.9 ** (9 - k) for k in range(10)), rel=1e-12)
    assert c2 == pytest.approx(2 * 0.5 * 2.0 / 8 * 0.9**6, rel=1e-12)
