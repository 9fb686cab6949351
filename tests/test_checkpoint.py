"""Recorded statistics live in the callback state_dict, so a checkpoint can still unlearn."""

from pathlib import Path

import pytest
import torch
from helpers import N_CLASSES, analytic_model, quiet_trainer, toy_dataset, toy_tensors
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_unlearn import (
    ACUUnlearner,
    AnalyticRecorder,
    CCLHessianRecorder,
    ForgetRequest,
)
from lightning_unlearn.functional import acu


def test_checkpoint_restores_statistics_and_forgets_identically(tmp_path):
    data = toy_dataset(150)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    trainer = quiet_trainer([rec])
    trainer.fit(model, DataLoader(data, batch_size=32))
    ACUUnlearner(model, rec).forget(ForgetRequest.samples([1, 2]), data)  # forget before saving, too
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)

    # the original run goes on forgetting
    original = ACUUnlearner(model, rec).forget(ForgetRequest.of_class(1), data)

    # a fresh process: new module, new recorder, restored from the file
    restored_model = analytic_model()
    restored_model.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    restored = AnalyticRecorder(ridge=0.5)
    restored.load_from_checkpoint(path)
    assert restored.catalog.forgotten.sum() == 2
    result = ACUUnlearner(restored_model, restored).forget(ForgetRequest.of_class(1), data)
    assert torch.equal(result.removed_ids, original.removed_ids)
    assert torch.allclose(restored.W, rec.W, rtol=0, atol=1e-12)
    assert torch.equal(restored_model.head.weight, model.head.weight)


def test_resumed_fit_restores_callback_state_and_keeps_learning(tmp_path):
    """Trainer.fit(ckpt_path=...) restores the recorder too; the next experience adds to it."""
    first, second = toy_dataset(80), toy_dataset(80, seed=1, id_offset=80)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    trainer = quiet_trainer([rec])
    trainer.fit(model, DataLoader(first, batch_size=16))
    trainer.save_checkpoint(tmp_path / "a.ckpt")

    model2, rec2 = analytic_model(), AnalyticRecorder(ridge=0.5)
    rec2.experience = 1
    quiet_trainer([rec2], max_epochs=2).fit(model2, DataLoader(second, batch_size=16), ckpt_path=tmp_path / "a.ckpt")
    assert len(rec2.catalog) == 160 and rec2.catalog.experiences.unique().tolist() == [0, 1]


def test_checkpoint_without_statistics_is_a_clear_error(tmp_path):
    data = toy_dataset(40)
    model = analytic_model()
    trainer = quiet_trainer([AnalyticRecorder(ridge=2.0)])
    trainer.fit(model, DataLoader(data, batch_size=16))
    trainer.save_checkpoint(tmp_path / "other.ckpt")
    rec = AnalyticRecorder(ridge=0.5)  # a different recorder configuration: a different state key
    with pytest.raises(ValueError, match="AnalyticRecorder with other settings \\(ridge=2.0 there, 0.5 here\\)"):
        rec.load_from_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="holds no statistics of CCLHessianRecorder"):
        CCLHessianRecorder().load_from_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="lacks recorded statistics"):
        rec.load_state_dict({"catalog": None, "ridge": 0.5})
    assert len(rec.catalog) == 0


def test_resuming_the_same_experience_does_not_count_samples_twice(tmp_path):
    data = toy_dataset(80)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    trainer = quiet_trainer([rec])
    trainer.fit(model, DataLoader(data, batch_size=16))
    trainer.save_checkpoint(tmp_path / "a.ckpt")

    model2, rec2 = analytic_model(), AnalyticRecorder(ridge=0.5)
    rec2.experience = 0  # the interrupted experience goes on
    quiet_trainer([rec2], max_epochs=3).fit(model2, DataLoader(data, batch_size=16), ckpt_path=tmp_path / "a.ckpt")
    assert len(rec2.catalog) == 80
    assert torch.equal(rec2.R, rec.R) and torch.equal(rec2.W, rec.W)


def test_model_checkpoint_writes_the_checkpoints_of_an_analytic_fit(tmp_path):
    """The analytic head takes no gradient step, yet Lightning counts one step per batch."""
    data = toy_dataset(64)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    at_epoch_end = ModelCheckpoint(dirpath=tmp_path / "epochs")
    every_step = ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=1, save_top_k=-1)
    trainer = quiet_trainer([rec, at_epoch_end, every_step], enable_checkpointing=True)
    trainer.fit(model, DataLoader(data, batch_size=16))
    assert trainer.global_step == 4 and len(list((tmp_path / "steps").glob("*.ckpt"))) == 4
    restored = AnalyticRecorder(ridge=0.5)
    restored.load_from_checkpoint(at_epoch_end.best_model_path)
    assert len(restored.catalog) == 64 and torch.equal(restored.W, rec.W)
    assert torch.equal(model.head.weight, rec.W.T)  # the no-op optimizer step never moved the head


def test_model_checkpoint_writes_analytic_runs_and_the_restored_recorder_forgets_exactly(tmp_path):
    """No gradient step happens in an analytic fit, yet Lightning's own ModelCheckpoint writes its checkpoints."""
    data = toy_dataset(100)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    quiet_trainer([rec, ckpt], enable_checkpointing=True).fit(model, DataLoader(data, batch_size=16))
    assert ckpt.last_model_path and Path(ckpt.last_model_path).exists()
    saved = torch.load(ckpt.last_model_path, weights_only=True)
    assert saved["global_step"] == 7  # one (no-op) step per batch: 100 samples / 16

    restored_model, restored = analytic_model(), AnalyticRecorder(ridge=0.5)
    restored_model.load_state_dict(saved["state_dict"])
    restored.load_from_checkpoint(ckpt.last_model_path)
    assert torch.equal(restored.W, rec.W) and len(restored.catalog) == 100
    ACUUnlearner(restored_model, restored).forget(ForgetRequest.samples([0, 1, 2]), data)
    keep = restored.catalog.active_ids()
    x, y = toy_tensors(100)
    F = restored_model.features(x[keep])
    W_ref = acu.ridge_solution(F.T @ F, F.T @ acu.one_hot(y[keep], N_CLASSES), 0.5)[1]
    # float64: cond(R + gamma I) ~ 1e3 here, a ridge solve is accurate to ~ eps * 1e3; 500x margin
    assert float((restored.W - W_ref).norm() / W_ref.norm()) <= 1e-10


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda s: {**s, "W": s["W"] * 1.01}, r"W != T Q \(eq. 3\)"),
        (lambda s: {**s, "T": s["T"] + 1e-3 * torch.eye(len(s["T"]), dtype=s["T"].dtype)}, r"T \(R \+ gamma I\) != I"),
        (lambda s: {**s, "R": s["R"][:-1]}, "R has shape"),
        (lambda s: {**s, "Q": s["Q"] * float("nan")}, r"non-finite values in \['Q'\]"),
    ],
)
def test_a_tampered_recorder_state_is_refused_naming_what_fails(tamper, message):
    data = toy_dataset(60)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    quiet_trainer([rec]).fit(model, DataLoader(data, batch_size=16))
    ACUUnlearner(model, rec).forget(ForgetRequest.samples([4]), data)
    fresh = AnalyticRecorder(ridge=0.5)
    fresh.load_state_dict(rec.state_dict())  # the honest state, after a request, is accepted
    fresh = AnalyticRecorder(ridge=0.5)
    with pytest.raises(ValueError, match=message):
        fresh.load_state_dict(tamper(rec.state_dict()))
    assert len(fresh.catalog) == 0 and fresh.W is None


def test_a_module_whose_head_differs_from_the_recorder_is_refused():
    data = toy_dataset(60)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    quiet_trainer([rec]).fit(model, DataLoader(data, batch_size=16))
    with torch.no_grad():
        model.head.weight.mul_(1.01)  # e.g. a tampered module checkpoint
    W = rec.W.clone()
    with pytest.raises(ValueError, match=r"module's head \['head.weight'\] differs from the recorder's W"):
        ACUUnlearner(model, rec).forget(ForgetRequest.samples([4]), data)
    assert torch.equal(rec.W, W) and rec.catalog.n_active == 60


def test_the_unlearning_state_keeps_the_top_level_keys_of_older_checkpoints():
    data = toy_dataset(60)
    model, rec = analytic_model(), AnalyticRecorder(ridge=0.5)
    quiet_trainer([rec]).fit(model, DataLoader(data, batch_size=32))
    rec.unlearning_state.ledger_anchor = {"count": 1, "head": "ab", "keyed": False}
    rec.unlearning_state.privacy = {"hf": {"history": [[1.0, 1e-5]]}}
    state = rec.state_dict()
    held = rec.unlearning_state
    assert state["ledger_anchor"] == held.ledger_anchor and state["lineage"] == held.lineage
    older = {k: v for k, v in state.items() if k != "ledger_overrides"}  # saved before accepted ledgers were kept
    restored = AnalyticRecorder(ridge=0.5)
    restored.load_state_dict(older)
    assert restored.unlearning_state == rec.unlearning_state and restored.unlearning_state.ledger_overrides == []


def test_unlearning_state_example_runs_as_a_doctest():
    import doctest

    from lightning_unlearn.core import state

    failed, attempted = doctest.testmod(state, optionflags=doctest.ELLIPSIS)
    assert (failed, attempted) == (0, 7)
