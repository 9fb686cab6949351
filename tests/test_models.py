"""The library's LightningModules reload with Lightning's ``load_from_checkpoint``; a user's analytic-head module
(``AnalyticHeadModule``) fits without a warning about its training step or optimizer."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, quiet_trainer, toy_dataset, toy_tensors
from torch import nn
from torch.utils.data import DataLoader

from lightning_unlearn import (
    AnalyticClassifier,
    AnalyticHead,
    AnalyticHeadModule,
    AnalyticRecorder,
    ProximalClassifier,
    SupervisedClassifier,
)
from lightning_unlearn.functional import acu
from lightning_unlearn.models import mlp_backbone
from lightning_unlearn_bench.models import _Pretraining

# float64 features and ridge solutions on well-conditioned blobs (cond(R + gamma I) < 1e4): the recorder's head
# and an independent solve differ by ~eps * kappa ~ 2e-12 relative; 100x margin
REL_TOL = 1e-10


def fitted(module: L.LightningModule, tmp_path, name: str, callbacks=()) -> str:
    quiet_trainer(list(callbacks), max_epochs=1).fit(module, DataLoader(toy_dataset(64), batch_size=16))
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(module)
    path = str(tmp_path / f"{name}.ckpt")
    trainer.save_checkpoint(path)
    return path


def same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa if isinstance(sa[k], torch.Tensor))


def test_library_modules_reload_with_load_from_checkpoint(tmp_path):
    """Hyperparameters are saved (the networks are not: Lightning's recommendation), so each class rebuilds itself
    from the checkpoint with its network passed in, with the checkpoint's weights and settings."""
    torch.manual_seed(0)
    sup = SupervisedClassifier(nn.Linear(N_FEATURES, N_CLASSES), lr=0.3, l2=0.01, momentum=0.5)
    back = SupervisedClassifier.load_from_checkpoint(fitted(sup, tmp_path, "sup"), net=nn.Linear(N_FEATURES, N_CLASSES))
    assert (back.lr, back.l2, back.momentum) == (0.3, 0.01, 0.5) and same_state(back, sup)

    prox = ProximalClassifier(nn.Linear(N_FEATURES, N_CLASSES), lr=0.2, l2=0.05, reg_lambda=2.0)
    back = ProximalClassifier.load_from_checkpoint(fitted(prox, tmp_path, "prox"), net=nn.Linear(N_FEATURES, N_CLASSES))
    assert (back.lr, back.l2, back.reg_lambda, back.optimizer_name) == (0.2, 0.05, 2.0, "sgd")
    assert same_state(back, prox) and back.regularizer.tasks_learned == prox.regularizer.tasks_learned == 1

    ana = AnalyticClassifier(mlp_backbone(N_FEATURES, 16, 8), 8, N_CLASSES, expansion_dim=24, seed=3)
    path = fitted(ana, tmp_path, "ana", [AnalyticRecorder(ridge=1.0)])
    back = AnalyticClassifier.load_from_checkpoint(path, backbone=mlp_backbone(N_FEATURES, 16, 8))
    assert back.num_classes == N_CLASSES and same_state(back, ana) and back.head.weight.abs().sum() > 0

    net = nn.Linear(N_FEATURES, N_CLASSES)
    pre = _Pretraining(net, lr=0.05, momentum=0.9, weight_decay=5e-4, epochs=3)
    back = _Pretraining.load_from_checkpoint(fitted(pre, tmp_path, "pre"), net=nn.Linear(N_FEATURES, N_CLASSES))
    assert dict(back.hparams) == {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4, "epochs": 3}


class UserAnalytic(AnalyticHeadModule):
    """A user's module: a frozen trunk and an AnalyticHead, nothing else learned."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Linear(N_FEATURES, 16), nn.Tanh()).requires_grad_(False)
        self.head = AnalyticHead(16, N_CLASSES, expansion_dim=32, seed=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


def test_an_analytic_head_module_fits_warning_free_and_counts_its_steps():
    module, rec = UserAnalytic(), AnalyticRecorder(ridge=0.5, backbone="trunk", head="head")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = quiet_trainer([rec], max_epochs=2)
        trainer.fit(module, DataLoader(toy_dataset(64), batch_size=16))
    about_us = [str(w.message) for w in caught if any(k in str(w.message) for k in ("training_step", "optimizer"))]
    assert about_us == []  # Lightning's 'returned None' warnings are gone
    assert trainer.global_step == 2 * 64 // 16  # one (no-op) step per batch
    x, y = toy_tensors(64)
    with torch.no_grad():
        F = module.head.expansion(module.trunk.double()(x.double()))
    W = acu.ridge_solution(F.T @ F, F.T @ acu.one_hot(y, N_CLASSES), 0.5)[1]
    assert float((module.head.linear.weight.T - W).norm() / W.norm()) <= REL_TOL  # the recorder wrote the head


def test_an_analytic_head_module_without_a_head_is_refused_at_fit_start():
    class NoHead(AnalyticHeadModule):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Linear(N_FEATURES, 4).requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.trunk(x)

    with pytest.raises(ValueError, match="holds no AnalyticHead"):
        quiet_trainer([], max_epochs=1).fit(NoHead(), DataLoader(toy_dataset(16), batch_size=8))
