"""ACU on a user's own LightningModule: a small CNN with BatchNorm as the named frozen backbone, an AnalyticHead."""

import lightning as L
import pytest
import torch
from helpers import quiet_trainer, toy_tensors
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticHead,
    AnalyticRecorder,
    ForgetRequest,
    IndexedDataset,
)
from lightning_unlearn.functional import acu

N = 96
# float64 features throughout; cond(R + gamma I) stays below ~1e4 on this data, so a ridge solve's
# relative forward error (~ eps * kappa ~ 2e-12) bounds the gap between ACU and retraining; 100x margin
REL_TOL = 1e-10


class UserCNN(L.LightningModule):
    """What a user writes: a pre-trained trunk (frozen, BatchNorm inside), their own probe trained by SGD."""

    def __init__(self, bias: bool, train_trunk: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        )
        with torch.no_grad():  # "pre-trained" batch-norm statistics
            self.trunk[1].running_mean.uniform_(-0.5, 0.5)
            self.trunk[1].running_var.uniform_(0.5, 2.0)
        self.trunk.requires_grad_(False)
        self.head = AnalyticHead(16, num_classes=4, expansion_dim=24, bias=bias, seed=1)
        self.probe = nn.Linear(16, 4)
        self.train_trunk = train_trunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch, batch_idx):
        if self.train_trunk:
            self.trunk.train()  # a mistake: batch-norm statistics move
        x, y = batch[0], batch[1]
        return nn.functional.cross_entropy(self.probe(self.trunk(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.probe.parameters(), lr=0.1)


def images(n: int = N, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = toy_tensors(n, seed)
    return x.repeat(1, 3).view(n, 1, 6, 6), y


def retrained_head(module: UserCNN, x: torch.Tensor, y: torch.Tensor, ridge: float) -> torch.Tensor:
    """Ridge retraining on ``(x, y)``, features computed independently: a float64 copy of the trunk."""
    trunk = UserCNN(bias=False).trunk.double().eval()
    trunk.load_state_dict(module.trunk.state_dict())
    with torch.no_grad():
        F = module.head.expansion(trunk(x.double()))
    if module.head.linear.bias is not None:
        F = torch.cat([F, torch.ones(len(F), 1, dtype=F.dtype)], 1)
    return acu.ridge_solution(F.T @ F, F.T @ acu.one_hot(y, 4), ridge)[1]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("bias", [False, True])
def test_acu_on_a_user_cnn_equals_ridge_retraining(bias):
    x, y = images()
    data = IndexedDataset(TensorDataset(x, y))
    module, rec = UserCNN(bias), AnalyticRecorder(ridge=0.5, backbone="trunk", head="head")
    running_mean = module.trunk[1].running_mean.clone()
    quiet_trainer([rec], max_epochs=2).fit(module, DataLoader(data, batch_size=16, shuffle=True))
    assert torch.equal(module.trunk[1].running_mean, running_mean)  # the recorder kept the trunk in eval mode
    assert rec.W.shape == (24 + bias, 4)
    assert rel(rec.W, retrained_head(module, x, y, 0.5)) <= REL_TOL
    strategy = ACUUnlearner(module, rec)
    for request in (ForgetRequest.samples([0, 5, 9]), ForgetRequest.of_class(2)):
        strategy.forget(request, data)
        keep = rec.catalog.active_ids()
        W_ref = retrained_head(module, x[keep], y[keep], 0.5)
        assert rel(rec.W, W_ref) <= REL_TOL
        linear = module.head.linear
        W_module = torch.cat([linear.weight.T, linear.bias[None]]) if bias else linear.weight.T
        assert rel(W_module, W_ref) <= REL_TOL  # the module's own head serves the unlearned model
    logits = module(x[keep])
    assert logits.dtype == torch.float64 and logits.shape == (len(keep), 4)


def test_a_backbone_that_moves_during_the_experience_is_refused():
    x, y = images()
    module, rec = UserCNN(bias=True, train_trunk=True), AnalyticRecorder(ridge=0.5, backbone="trunk", head="head")
    with pytest.raises(ValueError, match="backbone 'trunk' changed during the experience"):
        quiet_trainer([rec]).fit(module, DataLoader(IndexedDataset(TensorDataset(x, y)), batch_size=16))
    assert len(rec.catalog) == 0


def test_a_trainable_backbone_or_a_missing_head_is_refused_by_name():
    x, y = images()
    loader = DataLoader(IndexedDataset(TensorDataset(x, y)), batch_size=16)
    with pytest.raises(ValueError, match="backbone 'probe' are trainable"):
        quiet_trainer([AnalyticRecorder(backbone="probe", head="head")]).fit(UserCNN(bias=False), loader)
    with pytest.raises(ValueError, match="AnalyticHead submodule 'classifier'"):
        quiet_trainer([AnalyticRecorder(backbone="trunk", head="classifier")]).fit(UserCNN(bias=False), loader)
