"""SAFE ([SAFE]) with a user's module and its own loss: a label-smoothed training loss is refused with the default
cross-entropy ``loss_fn`` and used when given; the retention statistics are sums of that loss (Eq. (12)/(15))."""

import math

import pytest
import torch
from helpers_certified import D_IN, N_CLASSES, blobs, trainer, user_model
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_unlearn import ForgetRequest
from lightning_unlearn.callbacks import SAFERecorder
from lightning_unlearn.unlearners import SAFEUnlearner

SMOOTHING = 0.2
N = 96


def smoothed(outputs: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(outputs, targets, label_smoothing=SMOOTHING, reduction="none")


def fit(model, ds, rec) -> None:
    loader = DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([rec], max_epochs=3).fit(model, loader)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, 12), nn.Tanh(), nn.Linear(12, N_CLASSES)).double()


def test_label_smoothed_module_is_refused_with_the_default_loss():
    rec = SAFERecorder(num_classes=N_CLASSES, proj_dim=4)
    with pytest.raises(ValueError, match=r"loss_fn disagrees with UserModule.training_step on a batch"):
        fit(user_model(net(), smoothing=SMOOTHING, weight_decay=0.0), blobs(N, seed=0), rec)


def test_label_smoothed_module_is_unlearned_with_its_own_loss():
    ds = blobs(N, seed=0)
    model = user_model(net(), smoothing=SMOOTHING, weight_decay=0.0)
    rec = SAFERecorder(num_classes=N_CLASSES, proj_dim=4, loss_fn=smoothed)
    fit(model, ds, rec)
    x, y = ds.dataset.tensors
    # Eq. (12): the recorded sum is the gradient of the module's own (label-smoothed) loss at w_0;
    # float64 sums of 96 terms in another order: 1e-10 relative is ~1e5 ulp of slack
    model.zero_grad()
    smoothed(model(x), y).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(rec.grad_sum[n], p.grad, rtol=1e-10, atol=1e-12), n
    forget = [3, 11, 40]
    strategy = SAFEUnlearner(model, rec, step_size=0.05)
    result = strategy.forget(ForgetRequest.samples(forget), ds)
    keep = torch.tensor([i not in forget for i in range(N)])
    with torch.no_grad():
        outputs = torch.func.functional_call(model.net, {k[4:]: v for k, v in rec.w0.items()}, (x[keep],))
        own, plain = float(smoothed(outputs, y[keep]).mean()), float(nn.functional.cross_entropy(outputs, y[keep]))
    # Eq. (14)-(15): the retained risk at w_0 is the mean of the module's loss over D_t (float64: 1e-10 relative)
    assert math.isclose(result.extra["retain_risk_w0"], own, rel_tol=1e-10)
    assert not math.isclose(own, plain, rel_tol=1e-3)  # plain cross-entropy would be another number


def test_outputs_that_are_not_class_logits_are_refused():
    ds = blobs(N, seed=0)
    model = user_model(nn.Linear(D_IN, N_CLASSES + 2).double(), weight_decay=0.0)
    rec = SAFERecorder(num_classes=N_CLASSES, proj_dim=4, offload=True)
    fit(model, ds, rec)
    assert rec.counts.device.type == "cpu" and rec.grad_sum["net.weight"].device.type == "cpu"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=rf"class logits of shape \(1, {N_CLASSES}\).*got \(1, {N_CLASSES + 2}\)"):
        SAFEUnlearner(model, rec, step_size=0.05).forget(ForgetRequest.samples([5]), ds)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
