"""Faults lose nothing and tampering is caught before a request runs (issue 20).

Each fault is injected into a run restored from a checkpoint taken after a first request, with the second
request hitting the fault; afterwards the module, the recorder's statistics and catalog, the accountant and
the ledger are compared with what they were (a fault before the commit point) or with an uninterrupted run
of the same two requests (after recovery). ACU is exact and deterministic, and SAFE's calibrated release is
seeded (tests/helpers_faults.py), so "equal" means bit for bit.
"""

from __future__ import annotations

import ast
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_faults import (
    METHODS,
    SEEDED,
    data,
    fitted,
    fresh,
    noise_free,
    outcome,
    requests,
    restore,
    same,
    save,
    snapshot,
    strategy,
)
from torch.utils.data import Dataset

import lightning_unlearn
import lightning_unlearn.core.ledger
from lightning_unlearn import Certificate, ForgetRequest, Ledger, ReleaseConfig
from lightning_unlearn.core.digest import LEGACY, digest_matches, weights_digest
from lightning_unlearn.core.ledger import KEY_ENV, LedgerError
from lightning_unlearn.data import IndexedDataset
from lightning_unlearn.unlearners import ErasurePendingError, SAFEUnlearner
from lightning_unlearn.warnings import UnlearningWarning

pytestmark = pytest.mark.filterwarnings(f"ignore:{SEEDED}")  # SAFE's release is seeded on purpose (helpers_faults)
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "faults_child.py"
STAGES = (
    "compute",
    "catalog",
    "statistics",
    "weights",
    "ledger_partial",
    "ledger_written",
    "ledger_synced",
    "erasure",
    "returned",
)
#: stages after which the ledger holds the entry (the page cache survives a SIGKILL): recovered by redo_pending
DURABLE = {"ledger_written", "ledger_synced", "erasure", "returned"}


# -- a checkpoint after a first request, and the uninterrupted run ---------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per method: fitted (checkpoint fitted.ckpt), the first request executed on a file ledger, then a checkpoint
    (run.ckpt, ledger.jsonl)."""
    out = {}
    for method in METHODS:
        run = tmp_path_factory.mktemp(method)
        model, rec = fitted(method)
        save(run / "fitted.ckpt", model, rec)
        strategy(method, model, rec, Ledger(run / "ledger.jsonl")).forget(requests(method)[0], data(method))
        save(run / "run.ckpt", model, rec)
        out[method] = run
    return out


def resumed(method: str, run: Path, where: Path, ledger: str = "ledger.jsonl"):
    """The checkpoint restored, with its own copy of the run's ledger at ``where/ledger.jsonl``."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / "ledger.jsonl"
    shutil.copy(run / ledger, path)
    model, rec = restore(method, run / "run.ckpt")
    return strategy(method, model, rec, Ledger(path)), path


@pytest.fixture(scope="module")
def uninterrupted(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Per method: the outcome and accountant of the second request executed without a fault."""
    out = {}
    for method, run in runs.items():
        s, _ = resumed(method, run, tmp_path_factory.mktemp(f"{method}_ref"))
        s.forget(requests(method)[1], data(method))
        out[method] = {"outcome": outcome(s), "accountant": s.recorder.unlearning_state.privacy}
    return out


def agrees(s, path: Path) -> None:
    """Model, statistics, catalog and ledger agree: the file verifies against the recorder's anchor, the samples
    it records as removed are exactly the catalog's forgotten ones, and its last entry pins the module's weights."""
    ledger = Ledger(path)
    report = ledger.verify(s.recorder.unlearning_state.ledger_anchor)
    assert report.count == len(ledger) and s.recorder.unlearning_state.ledger_anchor["head"] == report.head
    catalog = s.recorder.catalog
    assert ledger.forgotten_ids() == set(catalog.ids[catalog.forgotten].tolist())
    assert digest_matches(s.module, ledger[-1].weights_digest)
    assert s.recorder.unlearning_state.unerased == []


# -- a full disk ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_a_disk_full_at_any_write_or_fsync_changes_nothing_and_the_retry_is_exact(
    method, runs, uninterrupted, tmp_path, monkeypatch
):
    """The disk fills at the k-th ``os.write`` of the entry's line, for every k (writes are short, at most 64 bytes,
    as POSIX allows), and the fsync fails: each time the file, weights, statistics, catalog, accountant and history
    are as before; the retry gives the uninterrupted run's result. (The attempts reuse the first one's computed
    update: computing touches nothing, the faults are in the commit.)"""
    s, path = resumed(method, runs[method], tmp_path)
    second, d = requests(method)[1], data(method)
    before, text = snapshot(s), path.read_bytes()
    compute, computed = s._compute, []

    def computed_once(ids, forget_data):
        if not computed:
            computed.append(compute(ids, forget_data))
        return computed[0]

    monkeypatch.setattr(s, "_compute", computed_once)
    real_write, calls = os.write, [0]

    def full_at(k):
        def write(fd, line):
            calls[0] += 1
            if calls[0] == k:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, bytes(line[:64]))

        return write

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", failing_fsync)
        with pytest.raises(OSError, match="Input/output error"):
            s.forget(second, d)
    assert path.read_bytes() == text and same(snapshot(s), before)
    k = 1
    while True:
        calls[0] = 0
        with monkeypatch.context() as m:
            m.setattr(os, "write", full_at(k))
            try:
                s.forget(second, d)
                break  # the line needed fewer than k writes: written whole, committed
            except OSError as err:
                assert err.errno == errno.ENOSPC
        assert path.read_bytes() == text and same(snapshot(s), before), f"disk full at write {k}"
        k += 1
    assert k > 10  # the entry took more than ten writes, and the disk filled at each of them
    assert same(outcome(s), uninterrupted[method]["outcome"])
    assert s.recorder.unlearning_state.privacy == uninterrupted[method]["accountant"]
    agrees(s, path)


def test_a_failed_directory_fsync_when_the_ledger_is_created_changes_nothing(runs, tmp_path, monkeypatch):
    """A new ledger file is made durable with an fsync of its directory; if that fails, the request is undone."""
    model, rec = restore("acu", runs["acu"] / "fitted.ckpt")  # no request yet: the first one creates the file
    s = strategy("acu", model, rec, Ledger(tmp_path / "new.jsonl"))
    before = snapshot(s)

    def failing(path):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(lightning_unlearn.core.ledger, "_fsync_directory", failing)
        with pytest.raises(OSError, match="Input/output error"):
            s.forget(requests("acu")[1], data("acu"))
    assert same(snapshot(s), before) and (tmp_path / "new.jsonl").read_bytes() == b""
    s.forget(requests("acu")[1], data("acu"))
    agrees(s, tmp_path / "new.jsonl")


def test_a_real_file_size_limit_cuts_the_write_and_the_rollback_holds(runs, uninterrupted, tmp_path):
    """The OS itself refuses the write part-way (RLIMIT_FSIZE: EFBIG after the bytes up to the limit): the
    ledger is truncated back through its descriptor and nothing else changed."""
    resource = pytest.importorskip("resource")
    s, path = resumed("acu", runs["acu"], tmp_path)
    second, d = requests("acu")[1], data("acu")
    before, text = snapshot(s), path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(text) + 100, hard))
        with pytest.raises(OSError) as failure:
            s.forget(second, d)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failure.value.errno == errno.EFBIG
    assert path.read_bytes() == text and same(snapshot(s), before)
    s.forget(second, d)
    assert same(outcome(s), uninterrupted["acu"]["outcome"])
    agrees(s, path)


# -- an interrupt at each commit step ---------------------------------------------------------------------------------
class Interrupting(dict):
    """A change whose ``items()``, on its ``at``-th call, yields the first entry and then a KeyboardInterrupt: Ctrl-C
    part-way through the step that applies it (the earlier calls are the step's checks)."""

    def __init__(self, entries, at: int) -> None:
        super().__init__(entries)
        self.at, self.calls = at, 0

    def items(self):
        self.calls += 1
        entries = iter(super().items())
        if self.calls < self.at:
            yield from entries
            return
        yield next(entries)
        raise KeyboardInterrupt


@pytest.mark.parametrize("step", ["catalog", "statistics", "weights", "state"])
def test_an_interrupt_inside_any_commit_step_undoes_it(step, runs, uninterrupted, tmp_path, monkeypatch):
    """A KeyboardInterrupt right after the catalog marked the ids forgotten (its undo is taken before), or part-way
    through applying the statistics, swapping the weights or replacing the strategy's state: nothing is changed,
    and the retry is not refused as "already forgotten". (Between two steps a real Ctrl-C is held until the
    commit is done: next test.)"""
    s, path = resumed("safe", runs["safe"], tmp_path)
    second, d = requests("safe")[1], data("safe")
    before, text = snapshot(s), path.read_bytes()
    compute, mark = s._compute, s.catalog.mark_forgotten

    def marked_then_interrupted(ids):
        mark(ids)
        raise KeyboardInterrupt

    def interrupted_update(ids, forget_data):
        update = compute(ids, forget_data)
        field, at = {"statistics": ("statistics", 1), "weights": ("weights", 2), "state": ("state", 1)}[step]
        return dataclasses.replace(update, **{field: Interrupting(getattr(update, field), at)})

    with monkeypatch.context() as m:
        if step == "catalog":
            m.setattr(s.catalog, "mark_forgotten", marked_then_interrupted)
        else:
            m.setattr(s, "_compute", interrupted_update)
        with pytest.raises(KeyboardInterrupt):
            s.forget(second, d)
    assert path.read_bytes() == text and same(snapshot(s), before)
    s.forget(second, d)
    assert same(outcome(s), uninterrupted["safe"]["outcome"])
    agrees(s, path)


@pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="needs signal.raise_signal")
def test_ctrl_c_during_the_commit_waits_for_it(runs, uninterrupted, tmp_path, monkeypatch):
    """A real SIGINT arriving while the ledger entry is written is held until the commit is done: the request is
    complete and consistent, then the KeyboardInterrupt is raised."""
    s, path = resumed("acu", runs["acu"], tmp_path)
    append = s.ledger.append

    def append_then_ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return append(*args, **kwargs)

    monkeypatch.setattr(s.ledger, "append", append_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        s.forget(requests("acu")[1], data("acu"))
    assert len(s.history) == 1 and same(outcome(s), uninterrupted["acu"]["outcome"])
    agrees(s, path)


# -- a failure after the commit point ---------------------------------------------------------------------------------
def test_a_failed_erasure_leaves_an_executed_accounted_request_and_is_completed_later(tmp_path, monkeypatch):
    """The memory-mapped store's erasure (msync) fails after the entry is written: the caller learns the request
    was executed (ErasurePendingError with its result); anchor, history and accountant include it; no checkpoint
    can be saved with the forgotten rows; the next request erases them first."""
    from helpers_certified import blobs, fit_hf, sgd_model

    from lightning_unlearn.callbacks import TrajectoryRecorder
    from lightning_unlearn.store import RowStore
    from lightning_unlearn.unlearners import HFUnlearner

    ds = blobs(48, seed=1)
    model, rec = (
        sgd_model(),
        TrajectoryRecorder(dtype=torch.float64, store="mmap", path=tmp_path / "A.bin", capacity=64),
    )
    fit_hf(model, ds, rec, epochs=2)
    path = tmp_path / "ledger.jsonl"
    s = HFUnlearner(model, rec, Ledger(path), release=ReleaseConfig(sigma_override=0.01))
    rows = torch.tensor([rec.row_of[i] for i in (3, 4)])
    assert bool(rec.A[rows].abs().sum() > 0)

    def msync_fails(self):
        raise OSError(errno.EIO, "msync failed")

    with monkeypatch.context() as m:
        m.setattr(RowStore, "flush", msync_fails)
        with pytest.raises(ErasurePendingError, match="executed and recorded") as e:
            s.forget(ForgetRequest.samples([3, 4]))
        assert e.value.result.removed_ids.tolist() == [3, 4] and s.history == [e.value.result]
        assert rec.unlearning_state.ledger_anchor == Ledger(path).anchor() and len(Ledger(path)) == 1
        assert len(s.accountant) == 1 and rec.unlearning_state.privacy["hf"] == s.accountant.state_dict()
        assert rec.catalog.live([3, 4]) == [] and [t.tolist() for t in rec.unlearning_state.unerased] == [[3, 4]]
        with pytest.raises(OSError, match="msync failed"):
            rec.state_dict()  # no checkpoint while the forgotten rows are there
        with pytest.raises(OSError, match="msync failed"):
            s.forget(ForgetRequest.samples([5]))  # the next request erases first; it cannot, so nothing runs
        assert len(Ledger(path)) == 1 and rec.catalog.live([5]) == [5]
    s.forget(ForgetRequest.samples([5]))
    on_disk = torch.frombuffer(bytearray((tmp_path / "A.bin").read_bytes()), dtype=torch.float64)
    on_disk = on_disk.view(64, -1)
    assert bool((on_disk[rows] == 0).all()) and rec.unlearning_state.unerased == []
    agrees(s, path)


# -- a kill at every stage, and a full filesystem, in processes of their own --------------------------------------
def _tmpfs_command(mount: Path) -> list[str] | None:
    """The command prefix that runs a program in a private user and mount namespace with a 1 MiB tmpfs at
    ``mount`` (``unshare``, no privilege needed where the kernel allows user namespaces), or None."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return None
    mount.mkdir()
    unshare = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c"]
    mount_it = 'mount -t tmpfs -o size=1m tmpfs "$1"'
    if subprocess.run([*unshare, mount_it, "sh", str(mount)], capture_output=True, timeout=60).returncode != 0:
        return None
    return [*unshare, mount_it + ' && shift && exec "$@"', "sh", str(mount)]


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    workdir = tmp_path_factory.mktemp("child")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    mount = workdir / "tmpfs"
    prefix = _tmpfs_command(mount)
    command = [sys.executable, str(SCRIPT), str(workdir)]
    if prefix is not None:
        command = [*prefix, *command, "--tmpfs", str(mount)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, json.loads((workdir / "results.json").read_text())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the kills run in forked copies of a process (POSIX)")
@pytest.mark.parametrize("method", METHODS)
def test_a_kill_at_any_stage_of_a_request_is_recovered_on_restart(method, child, tmp_path):
    """SIGKILL at each stage; the restart restores the checkpoint and reopens the ledger, which verifies against
    it. Before the entry is durable the request simply never happened (a torn half line is named, and truncated
    with recover=True) and its retry is exact; after, the restart finds it pending and redo_pending executes it
    again, to the same weights (the entry of the killed run and of the redo pin the same digest), and the
    accountant counts the killed run's release as well as the redo's (whose noise is therefore new: its
    noise-free model is compared)."""
    workdir, results = child
    run = workdir / method
    second, d = requests(method)[1], data(method)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the child: a matmul's rounding depends on how many threads split it
    try:
        _recover_every_stage(method, run, results, second, d, tmp_path)
    finally:
        torch.set_num_threads(threads)


def _recover_every_stage(method, run, results, second, d, tmp_path):
    reference, _ = resumed(method, run, tmp_path / "uninterrupted")  # the child's checkpoint, no fault
    reference.forget(second, d)
    for stage in STAGES:
        assert results["kills"][method][stage], (stage, (run / stage / "error.txt").read_text())
        path = run / stage / "ledger.jsonl"
        if stage == "ledger_partial":
            with pytest.raises(LedgerError, match="torn last line 2"):
                Ledger(path)
            with pytest.warns(UnlearningWarning, match="truncated a torn last line 2"):
                Ledger(path, recover=True)
        model, rec = restore(method, run / "run.ckpt")
        s = strategy(method, model, rec, Ledger(path))
        s.check_ledger()
        if stage in DURABLE:
            assert [e.seq for e in s.pending()] == [1], stage
            (redone,) = s.redo_pending(d)
            ledger = Ledger(path)
            assert redone.extra["redo_of"] == 1 and ledger[1].removed_ids == ledger[2].removed_ids, stage
            if method == "acu":  # exact and deterministic: the killed run published these very weights
                assert ledger[1].weights_digest == ledger[2].weights_digest, stage
        else:
            assert s.pending() == [] and len(Ledger(path)) == 1, stage
            s.forget(second, d)
        got, expected = outcome(s), outcome(reference)
        if method == "safe" and stage in DURABLE:  # the redo is a new release: fresh noise, the same noise-free model
            published = max(float(v.abs().max()) for v in (*got["weights"].values(), *expected["weights"].values()))
            gap = float((noise_free(s) - noise_free(reference)).abs().max())
            assert gap <= 2 * torch.finfo(torch.float64).eps * published, (stage, gap)
            buffers = dict(s.module.named_buffers())
            for run_outcome in (got, expected):
                run_outcome["weights"] = {k: v for k, v in run_outcome["weights"].items() if k in buffers}
                del run_outcome["recorder"]["cumulative_surrogate"]  # the round's risk at w_t: noise included
        assert same(got, expected), stage
        agrees(s, path)
        if method == "safe":
            history = reference.recorder.unlearning_state.privacy["safe"]["history"]
            expected = [*history[:1], *history[1:] * (2 if stage in DURABLE else 1)]
            assert rec.unlearning_state.privacy["safe"]["history"] == expected, stage


def test_a_full_small_filesystem_rolls_back_the_torn_write(child, tmp_path):
    """On a real 1 MiB tmpfs filled up, the entry's write fails part-way with ENOSPC: the ledger and the state are
    as before; with room again, the retry equals an uninterrupted run."""
    workdir, results = child
    if "tmpfs" not in results:
        pytest.skip("no tmpfs: this OS does not let an unprivileged process mount one in a private namespace")
    tmpfs = results["tmpfs"]
    assert tmpfs["statvfs_bytes"] <= 2**20 and tmpfs["errno"] == errno.ENOSPC
    assert tmpfs["ledger_unchanged"] and tmpfs["state_unchanged"]
    from helpers import toy_dataset

    big = toy_dataset(400, id_offset=10**12)
    shutil.copy(workdir / "tmpfs_base.jsonl", tmp_path / "ledger.jsonl")
    model, rec = restore("acu", workdir / "tmpfs.ckpt")
    s = strategy("acu", model, rec, Ledger(tmp_path / "ledger.jsonl"))
    s.forget(ForgetRequest.samples(big.ids[4:304]), big)
    final = torch.load(workdir / "tmpfs_final.pt", weights_only=True)
    assert same(final["weights"], model.state_dict())
    assert same(
        {k: v for k, v in final["recorder"].items() if k != "ledger_anchor"},
        {k: v for k, v in rec.state_dict().items() if k != "ledger_anchor"},
    )
    assert [e.removed_ids for e in Ledger(workdir / "tmpfs_final.jsonl")] == [e.removed_ids for e in s.ledger]


# -- tampering, caught before any request executes --------------------------------------------------------------
def _rehash(entries: list[dict], key: bytes | None = None) -> list[dict]:
    """The chain recomputed after an edit, as a forger would (plain SHA-256, or HMAC with ``key``)."""
    import hmac

    prev = "0" * 64
    for e in entries:
        e["prev_hash"] = prev
        body = json.dumps({k: v for k, v in e.items() if k != "hash"}, sort_keys=True).encode()
        e["hash"] = hmac.new(key, body, hashlib.sha256).hexdigest() if key else hashlib.sha256(body).hexdigest()
        prev = e["hash"]
    return entries


def _write(path: Path, entries: list[dict]) -> None:
    path.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))


@pytest.fixture(scope="module")
def anchored(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ACU run with three requests on its ledger, then a checkpoint anchoring all three."""
    run = tmp_path_factory.mktemp("anchored")
    model, rec = restore("acu", runs["acu"] / "fitted.ckpt")
    s = strategy("acu", model, rec, Ledger(run / "ledger.jsonl"))
    for ids in ([1], [2], [3]):
        s.forget(ForgetRequest.samples(ids), data("acu"))
    save(run / "run.ckpt", model, rec)
    other = tmp_path_factory.mktemp("other")  # another run's ledger: the same model and requests, its own entries
    model, rec = restore("acu", runs["acu"] / "fitted.ckpt")
    rec.unlearning_state.lineage = "another run"
    s = strategy("acu", model, rec, Ledger(other / "ledger.jsonl"))
    for ids in ([1], [2], [3]):
        s.forget(ForgetRequest.samples(ids), data("acu"))
    shutil.copy(other / "ledger.jsonl", run / "other.jsonl")
    return run


def _tamper(path: Path, how: str, run: Path) -> None:
    lines = path.read_text().splitlines()
    if how == "dropped last line":
        path.write_text("".join(line + "\n" for line in lines[:-1]))
    elif how == "emptied":
        path.write_text("")
    elif how == "deleted":
        path.unlink()
    elif how == "middle entry edited, chain rehashed":
        entries = [json.loads(line) for line in lines]
        entries[1]["timestamp"] = "2026-01-01T00:00:00+00:00"  # backdated (removed ids another entry forgot would
        # repeat an execution, which is never accepted: tests/test_misuse_ledger.py)
        _write(path, _rehash(entries))
    elif how == "another run's ledger":
        shutil.copy(run / "other.jsonl", path)


TAMPERING = {
    "dropped last line": "has 2 entries but the checkpoint anchors 3: truncated or replaced",
    "emptied": "has 0 entries but the checkpoint anchors 3",
    "deleted": "has 0 entries but the checkpoint anchors 3",
    "middle entry edited, chain rehashed": "entry 2 differs from the checkpoint's anchor",
    "another run's ledger": "entry 2 differs from the checkpoint's anchor",
}


@pytest.mark.parametrize("how", TAMPERING)
@pytest.mark.parametrize("when", ["before opening", "while open"])
def test_a_tampered_ledger_is_refused_before_anything_runs_and_an_operator_can_override(
    how, when, anchored, tmp_path, caplog
):
    s, path = None, tmp_path / "ledger.jsonl"
    shutil.copy(anchored / "ledger.jsonl", path)
    if when == "before opening":
        _tamper(path, how, anchored)
    model, rec = restore("acu", anchored / "run.ckpt")
    s = strategy("acu", model, rec, Ledger(path))
    if when == "while open":
        report = s.check_ledger()
        anchor = rec.unlearning_state.ledger_anchor
        assert report.count == 3 and report.head == anchor["head"] and report.anchor == anchor
        _tamper(path, how, anchored)
    before = snapshot(s)
    on_disk = path.read_bytes() if path.exists() else None
    message = TAMPERING[how] if when == "before opening" else "no longer holds the 3 entries"
    with pytest.raises(LedgerError, match=message):
        s.forget(ForgetRequest.samples([10]), data("acu"))
    with pytest.raises(LedgerError, match=message):
        s.redo_pending(data("acu"))
    assert same(snapshot(s), before) and (path.read_bytes() if path.exists() else None) == on_disk
    # the operator knows why (say, the file was restored from an older backup) and says so
    s.ledger = Ledger(path)
    with pytest.raises(ValueError, match="reason"):
        s.accept_ledger(" ")
    with caplog.at_level(logging.WARNING, logger="lightning_unlearn.ledger"):
        s.accept_ledger("restored from the 2026-11-20 backup")
    assert "restored from the 2026-11-20 backup" in caplog.text
    assert rec.unlearning_state.ledger_overrides[-1]["replaced_anchor"]["count"] == 3
    assert rec.state_dict()["ledger_overrides"][-1]["reason"] == "restored from the 2026-11-20 backup"
    s.forget(ForgetRequest.samples([10]), data("acu"))
    assert Ledger(path).verify(rec.unlearning_state.ledger_anchor).count == rec.unlearning_state.ledger_anchor["count"]


def test_a_keyed_ledger_cannot_be_downgraded(runs, tmp_path, monkeypatch):
    """Relabelled ``keyed: false`` and rehashed with plain SHA-256, a keyed ledger is refused while the key is set
    (the key's presence decides the hash, not the file); opened without the key, its keyed entries say the key is
    needed, and a downgraded copy that opens without the key fails against the checkpoint's (keyed) anchor."""
    monkeypatch.setenv(KEY_ENV, "auditor-secret")
    model, rec = restore("acu", runs["acu"] / "fitted.ckpt")
    path = tmp_path / "ledger.jsonl"
    s = strategy("acu", model, rec, Ledger(path))
    s.forget(ForgetRequest.samples([1]), data("acu"))
    s.forget(ForgetRequest.samples([2]), data("acu"))
    assert rec.unlearning_state.ledger_anchor["keyed"] and s.check_ledger().keyed
    original = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(e["keyed"] for e in original) and "auditor-secret" not in path.read_text()
    downgraded = _rehash([{**e, "keyed": False} for e in original])
    _write(path, downgraded)
    with pytest.raises(LedgerError, match="entry 0 is not HMAC-keyed although .* is set: a downgraded ledger"):
        Ledger(path)
    with pytest.raises(LedgerError, match="entry 0 is not HMAC-keyed"):
        s.forget(ForgetRequest.samples([3]), data("acu"))
    _write(path, _rehash([{**e, "removed_ids": [7]} if e["seq"] == 1 else dict(e) for e in original], b"guessed key"))
    with pytest.raises(LedgerError, match="corrupt at entry 0"):
        Ledger(path)
    monkeypatch.delenv(KEY_ENV)
    _write(path, original)
    with pytest.raises(LedgerError, match=r"entry 0 is keyed \(HMAC\): set"):
        Ledger(path)
    _write(path, downgraded)
    with pytest.raises(LedgerError, match="made with an HMAC-keyed chain"):
        Ledger(path).verify(rec.unlearning_state.ledger_anchor)


def test_legacy_xxh3_digests_are_read_compared_and_reported(runs, anchored, tmp_path):
    """Entries written before BLAKE3 (a bare XXH3-128 digest) still verify and replay; the report counts them."""
    path = tmp_path / "ledger.jsonl"
    model, rec = restore("acu", anchored / "run.ckpt")
    assert weights_digest(model).startswith("blake3:") and digest_matches(model, weights_digest(model, LEGACY))
    entries = [json.loads(line) for line in (anchored / "ledger.jsonl").read_text().splitlines()]
    entries[-1]["weights_digest"] = weights_digest(model, LEGACY)  # the weights after the third request
    _write(path, _rehash(entries))
    report = Ledger(path).verify()
    assert report.legacy_digests == 1 and "1 entries with XXH3-128 weights digests" in str(report)
    audit_model, audit_rec = restore("acu", runs["acu"] / "fitted.ckpt")
    checks = Ledger(path).replay(strategy("acu", audit_model, audit_rec, Ledger()), data("acu"))
    assert [ok for _, ok in checks] == [True, True, True]


def test_a_store_checkpoint_digest_is_blake3_and_old_xxh3_references_still_attach(tmp_path):
    from lightning_unlearn.store import RowStore, StoreError

    store = RowStore.create(tmp_path / "s.bin", 8, 5, torch.float64)
    store.data[:6] = torch.arange(30.0, dtype=torch.float64).view(6, 5)
    reference = store.state_dict(6)
    legacy = {**reference, "digest": store.digest(6, legacy=True)}
    assert reference["digest"].startswith("blake3:") and len(legacy["digest"]) == 32
    store.close()
    for ref in (reference, legacy):
        RowStore.attach(ref).close()
    with open(tmp_path / "s.bin", "r+b") as fh:  # one byte of row 2 changed after the checkpoint
        fh.seek(2 * 5 * 8)
        fh.write(b"\x01")
    for ref in (reference, legacy):
        with pytest.raises(StoreError, match="digest mismatch"):
            RowStore.attach(ref)


# -- bad state and bad input -----------------------------------------------------------------------------------------
def test_a_checkpoint_whose_catalog_repeats_an_id_is_refused(runs):
    state = torch.load(runs["acu"] / "run.ckpt", weights_only=True)["recorder"]
    catalog = state["catalog"]
    ids = catalog["ids"].clone()
    ids[ids == 30] = 33  # id 30's row now claims to be sample 33
    model, rec = fresh("acu")
    with pytest.raises(ValueError, match=r"names sample ids more than once: \[33\]"):
        rec.catalog.load_state_dict({**catalog, "ids": ids})
    assert len(rec.catalog) == 0  # refused before anything was loaded
    with pytest.raises(ValueError, match="more than once"):
        rec.load_state_dict({**state, "catalog": {**catalog, "ids": ids}})
    kept = catalog["forgotten"].clone()
    kept[5] = True  # marked forgotten, its fingerprint still there
    with pytest.raises(ValueError, match="keeps the fingerprints of forgotten sample ids"):
        rec.catalog.load_state_dict({**catalog, "forgotten": kept})
    with pytest.raises(ValueError, match="different lengths"):
        rec.catalog.load_state_dict({**catalog, "labels": catalog["labels"][:-1]})
    with pytest.raises(ValueError, match="1-d integer"):
        rec.catalog.load_state_dict({**catalog, "labels": catalog["labels"].double()})


def test_huge_and_numpy_integers_in_requests(runs, uninterrupted, tmp_path):
    for make in (ForgetRequest.of_class, ForgetRequest.of_experience):
        with pytest.raises(ValueError, match="must fit in 64 bits"):
            make(2**70)
        for bad in (-1, True, np.bool_(True), 2.0, "2", torch.tensor([2]), np.int64(-3)):
            with pytest.raises(ValueError, match="non-negative int"):
                make(bad)
    with pytest.raises(ValueError, match="must fit in 64 bits"):
        ForgetRequest.samples([1, 2**70])
    with pytest.raises(ValueError, match="must fit in 64 bits"):
        ForgetRequest.samples(np.array([2**64 - 1], dtype=np.uint64))
    assert ForgetRequest.of_class(np.int64(2)) == ForgetRequest.of_class(2) == ForgetRequest.of_class(torch.tensor(2))
    assert (
        ForgetRequest.of_experience(np.uint8(0)).target == 0 and type(ForgetRequest.of_class(np.int32(2)).target) is int
    )
    direct = ForgetRequest("samples", (np.int64(4), 5))
    assert direct.sample_ids == (4, 5) and all(type(i) is int for i in direct.sample_ids)
    assert ForgetRequest.from_dict(json.loads(json.dumps(direct.to_dict()))) == direct
    s, _ = resumed("acu", runs["acu"], tmp_path)
    s.forget(ForgetRequest.of_class(np.int64(2)), data("acu"))  # the run's second request, given as a numpy int
    assert same(outcome(s), uninterrupted["acu"]["outcome"])


# -- reading only the rows to forget ---------------------------------------------------------------------------------
class Guarded(Dataset):
    """A dataset that counts its reads and refuses every row outside ``allowed`` once that is set."""

    def __init__(self, base: Dataset) -> None:
        self.base, self.allowed, self.reads = base, None, []

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        if self.allowed is not None and i not in self.allowed:
            raise AssertionError(f"row {i} of a retained sample was read")
        self.reads.append(i)
        return self.base[i]


def test_safe_reads_only_the_rows_it_forgets_from_the_full_training_set(runs, tmp_path):
    s, _ = resumed("safe", runs["safe"], tmp_path)
    rows = Guarded(data("safe").dataset)
    full = IndexedDataset(rows)  # the whole training set (ids = row numbers), as a user passes it
    first, second = requests("safe")
    rows.allowed = set(first.sample_ids) | set(second.sample_ids)  # this round's and the earlier round's (Eq. (25))
    rows.reads = []
    s.forget(second, full)
    assert sorted(rows.reads) == sorted(rows.allowed)
    assert isinstance(s, SAFEUnlearner) and s.forget_scope == "all"


# -- labels and the house ---------------------------------------------------------------------------------------
def test_noise_is_never_labelled_none(runs, tmp_path):
    ij = Certificate(method="ij", exact=False, epsilon=1.0, delta=1e-5, sigma=3.1e11, constants="estimated")
    assert not ij.certified and ij.guarantee == "uncertified-noise(sigma=3.1e+11)"
    assert "NOT certified (estimated constants), sigma=3.1e+11" in str(ij)
    fixed = Certificate(method="hf", exact=False, sigma=0.5, accounting={})
    assert fixed.guarantee == "uncertified-noise(sigma=0.5)" and "uncertified noise, sigma=0.5" in str(fixed)
    assert Certificate(method="finetune", exact=False).guarantee == "none"
    with pytest.raises(ValueError, match="sigma"):
        Certificate(method="x", exact=False, sigma=-1.0)
    model, rec = restore("safe", runs["safe"] / "run.ckpt")
    result = SAFEUnlearner(
        model, rec, release=ReleaseConfig(epsilon=None, delta=None, sigma_override=0.05, seed=1)
    ).forget(requests("safe")[1], data("safe"))
    assert result.certificate.sigma == 0.05 and result.certificate.guarantee == "uncertified-noise(sigma=0.05)"
    from lightning_unlearn_bench.loop import _guarantee

    assert _guarantee(result.certificate) == "uncertified-noise(sigma=0.05)"


def test_no_module_needs_fcntl_and_the_lock_is_a_declared_dependency():
    """``import lightning_unlearn`` works where ``fcntl`` does not exist (Windows): no module imports it."""
    package = Path(lightning_unlearn.__file__).parent
    importers = []
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if "fcntl" in names:
                importers.append(str(source.relative_to(package)))
    assert importers == []
    assert any(d.startswith("filelock") for d in _dependencies())


def _dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_undoing_runs_the_undos_newest_first_when_a_step_fails():
    from types import SimpleNamespace

    from lightning_unlearn.core.undo import replace_attributes, undoing

    box, seen = SimpleNamespace(a=1, b=2), []
    with pytest.raises(RuntimeError, match="the third step"):
        with undoing() as undo:
            undo.append(replace_attributes(box, {"a": 10, "b": 20}))
            undo.append(lambda: seen.append(box.a))  # undone first: the attributes are still replaced
            raise RuntimeError("the third step")
    assert seen == [10] and (box.a, box.b) == (1, 2)
