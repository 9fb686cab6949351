"""Benchmark: the privacy-utility curve of the certified methods (HF, [CCL] Hessian and gradient, SAFE's noise).

L2-regularised logistic regression on scikit-learn's digits (no download), 5% of the training
samples deleted in single-sample requests, the recipe proposed for (epsilon = 1, delta = 1e-5),
closed-form constants, OS-entropy noise; test accuracy after all requests vs the per-release
epsilon, next to retraining and the noise-free updates, with the accountant's total epsilon and
the MIA-U / offline LiRA AUCs. Writes ``tradeoff.csv`` and ``tradeoff.png`` to the given directory
(default ``benchmarks/results``). Same as ``lightning-unlearn tradeoff --out DIR``.

    python benchmarks/tradeoff.py [OUT_DIR]
"""

from __future__ import annotations

import logging
import sys
import warnings

from lightning_unlearn_bench.tradeoff import format_tradeoff, run_tradeoff, write_tradeoff

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"
    rows, setup = run_tradeoff()
    r = setup.recipe
    print(
        f"\nproposed recipe: lr={r.lr:.4g} l2={r.l2:g}; predicted gamma={r.gamma:.4g} (Taylor term "
        f"{r.taylor_term:.4g}, "
        f"gradient-mismatch term {r.gradient_mismatch_term:.4g}), sigma at epsilon=1: {r.sigma:.4g}"
    )
    print(format_tradeoff(rows))
    print("wrote", *write_tradeoff(rows, setup.recipe, out))
