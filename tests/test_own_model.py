"""Bring your own model: the training-based methods on user modules (BatchNorm, dict batches, their own loss and
optimizer, torchvision resnet18), and all-or-nothing requests under a failure injected at every commit stage."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import Counter
from typing import Any

import lightning as L
import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, fit_analytic, quiet_trainer, toy_dataset
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn import ACUUnlearner, ForgetRequest, IndexedDataset, Ledger
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.contract import BatchKeys
from lightning_unlearn.core.ledger import weights_digest
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.unlearners import (
    FinetuneUnlearner,
    L1SparseUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RBMUnlearner,
    RetrainUnlearner,
    SCRUBUnlearner,
    WoodFisherUnlearner,
)

TRAINED = ("retrain", "finetune", "neggrad", "neggrad_plus", "randomlabel", "rbm", "salun", "scrub", "l1_sparse")
#: the methods that read the module's own loss: the trained ones and WoodFisher (one influence step, no training)
OWN_LOSS = (*TRAINED, "woodfisher")
KEYS = BatchKeys(input="image")


class Images(Dataset):
    """Dict items ``{"image": 3x8x8, "label": int}``, a class-dependent colour plus noise."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(0)
        self.y = torch.arange(n) % N_CLASSES
        colours = torch.randn(N_CLASSES, 3, 1, 1, generator=torch.Generator().manual_seed(1))
        self.x = colours[self.y] + 0.5 * torch.randn(n, 3, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.x[i], "label": int(self.y[i])}


class UserCNN(L.LightningModule):
    """A user's module, none of the library's classes: Conv-BatchNorm2d-ReLU, dict batches, label smoothing, Adam."""

    calls: Counter = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.head = nn.Linear(8, N_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        UserCNN.calls["training_step"] += 1
        loss = nn.functional.cross_entropy(self(batch["image"]), batch["label"], label_smoothing=0.1)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        UserCNN.calls["configure_optimizers"] += 1
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def strategy(
    name: str,
    module: nn.Module,
    rec: SampleRecorder,
    train: Dataset,
    initial: dict[str, Tensor] | None = None,
    **kw: Any,
) -> Any:
    """The method ``name`` with 1 epoch and small batches."""
    kw = {"epochs": 1, "batch_size": 16, **kw}
    if name == "retrain":
        return RetrainUnlearner(module, rec, train, initial, batch_size=kw["batch_size"], ledger=kw.get("ledger"))  # type: ignore[arg-type]
    if name == "neggrad":
        return NegGradUnlearner(module, rec, **kw)
    if name in ("rbm", "salun"):
        return RBMUnlearner(module, rec, train, masking="retain" if name == "rbm" else "forget", **kw)
    if name == "woodfisher":
        return WoodFisherUnlearner(module, rec, train, batch_size=kw["batch_size"], ledger=kw.get("ledger"))
    return {
        "finetune": FinetuneUnlearner,
        "neggrad_plus": NegGradPlusUnlearner,
        "randomlabel": RandomLabelUnlearner,
        "scrub": SCRUBUnlearner,
        "l1_sparse": L1SparseUnlearner,
    }[name](module, rec, train, **kw)


def clone_state(module: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def cnn() -> tuple[UserCNN, SampleRecorder, IndexedDataset, dict[str, Tensor]]:
    torch.manual_seed(0)
    train = IndexedDataset(Images(48))
    model, rec = UserCNN(), SampleRecorder(batch_keys=KEYS)
    initial = clone_state(model)
    quiet_trainer([rec], max_epochs=2).fit(model, DataLoader(train, batch_size=16, shuffle=True))
    return model, rec, train, initial


@pytest.mark.parametrize("name", OWN_LOSS)
def test_user_cnn_with_batchnorm_dict_batches_and_its_own_loss_and_optimizer(cnn, name):
    model, rec, train, initial = (copy.deepcopy(o) for o in cnn)
    before = clone_state(model)
    calls = Counter(UserCNN.calls)
    s = strategy(name, model, rec, train, initial)
    result = s.forget(ForgetRequest.of_class(1), train if s.reads_data else None)
    assert result.certificate.method == name and sorted(result.removed_ids.tolist()) == list(range(1, 48, 4))
    assert int(rec.catalog.forgotten.sum()) == 12 and len(s.ledger) == 1
    after = model.state_dict()
    assert not torch.equal(after["head.weight"], before["head.weight"])
    assert UserCNN.calls["training_step"] > calls["training_step"]  # the module's own loss
    if name == "woodfisher":  # one step on the parameters, gradients taken in eval mode: batch-norm buffers stay
        assert all(torch.equal(after[k], before[k]) for k in before if "running" in k or "num_batches" in k)
        return
    # batch-norm statistics are part of the update: running mean and the 0-dim step counter moved
    assert not torch.equal(after["features.1.running_mean"], before["features.1.running_mean"])
    assert after["features.1.num_batches_tracked"].ndim == 0
    assert int(after["features.1.num_batches_tracked"]) != int(before["features.1.num_batches_tracked"])
    # the module's own training_step and configure_optimizers did the training
    assert UserCNN.calls["configure_optimizers"] > calls["configure_optimizers"]
    with pytest.raises(ValueError, match="already (been )?forgotten"):
        s.forget(ForgetRequest.of_class(1), train if s.reads_data else None)


def bn_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(N_FEATURES, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, N_CLASSES))


@pytest.mark.parametrize("name", OWN_LOSS)
def test_batchnorm1d_module_forgets_a_single_sample(name):
    """The issue's module ``Linear -> BatchNorm1d -> ReLU -> Linear``; one forgotten sample is a forget batch of one,
    and 41 retained samples in batches of 8 end with a batch of one (both run with batch norm in eval mode)."""
    train = toy_dataset(42)
    torch.manual_seed(0)
    model, rec = SupervisedClassifier(bn_mlp(), lr=0.1), SampleRecorder()
    initial = clone_state(model)
    quiet_trainer([rec], max_epochs=2).fit(model, DataLoader(train, batch_size=8, shuffle=True))
    s = strategy(name, model, rec, train, initial, batch_size=8)
    result = s.forget(ForgetRequest.samples([5]), train if s.reads_data else None)
    assert result.removed_ids.tolist() == [5] and len(s.ledger) == 1
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_plain_module_falls_back_to_cross_entropy_and_sgd():
    train = toy_dataset(64)
    torch.manual_seed(0)
    net = bn_mlp()
    rec = SampleRecorder()
    quiet_trainer([rec], max_epochs=2).fit(
        SupervisedClassifier(net, lr=0.1), DataLoader(train, batch_size=16, shuffle=True)
    )
    before = clone_state(net)
    s = FinetuneUnlearner(net, rec, train, epochs=1, batch_size=16)
    assert not s.trains_itself and s.lr == 0.1  # the documented default step of plain modules
    s.forget(ForgetRequest.of_class(2))
    assert (
        not torch.equal(net[0].weight, before["0.weight"])
        and net[1].num_batches_tracked > before["1.num_batches_tracked"]
    )
    with pytest.raises(ValueError, match="trains with its own training_step"):
        FinetuneUnlearner(SupervisedClassifier(bn_mlp()), rec, train, momentum=0.9)


def test_lr_override_of_a_module_with_a_scheduler_is_refused():
    class Scheduled(SupervisedClassifier):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    train = toy_dataset(32)
    model, rec = Scheduled(bn_mlp()), SampleRecorder()
    quiet_trainer([rec]).fit(model, DataLoader(train, batch_size=16))
    before = clone_state(model)
    with pytest.raises(ValueError, match="configures a scheduler: pass lr=None"):
        FinetuneUnlearner(model, rec, train, epochs=1, lr=0.5).forget(ForgetRequest.samples([1]))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()) and rec.catalog.n_active == 32
    FinetuneUnlearner(model, rec, train, epochs=1).forget(ForgetRequest.samples([1]))  # its own schedule: fine
    assert rec.catalog.n_active == 31


@pytest.mark.slow
def test_torchvision_resnet18_on_fake_data():
    torchvision = pytest.importorskip("torchvision")

    class ResNet(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=N_CLASSES)

        def forward(self, x: Tensor) -> Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Tensor:
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    fake = torchvision.datasets.FakeData(
        16, (3, 32, 32), N_CLASSES, transform=torchvision.transforms.ToTensor(), random_offset=0
    )
    train = IndexedDataset(fake)
    torch.manual_seed(0)
    model, rec = ResNet(), SampleRecorder()
    quiet_trainer([rec]).fit(model, DataLoader(train, batch_size=8))
    for name in ("finetune", "rbm"):
        before = clone_state(model)
        s = strategy(name, model, rec, train, batch_size=8)
        s.forget(
            ForgetRequest.samples([2 * len(s.history) + 1 if name == "finetune" else 4]),
            train if s.reads_data else None,
        )
        after = model.state_dict()
        assert not torch.equal(after["net.fc.weight"], before["net.fc.weight"]), name
        assert not torch.equal(after["net.bn1.running_var"], before["net.bn1.running_var"]), name
    assert rec.catalog.n_active == 14


def test_weights_digest_covers_zero_dim_buffers():
    model = SupervisedClassifier(bn_mlp())
    first = weights_digest(model)
    model.net[1].num_batches_tracked += 1  # a 0-dim buffer
    assert weights_digest(model) != first


# -- all or nothing ----------------------------------------------------------------------------------------------
class _Exploding:
    """Stands in for a new tensor of the right shape whose data cannot be read (fails inside ``swap_weights``)."""

    def __init__(self, like: Tensor) -> None:
        self.shape = like.shape

    def detach(self) -> Tensor:
        raise RuntimeError("injected failure in swap_weights")


def snapshot(s: Any, ledger_path: Any) -> dict[str, Any]:
    return {
        "weights": clone_state(s.module),
        "recorder": copy.deepcopy(s.recorder.state_dict()),
        "ledger": ledger_path.read_bytes() if ledger_path.exists() else b"",
        "entries": len(s.ledger),
        "history": len(s.history),
    }


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Equal structure, and tensors equal byte for byte (dtype and shape included)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
        ), where
    else:
        assert a == b, where


def built(name: str, ledger: Ledger) -> tuple[Any, Dataset, ForgetRequest]:
    if name == "acu":
        train = toy_dataset(48)
        model, rec = fit_analytic([train])
        return ACUUnlearner(model, rec, ledger=ledger), train, ForgetRequest.of_class(2)
    train = toy_dataset(40)
    torch.manual_seed(0)
    model, rec = SupervisedClassifier(bn_mlp(), lr=0.1), SampleRecorder()
    initial = clone_state(model)
    quiet_trainer([rec]).fit(model, DataLoader(train, batch_size=16, shuffle=True))
    return strategy(name, model, rec, train, initial, ledger=ledger), train, ForgetRequest.of_class(2)


STAGES = ("compute", "apply_forget", "swap_weights", "ledger")


@pytest.mark.slow
@pytest.mark.parametrize("name", [*OWN_LOSS, "acu"])
def test_a_failure_at_any_stage_changes_nothing_and_the_request_can_be_retried(name, tmp_path, monkeypatch):
    """Failures injected after the whole computation, in the recorder's write-back, part-way through the weight swap
    and in the ledger's fsync (after its line was written): parameters, buffers, recorder state (catalog included),
    ledger file and history stay byte-identical each time, and the same request then succeeds."""
    path = tmp_path / "ledger.jsonl"
    s, train, request = built(name, Ledger(path))
    data = train if s.reads_data else None
    s.forget(ForgetRequest.samples([0]), data)  # one earlier request: the ledger file and the catalog are not empty
    before = snapshot(s, path)
    compute = s._compute

    def failing_compute(ids: Tensor, d: Any, stage: str) -> Any:
        update = compute(ids, d)  # everything is computed, then the method fails
        if stage == "compute":
            raise RuntimeError("injected failure in _compute")
        weights = dict(update.weights)
        last = next(reversed(weights))
        weights[last] = _Exploding(weights.pop(last))  # swapped after every other tensor
        return dataclasses.replace(update, weights=weights)

    def failing_apply(*args: Any) -> Any:
        raise RuntimeError("injected failure in apply_forget")

    def failing_fsync(fd: int) -> None:
        raise OSError("injected failure in the ledger write")

    for stage in STAGES:
        with monkeypatch.context() as m:
            if stage in ("compute", "swap_weights"):
                m.setattr(s, "_compute", lambda ids, d, stage=stage: failing_compute(ids, d, stage))
            elif stage == "apply_forget":
                m.setattr(s.recorder, "apply_forget", failing_apply)
            else:
                m.setattr(os, "fsync", failing_fsync)
            with pytest.raises((RuntimeError, OSError), match="injected"):
                s.forget(request, data)
        assert_identical(snapshot(s, path), before, stage)
    result = s.forget(request, data)
    assert (
        len(s.ledger) == 2
        and len(Ledger(path)) == 2
        and int(s.recorder.catalog.forgotten.sum()) == 1 + result.removed_ids.numel()
    )
