"""Do the training-based methods forget with their defaults? Forget accuracy next to retraining's (issue 9).

The harness of ``benchmarks/compare.py`` (digits, 5 class-incremental experiences, frozen MLP
backbone) with class requests: after each request the accuracy on every forgotten sample of a
method's model is compared with the accuracy of a model retrained from scratch on the retained
data (for a forgotten class, about 0%). Every method runs with its defaults (no options), on the
analytic family (ACU's protocol) and on the supervised family (a LightningModule trained by its
own SGD, so the methods use its own ``training_step`` and optimizer).

    python benchmarks/forgetting_defaults.py [--families analytic,supervised] [--k 2]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

from lightning_unlearn.schedule import make_schedule
from lightning_unlearn_bench import digits_benchmark, evaluate, format_table, get_method

METHODS = ("finetune", "neggrad", "neggrad_plus", "randomlabel", "rbm", "salun")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="analytic,supervised")
    parser.add_argument("--k", type=int, default=2, help="class requests per run")
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    info = digits_benchmark()
    schedule = make_schedule(info.catalog(), args.k, kinds=("class",), seed=0)
    body = []
    for family in args.families.split(","):
        start = time.perf_counter()
        report = evaluate([get_method(m, family=family) for m in args.methods.split(",")], info, schedule)
        ref = report.reference_rows
        for m in report.methods():
            rows = report.table(m)
            body.append(
                [
                    m,
                    family,
                    *(f"{100 * r['forget_acc']:.1f} / {100 * q['forget_acc']:.1f}" for r, q in zip(rows, ref)),
                    f"{100 * sum(r['retain_acc'] for r in rows) / len(rows):.1f}",
                    f"{100 * sum(q['retain_acc'] for q in ref) / len(ref):.1f}",
                ]
            )
        print(f"[{family}: {time.perf_counter() - start:.0f} s]")
    head = [
        "method",
        "family",
        *(f"forget acc % req {i + 1} (method / retrain)" for i in range(args.k)),
        "retain acc %",
        "retrain's",
    ]
    print(format_table(head, body, title=f"Class requests {[str(r) for r in schedule]}, defaults"))


if __name__ == "__main__":
    main()
