"""Benchmark: the cost of one HF deletion request against the raw work it needs ([HF] Alg. 1 line 13 + noise).

One run prints one table: for d in {650, 2M, 11M} trainable parameters (11M is the size of a
torchvision resnet18) and request sizes m in {1, 32}, the wall time of ``HFStrategy.forget``
(ours: bound, row addition, noise, certificate, accountant, ledger with its weights digest,
erasing the rows, rollback bookkeeping) against

* raw: the minimal in-place row addition ``w.add_(rows.sum(0))`` on the same rows;
* raw + publish: that addition plus publishing a noised copy ``w + sigma * z`` with ``z`` drawn
  like every certified release here (OS entropy, :func:`lightning_unlearn.privacy.gaussian_noise`);

with the ratios, the HF paper's 0.6 ms per request for ResNet-18 (GPU, noise not included)
as a reference column, and how much of ours is the privacy accountant's PLD total
(dp-accounting). The recorder is synthetic (random rows, a 2-epoch trajectory of batch 128
over 50,000 samples of which a few are tracked): a request's cost does not depend on how the
rows were recorded. Times are medians over a few requests (one at d = 11M, m = 32, to bound
memory), on one thread (the machine is shared; both sides alike).

    python benchmarks/hf_request.py
"""

from __future__ import annotations

import statistics
import warnings
from time import perf_counter

import torch
from torch import nn

from lightning_unlearn import ForgetRequest
from lightning_unlearn.callbacks import TrajectoryRecorder
from lightning_unlearn.privacy import gaussian_noise
from lightning_unlearn.strategies import HFStrategy

warnings.filterwarnings("ignore", message=".*deletion capacity.*")
N, BATCH, EPOCHS, LR, L2, CLASSES = 50_000, 128, 2, 0.01, 0.01, 10
PAPER_MS = 0.6  # [HF] Table 6: per-request unlearning time, ResNet-18 on CIFAR-10 (GPU)
SIZES = (1, 32)


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


def median_ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def measure(d: int, reps: dict[int, int]) -> dict[int, tuple[float, float, float, float]]:
    """``{m: (ours, raw, raw + publish, accounting)}`` in ms (accounting: the PLD total of the releases so far,
    which ours includes)."""
    tracked = sum(m * r for m, r in reps.items())
    module, recorder = synthetic(d, tracked)
    strategy = HFStrategy(module, recorder, smoothness=1.0, grad_bound=1.0, max_deletions=10**9)
    out, next_id = {}, 0
    for m, r in reps.items():
        ours = []
        for _ in range(r):
            ids = list(range(next_id, next_id + m))
            next_id += m
            start = perf_counter()
            strategy.forget(ForgetRequest.samples(ids))
            ours.append(perf_counter() - start)
        start = perf_counter()
        strategy.accountant.totals(strategy.delta)  # type: ignore[union-attr]
        accounting = perf_counter() - start
        rows, w = recorder.A[:m], torch.randn(d)  # erased rows: the same memory traffic as live ones
        raw, publish = [], []
        for _ in range(max(r, 3)):
            start = perf_counter()
            w.add_(rows.sum(0))
            raw.append(perf_counter() - start)
            start = perf_counter()
            w.add_(rows.sum(0))
            published = w + gaussian_noise(w.shape, 0.1, w.dtype, None, 0)
            publish.append(perf_counter() - start)
            del published
        out[m] = (median_ms(ours), median_ms(raw), median_ms(publish), 1e3 * accounting)
    recorder.close()
    return out


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # both sides on one thread: the machine is shared, ratios stay comparable
    measure(650, {1: 2})  # warm-up (imports, first allocations)
    header = (
        f"{'d':>11} {'m':>3} {'ours ms':>9} {'raw ms':>8} {'raw+pub ms':>11} {'ours/raw':>9} {'ours/(raw+pub)':>15} "
        f"{'HF paper ms':>12} {'of ours: PLD acct ms':>21}"
    )
    print(header)
    print("-" * len(header))
    for d, reps in ((650, {1: 9, 32: 5}), (2_000_000, {1: 5, 32: 3}), (11_000_000, {1: 3, 32: 1})):
        for m, (ours, raw, pub, acct) in measure(d, reps).items():
            paper = f"{PAPER_MS:.1f}" if d == 11_000_000 else "-"
            print(
                f"{d:>11,} {m:>3} {ours:>9.2f} {raw:>8.3f} {pub:>11.2f} {ours / raw:>9.1f} {ours / pub:>15.2f} "
                f"{paper:>12} {acct:>21.1f}"
            )


if __name__ == "__main__":
    main()
