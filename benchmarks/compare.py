"""Every registered method through one continual-unlearning protocol, next to ACU's Table 1 (issue 4 benchmark).

Real data, no download: scikit-learn's handwritten digits (``lightning_unlearn_bench.digits``), an MLP
backbone pre-trained on the disjoint base split and frozen, then a class-incremental stream of
5 experiences (2 classes each). As in ACU App. E.1, a quarter of the learned samples is split
into K = 5 or K = 25 disjoint forget requests (seeded), executed one after another. Gaps are to
retraining from scratch on the retained data, averaged over the requests; accuracies in
percentage points, MIA as a fraction. Three groups of comparable methods:

* analytic (ACU's protocol, Section 4.1: every method starts from the same model learned on the
  stream): the frozen backbone + ACU's ridge head; ACU, and the baselines, RBM and SalUn updating
  the head with their defaults; the reference is a fresh analytic fit on the retained data.
* supervised: backbone + linear layer, all trainable, learned by SGD (5 epochs per experience,
  naive fine-tuning, so earlier classes are largely forgotten); SAFE, RBM, SalUn and the
  baselines update the whole network; the reference replays that recipe on the retained data.
* certified: the frozen backbone + a linear layer (L2-regularised logistic regression, the convex
  setting of the certificates): HF on the ``linear`` family (SGD), [CCL]'s Hessian and gradient
  methods on the ``proximal`` family ([CCL]'s regulariser, each task solved by full-batch L-BFGS),
  each certified at (1, 1e-5) and without noise (what the update itself achieves); the references
  replay each recipe on the retained data.

The paper's numbers are CIFAR-10 with a ResNet backbone, so only the ordering of the methods
is comparable, not the magnitudes.

    python benchmarks/compare.py [--out outputs/compare] [--methods acu,finetune,...]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from lightning_unlearn.schedule import make_schedule
from lightning_unlearn_bench import Report, available_methods, digits_benchmark, evaluate, format_table, get_method

for noise in (
    ".*does not have many workers.*",
    ".*configure_optimizers.*returned `None`.*",
    ".*module\\(s\\) in eval mode.*",
    ".*smaller than the logging interval.*",
    ".*no `val_dataloader`.*",
    ".*LeafSpec.*",
):
    warnings.filterwarnings("ignore", noise)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

#: ACU paper Table 1, CIFAR-10: (K=5, K=25) for dParams, dRetain, dForget, dTest, dMIA
PAPER = {
    "finetune": ((33.65, 35.45), (6.61, 6.09), (1.03, 4.19), (2.26, 4.20), (0.02, 0.04)),
    "randomlabel": ((27.45, 26.75), (2.21, 3.26), (0.92, 2.47), (2.40, 3.89), (0.01, 0.03)),
    "neggrad_plus": ((28.63, 55.50), (13.21, 82.32), (9.73, 71.85), (11.51, 70.91), (0.09, 0.07)),
    "neggrad": ((28.30, 28.31), (6.06, 24.85), (1.57, 14.82), (6.55, 20.20), (0.02, 0.15)),
    "acu": ((0.0, 0.0),) * 5,
}
_BASELINES = ("rbm", "salun", "finetune", "neggrad", "neggrad_plus", "randomlabel")
#: (registered name, options) per group of comparable methods
GROUPS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "analytic": [("acu", {})] + [(n, {}) for n in _BASELINES],
    "supervised": [("safe", {})] + [(n, {"family": "supervised"}) for n in _BASELINES],
    "certified": [(n, noise) for n in ("hf", "ccl_hessian", "ccl_gradient") for noise in ({}, {"noise": False})],
}
COLUMNS = ("l2_to_retrain", "retain_gap_pp", "forget_gap_pp", "test_gap_pp", "mia_gap")
HEADS = ("dParams", "dRetain", "dForget", "dTest", "dMIA")


def side_by_side(reports: dict[int, Report]) -> str:
    """One row per method: each Table 1 column for K=5 and K=25 as ``ours (paper)``."""
    ks = sorted(reports)
    head = ["method", *(f"{h} K={k}" for h in HEADS for k in ks)]
    body = []
    for method in reports[ks[0]].methods():
        cells = [method]
        for c, col in enumerate(COLUMNS):
            for j, k in enumerate(ks):
                ours = reports[k].summary()[method][col]
                paper = PAPER.get(method.split("[")[0], ((None, None),) * 5)[c][j] if k in (5, 25) else None
                cells.append(f"{ours:.2f} ({paper:.2f})" if paper is not None else f"{ours:.2f} (-)")
        body.append(cells)
    return format_table(head, body, title="ours on digits (paper, CIFAR-10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs") / "compare")
    parser.add_argument(
        "--methods",
        default=",".join(available_methods()),
        help="registered names to run (in every group they belong to)",
    )
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"method groups to run, of {', '.join(GROUPS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; the models are tiny, and one thread keeps times stable when other "
        "processes share the cores",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    info = digits_benchmark(5, seed=args.seed)
    catalog = info.catalog()
    print(f"digits: {len(catalog)} learned samples in 5 experiences, {len(info.test)} test samples")
    wanted = set(args.methods.split(","))
    for group in args.groups.split(","):
        methods = [get_method(name, **options) for name, options in GROUPS[group] if name in wanted]
        if not methods:
            continue
        print(f"\n== {group}: {', '.join(m.name for m in methods)}")
        reports = {}
        for k in (5, 25):
            schedule = make_schedule(
                catalog, k, kinds=("samples",), samples_per_request=len(catalog) // (4 * k), seed=args.seed
            )
            reports[k] = evaluate(methods, info, schedule, out_dir=args.out / group, progress=True)
            print("\n" + reports[k].format() + "\n", flush=True)
        print(side_by_side(reports))
    print(f"\nwrote CSVs and plots to {args.out}; total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
