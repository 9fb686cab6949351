"""Faults that need a process of their own, run by tests/test_faults.py.

Usage: python faults_child.py WORKDIR [--tmpfs MOUNTPOINT]

1. A kill at every stage of a request: for each method of tests/helpers_faults.py, fit, execute the first
   request on a file ledger and save a checkpoint (WORKDIR/<method>/run.ckpt, ledger.jsonl); then, for each
   stage, fork a copy of this process that executes the second request on its own copy of the ledger
   (WORKDIR/<method>/<stage>/ledger.jsonl) and SIGKILLs itself at that stage. The test restores the checkpoint,
   reopens the stage's ledger and recovers. Forking after ``torch.set_num_threads(1)`` (and with OMP/MKL at one
   thread, set by the test) copies a process without a thread pool.
2. With --tmpfs (the test mounts a small tmpfs in a private mount namespace): a ledger on a full filesystem.
   The ledger's first entry is written, the filesystem is filled, the second request (an entry longer than a
   page, so it cannot fit in the last page's slack) fails with ENOSPC, and what is left is checked against
   what was there; the filler is removed and the request retried. Results go to WORKDIR/tmpfs.json.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
import traceback
import warnings
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import fit_analytic, toy_dataset  # noqa: E402
from helpers_faults import METHODS, SEEDED, data, fitted, requests, same, save, snapshot, strategy  # noqa: E402

import lightning_unlearn.unlearners.base as base  # noqa: E402
from lightning_unlearn import ACUUnlearner, ForgetRequest, Ledger  # noqa: E402

warnings.filterwarnings("ignore", message=SEEDED)  # the SAFE run's release is seeded on purpose
STAGES = (
    "compute",  # the update computed, nothing changed
    "catalog",  # the ids marked forgotten
    "statistics",  # the recorder's statistics changed
    "weights",  # the module's weights swapped
    "ledger_partial",  # half the entry's line written
    "ledger_written",  # the whole line written, not fsynced
    "ledger_synced",  # the entry durable: the commit point
    "erasure",  # the derived state updated, the erasure running
    "returned",  # forget returned, no checkpoint saved since
)


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(stage: str, s: base.Unlearner) -> None:
    """Make this process kill itself when the request reaches ``stage``."""
    if stage == "compute":
        compute = s._compute
        s._compute = lambda ids, d: (compute(ids, d), kill())[0]
    elif stage == "catalog":
        mark = s.catalog.mark_forgotten
        s.catalog.mark_forgotten = lambda ids: (mark(ids), kill())[0]
    elif stage == "statistics":
        apply = s.recorder.apply_forget
        s.recorder.apply_forget = lambda ids, change: (apply(ids, change), kill())[0]
    elif stage == "weights":
        swap = base.swap_weights
        base.swap_weights = lambda module, weights: (swap(module, weights), kill())[0]
    elif stage == "ledger_partial":
        write = os.write
        os.write = lambda fd, line: (write(fd, bytes(line[: len(line) // 2])), kill())[0]
    elif stage == "ledger_written":
        os.fsync = lambda fd: kill()
    elif stage == "ledger_synced":
        fsync = os.fsync
        os.fsync = lambda fd: (fsync(fd), kill())[0]
    elif stage == "erasure":
        s.recorder.erase_forgotten = lambda ids: kill()


def kills(workdir: Path) -> dict[str, dict[str, bool]]:
    out: dict[str, dict[str, bool]] = {}
    for method in METHODS:
        run = workdir / method
        run.mkdir()
        model, rec = fitted(method)
        first, second = requests(method)
        d = data(method)
        strategy(method, model, rec, Ledger(run / "ledger.jsonl")).forget(first, d)
        save(run / "run.ckpt", model, rec)
        out[method] = {}
        for stage in STAGES:
            (run / stage).mkdir()
            shutil.copy(run / "ledger.jsonl", run / stage / "ledger.jsonl")
            pid = os.fork()
            if pid == 0:
                try:
                    s = strategy(method, model, rec, Ledger(run / stage / "ledger.jsonl"))
                    arm(stage, s)
                    s.forget(second, d)
                    if stage == "returned":
                        kill()
                except BaseException:
                    (run / stage / "error.txt").write_text(traceback.format_exc())
                finally:
                    os._exit(3)  # reached only if the stage never came
            _, status = os.waitpid(pid, 0)
            out[method][stage] = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return out


def full_tmpfs(workdir: Path, mount: Path) -> dict[str, object]:
    big = toy_dataset(400, id_offset=10**12)  # 13-digit ids: 300 of them make an entry of about 9 kB
    ids = big.ids.tolist()
    model, rec = fit_analytic([big])
    path = mount / "ledger.jsonl"
    s = ACUUnlearner(model, rec, Ledger(path))
    s.forget(ForgetRequest.samples(ids[:4]), big)
    save(workdir / "tmpfs.ckpt", model, rec)
    shutil.copy(path, workdir / "tmpfs_base.jsonl")
    before, text = snapshot(s), path.read_bytes()
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)
    second = ForgetRequest.samples(ids[4:304])
    try:
        s.forget(second, big)
        failure = None
    except OSError as err:
        failure = err.errno
    result = {
        "statvfs_bytes": os.statvfs(mount).f_blocks * os.statvfs(mount).f_frsize,
        "errno": failure,
        "ledger_unchanged": path.read_bytes() == text,
        "state_unchanged": same(snapshot(s), before),
    }
    os.unlink(mount / "filler")
    s.forget(second, big)
    torch.save({"weights": model.state_dict(), "recorder": rec.state_dict()}, workdir / "tmpfs_final.pt")
    shutil.copy(path, workdir / "tmpfs_final.jsonl")
    return result


def main() -> None:
    workdir = Path(sys.argv[1])
    results: dict[str, object] = {"kills": kills(workdir)}
    if "--tmpfs" in sys.argv:
        results["tmpfs"] = full_tmpfs(workdir, Path(sys.argv[sys.argv.index("--tmpfs") + 1]))
    (workdir / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
