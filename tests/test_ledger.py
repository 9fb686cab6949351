"""The ledger is append-only, tamper-evident, survives restarts, and replays to the same weights."""

import json

import pytest
import torch
from helpers import fit_analytic, toy_dataset

from lightning_unlearn import ACUStrategy, AnalyticRecorder, ForgetRequest, Ledger
from lightning_unlearn.core.ledger import weights_digest


def test_entries_record_what_when_method_certificate(tmp_path):
    data = toy_dataset(100)
    model, rec = fit_analytic([data])
    ledger = Ledger(tmp_path / "ledger.jsonl")
    strategy = ACUStrategy(model, rec, ledger)
    strategy.forget(ForgetRequest.samples([7, 8]), data)
    strategy.forget(ForgetRequest.of_class(3), data)
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["method"] == "acu" and first["removed_ids"] == [7, 8]
    assert first["certificate"]["exact"] is True and first["timestamp"].endswith("+00:00")
    assert ledger[1].request == {"kind": "class", "sample_ids": [], "target": 3}
    assert ledger[1].weights_digest == weights_digest(model)
    # reopening continues the chain
    reopened = Ledger(tmp_path / "ledger.jsonl")
    assert len(reopened) == 2 and reopened.forgotten_ids() == {7, 8} | set(range(3, 100, 4))


def test_tampering_is_detected(tmp_path):
    data = toy_dataset(60)
    model, rec = fit_analytic([data])
    path = tmp_path / "ledger.jsonl"
    strategy = ACUStrategy(model, rec, Ledger(path))
    strategy.forget(ForgetRequest.samples([1]), data)
    strategy.forget(ForgetRequest.samples([2]), data)
    lines = path.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["removed_ids"] = [5]
    path.write_text(json.dumps(edited) + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match="corrupt at entry 0"):
        Ledger(path)
    path.write_text(lines[1] + "\n")  # an entry deleted
    with pytest.raises(ValueError, match="corrupt at entry 0"):
        Ledger(path)


def test_replay_reproduces_exact_weights(tmp_path):
    data = toy_dataset(100)
    model, rec = fit_analytic([data])
    saved_model, saved_rec = {k: v.clone() for k, v in model.state_dict().items()}, rec.state_dict()
    strategy = ACUStrategy(model, rec, Ledger(tmp_path / "l.jsonl"))
    for request in (ForgetRequest.samples([0, 1]), ForgetRequest.of_class(2), ForgetRequest.of_experience(0)):
        strategy.forget(request, data)

    # an auditor restores the pre-request state and replays the ledger
    from helpers import analytic_model

    audit_model, audit_rec = analytic_model(), AnalyticRecorder(gamma=rec.gamma)
    audit_model.load_state_dict(saved_model)
    audit_rec.load_state_dict(saved_rec)
    checks = Ledger(tmp_path / "l.jsonl").replay(ACUStrategy(audit_model, audit_rec), data)
    assert [ok for _, ok in checks] == [True, True, True]
    assert torch.equal(audit_model.head.weight, model.head.weight)
