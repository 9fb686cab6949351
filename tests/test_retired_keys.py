"""Ledgers and checkpoints written before a method key was renamed (``hessian``/``gradient`` -> ``ccl_hessian``/
``ccl_gradient``) still verify, redo, replay and count their releases: everything that reads an entry's method back
reads it through ``lightning_unlearn.core.keys.RETIRED_KEYS``."""

import pytest
from helpers_certified import cl_tasks, fit_tasks, proximal_model

from lightning_unlearn import ForgetRequest, Ledger, ReleaseConfig
from lightning_unlearn.callbacks import CCLRecorder
from lightning_unlearn.core.keys import RETIRED_KEYS, current_key
from lightning_unlearn.core.ledger import LedgerError, weights_digest
from lightning_unlearn.core.state import UnlearningState
from lightning_unlearn.privacy.accountant import PrivacyAccountant
from lightning_unlearn.unlearners import CCLGradientUnlearner, available_unlearners, unlearner_class

TASKS = cl_tasks(30)[:2]
RELEASE = ReleaseConfig(epsilon=1.0, delta=1e-5, seed=0)  # seeded: a replay draws the same noise


def _strategy(model, rec, path):
    return CCLGradientUnlearner(model, rec, Ledger(path), lipschitz=2.0, smoothness=3.0, bound="paper", release=RELEASE)


def _resumed(saved_model, saved_rec):
    model, rec = proximal_model(), CCLRecorder()
    model.load_state_dict(saved_model)
    rec.load_state_dict(saved_rec)
    return model, rec


@pytest.fixture
def old_ledger(tmp_path, monkeypatch):
    """A run stopped after one request that the previous release executed and recorded as ``gradient``: the state
    saved before it (module and recorder), the module after it, and the ledger file."""
    rec = CCLRecorder()
    model = fit_tasks(TASKS, rec)
    saved = {k: v.clone() for k, v in model.state_dict().items()}, rec.state_dict()
    path = tmp_path / "ledger.jsonl"
    with monkeypatch.context() as patch:
        patch.setattr(CCLGradientUnlearner, "method", "gradient")  # the key it had then
        _strategy(model, rec, path).forget(ForgetRequest.of_experience(0))
    return saved, weights_digest(model), path


def test_the_table_names_the_successor_of_each_retired_key():
    assert dict(RETIRED_KEYS) == {"hessian": "ccl_hessian", "gradient": "ccl_gradient"}
    assert set(RETIRED_KEYS.values()) <= set(available_unlearners())
    assert not set(RETIRED_KEYS) & set(available_unlearners())  # a retired key names no method of its own
    assert current_key("gradient") == "ccl_gradient" and current_key("acu") == "acu"
    with pytest.raises(ValueError, match=r"'hessian' \(a retired key: the method is 'ccl_hessian' now\)"):
        unlearner_class("hessian")


def test_an_old_entry_verifies_and_its_release_counts_for_its_successor(old_ledger):
    _, _, path = old_ledger
    ledger = Ledger(path)
    assert ledger.verify().count == 1
    (entry,) = ledger
    assert (entry.method, entry.method_key) == ("gradient", "ccl_gradient")  # the hashed record is left as written
    assert len(PrivacyAccountant.from_ledger(ledger, "ccl_gradient")) == 1


def test_a_stopped_old_entry_is_redone_by_its_successor(old_ledger):
    (saved_model, saved_rec), _, path = old_ledger
    model, rec = _resumed(saved_model, saved_rec)
    strategy = _strategy(model, rec, path)
    assert [e.seq for e in strategy.pending()] == [0]
    assert len(strategy.accountant) == 1  # rebuilt from the ledger (no release in the checkpoint): the old entry's
    (redone,) = strategy.redo_pending()
    assert redone.extra["redo_of"] == 0 and redone.removed_ids.tolist() == list(range(30))
    ledger = Ledger(path)
    assert [e.method for e in ledger] == ["gradient", "ccl_gradient"] and ledger.verify().count == 2
    assert strategy.pending() == []


def test_a_stopped_old_entry_is_refused_by_another_method(old_ledger):
    (saved_model, saved_rec), _, path = old_ledger
    model, rec = _resumed(saved_model, saved_rec)
    strategy = _strategy(model, rec, path)
    strategy.method = "ccl_hessian"
    before = weights_digest(model)
    with pytest.raises(LedgerError, match="executed by 'gradient'"):
        strategy.redo_pending()
    assert weights_digest(model) == before and len(Ledger(path)) == 1


def test_an_old_ledger_replays_on_its_successor(old_ledger):
    (saved_model, saved_rec), after, path = old_ledger
    model, rec = _resumed(saved_model, saved_rec)
    strategy = CCLGradientUnlearner(model, rec, lipschitz=2.0, smoothness=3.0, bound="paper", release=RELEASE)
    ((entry, same),) = Ledger(path).replay(strategy)
    assert entry.method == "gradient" and same and weights_digest(model) == after


def test_a_checkpoint_keeps_the_accountant_saved_under_a_retired_key():
    saved = PrivacyAccountant("pld").state_dict()
    state = UnlearningState.from_state_dict({"privacy": {"gradient": saved, "acu": None}})
    assert state.privacy == {"ccl_gradient": saved, "acu": None}
    assert UnlearningState.from_state_dict({}).privacy is None
