"""Tiny convex (L2-regularised logistic regression) and MLP setups for the HF and [CCL] tests."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.callbacks import CCLHessianRecorder, CCLRecorder, TrajectoryRecorder
from lightning_unlearn.functional import autodiff
from lightning_unlearn.models import ProximalClassifier, SupervisedClassifier

D_IN, N_CLASSES = 6, 3


def blobs(n: int, seed: int, shift: float = 0.0, id_offset: int = 0) -> IndexedDataset:
    """float64 Gaussian blobs (class c centred on 2 e_c), ids ``id_offset + row``."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    x = torch.randn(n, D_IN, generator=g, dtype=torch.float64) + 2 * nn.functional.one_hot(y, D_IN).double() + shift
    return IndexedDataset(TensorDataset(x, y), ids=torch.arange(n) + id_offset)


def trainer(callbacks: list, max_epochs: int = 1, **kwargs) -> L.Trainer:
    opts = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(max_epochs=max_epochs, callbacks=callbacks, **{**opts, **kwargs})


# -- HF: SGD trajectory and its masked-gradient replay (Eqs. (4)-(5)) ----------------------------------
def sgd_model(net: nn.Module | None = None, lr: float = 0.1, l2: float = 0.1) -> SupervisedClassifier:
    torch.manual_seed(0)
    return SupervisedClassifier(net if net is not None else nn.Linear(D_IN, N_CLASSES).double(), lr=lr, l2=l2)


def fit_hf(
    model: SupervisedClassifier,
    ds: IndexedDataset,
    recorder: TrajectoryRecorder,
    epochs: int = 4,
    batch_size: int = 16,
    **kw,
) -> Tensor:
    """Fit with a seeded shuffled loader; returns the initial weights."""
    w0 = autodiff.flat_params(model).clone()
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer([recorder], max_epochs=epochs, **kw).fit(model, loader)
    return w0


def replay(model: nn.Module, recorder: TrajectoryRecorder, w0: Tensor, ds: IndexedDataset, removed: set[int]) -> Tensor:
    """Retrain from ``w0`` with the recorded batches and step sizes, the removed samples' gradients
    zeroed and the denominators ``|B_t|`` kept (HF's retraining reference)."""
    x_all, y_all = ds.dataset.tensors
    row_of_id = {int(i): k for k, i in enumerate(ds.ids.tolist())}
    loss = autodiff.ModuleLoss(model, recorder.l2)
    occ_rows, occ_steps = recorder.occurrences()
    theta = w0.clone()
    for t in range(recorder.n_steps):
        ids = [recorder.row_ids[r] for r in occ_rows[occ_steps == t].tolist()]
        keep = torch.tensor([i not in removed for i in ids], dtype=theta.dtype)
        rows = torch.tensor([row_of_id[i] for i in ids])
        g = autodiff.per_sample_grads(loss, theta, x_all[rows], y_all[rows])
        theta = theta - recorder.lrs[t] / recorder.batch_sizes[t] * (keep[:, None] * g).sum(0)
    return theta


# -- [CCL]: tasks solved exactly (L-BFGS, full batch) -----------------------------------------------
def cl_tasks(n: int = 60) -> list[IndexedDataset]:
    return [blobs(n, seed=k, shift=0.3 * k, id_offset=100 * k) for k in range(3)]


def proximal_model(l2: float = 0.05, reg_lambda: float = 1.0) -> ProximalClassifier:
    torch.manual_seed(0)
    return ProximalClassifier(
        nn.Linear(D_IN, N_CLASSES).double(), lr=1.0, l2=l2, reg_lambda=reg_lambda, optimizer="lbfgs"
    )


def fit_tasks(
    tasks: list, recorder: CCLRecorder | None = None, model: ProximalClassifier | None = None
) -> ProximalClassifier:
    """Learn each task as one experience (index = position), each solved by full-batch L-BFGS."""
    model = model if model is not None else proximal_model()
    for k, ds in enumerate(tasks):
        if recorder is not None:
            recorder.experience = k
        trainer([recorder] if recorder is not None else [], max_epochs=2).fit(model, DataLoader(ds, batch_size=len(ds)))
    return model


def concat_indexed(a: IndexedDataset, b: IndexedDataset) -> IndexedDataset:
    (xa, ya), (xb, yb) = a.dataset.tensors, b.dataset.tensors
    return IndexedDataset(TensorDataset(torch.cat([xa, xb]), torch.cat([ya, yb])), ids=torch.cat([a.ids, b.ids]))


def without(ds: IndexedDataset, ids: set[int]) -> IndexedDataset:
    keep = torch.tensor([i not in ids for i in ds.ids.tolist()])
    x, y = ds.dataset.tensors
    return IndexedDataset(TensorDataset(x[keep], y[keep]), ids=ds.ids[keep])


def recorded(recorder: CCLHessianRecorder | TrajectoryRecorder) -> dict:
    """A deep copy of a recorder's state, for "nothing changed" checks."""
    return {
        k: (
            v.clone()
            if isinstance(v, Tensor)
            else [t.clone() if isinstance(t, Tensor) else t for t in v]
            if isinstance(v, list)
            else v
        )
        for k, v in recorder.state_dict().items()
        if k != "catalog"
    }


def same_state(a: dict, b: dict) -> bool:
    def eq(u, v):
        if isinstance(u, Tensor):
            return isinstance(v, Tensor) and u.shape == v.shape and torch.equal(u, v)
        if isinstance(u, list):
            return len(u) == len(v) and all(eq(p, q) for p, q in zip(u, v))
        if isinstance(u, dict):  # a factored or low-rank Hessian
            return isinstance(v, dict) and u.keys() == v.keys() and all(eq(u[k], v[k]) for k in u)
        return u == v

    return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)


# -- "bring your own model": user-written LightningModules, none of the library's classes ---------------
class UserModule(L.LightningModule):
    """A module as a user writes it: its own ``training_step`` (cross-entropy, optionally label-smoothed,
    optionally plus a regulariser's in-loss penalty) and ``configure_optimizers`` (SGD with weight decay)."""

    def __init__(
        self,
        net: nn.Module,
        lr: float = 0.1,
        weight_decay: float = 0.1,
        smoothing: float = 0.0,
        momentum: float = 0.0,
        penalty=None,
    ) -> None:
        super().__init__()
        self.net, self.lr, self.weight_decay, self.momentum = net, lr, weight_decay, momentum
        self.smoothing, self.penalty = smoothing, penalty

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, y, _ = batch
        loss = nn.functional.cross_entropy(self(x), y, label_smoothing=self.smoothing)
        self.log("loss", loss, on_step=True)
        return loss + self.penalty(self) if self.penalty is not None else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.weight_decay, momentum=self.momentum)


def user_model(net: nn.Module | None = None, **kwargs) -> UserModule:
    torch.manual_seed(0)
    return UserModule(net if net is not None else nn.Linear(D_IN, N_CLASSES).double(), **kwargs)
