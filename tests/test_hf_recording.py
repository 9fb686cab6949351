"""HF recording ([HF] Eq. (10)): the per-step kernel, BatchNorm in training mode, float16 storage."""

import copy
import gc
import weakref

import lightning as L
import pytest
import torch
from helpers_certified import D_IN, N_CLASSES, blobs, fit_hf, sgd_model, trainer, user_model
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.functional import autodiff, hf
from lightning_unlearn.unlearners import HFUnlearner
from lightning_unlearn.warnings import UnlearningWarning


def test_propagate_is_eq10_on_a_chunk_with_repeated_rows():
    g = torch.Generator().manual_seed(0)
    d, k, lr, b = 7, 4, 0.3, 5
    S = torch.randn(d, d, generator=g, dtype=torch.float64)
    H = S @ S.T / d
    rows = torch.randn(k, d, generator=g, dtype=torch.float64)
    positions = torch.tensor([2, 0, 2])  # row 2 occurs twice in the batch: it injects twice (footnote 5)
    grads = torch.randn(3, d, generator=g, dtype=torch.float64)
    expected = rows - lr * rows @ H
    expected[2] += lr / b * (grads[0] + grads[2])
    expected[0] += lr / b * grads[1]
    got = hf.propagate(rows, lambda V: V @ H, lr, b, positions, grads)
    assert torch.allclose(got, expected, rtol=0, atol=1e-14)  # float64, O(d) operations of O(1) values
    assert torch.allclose(hf.propagate(rows, lambda V: V @ H, lr, b), rows - lr * rows @ H, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="3 injected rows but per-sample gradients of shape"):
        hf.propagate(rows, lambda V: V @ H, lr, b, positions, grads[:2])


def test_step_objective_hvp_and_sample_grads_match_autograd():
    ds = blobs(10, seed=3)
    x, y = ds.dataset.tensors
    net = nn.Sequential(nn.Linear(D_IN, 4), nn.Tanh(), nn.Linear(4, N_CLASSES)).double()
    loss = autodiff.ModuleLoss(net, 0.05)
    theta = autodiff.flat_params(net)
    step = hf.StepObjective(loss, theta, x, y, chunk_size=2)
    V = torch.randn(5, theta.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    reference = torch.stack([torch.autograd.functional.hvp(lambda t: loss.mean(t, x, y), theta, v)[1] for v in V])
    assert torch.allclose(step.hvp(V), reference, rtol=1e-10, atol=1e-12)  # float64, same arithmetic reordered
    positions = torch.tensor([1, 7])
    expected = torch.stack([torch.func.grad(loss)(theta, x[p], y[p]) for p in positions])
    assert torch.allclose(step.sample_grads(positions), expected, rtol=1e-10, atol=1e-12)
    assert not step.coupled and step.sample_grads(torch.tensor([], dtype=torch.long)).shape == (0, theta.numel())


class _BatchNormNet(nn.Module):
    """Linear -> BatchNorm1d (training mode: batch statistics) -> tanh -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, N_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _bn_model() -> L.LightningModule:
    torch.manual_seed(0)
    return user_model(_BatchNormNet().double(), lr=0.1, weight_decay=0.01)


def _manual_batch_loss(theta: torch.Tensor, spec, x: torch.Tensor, y: torch.Tensor, l2: float, n: int) -> torch.Tensor:
    """``n`` times the batch-statistics loss of :class:`_BatchNormNet` written out by hand (sum form)."""
    p = autodiff.unflatten(theta, spec)
    h = x @ p["net.net.0.weight"].T + p["net.net.0.bias"]
    h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-5) * p["net.net.1.weight"] + p["net.net.1.bias"]
    logits = torch.tanh(h) @ p["net.net.3.weight"].T + p["net.net.3.bias"]
    return n * (nn.functional.cross_entropy(logits, y) + 0.5 * l2 * theta.pow(2).sum())


def test_batchnorm_in_training_mode_rows_follow_the_batch_loss_and_buffers_are_untouched():
    """The recursion with H_t of the step's batch-statistics loss and leave-one-out injections
    ``grad S_B - grad S_{B without u}``, against a loop over a hand-written BatchNorm (float64)."""
    ds = blobs(24, seed=2)
    x_all, y_all = ds.dataset.tensors
    model, rec = _bn_model(), TrajectoryRecorder(torch.float64)
    with pytest.warns(UnlearningWarning, match=r"BatchNorm layers \['net.net.1'\] train with batch statistics"):
        w0 = fit_hf(model, ds, rec, epochs=2, batch_size=8)

    plain = _bn_model()
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([], max_epochs=2).fit(plain, loader)
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # recording changes neither the weights nor BatchNorm's running buffers

    spec, l2 = autodiff.param_spec(model), rec.l2
    rows, steps = rec.occurrences()
    A, theta = torch.zeros(24, w0.numel(), dtype=torch.float64), w0.clone()
    for t in range(rec.n_steps):
        ids = [rec.row_ids[r] for r in rows[steps == t].tolist()]
        xb, yb, lr, b = x_all[ids], y_all[ids], rec.lrs[t], len(ids)
        mean = lambda th, xb=xb, yb=yb, b=b: _manual_batch_loss(th, spec, xb, yb, l2, b) / b  # noqa: E731
        new = torch.stack([a - lr * torch.autograd.functional.hvp(mean, theta, a)[1] for a in A])
        full = torch.func.grad(mean)(theta) * b
        for j, u in enumerate(ids):
            keep = [i for i in range(b) if i != j]
            loo = torch.func.grad(_manual_batch_loss)(theta, spec, xb[keep], yb[keep], l2, b - 1)
            new[u] += lr / b * (full - loo)
        A, theta = new, theta - lr * full / b
    assert torch.allclose(theta, autodiff.flat_params(model), rtol=0, atol=1e-12)  # the reference replays the fit
    fast = rec.A[[rec.row_of[i] for i in range(24)]]
    assert fast.abs().max() > 1e-3
    assert torch.allclose(fast, A, rtol=1e-8, atol=1e-10)  # float64: the same sums in another order


def test_dropout_in_training_mode_is_refused():
    net = nn.Sequential(nn.Linear(D_IN, 4), nn.Dropout(0.5), nn.Linear(4, N_CLASSES)).double()
    with pytest.raises(ValueError, match=r"Dropout layers \['net.1'\] are in training mode"):
        fit_hf(user_model(net), blobs(16, seed=0), TrajectoryRecorder(), epochs=1)


class _RowNorms(L.Callback):
    """After the recorder's step (listed after it): ``S_u = sum_t ||a_u(t+1)||`` per row."""

    def __init__(self, rec: TrajectoryRecorder) -> None:
        self.rec, self.sums = rec, torch.zeros(0, dtype=torch.float64)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        norms = self.rec.A[: self.rec.n_rows].double().norm(dim=1)
        self.sums = torch.cat([self.sums, norms.new_zeros(norms.numel() - self.sums.numel())]) + norms


def test_float16_rows_stay_within_the_derived_rounding_bound_of_float32_rows(tmp_path):
    """Float16 storage, float32 accumulation: each step rounds a stored entry by at most u = 2^-11 relative
    (2^-25 absolute below the normal range). With contracting steps (eta ||H_t|| <= 2 on a convex loss) the
    rounding errors add up without growing: ||a16 - a32|| <= u sum_t ||a_t|| + T 2^-25 sqrt(d), plus the
    float32 arithmetic's own differences (64 eps32 sum_t ||a_t||, generous)."""
    x, y = blobs(48, seed=5).dataset.tensors
    ds = IndexedDataset(TensorDataset(x.float(), y), ids=torch.arange(48))

    def fit(rec: TrajectoryRecorder, *extra: L.Callback) -> None:
        torch.manual_seed(0)
        model = user_model(nn.Linear(D_IN, N_CLASSES), lr=0.1, weight_decay=0.1)
        loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1))
        trainer([rec, *extra], max_epochs=4).fit(model, loader)

    r32 = TrajectoryRecorder(torch.float32)
    norms = _RowNorms(r32)
    fit(r32, norms)
    r16 = TrajectoryRecorder(torch.float16, store="mmap", path=tmp_path / "rows.bin", capacity=48)
    fit(r16)
    assert r32.smoothness * 0.1 <= 2  # the steps contract: the bound applies
    assert r16.memory_bytes() * 2 == r32.memory_bytes() and r16.row_ids == r32.row_ids
    d, T = r32.A.shape[1], r32.n_steps
    u, eps32 = 2.0**-11, torch.finfo(torch.float32).eps
    tol = (u + 64 * eps32) * norms.sums + T * 2.0**-25 * d**0.5
    error = (r16.A[:48].double() - r32.A[:48].double()).norm(dim=1)
    assert bool((error <= tol).all()), (error / tol).max()
    assert float(error.max()) > 0  # float16 storage did round
    r16.close()


def test_a_recorder_holds_its_trainer_weakly_so_copies_share_it_and_discarded_ones_free_at_once():
    """The Trainer holds its callbacks: a recorder holding it strongly made a reference cycle (its tensors freed only
    when the cycle collector ran: a harness loop of dense-Hessian rows grew to 13 GB) and copy.deepcopy copied the
    whole Trainer with it."""
    model, rec = sgd_model(), TrajectoryRecorder(torch.float64)
    fit_hf(model, blobs(24, seed=5), rec, epochs=1, batch_size=8)
    assert rec.trainer is not None and rec.trainer is model.trainer  # alive while the module keeps it
    enabled = gc.isenabled()
    gc.disable()
    try:
        copied = copy.deepcopy(rec)
        assert copied.trainer is rec.trainer  # shared, not copied
        unlearner = HFUnlearner(copy.deepcopy(model), copied, release=ReleaseConfig(noise=False))
        unlearner.forget(ForgetRequest.samples([3]))
        alive = weakref.ref(copied)
        del unlearner, copied
        assert alive() is None  # freed by reference counting, with the cycle collector off
    finally:
        if enabled:
            gc.enable()
