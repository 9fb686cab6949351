"""The "your module" contract: tuple and dict batches, configurable keys, ids on dict datasets, loss checks."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import N_CLASSES, N_FEATURES, quiet_trainer, toy_tensors
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_unlearn import IndexedDataset
from lightning_unlearn.callbacks import SampleRecorder
from lightning_unlearn.contract import (
    BatchKeys,
    check_loss_fn,
    resolve_loss_fn,
    training_loss,
    trains_itself,
    unpack_batch,
    with_target,
)
from lightning_unlearn.data import select_by_ids
from lightning_unlearn.models import AnalyticClassifier, ProximalClassifier


class DictData(Dataset):
    """Items ``{"image": x, "label": y}`` (plus ``"id"`` if given), like many user datasets."""

    def __init__(self, n: int = 40, ids: bool = False) -> None:
        self.x, self.y = toy_tensors(n)
        self.ids = ids

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        item = {"image": self.x[i], "label": self.y[i]}
        return {**item, "id": torch.tensor(1000 + i)} if self.ids else item


class Smoothed(L.LightningModule):
    """A user module: dict batches, label-smoothed cross-entropy, Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(N_FEATURES, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.cross_entropy(self(batch["image"]), batch["label"], label_smoothing=0.1)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


KEYS = BatchKeys(input="image")


def test_tuple_and_dict_batches_unpack_to_the_same_triple():
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 2])
    ids = torch.tensor([7, 8, 9])
    for batch in (
        (x, y, ids),
        [x, y, ids, torch.zeros(3)],
        {"x": x, "y": y, "sample_id": ids},
        {"input": x, "label": y, "id": ids},
    ):
        bx, by, bids = unpack_batch(batch)
        assert bx is x and torch.equal(by, y) and torch.equal(bids, ids)
    # precedence: "sample_id" before "id" (a dataset's own string or record "id" does not shadow the wrapper's)
    assert unpack_batch({"x": x, "y": y, "id": ids + 1, "sample_id": ids})[2].tolist() == [7, 8, 9]
    assert unpack_batch({"img": x, "cls": y, "uid": ids}, BatchKeys("img", "cls", "uid"))[2].tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="no sample_id under 'sample_id' / 'id'.*IndexedDataset"):
        unpack_batch({"x": x, "y": y})
    with pytest.raises(ValueError, match="no input under 'pixels'"):
        unpack_batch({"x": x, "y": y, "id": ids}, BatchKeys(input="pixels"))
    with pytest.raises(ValueError, match="no sample ids"):
        unpack_batch((x, y))
    with pytest.raises(ValueError, match="one per row"):
        unpack_batch((x, y, ids[:2]))
    assert with_target({"x": x, "label": y}, y + 1)["label"].tolist() == [1, 2, 3]
    assert with_target((x, y, ids), y + 1)[1].tolist() == [1, 2, 3]


def test_indexed_dataset_over_dict_items_and_select_by_ids():
    data = IndexedDataset(DictData(40), ids=torch.arange(40) + 500)
    item = data[3]
    assert set(item) == {"image", "label", "sample_id"} and int(item["sample_id"]) == 503
    batch = next(iter(DataLoader(data, batch_size=8)))
    assert unpack_batch(batch, KEYS)[2].tolist() == list(range(500, 508))
    x, y = select_by_ids(data, torch.tensor([510, 501]), keys=KEYS)
    assert torch.equal(x, torch.stack([data.dataset.x[10], data.dataset.x[1]])) and y.tolist() == [
        data.dataset.y[10],
        data.dataset.y[1],
    ]
    # ids known by position: a concatenation with a repeated id reads its first occurrence; missing ids are named
    twice = torch.utils.data.ConcatDataset([data, IndexedDataset(DictData(40), ids=torch.arange(40) + 530)])
    x, _ = select_by_ids(twice, torch.tensor([535, 531]), keys=KEYS)
    assert torch.equal(x, torch.stack([data.dataset.x[35], data.dataset.x[31]]))
    with pytest.raises(ValueError, match=r"lacks 2 requested sample ids, e.g. \[7, 600\]"):
        select_by_ids(data, torch.tensor([7, 510, 600]), keys=KEYS)
    with pytest.raises(ValueError, match="already have a 'id' entry"):
        IndexedDataset(DictData(4, ids=True), id_key="id")
    # the dataset's own ids under "id" are read when nothing else is given
    assert unpack_batch(next(iter(DataLoader(DictData(4, ids=True), batch_size=4))), KEYS)[2].tolist() == [
        1000,
        1001,
        1002,
        1003,
    ]


def test_recorder_learns_from_dict_batches_with_configured_keys():
    rec = SampleRecorder(batch_keys=KEYS)
    data = IndexedDataset(DictData(40))
    quiet_trainer([rec]).fit(Smoothed(), DataLoader(data, batch_size=16))
    assert sorted(rec.catalog.ids.tolist()) == list(range(40))
    assert torch.equal(rec.catalog.labels_of(torch.arange(40)), data.dataset.y)


def test_loss_fn_is_checked_against_the_module_training_loss():
    torch.manual_seed(0)
    module = Smoothed()
    batch = next(iter(DataLoader(IndexedDataset(DictData(32)), batch_size=32)))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert trains_itself(module) and not trains_itself(nn.Linear(2, 2))
    assert not trains_itself(AnalyticClassifier(nn.Identity(), 4, 2))  # manual optimization
    assert training_loss(module, batch).ndim == 0
    with pytest.raises(ValueError, match="disagrees with Smoothed.training_step"):
        resolve_loss_fn(module, None, batch, keys=KEYS)  # plain CE is not the label-smoothed loss

    def smoothed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y, label_smoothing=0.1, reduction="none")

    assert resolve_loss_fn(module, smoothed, batch, keys=KEYS) is smoothed
    with pytest.raises(ValueError, match="one loss per sample"):
        check_loss_fn(module, lambda out, y: smoothed(out, y).mean(), batch, keys=KEYS)
    with pytest.raises(TypeError, match="callable"):
        resolve_loss_fn(module, "ce")  # type: ignore[arg-type]
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    # a regulariser in the training loss is accounted for by a penalty
    reg = ProximalClassifier(nn.Linear(N_FEATURES, N_CLASSES), l2=0.5)
    reg.start_task()
    tup = (torch.randn(8, N_FEATURES), torch.arange(8) % N_CLASSES, torch.arange(8))
    with pytest.raises(ValueError, match="disagrees"):
        check_loss_fn(reg, resolve_loss_fn(reg), tup)
    check_loss_fn(reg, resolve_loss_fn(reg), tup, penalty=reg.regularizer.penalty)


def test_fingerprints_read_a_sample_the_same_at_any_float_precision():
    from lightning_unlearn.core.catalog import fingerprints

    # precision="64-true" casts each batch to float64 before the recorder's hooks; the forget data is read as stored
    x = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fingerprints(x), fingerprints(x.double()))
    assert torch.equal(fingerprints(x.half()), fingerprints(x.half().float()))
    nudged = x.clone()
    nudged[2, 0, 0] = torch.nextafter(nudged[2, 0, 0], torch.tensor(10.0))  # one ulp of one value
    assert (fingerprints(nudged) != fingerprints(x)).tolist() == [False, False, True, False]
    assert not torch.equal(fingerprints(x), fingerprints(x.reshape(4, 6)))  # the shape is part of the digest
    ids = torch.arange(6).reshape(2, 3)
    assert not (fingerprints(ids) == fingerprints(ids.double())).any()  # integers are not floats
