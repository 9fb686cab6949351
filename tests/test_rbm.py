"""RBM and SalUn ([RBM]): the synthetic linear experiment of App. B.1 and the masked-fine-tuning strategy."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, quiet_trainer, toy_dataset
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.functional.rbm import masked_update, mean_loss_gradient, saliency_mask, trainable_mask
from lightning_unlearn.metrics import accuracy
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.unlearners import RBMUnlearner

F64 = torch.float64


# -- App. B.1: over-parameterised linear regression, min-norm fine-tuning (Eqs. (1)-(3)) ------------------
def min_norm(a: Tensor, b: Tensor, start: Tensor) -> Tensor:
    """``argmin ||w - start||  s.t.  a w = b`` (Eq. (2); Eq. (1)/(3) with ``start = 0``)."""
    return start + a.T @ torch.linalg.solve(a @ a.T, b - a @ start)


def projection(a: Tensor) -> Tensor:
    return a.T @ torch.linalg.solve(a @ a.T, a)


def mse(a: Tensor, b: Tensor, w: Tensor) -> float:
    return float(((a @ w - b) ** 2).mean())


def norm2(v: Tensor, a: Tensor) -> float:
    """``||v||^2`` in the metric ``a^T a / n`` (the theorems' ``X X^T / n``)."""
    return float(v @ (a.T @ a / len(a)) @ v)


@pytest.mark.parametrize("d_lap", [0, 8])
def test_synthetic_linear_experiment_retention_masking_keeps_the_remaining_loss(d_lap):
    """App. B.1 at small size: ``X_r = [R, L1, 0]``, ``X_f = [0, L2, F]``, ``y = X w``, n < d.

    Masks come from :func:`saliency_mask` on the gradients of a nearly interpolating model
    (ridge 1e-8: at the exact interpolant every gradient is 0). Masked models keep ``w_o`` on
    the kept weights and 0 elsewhere (Section 4), then fine-tune by Eq. (2) on the first
    ``n_t < n_r`` remaining samples. Checked: Theorems 3.2/3.4 (naive FT does not forget) and
    Theorem 4.1 (RBM = Option A keeps RL = 0; SalUn = Option B pays ``||(I - P_t) w_lap||^2``),
    each loss to 1e-9 relative to its closed form, with ``w_*`` the interpolant ``w_o``.
    """
    d_r, d_f, n_r, n_f, n_t = 16, 16, 12, 6, 8
    d = d_r + d_lap + d_f
    g = torch.Generator().manual_seed(0)
    x_r, x_f = torch.zeros(n_r, d, dtype=F64), torch.zeros(n_f, d, dtype=F64)
    x_r[:, : d_r + d_lap] = torch.randn(n_r, d_r + d_lap, generator=g, dtype=F64)
    x_f[:, d_r:] = torch.randn(n_f, d_lap + d_f, generator=g, dtype=F64)
    w_true = torch.randn(d, generator=g, dtype=F64)
    y_r, y_f = x_r @ w_true, x_f @ w_true
    x, y = torch.cat([x_r, x_f]), torch.cat([y_r, y_f])

    zero = torch.zeros(d, dtype=F64)
    w_o = min_norm(x, y, zero)  # Eq. (1)
    w_ridge = x.T @ torch.linalg.solve(x @ x.T + 1e-8 * torch.eye(len(x), dtype=F64), y)
    grad = {"r": 2 / n_r * x_r.T @ (x_r @ w_ridge - y_r), "f": 2 / n_f * x_f.T @ (x_f @ w_ridge - y_f)}
    m_r = saliency_mask({"w": grad["r"]}, threshold=1e-14)  # Eq. (9)
    m_f = saliency_mask({"w": grad["f"]}, threshold=1e-14)  # Eq. (6)
    assert m_r["w"].nonzero().flatten().tolist() == list(range(d_r + d_lap))  # features of D_r (with the overlap)
    assert m_f["w"].nonzero().flatten().tolist() == list(range(d_r, d))  # features of D_f (with the overlap)

    x_t, y_t = x_r[:n_t], y_r[:n_t]
    w_t = min_norm(x_t, y_t, w_o)  # naive FT
    w_g = min_norm(x_r, y_r, zero)  # golden: retrain on D_r (Eq. (3))
    keep = {"rbm": ~trainable_mask(m_r, "retain")["w"], "salun": ~trainable_mask(m_f, "forget")["w"]}
    w_hat = {m: min_norm(x_t, y_t, masked_update(zero, w_o, k)) for m, k in keep.items()}

    block = [
        torch.arange(d) < d_r,
        (torch.arange(d) >= d_r) & (torch.arange(d) < d_r + d_lap),
        torch.arange(d) >= d_r + d_lap,
    ]
    w_r, w_lap, w_f = (torch.where(b, w_o, zero) for b in block)
    p, p_r, p_t = projection(x), projection(x_r), projection(x_t)
    eye = torch.eye(d, dtype=F64)

    def close(value: float, expected: float) -> bool:
        return abs(value - expected) <= 1e-9 * max(1.0, abs(expected))

    # Theorems 3.2 / 3.4: FT fits both sets, the golden model does not fit D_f
    assert mse(x_r, y_r, w_t) < 1e-20 and mse(x_f, y_f, w_t) < 1e-20
    golden_ul = norm2(p_r @ (w_r + w_lap) - (w_f + w_lap), x_f)
    assert close(mse(x_f, y_f, w_g), golden_ul) and golden_ul > 1.0
    # Theorem 4.1, Option A (RBM keeps the overlap): RL = 0
    assert mse(x_r, y_r, w_hat["rbm"]) < 1e-20
    assert close(mse(x_f, y_f, w_hat["rbm"]), norm2(p @ (w_r + w_lap) - (w_f + w_lap), x_f))
    # Option B (SalUn discards it): RL = ||(I - P_t) w_lap||^2 in X_r X_r^T / n_r
    assert close(mse(x_r, y_r, w_hat["salun"]), norm2((eye - p_t) @ w_lap, x_r))
    assert close(mse(x_f, y_f, w_hat["salun"]), norm2(p @ w_r + p_t @ w_lap - (w_f + w_lap), x_f))
    if d_lap == 0:  # distinct features (Theorem 4.1.1): both masks are the same and match the golden UL
        assert torch.equal(w_hat["rbm"], w_hat["salun"])
        assert close(mse(x_f, y_f, w_hat["rbm"]), norm2(w_f, x_f)) and close(golden_ul, norm2(w_f, x_f))
    else:
        assert mse(x_r, y_r, w_hat["salun"]) > 0.1


# -- functional pieces -----------------------------------------------------------------------------------
def test_saliency_mask_sparsity_is_global_and_exact():
    grads = {"a": torch.tensor([[0.1, -5.0], [0.3, 0.2]]), "b": torch.tensor([4.0, -0.05, 1.0, -2.0])}
    mask = saliency_mask(grads, sparsity=0.5)  # 8 weights: the 4 smallest |g| are not salient
    assert mask["a"].tolist() == [[False, True], [False, False]] and mask["b"].tolist() == [True, False, True, True]
    assert sum(int(m.sum()) for m in mask.values()) == 4
    assert all(m.all() for m in saliency_mask(grads, sparsity=0.0).values())
    assert trainable_mask(mask, "retain")["b"].tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="exactly one of"):
        saliency_mask(grads)
    with pytest.raises(ValueError, match="sparsity must lie"):
        saliency_mask(grads, sparsity=1.0)
    with pytest.raises(ValueError, match="masking must be one of"):
        trainable_mask(mask, "both")  # type: ignore[arg-type]


def test_mean_loss_gradient_of_batch_means_is_the_gradient_of_the_mean_loss():
    torch.manual_seed(0)
    net = nn.Linear(3, 2).double()
    x, y = torch.randn(10, 3, dtype=F64), torch.tensor([0, 1] * 5)
    params = dict(net.named_parameters())
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    grads = mean_loss_gradient(params, ((nn.functional.cross_entropy(net(bx), by), len(by)) for bx, by in batches))
    nn.functional.cross_entropy(net(x), y).backward()
    assert torch.allclose(grads["weight"], net.weight.grad, atol=1e-14) and torch.allclose(
        grads["bias"], net.bias.grad, atol=1e-14
    )
    with pytest.raises(ValueError, match="at least one sample"):
        mean_loss_gradient(params, [])


# -- the strategy ----------------------------------------------------------------------------------------
D_R, D_LAP, D_F = 4, 4, 4


def overlap_dataset(n: int = 240) -> IndexedDataset:
    """A 4-class analogue of App. B.1: classes 0-2 live on features ``[R, L]``, class 3 on ``[L, F]``.

    The overlap ``L`` carries the class signal of all classes; ``R`` and ``F`` are weak.
    """
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % N_CLASSES
    centres = 3 * torch.randn(N_CLASSES, D_LAP, generator=g)
    x = torch.zeros(n, D_R + D_LAP + D_F)
    x[:, D_R : D_R + D_LAP] = centres[y] + torch.randn(n, D_LAP, generator=g)
    own = torch.randn(n, D_R, generator=g) + 0.3 * (y[:, None] == torch.arange(D_R)).float()
    x[:, :D_R] = torch.where((y < 3)[:, None], own, torch.zeros(()))
    x[:, D_R + D_LAP :] = torch.where((y == 3)[:, None], torch.randn(n, D_F, generator=g) + 0.5, torch.zeros(()))
    return IndexedDataset(TensorDataset(x, y), ids=torch.arange(n))


def linear_model(train: IndexedDataset) -> tuple[SupervisedClassifier, SampleRecorder]:
    torch.manual_seed(0)
    model, rec = SupervisedClassifier(nn.Linear(D_R + D_LAP + D_F, N_CLASSES), lr=0.2), SampleRecorder()
    quiet_trainer([rec], max_epochs=15).fit(
        model, DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    )
    return model, rec


def test_rbm_keeps_retained_predictions_where_salun_loses_retain_accuracy():
    """Class-level forgetting on overlapping features: with the support masks (tiny ``gamma``) RBM trains
    only the forget class's own features, so retained logits do not move; SalUn also trains the
    shared features and its retain accuracy falls below RBM's."""
    train = overlap_dataset()
    retain, forget = (
        Subset(train, [i for i in range(len(train)) if i % 4 != 3]),
        Subset(train, list(range(3, len(train), 4))),
    )
    x_retain = torch.stack([train[i][0] for i in retain.indices])
    results = {}
    for masking in ("retain", "forget"):
        model, rec = linear_model(train)
        assert accuracy(model, retain, N_CLASSES) > 0.95 and accuracy(model, forget, N_CLASSES) > 0.95
        with torch.no_grad():
            logits_before = model(x_retain)
        strategy = RBMUnlearner(model, rec, train, masking=masking, threshold=1e-12, epochs=10, lr=1.0, batch_size=32)
        out = strategy.forget(ForgetRequest.of_class(3), train)
        with torch.no_grad():
            moved = float((model(x_retain) - logits_before).abs().max())
        results[masking] = (accuracy(model, retain, N_CLASSES), accuracy(model, forget, N_CLASSES), moved, out)
    (rbm_ra, rbm_fa, rbm_moved, rbm), (salun_ra, salun_fa, _, salun) = results["retain"], results["forget"]
    assert rbm_moved == 0.0 and rbm_ra > 0.95
    assert rbm_fa < 0.5 and salun_fa < 0.5  # both forget the class
    assert salun_ra < rbm_ra - 0.03, (rbm_ra, salun_ra)  # measured: 1.0 vs 0.94
    assert rbm.certificate.method == "rbm" and salun.certificate.method == "salun" and not rbm.certificate.certified
    assert rbm.extra["trainable_fraction"] < salun.extra["trainable_fraction"]


def test_frozen_weights_stay_exactly_at_their_original_values():
    train = toy_dataset(160)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.ReLU(), nn.Linear(16, N_CLASSES))
    model, rec = SupervisedClassifier(net, lr=0.1, momentum=0.9), SampleRecorder()  # the module's own SGD has momentum
    quiet_trainer([rec], max_epochs=3).fit(model, DataLoader(train, batch_size=32, shuffle=True))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = RBMUnlearner(model, rec, train, epochs=2, lr=0.05, batch_size=32)
    forget = list(range(20))
    trainable = strategy.mask(
        Subset(train, list(range(20, 160))), copy.deepcopy(model)
    )  # the request's mask (D_r = ids 20..159)
    result = strategy.forget(ForgetRequest.samples(forget), train)
    n_weights = sum(m.numel() for m in trainable.values())
    assert sum(int(m.sum()) for m in trainable.values()) == n_weights - n_weights // 2  # sparsity 50%, Eq. (9)
    assert result.extra["trainable_fraction"] == pytest.approx(0.5, abs=1 / n_weights)
    for name, p in model.named_parameters():
        assert torch.equal(p[~trainable[name]], before[name][~trainable[name]]), name
        assert not torch.equal(p[trainable[name]], before[name][trainable[name]]), name
    assert strategy.ledger[-1].method == "rbm"


def test_bad_input_raises_and_changes_nothing():
    train = toy_dataset(80)
    torch.manual_seed(0)
    model, rec = SupervisedClassifier(nn.Linear(N_FEATURES, N_CLASSES), lr=0.1), SampleRecorder()
    quiet_trainer([rec]).fit(model, DataLoader(train, batch_size=16))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="masking must be one of"):
        RBMUnlearner(model, rec, train, masking="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sparsity must lie"):
        RBMUnlearner(model, rec, train, sparsity=1.0)
    with pytest.raises(ValueError, match="threshold gamma must be positive"):
        RBMUnlearner(model, rec, train, threshold=0.0)
    strategy = RBMUnlearner(model, rec, train, epochs=1)
    with pytest.raises(ValueError, match="needs the samples to forget"):
        strategy.forget(ForgetRequest.samples([1, 2]))
    with pytest.raises(ValueError, match="unknown|never learned"):
        strategy.forget(ForgetRequest.samples([1, 999]), train)
    with pytest.raises(ValueError, match="no retained samples"):
        strategy.forget(ForgetRequest.samples(range(80)), train)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert rec.catalog.n_active == 80 and len(strategy.ledger) == 0
