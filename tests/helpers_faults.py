"""Two small runs for the fault-injection tests, shared with their subprocess (tests/scripts/faults_child.py).

``acu``: ACU on the toy blobs (exact and deterministic: a redone request gives the same weights bit for bit).
``safe``: SAFE with a calibrated (epsilon, delta) release on a small float64 MLP, its noise seeded (from the
seed and the release's number, so a redo draws the same noise; a seeded release is marked seeded, not
certified: reproducibility is what these tests need, privacy is tested elsewhere).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from helpers import analytic_model, fit_analytic, toy_dataset
from helpers_certified import N_CLASSES, blobs, trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn import AnalyticRecorder, ForgetRequest, Ledger, ReleaseConfig, SAFERecorder
from lightning_unlearn.models import SupervisedClassifier
from lightning_unlearn.unlearners import ACUUnlearner, SAFEUnlearner, Unlearner

METHODS = ("acu", "safe")
SAFE_RELEASE = ReleaseConfig(epsilon=1.0, delta=1e-5, seed=3)
#: the message of the one warning these runs provoke on purpose (the seeded release)
SEEDED = "certified noise seeded"


def safe_model() -> SupervisedClassifier:
    torch.manual_seed(0)
    return SupervisedClassifier(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, N_CLASSES)).double(), lr=0.2)


def data(method: str) -> Dataset:
    return toy_dataset(60) if method == "acu" else blobs(60, seed=0)


def fresh(method: str) -> tuple[nn.Module, Any]:
    """An unfitted module and recorder of the method's kind (to restore a checkpoint into)."""
    if method == "acu":
        return analytic_model(), AnalyticRecorder(ridge=0.5)
    return safe_model(), SAFERecorder(num_classes=N_CLASSES, proj_dim=4)


def fitted(method: str) -> tuple[nn.Module, Any]:
    if method == "acu":
        return fit_analytic([data(method)])
    model, rec = fresh(method)
    loader = DataLoader(data(method), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([rec], max_epochs=2).fit(model, loader)
    return model, rec


def strategy(method: str, model: nn.Module, rec: Any, ledger: Ledger) -> Unlearner:
    if method == "acu":
        return ACUUnlearner(model, rec, ledger)
    return SAFEUnlearner(model, rec, ledger=ledger, weight_bound=50.0, release=SAFE_RELEASE)


def requests(method: str) -> tuple[ForgetRequest, ForgetRequest]:
    """The request before the checkpoint and the one the faults hit."""
    if method == "acu":
        return ForgetRequest.samples([1, 2]), ForgetRequest.of_class(2)
    return ForgetRequest.samples([3, 5]), ForgetRequest.samples([7, 11, 13])


def save(path: Path, model: nn.Module, rec: Any) -> None:
    """A checkpoint: the module's and the recorder's state (what Lightning's checkpoint holds of them)."""
    torch.save({"model": model.state_dict(), "recorder": rec.state_dict()}, path)


def restore(method: str, path: Path) -> tuple[nn.Module, Any]:
    ckpt = torch.load(path, weights_only=True)
    model, rec = fresh(method)
    model.load_state_dict(ckpt["model"])
    rec.load_state_dict(ckpt["recorder"])
    return model, rec


def snapshot(s: Unlearner) -> dict[str, Any]:
    """Everything a request may change in memory: weights, the recorder's state (statistics, catalog, anchor,
    accountant), the strategy's accountant and history."""
    return {
        "weights": {k: v.detach().clone() for k, v in s.module.state_dict().items()},
        "recorder": s.recorder.state_dict(),
        "accountant": None if s.accountant is None else s.accountant.state_dict(),
        "history": len(s.history),
    }


def same(a: Any, b: Any) -> bool:
    """Equal, tensors bit for bit (dtype, shape and bytes)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    return bool(a == b)


def noise_free(s: Unlearner) -> torch.Tensor:
    """SAFE's published parameters (flat, float64) less the seeded noise of its last release: the noise-free model
    ``w_t``, to within the rounding of adding and subtracting the noise (one ulp of the published entries)."""
    from lightning_unlearn.functional.safe import flatten
    from lightning_unlearn.privacy.noise import gaussian_noise

    assert s.accountant is not None
    flat = flatten(dict(s.module.named_parameters()), s.recorder.param_names)
    sigma = s.history[-1].certificate.sigma
    return flat - gaussian_noise(flat.shape, sigma, flat.dtype, SAFE_RELEASE.seed, len(s.accountant) - 1)


def outcome(s: Unlearner) -> dict[str, Any]:
    """What a run's requests leave, to compare a recovered run with an uninterrupted one: the weights and the
    recorder's statistics and catalog (not its ledger anchor: two ledgers' heads differ by their timestamps)."""
    state = s.recorder.state_dict()
    return {
        "weights": {k: v.detach().clone() for k, v in s.module.state_dict().items()},
        "recorder": {k: v for k, v in state.items() if k not in ("ledger_anchor", "privacy")},
    }
