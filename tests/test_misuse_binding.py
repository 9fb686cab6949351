"""The misuse suite (issue 26, item 2): mistakes a user made that used to pass silently are refused, naming what is
wrong, and leave the model, the statistics and the catalog as they were.

1. Ids read from the wrong field: Avalanche's ``(x, y, task)`` items in a plain Lightning fit (the task label read
   as the sample id), and ``(x, y, id)`` items whose ids repeat inside one experience.
2. A recorder state from another run (another trunk, another head) beside this run's module.
3. A state loaded over a recorder that has executed forget requests.

The module is a user's: a small CNN whose frozen trunk has BatchNorm, and an analytic head; the data are
scikit-learn's handwritten digits.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
from helpers import quiet_trainer
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset, WeightedRandomSampler

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticHead,
    AnalyticRecorder,
    ForgetRequest,
    IndexedDataset,
    Ledger,
    SoftmaxHeadRecorder,
)
from lightning_unlearn.models import AnalyticHeadModule
from lightning_unlearn.unlearners import ResolveUnlearner
from lightning_unlearn.warnings import UnlearningWarning

N_CLASSES = 10


class DigitsNet(AnalyticHeadModule):
    """A user's module: a frozen, "pre-trained" Conv-BatchNorm trunk (its seed and width name the run) and an
    analytic head that the recorder solves."""

    def __init__(self, seed: int = 0, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        ).requires_grad_(False)
        with torch.no_grad():  # pre-trained batch-norm statistics
            self.trunk[1].running_mean.uniform_(-0.2, 0.2)
            self.trunk[1].running_var.uniform_(0.5, 1.5)
        self.head = AnalyticHead(4 * width, N_CLASSES, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


def digits(rows: slice) -> tuple[Tensor, Tensor]:
    x, y = load_digits(return_X_y=True)
    return torch.tensor(x[rows], dtype=torch.float32).view(-1, 1, 8, 8) / 16, torch.tensor(y[rows])


class TaskItems(Dataset):
    """Avalanche's items: ``(x, y, task_label)``, no sample id."""

    def __init__(self, x: Tensor, y: Tensor, task: int) -> None:
        self.x, self.y, self.task = x, y, task

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        return self.x[i], self.y[i], self.task


def fit(model: L.LightningModule, recorder: L.Callback, data: Dataset, **loader: Any) -> None:
    quiet_trainer([recorder]).fit(model, DataLoader(data, **{"batch_size": 64, **loader}))


def snapshot(model: nn.Module, recorder: AnalyticRecorder | SoftmaxHeadRecorder) -> dict[str, Any]:
    return copy.deepcopy({"model": model.state_dict(), "recorder": recorder.state_dict()})


def assert_same(a: Any, b: Any) -> None:
    """Equal bit for bit (tensors), recursively."""
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


@pytest.fixture(scope="module")
def first_experience() -> tuple[Tensor, Tensor, IndexedDataset]:
    x, y = digits(slice(0, 300))
    return x, y, IndexedDataset(TensorDataset(x, y))


def fitted(first_experience: tuple[Tensor, Tensor, IndexedDataset]) -> tuple[DigitsNet, AnalyticRecorder]:
    model, recorder = DigitsNet(), AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
    fit(model, recorder, first_experience[2], shuffle=True)
    return model, recorder


# -- 1. ids from where the user said they are ---------------------------------------------------------------------
def test_avalanche_task_labels_are_not_read_as_sample_ids():
    """Avalanche's items in a plain fit: the task label (0 for every item) would be the id of all 611 samples, one
    catalog row, and forgetting a real id would say "never learned"."""
    model, recorder = DigitsNet(), AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
    head = model.head.linear.weight.clone()
    x, y = digits(slice(0, 611))
    with pytest.raises(ValueError, match=r"(?s)sample ids.*are all 0.*Avalanche's task labels.*with_sample_ids"):
        fit(model, recorder, TaskItems(x, y, task=0))
    assert len(recorder.catalog) == 0 and recorder.W is None and not recorder.R.any()  # R: zeros, as at the start
    assert torch.equal(model.head.linear.weight, head)


def test_ids_repeated_inside_one_experience_are_refused_with_their_count(first_experience):
    """200 items under 150 ids: 50 of them name a second sample."""
    model, recorder = fitted(first_experience)
    before = snapshot(model, recorder)
    x, y = digits(slice(300, 500))
    ids = 1000 + torch.cat([torch.arange(150), torch.arange(50)])
    with pytest.raises(ValueError, match=r"50 sample ids in this batch were given to another sample"):
        fit(model, recorder, TensorDataset(x, y, ids), batch_size=200)
    assert_same(snapshot(model, recorder), before)


def test_a_sample_drawn_twice_is_one_sample_and_ddp_padding_repeats_only_across_ranks(first_experience):
    x, y, data = first_experience
    model, recorder = DigitsNet(), AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")

    def sampler() -> WeightedRandomSampler:  # with replacement: samples drawn twice in the epoch
        return WeightedRandomSampler(torch.ones(len(data)), 400, generator=torch.Generator().manual_seed(0))

    fit(model, recorder, data, sampler=sampler())
    drawn = torch.tensor(list(sampler()))
    assert len(recorder.catalog) == len(drawn.unique()) < 400
    assert torch.equal(recorder.catalog.ids.sort().values, drawn.unique())
    # DistributedSampler pads 7 samples to 8 over 2 ranks: the padded id is on the other rank, never twice on one
    per_rank = [list(DistributedSampler(range(7), num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    assert sorted(per_rank[0] + per_rank[1]) == [0, 0, 1, 2, 3, 4, 5, 6]
    for rows in per_rank:
        AnalyticRecorder().check_batch_ids(x[rows], y[rows], torch.tensor(rows), epoch=0)


# -- 2. a state beside the module it was recorded with -------------------------------------------------------------
def test_another_runs_state_is_refused_beside_this_module(tmp_path, first_experience):
    """Run A's certified head state (another trunk, other data) beside run B's module: refused at the unlearner's
    construction and at the next fit, naming the trunk; another trunk width is named as the head's shape."""
    data = first_experience[2]
    run_a, rec_a = DigitsNet(seed=1), SoftmaxHeadRecorder(1e-2, backbone="trunk", head="head")
    trainer = quiet_trainer([rec_a])
    trainer.fit(run_a, DataLoader(IndexedDataset(TensorDataset(*digits(slice(900, 1200)))), batch_size=64))
    trainer.save_checkpoint(tmp_path / "a.ckpt")

    run_b = DigitsNet(seed=2)
    loaded = SoftmaxHeadRecorder(1e-2, backbone="trunk", head="head").load_from_checkpoint(tmp_path / "a.ckpt")
    before = snapshot(run_b, loaded)
    trunk = r"frozen parameters and buffers of the backbone 'trunk' .*differ from those recorded \(digest blake3:"
    with pytest.raises(ValueError, match=trunk):
        ResolveUnlearner(run_b, loaded)
    with pytest.raises(ValueError, match=trunk):
        fit(run_b, loaded, data)
    assert_same(snapshot(run_b, loaded), before)

    wider = DigitsNet(seed=1, width=16)
    with pytest.raises(
        ValueError, match=r"head shape head.linear.weight \(10, 32\) recorded, head.linear.weight \(10, 64\) here"
    ):
        ResolveUnlearner(wider, loaded)
    ResolveUnlearner(run_a, loaded)  # beside its own module


def test_a_state_without_binding_loads_with_a_warning_and_is_bound_at_first_use(first_experience):
    model, recorder = fitted(first_experience)
    old = {k: v for k, v in recorder.state_dict().items() if k != "binding"}  # as an older version saved it
    restored = AnalyticRecorder(ridge=1.0, backbone="trunk", head="head")
    with pytest.warns(UnlearningWarning, match="saved without its binding.*cannot be checked"):
        restored.load_state_dict(old)
    ACUUnlearner(model, restored)
    assert restored.binding == recorder.binding
    with pytest.raises(ValueError, match="backbone 'trunk'"):
        ACUUnlearner(DigitsNet(seed=3), restored)


# -- 3. a recorder that has executed requests keeps its state ---------------------------------------------------
def test_a_recorder_that_executed_requests_refuses_a_state_unless_told(tmp_path, first_experience):
    data = first_experience[2]
    model, recorder = fitted(first_experience)
    trainer = quiet_trainer([recorder])
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "before.ckpt")
    other = fitted(first_experience)[1].state_dict()
    unlearner = ACUUnlearner(model, recorder, Ledger(tmp_path / "ledger.jsonl"))
    unlearner.forget(ForgetRequest.samples([3, 4]), data)
    before = snapshot(model, recorder)

    with pytest.raises(ValueError, match=r"executed forget requests \(2 samples forgotten.*another run's state"):
        recorder.load_state_dict(other)
    with pytest.raises(
        ValueError,
        match=r"executed forget requests.*loading checkpoint .*before.ckpt .*no ledger anchored.*replace=True",
    ):
        recorder.load_from_checkpoint(tmp_path / "before.ckpt")
    with pytest.raises(ValueError, match=r"restoring checkpoint .*before.ckpt would replace its state"):
        quiet_trainer([recorder]).fit(model, DataLoader(data, batch_size=64), ckpt_path=tmp_path / "before.ckpt")
    assert_same(recorder.state_dict(), before["recorder"])
    recorder.load_state_dict(recorder.state_dict())  # its own state at this point (a fit restoring its checkpoint)

    # said explicitly: the checkpoint's state, whose ledger then records requests it predates
    recorder.load_from_checkpoint(tmp_path / "before.ckpt", replace=True)
    assert not recorder.executed_requests and len(recorder.catalog) == 300
    assert [e.removed_ids for e in unlearner.pending()] == [[3, 4]]
    with recorder.replacing():
        recorder.load_state_dict(before["recorder"])
    assert_same(recorder.state_dict(), before["recorder"])
