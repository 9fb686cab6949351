"""NoisyFinetuneUnlearner on a user's own module (Conv-BatchNorm-dropout, dict batches, label smoothing, Adam): the
certificate against the closed form of its bound, the measured distance between the unlearned and a retrained
start against the deterministic part of the bound, BatchNorm statistics recomputed from the retained data only,
OS-entropy noise, composition and budget across requests, the convex variant, and bad input."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import lightning as L
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from helpers import N_CLASSES, quiet_trainer, toy_dataset
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig, ReleaseRefused
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.contract import BatchKeys
from lightning_unlearn.core.ledger import weights_digest
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.privacy.amplification import epsilon as rdp_epsilon
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner

KEYS = BatchKeys(input="image")
EPS, DELTA = 1.0, 1e-5


class Images(Dataset):
    """Dict items ``{"image": 1x8x8, "label": int}``, a class-dependent pattern plus noise."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.y = torch.arange(n) % N_CLASSES
        patterns = torch.randn(N_CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        self.x = patterns[self.y] + 0.5 * torch.randn(n, 1, 8, 8, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.x[i], "label": int(self.y[i])}


class UserCNN(L.LightningModule):
    """A user's module: Conv-BatchNorm2d-ReLU-Dropout, dict batches, label smoothing, Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Dropout(0.1), nn.Flatten()
        )
        self.head = nn.Linear(6 * 64, N_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return nn.functional.cross_entropy(self(batch["image"]), batch["label"], label_smoothing=0.1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def fit(train: Dataset, module: UserCNN | None = None) -> tuple[UserCNN, SampleRecorder, dict[str, Tensor]]:
    torch.manual_seed(0)
    model, rec = module or UserCNN(), SampleRecorder(batch_keys=KEYS)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    quiet_trainer([rec], max_epochs=2).fit(model, DataLoader(train, batch_size=16, shuffle=True))
    return model, rec, initial


@pytest.fixture(scope="module")
def trained() -> tuple[UserCNN, SampleRecorder, IndexedDataset, dict[str, Tensor]]:
    train = IndexedDataset(Images(64))
    model, rec, initial = fit(train)
    return model, rec, train, initial


def copies(trained: Any) -> tuple[UserCNN, SampleRecorder, IndexedDataset, dict[str, Tensor]]:
    return tuple(copy.deepcopy(o) for o in trained)  # type: ignore[return-value]


OPTIONS = {"steps": 6, "lr": 0.05, "clip": 2.0, "radius": 3.0, "batch_size": 16}


def test_certificate_matches_the_closed_form_and_the_target(trained):
    model, rec, train, initial = copies(trained)
    s = NoisyFinetuneUnlearner(model, rec, train, center=initial, **OPTIONS)
    before = parameters_to_vector(model.parameters()).detach().clone()
    result = s.forget(ForgetRequest.of_class(1))
    cert = result.certificate
    assert cert.certified and (cert.epsilon, cert.delta) == (EPS, DELTA)
    sigma, T, lr, clip, c0 = cert.sigma, OPTIONS["steps"], OPTIONS["lr"], OPTIONS["clip"], OPTIONS["radius"]
    # rho = 1, s = 2 lr C1: c = (2 C0 + 2 lr C1 T)^2 / (2 T sigma^2), and the target is met tightly
    c = (2 * c0 + 2 * lr * clip * T) ** 2 / (2 * T * sigma**2)
    assert cert.bounds["rdp_coefficient"] == pytest.approx(c, rel=1e-9)
    assert rdp_epsilon(c, DELTA) == pytest.approx(EPS, rel=1e-6) and rdp_epsilon(c, DELTA) <= EPS
    assert cert.accounting["epsilon_total"] == pytest.approx(EPS, rel=1e-6)
    assert result.extra["gradient_evaluations"] == T * OPTIONS["batch_size"]
    # the ledger gets settings and counts only: nothing measured on the model before the noise (it saw the samples)
    assert set(result.extra) == {
        "n_forgotten", "n_retained", "steps", "finetune_epochs", "gradient_evaluations", "forward_evaluations"
    }  # fmt: skip
    assert not torch.equal(parameters_to_vector(model.parameters()).detach(), before)
    assert len(s.ledger) == 1 and int(rec.catalog.forgotten.sum()) == 16


def run_without_noise(model: UserCNN, rec: SampleRecorder, train: Dataset, initial: dict, **kw: Any) -> Tensor:
    s = NoisyFinetuneUnlearner(
        model,
        rec,
        train,
        center=initial,
        generator=torch.Generator().manual_seed(5),
        release=ReleaseConfig(noise=False, accountant="rdp"),
        **kw,
    )
    s.forget(ForgetRequest.samples(list(range(0, 64, 8))))
    return parameters_to_vector(p for p in model.parameters()).detach()


def test_measured_distance_to_a_retrained_start_stays_below_the_deterministic_bound(trained):
    """Without noise, two runs of the same steps from the unlearned and from a retrained model end at most
    rho^T D + sum s = 2 C0 + 2 lr C1 T apart (the shift the noise hides); measured on the user's CNN, dropout off."""
    model, rec, train, initial = copies(trained)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0  # the same maps in both runs (dropout's masks would differ between them)
    forget = set(range(0, 64, 8))
    retained = Subset(train, [i for i in range(64) if i not in forget])  # items keep their sample ids
    retrained, rec_r, _ = fit(retained, copy.deepcopy(UserCNN()))
    for m in retrained.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    options = {**OPTIONS, "radius": 1.0}
    rec_r.catalog = copy.deepcopy(rec.catalog)  # the same request resolves to the same retained ids
    a = run_without_noise(model, rec, train, initial, **options)
    b = run_without_noise(retrained, rec_r, train, initial, **options)
    bound = 2 * options["radius"] + 2 * options["lr"] * options["clip"] * options["steps"]
    distance = float((a - b).norm())
    assert 0 < distance <= bound


def test_batchnorm_statistics_come_from_the_retained_data(trained):
    """The published running statistics are those of a fresh pass over the retained data with the published
    parameters (recomputed here independently, in float64), whatever the trained model's statistics were."""
    model, rec, train, initial = copies(trained)
    bn = model.features[1]
    bn.running_mean.fill_(1e3)  # statistics that saw the forgotten samples: they must not survive
    s = NoisyFinetuneUnlearner(model, rec, train, center=initial, **OPTIONS)
    s.forget(ForgetRequest.of_class(2))
    keep = [i for i in range(64) if i % N_CLASSES != 2]
    x = torch.stack([train[i]["image"] for i in keep]).double()
    conv = copy.deepcopy(model.features[0]).double()
    with torch.no_grad():
        h = conv(x)
    assert torch.allclose(bn.running_mean.double(), h.mean(dim=(0, 2, 3)), atol=1e-5)
    assert torch.allclose(bn.running_var.double(), h.var(dim=(0, 2, 3), unbiased=True), rtol=1e-4)


def test_noise_comes_from_os_entropy_unless_seeded(trained):
    outs = []
    for _ in range(2):
        model, rec, train, initial = copies(trained)
        NoisyFinetuneUnlearner(model, rec, train, center=initial, **OPTIONS).forget(ForgetRequest.of_class(1))
        outs.append(parameters_to_vector(model.parameters()).detach())
    assert not torch.equal(*outs)
    seeded = []
    for _ in range(2):
        model, rec, train, initial = copies(trained)
        s = NoisyFinetuneUnlearner(
            model, rec, train, center=initial, release=ReleaseConfig(seed=3, accountant="rdp"), **OPTIONS
        )
        with pytest.warns(UserWarning, match="NOT private"):
            result = s.forget(ForgetRequest.of_class(1))
        seeded.append(parameters_to_vector(model.parameters()).detach())
        assert result.certificate.seeded and not result.certificate.certified
    assert torch.equal(*seeded)


def test_releases_compose_and_the_budget_refuses_without_changing_anything(trained):
    model, rec, train, initial = copies(trained)
    s = NoisyFinetuneUnlearner(
        model, rec, train, center=initial, release=ReleaseConfig(budget=1.4, accountant="rdp"), **OPTIONS
    )
    first = s.forget(ForgetRequest.samples([0, 1]))
    z = 1 / math.sqrt(2 * first.certificate.bounds["rdp_coefficient"])
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.GaussianDpEvent(z), count=2)
    two = acc.get_epsilon(DELTA)
    assert two > 1.4  # so the second release must be refused
    digest, forgotten, entries = weights_digest(model), rec.catalog.forgotten.clone(), len(s.ledger)
    with pytest.raises(ReleaseRefused, match="privacy budget exceeded"):
        s.forget(ForgetRequest.samples([2]))
    assert weights_digest(model) == digest and torch.equal(rec.catalog.forgotten, forgotten)
    assert len(s.ledger) == entries and len(s.accountant) == 1
    # without a budget the second release is composed by the RDP accountant
    s.release = dataclasses.replace(s.release, budget=None)
    second = s.forget(ForgetRequest.samples([2]))
    assert second.certificate.accounting["epsilon_total"] == pytest.approx(two, rel=1e-9)
    assert second.certificate.accounting["accountant"] == "rdp"


def test_finetune_epochs_and_model_clipping_run_on_the_users_module(trained):
    model, rec, train, initial = copies(trained)
    s = NoisyFinetuneUnlearner(
        model, rec, train, center=initial, finetune_epochs=1, model_radius=4.0, weight_decay=0.1, **OPTIONS
    )
    result = s.forget(ForgetRequest.of_class(3))
    assert result.certificate.certified and result.extra["gradient_evaluations"] == 6 * 16 + 48
    assert result.certificate.bounds["model_radius"] == 4.0
    assert any("noise-free epochs" in line for line in result.certificate.assumptions)


def test_convex_variant_on_a_linear_head():
    """Softmax regression: the steps contract (rho < 1, no shift) and c = (rho^T D)^2 / (2 sigma^2 sum rho^2k)."""
    train = toy_dataset(120)
    torch.manual_seed(0)
    model, rec = SupervisedClassifier(nn.Linear(12, N_CLASSES), lr=0.05, l2=0.1), SampleRecorder()
    quiet_trainer([rec]).fit(model, DataLoader(train, batch_size=40))
    norm = max(float(train[i][0].norm()) for i in range(len(train)))
    lr = 1 / ((norm**2 + 1) / 2 + 0.1)  # 1/M: rho = 1 - lr lambda
    s = NoisyFinetuneUnlearner(model, rec, train, update="convex", weight_decay=0.1, steps=20, lr=lr, radius=5.0)
    cert = s.forget(ForgetRequest.samples([1, 2, 3])).certificate
    assert cert.certified and cert.bounds["shift"] == 0
    assert cert.bounds["rho"] == pytest.approx(1 - lr * 0.1, rel=1e-6)  # the retained inputs' norm: at most all's
    rho, T, sigma = cert.bounds["rho"], 20, cert.sigma
    c = (rho**T * 10.0) ** 2 / (2 * sigma**2 * sum(rho ** (2 * k) for k in range(T)))
    assert cert.bounds["rdp_coefficient"] == pytest.approx(c, rel=1e-9)


def test_bad_options_are_refused_naming_them(trained):
    model, rec, train, initial = copies(trained)
    with pytest.raises(ValueError, match="RDP accountant only"):
        NoisyFinetuneUnlearner(model, rec, train, release=ReleaseConfig(accountant="pld"))
    with pytest.raises(ValueError, match="radius"):
        NoisyFinetuneUnlearner(model, rec, train, radius=math.inf)
    with pytest.raises(ValueError, match="closed-form constants need a linear model"):
        NoisyFinetuneUnlearner(model, rec, train, update="convex", weight_decay=0.1)
    with pytest.raises(ValueError, match="center lacks"):
        NoisyFinetuneUnlearner(model, rec, train, center={})
    with pytest.raises(ValueError, match="steps"):
        NoisyFinetuneUnlearner(model, rec, train, steps=0)
    with pytest.raises(ValueError, match="own training_step"):
        NoisyFinetuneUnlearner(nn.Linear(3, 2), rec, train, finetune_epochs=1)
    with pytest.raises(ValueError, match="epsilon, delta"):
        NoisyFinetuneUnlearner(model, rec, train, release=ReleaseConfig(epsilon=None, delta=None, accountant="rdp"))


class Counting(UserCNN):
    """A module with a buffer its forward pass changes (a sample counter): it would carry the forgotten samples."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        self.seen += len(x)
        return super().forward(x)


def test_a_buffer_that_forward_changes_is_refused_and_nothing_changes():
    train = IndexedDataset(Images(32))
    model, rec, initial = fit(train, Counting())
    digest = weights_digest(model)
    s = NoisyFinetuneUnlearner(model, rec, train, center=initial, **OPTIONS)
    with pytest.raises(ValueError, match=r"buffers \['seen'\] change"):
        s.forget(ForgetRequest.samples([0]))
    assert weights_digest(model) == digest and not bool(rec.catalog.forgotten.any()) and len(s.ledger) == 0
