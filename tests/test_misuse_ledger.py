"""A ledger whose entries do not fit the recorder's anchor and run is refused before anything runs (issue 26).

Entries after the anchor are listed by ``Ledger.verify`` and refused by ``forget`` unless they are this run's
requests still to redo; an entry repeating an execution is refused even with its chain rehashed (with or without
the HMAC key); another run's entries are refused naming its lineage; the operator confirms them
(``accept_ledger``) or cuts them (``rollback_ledger``: atomic, durable, recorded as an entry). Every refusal leaves
weights, statistics, catalog, accountant and ledger bytes as they were.
"""

from __future__ import annotations

import copy
import errno
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers_faults import SEEDED, data, fitted, fresh, requests, restore, same, save, snapshot, strategy

from lightning_unlearn import ForgetRequest, Ledger
from lightning_unlearn.core.ledger import KEY_ENV, ROLLBACK, LedgerEntry, LedgerError
from lightning_unlearn.unlearners import Unlearner

pytestmark = pytest.mark.filterwarnings(f"ignore:{SEEDED}")  # SAFE's release is seeded on purpose (helpers_faults)
DATA = data("acu")


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, Any]:
    """A fitted ACU run's module and recorder state, before any request (what a checkpoint holds of them)."""
    model, rec = fitted("acu")
    return copy.deepcopy({"model": model.state_dict(), "recorder": rec.state_dict()})


def restored(checkpoint: dict[str, Any], path: Path, lineage: str | None = None, shared: bool = False) -> Unlearner:
    """The checkpoint restored (as another run's with ``lineage``) and given the ledger at ``path``."""
    state = copy.deepcopy(checkpoint)
    model, rec = fresh("acu")
    model.load_state_dict(state["model"])
    rec.load_state_dict(state["recorder"] if lineage is None else {**state["recorder"], "lineage": lineage})
    return strategy("acu", model, rec, Ledger(path, shared=shared))


def append_forged(path: Path, copy_of: int, key: bytes | None = None, **changes: Any) -> None:
    """Append a copy of entry ``copy_of`` (with ``changes``) chained to the last entry and hashed as the library
    hashes (with ``key``: by someone who holds the HMAC key): a consistent chain."""
    entries = [LedgerEntry.from_json(line) for line in path.read_text().splitlines()]
    body = replace(entries[copy_of], seq=len(entries), prev_hash=entries[-1].hash, **changes)
    with path.open("ab") as f:
        f.write(replace(body, hash=body.computed_hash(key)).to_line())


def refused(s: Unlearner, path: Path, match: str) -> None:
    """``forget`` and ``redo_pending`` raise a LedgerError matching ``match``; nothing changed, on disk or in memory."""
    before, on_disk = snapshot(s), path.read_bytes()
    with pytest.raises(LedgerError, match=match):
        s.forget(ForgetRequest.samples([30]), DATA)
    with pytest.raises(LedgerError, match=match):
        s.redo_pending(DATA)
    assert same(snapshot(s), before) and path.read_bytes() == on_disk
    assert s.catalog.live([30]) == [30]


@pytest.mark.parametrize("key", [None, "auditor-secret"], ids=["unkeyed", "keyed"])
def test_an_executed_entry_appended_again_with_its_chain_rehashed_is_refused(checkpoint, tmp_path, monkeypatch, key):
    """The copy of entry 1 as entry 2, chained and hashed consistently (unkeyed, or by whoever holds the key), opens
    as a ledger but fails verify (with or without the anchor), forget and accept_ledger, naming both entries; the
    copy disguised as a redo of another entry fails verify too; rollback_ledger cuts it, and requests go on."""
    if key is not None:
        monkeypatch.setenv(KEY_ENV, key)
    path = tmp_path / "ledger.jsonl"
    s = restored(checkpoint, path)
    s.forget(ForgetRequest.samples([1]), DATA)
    s.forget(ForgetRequest.samples([2, 3]), DATA)
    anchored = path.read_bytes()
    append_forged(path, 1, None if key is None else key.encode())
    assert len(Ledger(path)) == 3  # the chain itself is intact
    message = r"entry 2 forgets sample ids \[2, 3\] that entry 1 of the same run \(lineage [0-9a-f]{32}\) already"
    with pytest.raises(LedgerError, match=message):
        Ledger(path).verify(s.recorder.unlearning_state.ledger_anchor)
    with pytest.raises(LedgerError, match=message):
        Ledger(path).verify()
    refused(s, path, message)
    with pytest.raises(LedgerError, match=message):
        s.accept_ledger("looks fine to me")  # a repeated execution is never accepted
    assert s.recorder.unlearning_state.ledger_overrides == []
    path.write_bytes(anchored)
    append_forged(path, 1, None if key is None else key.encode(), extra={**s.ledger[1].extra, "redo_of": 0})
    with pytest.raises(LedgerError, match="entry 2 says it redoes entry 0, which is not the same request"):
        Ledger(path).verify()
    s.ledger = Ledger(path)  # (the open one read the first copy, and refuses a file rewritten since)
    s.rollback_ledger("entry 2 repeats entry 1")  # the way out: the record is chained and hashed with the key
    assert path.read_bytes().startswith(anchored) and Ledger(path)[2].keyed == (key is not None)
    s.forget(ForgetRequest.samples([30]), DATA)
    assert Ledger(path).verify(s.recorder.unlearning_state.ledger_anchor).count == 4


def test_a_copy_disguised_as_a_redo_is_listed_after_the_anchor_and_refused(checkpoint, tmp_path):
    """A copy of entry 1 marked as its redo is structurally a redo, so verify passes and lists it after the anchor;
    forget refuses it: this state has already forgotten its samples."""
    path = tmp_path / "ledger.jsonl"
    s = restored(checkpoint, path)
    s.forget(ForgetRequest.samples([1]), DATA)
    s.forget(ForgetRequest.samples([2, 3]), DATA)
    append_forged(path, 1, extra={**s.ledger[1].extra, "redo_of": 1})
    report = Ledger(path).verify(s.recorder.unlearning_state.ledger_anchor)
    assert [e.seq for e in report.beyond_anchor] == [2]
    refused(s, path, r"entry 2 \(acu samples\[2\]\(2, 3\), .* forgets sample ids \[2, 3\] this state does not hold")


def test_verify_lists_the_entries_after_the_anchor(checkpoint, tmp_path):
    """A checkpoint taken after the first request anchors one entry; verify against it lists the two written since:
    number, request, lineage and timestamp."""
    path = tmp_path / "ledger.jsonl"
    s = restored(checkpoint, path)
    s.forget(ForgetRequest.samples([1]), DATA)
    anchor = dict(s.recorder.unlearning_state.ledger_anchor)
    s.forget(ForgetRequest.of_class(2), DATA)
    s.forget(ForgetRequest.samples([5, 7]), DATA)
    report = Ledger(path).verify(anchor)
    assert report.count == 3 and report.anchor == anchor
    assert [(e.seq, e.request["kind"], e.lineage) for e in report.beyond_anchor] == [
        (1, "class", s.recorder.unlearning_state.lineage),
        (2, "samples", s.recorder.unlearning_state.lineage),
    ]
    assert [e.timestamp for e in report.beyond_anchor] == [s.ledger[1].timestamp, s.ledger[2].timestamp]
    text = str(report)
    lineage = s.recorder.unlearning_state.lineage
    assert f"after the anchor: entry 1 (acu class=2, lineage {lineage}, {s.ledger[1].timestamp})" in text
    assert "after the anchor: entry 2 (acu samples[2](5, 7)" in text
    assert Ledger(path).verify(s.recorder.unlearning_state.ledger_anchor).beyond_anchor == ()


def test_another_runs_ledger_is_refused_naming_its_lineage_and_the_operator_can_adopt_it(checkpoint, tmp_path, caplog):
    """Run A's ledger given to run B (a recorder restored from B's checkpoint, saved before any request): B's
    first request is refused, naming A's lineage, until the operator adopts the ledger."""
    path = tmp_path / "ledger.jsonl"
    a = restored(checkpoint, path, lineage="a" * 32)
    a.forget(ForgetRequest.samples([1]), DATA)
    a.forget(ForgetRequest.samples([2]), DATA)
    b = restored(checkpoint, path, lineage="b" * 32)
    message = rf"entry 0 \(acu samples\[1\]\(1\), lineage {'a' * 32}, .*\), written after the recorder's anchor "
    refused(b, path, message + rf"\(0 entries\), is another run's \(this recorder's lineage is {'b' * 32}")
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn.ledger"):
        b.accept_ledger("run B continues run A's ledger")
    assert "run B continues run A's ledger" in caplog.text
    b.forget(ForgetRequest.samples([1]), DATA)  # the entries are adopted (run B still holds sample 1)
    assert [e.lineage for e in Ledger(path)] == ["a" * 32, "a" * 32, "b" * 32]


@pytest.mark.parametrize("shared", [False, True])
def test_another_run_writing_after_the_anchor_is_refused_unless_the_ledger_is_shared(checkpoint, tmp_path, shared):
    """Run B's request is anchored; run A then appends to the same file: B's next request is refused naming A's
    lineage, unless B opened the ledger as shared by several runs. Either way a repeat of B's own entry is refused."""
    path = tmp_path / "ledger.jsonl"
    b = restored(checkpoint, path, lineage="b" * 32, shared=shared)
    b.forget(ForgetRequest.samples([5]), DATA)
    restored(checkpoint, path, lineage="a" * 32, shared=True).forget(ForgetRequest.samples([6]), DATA)
    if shared:
        b.forget(ForgetRequest.samples([7]), DATA)
        assert [e.lineage for e in Ledger(path)] == ["b" * 32, "a" * 32, "b" * 32]
        append_forged(path, 2)
        refused(b, path, "entry 3 forgets sample ids \\[7\\] that entry 2 of the same run")
    else:
        refused(b, path, rf"entry 1 \(acu samples\[1\]\(6\), lineage {'a' * 32}, .*\(1 entries\), is another run's")


def test_a_rollback_cuts_after_the_anchor_atomically_and_is_recorded(checkpoint, tmp_path, caplog):
    """rollback_ledger replaces what follows the anchor by one entry recording the cut (numbers, hashes, lineages,
    requests, reason; no removed ids): the anchored bytes are kept as they were, the recorder's anchor moves onto
    the record, the rollback is logged, and requests go on."""
    path = tmp_path / "ledger.jsonl"
    s = restored(checkpoint, path)
    s.forget(ForgetRequest.samples([1]), DATA)
    s.forget(ForgetRequest.samples([2, 3]), DATA)
    anchored = path.read_bytes()
    append_forged(path, 1)
    append_forged(path, 0, extra={"recorder": "c" * 32})
    cut = [LedgerEntry.from_json(line) for line in path.read_text().splitlines()[2:]]
    path.chmod(0o600)  # an audit file readable by its owner only stays so
    before = snapshot(s)
    with pytest.raises(ValueError, match="reason"):
        s.rollback_ledger(" ")
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn.ledger"):
        record = s.rollback_ledger("entries appended by hand on 2026-12-01")
    assert "cutting entries [2, 3]" in caplog.text and "entries appended by hand on 2026-12-01" in caplog.text
    assert path.read_bytes() == anchored + record.to_line() and path.stat().st_mode & 0o777 == 0o600
    assert record.seq == 2 and record.method == ROLLBACK and record.removed_ids == []
    assert record.extra["rolled_back_to"] == {"count": 2, "head": s.ledger[1].hash}
    assert record.extra["reason"] == "entries appended by hand on 2026-12-01"
    assert [(c["seq"], c["hash"], c["lineage"], c["request"]) for c in record.extra["cut"]] == [
        (e.seq, e.hash, e.lineage, e.request) for e in cut
    ]
    assert all("removed_ids" not in c for c in record.extra["cut"])
    assert s.recorder.unlearning_state.ledger_anchor == Ledger(path).anchor() and not list(tmp_path.glob("*.rollback"))
    after = snapshot(s)  # the weights and the statistics are as they were; the anchor is the record's
    after["recorder"].pop("ledger_anchor"), before["recorder"].pop("ledger_anchor")
    assert same(after, before)
    with pytest.raises(ValueError, match="no entry after the anchor of 3 entries"):
        s.rollback_ledger("again")
    s.forget(ForgetRequest.samples([4]), DATA)
    ledger = Ledger(path)
    anchor = s.recorder.unlearning_state.ledger_anchor
    assert [e.seq for e in ledger] == [0, 1, 2, 3] and ledger.verify(anchor).beyond_anchor == ()


def test_a_failed_rollback_leaves_the_ledger_as_it_was_and_a_rollback_is_fsynced_before_it_replaces(
    checkpoint, tmp_path, monkeypatch
):
    """The new file is written whole and fsynced beside the ledger, then renamed over it, then the directory is
    fsynced; a full disk at the write or a failed rename leaves the ledger's bytes, the anchor and the state as they
    were and no file beside it; the retry succeeds."""
    path = tmp_path / "ledger.jsonl"
    s = restored(checkpoint, path)
    s.forget(ForgetRequest.samples([1]), DATA)
    append_forged(path, 0)
    before, on_disk = snapshot(s), path.read_bytes()
    real_write, real_replace, real_fsync = os.write, os.replace, os.fsync

    def disk_full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def rename_fails(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    for name, failing in (("write", disk_full), ("replace", rename_fails)):
        with monkeypatch.context() as m:
            m.setattr(os, name, failing)
            with pytest.raises(OSError):
                s.rollback_ledger("a copy of entry 0")
        assert path.read_bytes() == on_disk and same(snapshot(s), before), name
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl", "ledger.jsonl.lock"], name
    events: list[str] = []

    def fsync(fd: int) -> None:
        events.append("fsync " + ("directory" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def rename(src: Any, dst: Any) -> None:
        events.append("replace")
        real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", fsync)
        m.setattr(os, "replace", rename)
        m.setattr(os, "write", real_write)
        s.rollback_ledger("a copy of entry 0")
    if os.path.isdir("/proc/self/fd"):
        assert events == ["fsync file", "replace", "fsync directory"]
    assert Ledger(path)[-1].method == ROLLBACK and len(Ledger(path)) == 2


def test_a_second_stop_before_a_checkpoint_redoes_the_stopped_request_once(checkpoint, tmp_path):
    """A run stopped after a request, resumed from the checkpoint before it and redone, is stopped again before its
    next checkpoint: resumed once more, the request and its first redo are one pending request, redone once."""
    path = tmp_path / "ledger.jsonl"
    restored(checkpoint, path).forget(ForgetRequest.samples([4, 9]), DATA)  # stopped before its next checkpoint
    (first,) = restored(checkpoint, path).redo_pending(DATA)  # resumed, redone, stopped again
    s = restored(checkpoint, path)
    assert [e.seq for e in s.pending()] == [0] and [e.seq for e in s.check_ledger().beyond_anchor] == [0, 1]
    (second,) = s.redo_pending(DATA)
    assert first.extra["redo_of"] == second.extra["redo_of"] == 0
    ledger = Ledger(path)
    assert [e.extra.get("redo_of") for e in ledger] == [None, 0, 0]
    assert ledger[2].weights_digest == ledger[1].weights_digest == ledger[0].weights_digest  # ACU: exact, bit for bit
    s.forget(ForgetRequest.samples([20]), DATA)


def test_rolling_back_a_stopped_runs_release_keeps_it_counted(tmp_path):
    """SAFE's second release, written by a run stopped before its next checkpoint, rolled back instead of redone:
    the release may have been published, so the accountant restored from the checkpoint (one release) counts it
    too, and the record of the cut keeps it."""
    first, second = requests("safe")
    model, rec = fitted("safe")
    path = tmp_path / "ledger.jsonl"
    stopped = strategy("safe", model, rec, Ledger(path))
    stopped.forget(first, data("safe"))
    save(tmp_path / "run.ckpt", model, rec)
    stopped.forget(second, data("safe"))  # then the process stops
    release = Ledger(path)[1].certificate["accounting"]["release"]
    model, rec = restore("safe", tmp_path / "run.ckpt")
    s = strategy("safe", model, rec, Ledger(path))
    assert s.accountant.history == stopped.accountant.history[:1] and [e.seq for e in s.pending()] == [1]
    record = s.rollback_ledger("the second request was withdrawn")
    assert record.extra["cut"][0]["release"] == release and s.pending() == []
    accountants = rec.unlearning_state.privacy
    assert s.accountant.history == stopped.accountant.history and accountants["safe"] == s.accountant.state_dict()
    assert rec.catalog.live(list(second.sample_ids)) == list(second.sample_ids)  # the request is not executed
