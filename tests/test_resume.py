"""Resuming a fit from a checkpoint records exactly what the uninterrupted fit records, or refuses.

A fit is interrupted right after a checkpoint saved inside an epoch (``Trainer.save_checkpoint`` in
``on_train_batch_end``, as ``ModelCheckpoint(every_n_train_steps=...)`` would), then resumed with
``Trainer.fit(ckpt_path=...)`` by a fresh module, recorder and loader. With a loader that resumes
mid-epoch the statistics equal the uninterrupted run's bit for bit (same batches, same order, same
float64 sums); with a plain ``DataLoader`` the resume is refused.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from helpers import analytic_model, quiet_trainer, toy_dataset
from helpers_certified import blobs, sgd_model, trainer
from torch.utils.data import DataLoader, Sampler

from lightning_unlearn import AnalyticRecorder, TrajectoryRecorder
from lightning_unlearn.callbacks import SAFERecorder, SampleRecorder


class EpochBatches(Sampler):
    """A seeded permutation per epoch, cut into batches; resumes after the batches already served."""

    def __init__(self, n: int, batch_size: int, seed: int = 0) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.served, self.skip = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        self.served, self.skip = self.skip, 0
        for start in range(self.served * self.batch_size, self.n, self.batch_size):
            self.served += 1
            yield order[start : start + self.batch_size]


class ResumableLoader(DataLoader):
    """A DataLoader with ``state_dict``/``load_state_dict``: Lightning saves and restores its position."""

    def __init__(self, dataset, batch_size: int) -> None:
        super().__init__(dataset, batch_sampler=EpochBatches(len(dataset), batch_size))

    def state_dict(self) -> dict:
        return {"epoch": self.batch_sampler.epoch, "served": self.batch_sampler.served}

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.epoch, self.batch_sampler.skip = state["epoch"], state["served"]


class Interrupt(Exception):
    pass


class SaveAndStop(L.Callback):
    """Save a checkpoint after batch ``batch`` of epoch ``epoch``, then interrupt the fit."""

    def __init__(self, path, epoch: int, batch: int) -> None:
        self.path, self.epoch, self.batch = path, epoch, batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            trainer.save_checkpoint(self.path)
            raise Interrupt


def interrupted_then_resumed(make, ckpt, epoch: int, batch: int, loader, epochs: int, experience: int | None = None):
    """``make() -> (module, recorder)``; the fit stops after a checkpoint in (epoch, batch), a fresh
    module and recorder resume it from the checkpoint; returns the resumed pair."""
    module, rec = make()
    rec.experience = experience
    with pytest.raises(Interrupt):
        trainer([rec, SaveAndStop(ckpt, epoch, batch)], max_epochs=epochs).fit(module, loader())
    module, rec = make()
    rec.experience = experience
    trainer([rec], max_epochs=epochs).fit(module, loader(), ckpt_path=ckpt)
    return module, rec


def analytic(ridge: float = 0.5):
    return lambda: (analytic_model(), AnalyticRecorder(ridge=ridge))


@pytest.mark.parametrize("epoch", [0, 1])
def test_acu_resumed_mid_epoch_of_the_first_experience_equals_the_uninterrupted_fit(tmp_path, epoch):
    data = toy_dataset(160)
    model, rec = analytic()()
    trainer([rec], max_epochs=2).fit(model, ResumableLoader(data, 16))

    def loader():
        return ResumableLoader(data, 16)

    model2, rec2 = interrupted_then_resumed(analytic(), tmp_path / "mid.ckpt", epoch, 4, loader, 2)
    assert len(rec2.catalog) == 160 and torch.equal(rec2.catalog.ids, rec.catalog.ids)  # same samples, same order
    for k in ("R", "Q", "T", "W"):  # bit for bit: the same float64 sums in the same order
        assert torch.equal(getattr(rec2, k), getattr(rec, k)), k
    assert torch.equal(model2.head.weight, model.head.weight)


def test_acu_resumed_mid_epoch_of_a_later_experience_equals_the_uninterrupted_fit(tmp_path):
    first, second = toy_dataset(64), toy_dataset(96, seed=1, id_offset=64)
    model, rec = analytic()()
    quiet_trainer([rec]).fit(model, DataLoader(first, batch_size=16))
    base = tmp_path / "first.pt"
    torch.save({"rec": rec.state_dict(), "model": model.state_dict()}, base)

    def make():
        m, r = analytic()()
        saved = torch.load(base, weights_only=True)
        m.load_state_dict(saved["model"])
        r.load_state_dict(saved["rec"])
        return m, r

    m_ref, r_ref = make()
    trainer([r_ref], max_epochs=1).fit(m_ref, ResumableLoader(second, 16))
    _, r2 = interrupted_then_resumed(make, tmp_path / "mid.ckpt", 0, 2, lambda: ResumableLoader(second, 16), 1)
    assert r2.catalog.experiences.unique().tolist() == [0, 1] and len(r2.catalog) == 160
    assert torch.equal(r2.catalog.ids, r_ref.catalog.ids) and torch.equal(r2.R, r_ref.R) and torch.equal(r2.W, r_ref.W)


@pytest.mark.parametrize("make", [analytic(), lambda: (sgd_model(), SampleRecorder())], ids=["acu", "samples"])
def test_mid_epoch_resume_with_a_plain_dataloader_is_refused(tmp_path, make):
    data = blobs(64, seed=0) if make()[1].__class__ is SampleRecorder else toy_dataset(64)
    with pytest.raises(ValueError, match="DataLoader cannot resume mid-epoch"):
        interrupted_then_resumed(make, tmp_path / "mid.ckpt", 0, 1, lambda: DataLoader(data, batch_size=16), 1)


def test_hf_resumed_mid_epoch_equals_the_uninterrupted_trajectory(tmp_path):
    ds = blobs(64, seed=0)

    def make():
        return sgd_model(), TrajectoryRecorder(dtype=torch.float64)

    model, rec = make()
    trainer([rec], max_epochs=2).fit(model, ResumableLoader(ds, 16))
    model2, rec2 = interrupted_then_resumed(make, tmp_path / "mid.ckpt", 1, 1, lambda: ResumableLoader(ds, 16), 2)
    assert torch.equal(rec2.A[: rec2.n_rows], rec.A[: rec.n_rows]) and rec2.row_ids == rec.row_ids
    assert rec2.lrs == rec.lrs and rec2.batch_sizes == rec.batch_sizes
    assert all(torch.equal(a, b) for a, b in zip(rec2.occurrences(), rec.occurrences()))
    assert rec2.smoothness == rec.smoothness and rec2.grad_max == rec.grad_max
    assert sorted(rec2.catalog.ids.tolist()) == list(range(64))
    assert all(torch.equal(p, q) for p, q in zip(model2.parameters(), model.parameters()))


def test_safe_resumed_mid_epoch_equals_the_uninterrupted_fit(tmp_path):
    ds = blobs(64, seed=0)

    def make():
        return sgd_model(), SAFERecorder(num_classes=3, proj_dim=4)

    model, rec = make()
    trainer([rec], max_epochs=2).fit(model, ResumableLoader(ds, 16))
    _, rec2 = interrupted_then_resumed(make, tmp_path / "mid.ckpt", 0, 2, lambda: ResumableLoader(ds, 16), 2)
    for k in ("counts", "s1", "s2", "loss_sum"):
        assert torch.equal(getattr(rec2, k), getattr(rec, k)), k
    assert all(torch.equal(rec2.grad_sum[n], rec.grad_sum[n]) for n in rec.grad_sum)


def test_resume_with_other_recorder_settings_is_refused_naming_them(tmp_path):
    data = toy_dataset(48)
    model, rec = analytic()()
    tr = quiet_trainer([rec])
    tr.fit(model, DataLoader(data, batch_size=16))
    tr.save_checkpoint(tmp_path / "acu.ckpt")
    with pytest.raises(ValueError, match=r"ridge=0.5 there, 2.0 here"):
        quiet_trainer([AnalyticRecorder(ridge=2.0)], max_epochs=2).fit(
            analytic_model(), DataLoader(data, batch_size=16), ckpt_path=tmp_path / "acu.ckpt"
        )

    ds = blobs(32, seed=0)
    hf_model, hf_rec = sgd_model(), TrajectoryRecorder(dtype=torch.float64, track=range(16))
    tr = trainer([hf_rec])
    tr.fit(hf_model, DataLoader(ds, batch_size=16))
    tr.save_checkpoint(tmp_path / "hf.ckpt")
    others = {
        "dtype": TrajectoryRecorder(dtype=torch.float32, track=range(16)),
        "track": TrajectoryRecorder(dtype=torch.float64),
    }
    for setting, other in others.items():
        with pytest.raises(ValueError, match=f"other settings \\({setting}="):
            loader = DataLoader(ds, batch_size=16)
            trainer([other], max_epochs=2).fit(sgd_model(), loader, ckpt_path=tmp_path / "hf.ckpt")
        with pytest.raises(ValueError, match=f"other settings \\({setting}="):
            other.load_from_checkpoint(tmp_path / "hf.ckpt")
        assert len(other.catalog) == 0
