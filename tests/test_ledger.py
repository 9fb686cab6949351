"""The ledger is append-only, tamper-evident, survives restarts, and replays to the same weights."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import fit_analytic, toy_dataset

from lightning_unlearn import ACUUnlearner, AnalyticRecorder, ForgetRequest, Ledger
from lightning_unlearn.core.ledger import KEY_ENV, LedgerError, weights_digest
from lightning_unlearn.warnings import UnlearningWarning


def test_entries_record_what_when_method_certificate(tmp_path):
    data = toy_dataset(100)
    model, rec = fit_analytic([data])
    ledger = Ledger(tmp_path / "ledger.jsonl")
    strategy = ACUUnlearner(model, rec, ledger)
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
    strategy = ACUUnlearner(model, rec, Ledger(path))
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
    strategy = ACUUnlearner(model, rec, Ledger(tmp_path / "l.jsonl"))
    for request in (ForgetRequest.samples([0, 1]), ForgetRequest.of_class(2), ForgetRequest.of_experience(0)):
        strategy.forget(request, data)

    # an auditor restores the pre-request state and replays the ledger
    from helpers import analytic_model

    audit_model, audit_rec = analytic_model(), AnalyticRecorder(ridge=rec.ridge)
    audit_model.load_state_dict(saved_model)
    audit_rec.load_state_dict(saved_rec)
    checks = Ledger(tmp_path / "l.jsonl").replay(ACUUnlearner(audit_model, audit_rec), data)
    assert [ok for _, ok in checks] == [True, True, True]
    assert torch.equal(audit_model.head.weight, model.head.weight)


# -- the probes of an auditor ----------------------------------------------------------------------
def _ledger_with_requests(tmp_path, n=3):
    data = toy_dataset(60)
    model, rec = fit_analytic([data])
    path = tmp_path / "ledger.jsonl"
    strategy = ACUUnlearner(model, rec, Ledger(path))
    for i in range(n):
        strategy.forget(ForgetRequest.samples([i]), data)
    return path, rec, strategy, data


@pytest.mark.parametrize("dropped", [1, 2])
def test_deleting_the_last_entries_is_detected_against_the_checkpoint_anchor(tmp_path, dropped):
    path, rec, _, _ = _ledger_with_requests(tmp_path)
    anchor = rec.state_dict()["ledger_anchor"]
    assert anchor["count"] == 3
    lines = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in lines[:-dropped]))
    Ledger(path).verify()  # the chain alone cannot tell
    with pytest.raises(LedgerError, match="truncated or replaced"):
        Ledger(path).verify(anchor)


def test_an_empty_replacement_is_detected_against_the_anchor(tmp_path):
    path, rec, _, _ = _ledger_with_requests(tmp_path, 1)
    path.write_text("")
    with pytest.raises(LedgerError, match="has 0 entries but the checkpoint anchors 1"):
        Ledger(path).verify(rec.unlearning_state.ledger_anchor)


def test_a_rewritten_chain_is_detected_by_the_anchor_and_by_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "auditor-secret")
    path, rec, _, _ = _ledger_with_requests(tmp_path)
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(e["keyed"] for e in entries) and "auditor-secret" not in path.read_text()
    # a forger edits entry 1 and recomputes every later hash with plain SHA-256 (not knowing the key)
    entries[1]["removed_ids"] = [42]
    prev = entries[0]["hash"]
    for e in entries[1:]:
        e["prev_hash"] = prev
        body = {k: v for k, v in e.items() if k != "hash"}
        e["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        prev = e["hash"]
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
    with pytest.raises(LedgerError, match="corrupt at entry 1"):
        Ledger(path)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(LedgerError, match="keyed"):
        Ledger(path)


def test_an_unkeyed_rewritten_chain_is_detected_by_the_anchor(tmp_path):
    path, rec, _, _ = _ledger_with_requests(tmp_path)
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[1]["removed_ids"] = [42]
    prev = entries[0]["hash"]
    for e in entries[1:]:
        e["prev_hash"] = prev
        e["hash"] = hashlib.sha256(
            json.dumps({k: v for k, v in e.items() if k != "hash"}, sort_keys=True).encode()
        ).hexdigest()
        prev = e["hash"]
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
    Ledger(path)  # a consistent unkeyed chain
    with pytest.raises(LedgerError, match="differs from the checkpoint's anchor"):
        Ledger(path).verify(rec.unlearning_state.ledger_anchor)


def test_a_torn_last_line_is_named_and_can_be_recovered(tmp_path):
    path, _, _, _ = _ledger_with_requests(tmp_path, 2)
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:40])  # a third append cut by a crash
    with pytest.raises(LedgerError, match="torn last line 3"):
        Ledger(path)
    with pytest.warns(UnlearningWarning, match="truncated a torn last line 3"):
        recovered = Ledger(path, recover=True)
    assert len(recovered) == 2 and path.read_text() == text


def test_two_writers_on_one_file_continue_one_chain(tmp_path):
    data = toy_dataset(60)
    path = tmp_path / "ledger.jsonl"
    strategies = []
    for _ in range(2):
        model, rec = fit_analytic([data])
        strategies.append(ACUUnlearner(model, rec, Ledger(path, shared=True)))  # two runs, one file
    for i in range(10):
        for k, s in enumerate(strategies):
            s.forget(ForgetRequest.samples([2 * i + k]), data)
    ledger = Ledger(path)
    assert len(ledger) == 20 and [e.seq for e in ledger] == list(range(20))


def test_concurrent_processes_append_without_corruption(tmp_path):
    script = tmp_path / "append.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import fit_analytic, toy_dataset\n"
        "from lightning_unlearn import ACUUnlearner, ForgetRequest, Ledger\n"
        "data = toy_dataset(60)\n"
        "model, rec = fit_analytic([data])\n"
        "s = ACUUnlearner(model, rec, Ledger(sys.argv[1], shared=True))\n"
        "k = int(sys.argv[2])\n"
        "for i in range(10):\n"
        "    s.forget(ForgetRequest.samples([2 * i + k]), data)\n"
    )
    path = tmp_path / "ledger.jsonl"
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(k)]) for k in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    ledger = Ledger(path)
    assert len(ledger) == 20 and ledger.forgotten_ids() == set(range(20))


def test_replay_never_writes_to_the_audited_ledger_and_refuses_another_method(tmp_path):
    path, _, strategy, data = _ledger_with_requests(tmp_path, 2)
    before = path.read_bytes()
    audited = Ledger(path)
    from helpers import analytic_model

    audit = ACUUnlearner(analytic_model(), AnalyticRecorder(ridge=strategy.recorder.ridge), audited)
    audit.recorder.load_state_dict(fit_analytic([data])[1].state_dict())
    audit.module.load_state_dict(fit_analytic([data])[0].state_dict())
    checks = audited.replay(audit, data)
    assert [ok for _, ok in checks] == [True, True]
    assert path.read_bytes() == before and len(audited) == 2
    other = ACUUnlearner(analytic_model(), AnalyticRecorder(ridge=strategy.recorder.ridge))
    other.method = "finetune"  # a strategy of another method
    with pytest.raises(LedgerError, match="executed by 'acu', not by 'finetune'"):
        audited.replay(other, data)


def test_only_rank_zero_writes_the_file(tmp_path, monkeypatch):
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    data = toy_dataset(60)
    model, rec = fit_analytic([data])
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ACUUnlearner(model, rec, ledger).forget(ForgetRequest.samples([1]), data)
    assert len(ledger) == 1 and not (tmp_path / "ledger.jsonl").exists()


def test_a_failed_ledger_write_changes_nothing_and_the_request_can_be_retried(tmp_path, monkeypatch):
    data = toy_dataset(60)
    model, rec = fit_analytic([data])
    path = tmp_path / "ledger.jsonl"
    strategy = ACUUnlearner(model, rec, Ledger(path))
    strategy.forget(ForgetRequest.samples([1]), data)
    state, weights, text = rec.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}, path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        strategy.forget(ForgetRequest.samples([2]), data)
    assert path.read_bytes() == text and len(strategy.ledger) == 1
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    after = rec.state_dict()
    assert all(torch.equal(after[k], state[k]) for k in ("R", "Q", "T", "W"))
    assert all(torch.equal(after["catalog"][k], state["catalog"][k]) for k in state["catalog"])
    monkeypatch.undo()
    strategy.forget(ForgetRequest.samples([2]), data)  # the retry succeeds
    assert len(Ledger(path)) == 2


# -- a ledger ahead of the state it is used with (a run resumed from a checkpoint older than its last requests) --
def _stopped_run(tmp_path):
    """A checkpoint (module and recorder state), then a request the ledger records but no later checkpoint holds."""
    data = toy_dataset(80)
    model, rec = fit_analytic([data])
    saved_model, saved_rec = {k: v.clone() for k, v in model.state_dict().items()}, rec.state_dict()
    path = tmp_path / "ledger.jsonl"
    ACUUnlearner(model, rec, Ledger(path)).forget(ForgetRequest.samples([4, 9]), data)
    from helpers import analytic_model

    resumed_model, resumed_rec = analytic_model(), AnalyticRecorder(ridge=rec.ridge)
    resumed_model.load_state_dict(saved_model)
    resumed_rec.load_state_dict(saved_rec)
    return data, model, resumed_model, resumed_rec, path


def test_new_requests_are_refused_while_the_ledger_records_requests_the_state_predates(tmp_path):
    data, _, model, rec, path = _stopped_run(tmp_path)
    strategy = ACUUnlearner(model, rec, Ledger(path))
    assert [e.seq for e in strategy.pending()] == [0]
    before, R = weights_digest(model), rec.R.clone()
    with pytest.raises(LedgerError, match=r"records requests \[0\].*ids \[4, 9\].*redo_pending"):
        strategy.forget(ForgetRequest.samples([20]), data)
    assert weights_digest(model) == before and torch.equal(rec.R, R) and len(Ledger(path)) == 1
    assert rec.catalog.live([4, 9, 20]) == [4, 9, 20]


def test_redo_pending_executes_the_entries_again_and_records_the_redo(tmp_path):
    data, stopped, model, rec, path = _stopped_run(tmp_path)
    strategy = ACUUnlearner(model, rec, Ledger(path))
    (redone,) = strategy.redo_pending(data)
    assert redone.removed_ids.tolist() == [4, 9] and redone.extra["redo_of"] == 0
    # ACU is exact and deterministic: the redone weights are the stopped run's, bit for bit
    assert weights_digest(model) == weights_digest(stopped) == Ledger(path)[0].weights_digest
    ledger = Ledger(path)
    assert len(ledger) == 2 and ledger[1].extra["redo_of"] == 0 and ledger[1].removed_ids == [4, 9]
    assert strategy.pending() == [] and rec.catalog.live([4, 9]) == []
    strategy.forget(ForgetRequest.samples([20]), data)  # new requests go through again


def test_redo_pending_refuses_an_entry_of_another_method(tmp_path):
    data, _, model, rec, path = _stopped_run(tmp_path)
    strategy = ACUUnlearner(model, rec, Ledger(path))
    strategy.method = "other"  # the entry was executed by "acu"
    before = weights_digest(model)
    with pytest.raises(LedgerError, match="executed by 'acu'"):
        strategy.redo_pending(data)
    assert weights_digest(model) == before and len(Ledger(path)) == 1


def test_an_open_ledger_checks_what_was_appended_or_changed_since_it_last_read_the_file(tmp_path):
    """A request re-checks only the bytes after those it checked before, and everything when they changed: a forged
    entry appended by another writer, a torn line, and an edit of an entry already checked are each refused."""
    path, _, strategy, data = _ledger_with_requests(tmp_path, 2)
    text = path.read_text()
    forged = {**json.loads(text.splitlines()[1]), "seq": 2, "prev_hash": strategy.ledger[1].hash}
    path.write_text(text + json.dumps(forged) + "\n")  # chained to the head, but its own hash is entry 1's
    with pytest.raises(LedgerError, match="corrupt at entry 2"):
        strategy.forget(ForgetRequest.samples([5]), data)
    path.write_text(text + text.splitlines()[0][:40])
    with pytest.raises(LedgerError, match="torn last line 3"):
        strategy.forget(ForgetRequest.samples([5]), data)
    path.write_text(text.replace('"removed_ids": [0]', '"removed_ids": [9]'))
    with pytest.raises(LedgerError, match="corrupt at entry 0"):
        strategy.forget(ForgetRequest.samples([5]), data)
    path.write_text(text)
    strategy.forget(ForgetRequest.samples([5]), data)
    assert [e.seq for e in Ledger(path)] == [0, 1, 2] and Ledger(path)[2].removed_ids == [5]
