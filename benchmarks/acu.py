"""ACU request vs a minimal in-place Woodbury update vs retraining the ridge head (issue 11 benchmark).

For each width ``d_F``, one model learns ``N`` samples; then ``reps`` consecutive requests of
``k`` samples each (for each ``k``; at ``d_F = 2048`` then one large request) are timed (best of
``reps``, the machine being shared) along three paths:

* ``ours``: what :class:`~lightning_unlearn.ACUUnlearner` does once it has the features, on a real
  :class:`~lightning_unlearn.AnalyticRecorder`: the cost model's path (``forget_factors`` + the
  commit ``apply_forget`` + applying the held rank-``k`` update to ``T``, or the re-solve), so the
  deferred in-place update is paid inside the timed request;
* ``in-place``: the minimal reference, ``F T``, the ``k x k`` Cholesky and two triangular solves, and
  ``T.addmm_`` / ``W +=`` on separate copies (no symmetrising copy, no new ``d_F x d_F`` tensor);
* ``retrain``: ``R = F^T F``, ``Q = F^T Y`` over the retained features and the ridge solve (eq. 8), once.

``R catch-up`` is the deferred cost the Woodbury path leaves for later: subtracting the request's
rows from ``R`` (done lazily, in blocks of up to ``d_F`` rows, when ``R`` is next needed).
``gap`` is ``||W_ours - W_retrain|| / ||W_retrain||`` after all requests at that width (the same
for its rows). Features are synthetic standard Gaussian, float64, 100 classes; feature extraction
is left out (the same per sample for every path). ``--crossover`` times both exact paths over ``k`` to calibrate the
cost model.

    python benchmarks/acu.py [--reps 7] [--crossover]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from lightning_unlearn import AnalyticRecorder
from lightning_unlearn.functional import acu

N_CLASSES, RIDGE = 100, 1.0


def seconds(fn: Callable[..., object], *args: object) -> float:
    """CPU seconds of ``fn(*args)`` (one thread: the machine is shared, and wall time counts other jobs)."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def recorder_for(F: torch.Tensor, Y: torch.Tensor, labels: torch.Tensor) -> AnalyticRecorder:
    """An AnalyticRecorder holding the statistics of ``(F, Y)`` as if it had learned them."""
    rec = AnalyticRecorder(ridge=RIDGE, fingerprint=False)
    R, Q = F.T @ F, F.T @ Y
    T, W = acu.ridge_solution(R, Q, RIDGE)
    rec.R, rec.Q, rec.T, rec.W = R, Q, T, W
    n = len(F)
    rec.catalog.add(torch.arange(n), labels, 0, torch.zeros(n, dtype=torch.long))
    return rec


def our_request(rec: AnalyticRecorder, ids: torch.Tensor, F: torch.Tensor, Y: torch.Tensor) -> None:
    """ACUUnlearner's math and commit for features ``F`` (``ACUUnlearner._compute``), then ``T`` brought up to date."""
    d_F, d_C = rec.W.shape
    if acu.woodbury_is_cheaper(d_F, d_C, len(F)):
        FT, S, W = acu.forget_factors(rec.T, rec.W, F, Y)
        change = {"tracking_update": (FT, S), "forgotten_rows": F, "forgotten_targets": Y, "W": W}
    else:
        R, Q, T, W = acu.resolve(rec.R, rec.Q, F, Y, rec.ridge)
        change = {"R": R, "Q": Q, "T": T, "W": W}
    rec.catalog.mark_forgotten(ids)
    rec.apply_forget(ids, change)
    rec.T  # noqa: B018  (the held rank-k update is applied here, inside the timing)


def inplace_reference(T: torch.Tensor, W: torch.Tensor, F: torch.Tensor, Y: torch.Tensor) -> None:
    """The minimal in-place rank-k Woodbury update of ``T`` and ``W`` (eq. 5, eq. 6)."""
    FT = F @ T
    K = torch.eye(len(F), dtype=T.dtype) - FT @ F.T
    L = torch.linalg.cholesky(K)
    S = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, FT, upper=False), upper=True)
    W.add_(S.T @ (F @ W - Y))
    T.addmm_(FT.T, S)


def rows_for(d: int, n: int, ks: tuple[int, ...], reps: int, big: int = 0) -> list[dict[str, object]]:
    """One learned model of ``n`` samples at width ``d``; ``reps`` requests of each ``k``, then one of ``big``."""
    g = torch.Generator().manual_seed(d)
    F = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    Y = acu.one_hot(labels, N_CLASSES)
    rec = recorder_for(F, Y, labels)
    T_ref, W_ref = rec.T.clone(), rec.W.clone()
    R_copy = rec.R.clone()
    out, start = [], 0
    for k, r in [*((k, reps) for k in ks), *([(big, 1)] if big else [])]:
        ours, ref, catch_up = [], [], []
        for _ in range(r):
            ids = torch.arange(start, start + k)
            start += k
            Fk, Yk = F[ids], Y[ids]
            ours.append(seconds(our_request, rec, ids, Fk, Yk))
            ref.append(seconds(inplace_reference, T_ref, W_ref, Fk, Yk))
            catch_up.append(seconds(R_copy.addmm_, Fk.T, Fk))  # (adds instead of subtracting: same cost)
        path = "woodbury" if acu.woodbury_is_cheaper(d, N_CLASSES, k) else "re-solve"
        times = {"ours": min(ours), "ref": min(ref), "catch_up": min(catch_up)}
        out.append({"d": d, "n": n, "k": k, "path": path, **times})
    del T_ref, W_ref, R_copy
    keep = torch.arange(start, n)
    t0 = time.process_time()
    Fr, Yr = F[keep], Y[keep]
    _, W_retrain = acu.ridge_solution(Fr.T @ Fr, Fr.T @ Yr, RIDGE)
    t_retrain = time.process_time() - t0
    gap = float((rec.W - W_retrain).norm() / W_retrain.norm())
    for r in out:
        r["retrain"], r["gap"] = t_retrain, gap
    return out


def crossover(d: int, n: int) -> None:
    """Time both exact paths for growing ``k`` (to calibrate ``acu.RESOLVE_SLOWDOWN``)."""
    g = torch.Generator().manual_seed(1)
    print(f"\ncrossover at d_F={d}: seconds per request; model ratio = woodbury_flops / resolve_flops")
    print(f"{'k':>6} {'woodbury':>9} {'re-solve':>9} {'measured w/r':>13} {'flops w/r':>10}")
    for k in (d // 4, d // 2, d, 2 * d):
        F = torch.relu(torch.randn(n + k, d, generator=g, dtype=torch.float64))
        Y = acu.one_hot(torch.randint(0, N_CLASSES, (n + k,), generator=g), N_CLASSES)
        R, Q = F.T @ F, F.T @ Y
        T, W = acu.ridge_solution(R, Q, RIDGE)
        t_w = seconds(inplace_reference, T.clone(), W.clone(), F[:k], Y[:k])
        t_r = seconds(acu.resolve, R, Q, F[:k], Y[:k], RIDGE)
        model = acu.woodbury_flops(d, k) / acu.resolve_flops(d, N_CLASSES)
        print(f"{k:>6} {t_w:>9.3f} {t_r:>9.3f} {t_w / t_r:>13.2f} {model:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--crossover", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, CPU seconds of one thread, float64, {N_CLASSES} classes, "
        f"best of {args.reps} requests (retrain: once)"
    )
    header = (
        f"{'d_F':>5} {'N':>6} {'k':>5} {'path':>8} {'ours (s)':>9} {'in-place (s)':>12} {'retrain (s)':>11} "
        f"{'ours/in-place':>13} {'retrain/ours':>12} {'R catch-up (s)':>14} {'gap W':>8}"
    )
    print(header)
    print("-" * len(header))
    # d_F = 8192 learns N = 16,384 samples, not 50,000 (F^T F alone would take ~20 minutes on 2 shared cores);
    # N = d_F would be the interpolation regime, where forgetting a sample (leverage ~1) is ill-conditioned
    rows = rows_for(2048, 50_000, (1, 100), args.reps, big=9_785) + rows_for(8192, 16_384, (1, 100), args.reps)
    for r in rows:
        print(
            f"{r['d']:>5} {r['n']:>6} {r['k']:>5} {r['path']:>8} {r['ours']:>9.4f} {r['ref']:>12.4f} "
            f"{r['retrain']:>11.2f} {r['ours'] / r['ref']:>12.2f}x {r['retrain'] / r['ours']:>11.0f}x "
            f"{r['catch_up']:>14.4f} {r['gap']:>8.1e}",
            flush=True,
        )
    if args.crossover:
        crossover(2048, 8192)


if __name__ == "__main__":
    main()
