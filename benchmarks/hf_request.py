"""Benchmark: one HF deletion request against its attainable floor ([HF] Alg. 1 line 13, noise, ledger).

One run prints one table: for d in {650, 2M, 11M} trainable parameters (11M is the size of a torchvision
resnet18), R one-sample requests of ``HFUnlearner.forget`` on a ledger file, noise-free and certified
((epsilon, delta) = (1, 1e-5)), each against the floor of the work a request must do, every part timed
alone right after each request (medians):

* raw: the minimal in-place row addition ``w.add_(row)``;
* digest: one digest of the published weights (``core.digest.weights_digest``, what the ledger entry pins);
* append: one fsync'd append of the entry's line (``core.ledger._append_line``: write loop and fsync);
* noise (certified only): d secure normals (``privacy.secure_gaussian``) added to a copy of the weights;

floor = their sum; ``ours / floor`` is the ratio. ``ledger`` is the time our request spent in
``Ledger.append`` (digest, entry, checking what the file gained since under the lock, the fsync'd append).
The recorder is synthetic (random rows, a 2-epoch trajectory of batch 128 over 50,000 samples of which a few
are tracked): a request's cost does not depend on how the rows were recorded. Every part is timed in CPU
seconds of the process (``time.process_time``, one thread: the machine is shared, and its load inflates wall
times several-fold and unevenly), and in wall seconds for the request and the append (whose fsync waits for
the disk, which CPU time does not count); [HF] reports 0.6 ms per request for ResNet-18 on a GPU, noise and
ledger not included.

    python benchmarks/hf_request.py [--requests 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from time import perf_counter, process_time

import lightning as L
import torch
from torch import nn

import lightning_unlearn.core.ledger
from lightning_unlearn import ForgetRequest, Ledger, ReleaseConfig
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.core.digest import weights_digest
from lightning_unlearn.functional import autodiff
from lightning_unlearn.privacy import secure_gaussian
from lightning_unlearn.unlearners import HFUnlearner

warnings.filterwarnings("ignore", message=".*deletion capacity.*")
N, BATCH, EPOCHS, LR, L2, CLASSES = 50_000, 128, 2, 0.01, 0.01, 10
PAPER_MS = 0.6  # [HF] Table 6: per-request unlearning time, ResNet-18 on CIFAR-10 (GPU)


def synthetic(d: int, tracked: int) -> tuple[nn.Module, TrajectoryRecorder]:
    """A linear module with ``d`` weights and a TrajectoryRecorder holding ``tracked`` random rows."""
    g = torch.Generator().manual_seed(0)
    module = nn.Linear(d // CLASSES, CLASSES, bias=False)
    steps = EPOCHS * N // BATCH
    occ_rows = torch.arange(tracked).repeat(EPOCHS)
    occ_steps = torch.randint(0, steps, (tracked * EPOCHS,), generator=g).sort().values
    ids = torch.arange(N)
    state = {
        "catalog": {
            "ids": ids,
            "labels": ids % CLASSES,
            "experiences": torch.zeros(N, dtype=torch.long),
            "forgotten": torch.zeros(N, dtype=torch.bool),
        },
        "A": torch.randn(tracked, d, generator=g) * 1e-3,
        "row_ids": torch.arange(tracked),
        "active": torch.ones(tracked, dtype=torch.bool),
        "lrs": torch.full((steps,), LR, dtype=torch.float64),
        "batch_sizes": torch.full((steps,), BATCH),
        "occ_rows": occ_rows,
        "occ_steps": occ_steps,
        "grad_max": 1.0,
        "smoothness": 1.0,
        "l2": L2,
        "ledger_anchor": None,
        "privacy": None,
    }
    recorder = TrajectoryRecorder()
    recorder.load_state_dict(state)
    return module, recorder


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU, wall) seconds of ``fn()``."""
    cpu, start = process_time(), perf_counter()
    fn()
    return process_time() - cpu, perf_counter() - start


def measure(d: int, requests: int, noise: bool, folder: Path) -> dict[str, float]:
    """Median CPU ms of our request, its ``Ledger.append`` and each part of the floor; ``*_wall``: wall ms."""
    module, recorder = synthetic(d, requests)
    ledger = Ledger(folder / f"ledger-{d}-{noise}.jsonl")
    strategy = HFUnlearner(
        module,
        recorder,
        ledger,
        smoothness=1.0,
        grad_bound=1.0,
        max_deletions=10**9,
        release=ReleaseConfig(noise=noise),
    )
    in_append: list[float] = []
    append = ledger.append

    def timed_append(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = process_time()
        try:
            return append(*args, **kwargs)
        finally:
            in_append.append(process_time() - start)

    ledger.append = timed_append  # type: ignore[method-assign]
    scratch = folder / f"scratch-{d}-{noise}.jsonl"
    w, row = torch.randn(d), torch.randn(d)
    parts: dict[str, list[tuple[float, float]]] = {"ours": [], "raw": [], "digest": [], "append": [], "noise": []}
    for i in range(requests):
        parts["ours"].append(timed(lambda i=i: strategy.forget(ForgetRequest.samples([i]))))
        parts["raw"].append(timed(lambda: w.add_(row)))
        parts["digest"].append(timed(lambda: weights_digest(module)))
        line = ledger[-1].to_line()
        parts["append"].append(timed(lambda line=line: lightning_unlearn.core.ledger._append_line(scratch, line)))
        if noise:
            flat = autodiff.flat_params(module)
            parts["noise"].append(timed(lambda flat=flat: flat + secure_gaussian(flat.shape, flat.dtype)))
    recorder.close()
    out = {k: 1e3 * statistics.median(c for c, _ in v) for k, v in parts.items() if v}
    out.update({f"{k}_wall": 1e3 * statistics.median(w for _, w in v) for k, v in parts.items() if v})
    out["ledger"] = 1e3 * statistics.median(in_append)
    for suffix in ("", "_wall"):
        out["floor" + suffix] = sum(out.get(k + suffix, 0.0) for k in ("raw", "digest", "append", "noise"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)  # both sides on one thread: the machine is shared
    header = (
        f"{'d':>11} {'release':>10} {'ours':>7} {'ledger':>7} | {'raw':>6} {'digest':>7} {'append':>7} "
        f"{'noise':>6} {'floor':>7} | {'ours/floor':>10} {'ours/raw':>8} | {'wall: ours':>10} {'append':>7} "
        f"{'ours/floor':>10} | {'HF paper':>8}"
    )
    print(
        f"HF requests of one sample, median CPU ms (process_time, one thread) over {args.requests} requests; "
        "wall ms at the right"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        measure(650, 2, False, Path(tmp))  # warm-up (imports, first allocations)
        for d in (650, 2_000_000, 11_000_000):
            for noise in (False, True):
                r = measure(d, args.requests, noise, Path(tmp))
                paper = f"{PAPER_MS:.1f}" if d == 11_000_000 else "-"
                print(
                    f"{d:>11,} {'certified' if noise else 'noise-free':>10} {r['ours']:>7.2f} {r['ledger']:>7.2f} | "
                    f"{r['raw']:>6.3f} {r['digest']:>7.2f} {r['append']:>7.2f} {r.get('noise', 0.0):>6.2f} "
                    f"{r['floor']:>7.2f} | {r['ours'] / r['floor']:>10.2f} {r['ours'] / r['raw']:>8.0f} | "
                    f"{r['ours_wall']:>10.2f} {r['append_wall']:>7.2f} {r['ours_wall'] / r['floor_wall']:>10.2f} | "
                    f"{paper:>8}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
