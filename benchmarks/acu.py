"""ACU request vs retraining the ridge head from the retained features (issue 2 benchmark).

For d_F in {512, 2048}, N = 50,000 retained samples and request sizes k in {1, 100, 1000}:
the wall time of one ACU forget step (eq. 5 + eq. 6), the wall time of the retrain reference
(R = F^T F and Q = F^T Y over the retained features, then the ridge solve of eq. 8), their ratio,
and the relative parameter gap ||W_acu - W_retrain|| / ||W_retrain||.

Both sides start from features already extracted (the frozen backbone's forward pass is the same
per sample for both, and retraining would need it for all N retained samples, ACU for k).
Synthetic Gaussian features, float64, 100 classes.

    python benchmarks/acu.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from lightning_unlearn.functional import acu


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=50_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    n_classes, ridge = 100, 1.0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, N={args.n} retained, float64, best of {args.repeats}")
    header = f"{'d_F':>6} {'k':>6} {'ACU request (s)':>16} {'retrain (s)':>12} {'speed-up':>9} {'rel. gap W':>11}"
    print(header)
    print("-" * len(header))
    for d in (512, 2048):
        for k in (1, 100, 1000):
            F = torch.relu(torch.randn(args.n + k, d, dtype=torch.float64))
            Y = acu.one_hot(torch.randint(0, n_classes, (args.n + k,)), n_classes)
            T, W = acu.ridge_solution(F.T @ F, F.T @ Y, ridge)  # the learned model, before the request
            Ff, Yf, Fr, Yr = F[:k], Y[:k], F[k:], Y[k:]
            t_acu, (_, W_acu) = timed(lambda: acu.forget(T, W, Ff, Yf), args.repeats)
            t_ref, (_, W_ref) = timed(lambda: acu.ridge_solution(Fr.T @ Fr, Fr.T @ Yr, ridge), args.repeats)
            gap = float((W_acu - W_ref).norm() / W_ref.norm())
            print(f"{d:>6} {k:>6} {t_acu:>16.4f} {t_ref:>12.4f} {t_ref / t_acu:>8.1f}x {gap:>11.2e}")
            del F, Y, T, W


if __name__ == "__main__":
    main()
