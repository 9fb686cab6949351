"""End-to-end demo: learn 5 class-incremental experiences with an analytic head, forget between them.

Real data, no download: scikit-learn's handwritten digits. A small MLP is pre-trained on a
disjoint "base" split and frozen (as in ACU); the ACU head then learns the stream with a
Lightning Trainer per experience while an AnalyticRecorder keeps its statistics. Between
experiences, three forget requests run (a few samples, one class, one whole experience), and
each is checked against a model retrained from scratch on the retained data.

    python examples/continual_unlearning.py [--out outputs/acu_demo]
"""

from __future__ import annotations

import argparse
import warnings
from datetime import datetime
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_unlearn import ACUUnlearner, AnalyticClassifier, AnalyticRecorder, ForgetRequest, IndexedDataset, Ledger
from lightning_unlearn.avalanche import benchmark_with_sample_ids, fit_stream
from lightning_unlearn.metrics import evaluate_unlearning, log_metrics
from lightning_unlearn.models import SupervisedClassifier, mlp_backbone
from lightning_unlearn.progress import progress_bar, quiet_lightning
from lightning_unlearn_bench.digits import digits_splits

# Lightning 2.6.6 (the newest) builds torch's deprecated LeafSpec in every fit, and torch warns about it: nothing
# a user of either can change, so this one FutureWarning is dropped; every other warning is shown.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
RIDGE, EXPANSION, N_EXPERIENCES = 1.0, 512, 5


def pretrain_backbone(x, y) -> torch.nn.Module:
    """Pre-train an MLP on the base split; its hidden layers become the frozen backbone."""
    L.seed_everything(0, verbose=False)
    backbone = mlp_backbone(64, 128, 64)
    net = torch.nn.Sequential(backbone, torch.nn.Linear(64, 10))
    # progress_bar(): Lightning's bar on a terminal, one line at the end of the fit in a pipe or a file
    trainer = L.Trainer(
        max_epochs=30, logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[progress_bar()]
    )
    trainer.fit(SupervisedClassifier(net, lr=0.1), DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))
    return backbone


def retrain_from_scratch(backbone, train: IndexedDataset, keep_ids: torch.Tensor) -> AnalyticClassifier:
    """The gold standard: a fresh analytic head fitted on the retained samples only."""
    reference = AnalyticClassifier(backbone, 64, 10, expansion_dim=EXPANSION)
    with quiet_lightning():  # the demo's own check after every step: no Lightning banner each time
        L.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[AnalyticRecorder(RIDGE)],
        ).fit(reference, DataLoader(Subset(train, keep_ids.tolist()), batch_size=256))
    return reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("outputs") / f"acu_demo-{datetime.now():%Y%m%d-%H%M%S}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    splits = digits_splits()
    print("1/3 pre-training the backbone on the base split (then frozen)")
    backbone = pretrain_backbone(*splits["base"])

    (x, y), (xt, yt) = splits["train"], splits["test"]
    bm = benchmark_with_sample_ids(TensorDataset(x, y), TensorDataset(xt, yt), N_EXPERIENCES, seed=0)
    train, test = IndexedDataset(TensorDataset(x, y)), IndexedDataset(TensorDataset(xt, yt))
    order = [c for experience in bm.train_stream for c in sorted(experience.classes_in_this_experience)]
    print(f"2/3 learning {N_EXPERIENCES} experiences of 2 classes each, class order {order}")

    model = AnalyticClassifier(backbone, 64, 10, expansion_dim=EXPANSION)
    recorder = AnalyticRecorder(RIDGE)
    strategy = ACUUnlearner(model, recorder, Ledger(args.out / "ledger.jsonl"))
    first_exp_ids = torch.nonzero(torch.isin(y, torch.tensor(order[:2]))).flatten()
    schedule = {
        1: [ForgetRequest.samples(first_exp_ids[:8])],  # a user asks to delete 8 records
        2: [ForgetRequest.of_class(order[2])],  # a whole class is withdrawn
        3: [ForgetRequest.of_experience(0)],  # a whole experience (task) is withdrawn
    }
    logger = CSVLogger(args.out, name="metrics")
    rows: list[dict[str, float | str]] = []

    def report(experience, trainer, results) -> None:
        seen = torch.tensor(sorted(experience.classes_seen_so_far))
        test_seen = Subset(test, torch.nonzero(torch.isin(yt, seen)).flatten().tolist())
        for result in results or [None]:
            cat = recorder.catalog
            retain, forget = Subset(train, cat.active_ids().tolist()), Subset(train, cat.ids[cat.forgotten].tolist())
            reference = retrain_from_scratch(backbone, train, cat.active_ids())
            m = evaluate_unlearning(
                model, retain=retain, forget=forget, test=test_seen, num_classes=10, reference=reference
            )
            label = f"after exp {experience.current_experience}" + (f": forget {result.request}" if result else "")
            label = label if len(label) <= 43 else label[:40] + "..."
            m["time_s"] = result.wall_time_s if result else float("nan")
            rows.append({"step": label, **m})
            log_metrics(trainer, m)  # at the trainer's next step, after the experience's training and requests

    fit_stream(
        model,
        bm.train_stream,
        callbacks=[recorder],  # progress as progress_bar() shows it (fit_stream's default)
        unlearning=strategy,
        requests=schedule,
        trainer_kwargs={"logger": logger, "log_every_n_steps": 1},  # 3 batches per experience: log each step
        batch_size=64,
        after_experience=report,
    )

    print("\n3/3 results (gaps are to a model retrained from scratch on the retained data)\n")
    cols = [
        "retain_acc",
        "forget_acc",
        "test_acc",
        "mia",
        "l2_to_retrain",
        "retain_acc_gap",
        "forget_acc_gap",
        "test_acc_gap",
        "mia_gap",
        "time_s",
    ]
    print(f"{'step':<44}" + "".join(f"{c:>15}" for c in cols))
    for r in rows:
        print(f"{r['step']:<44}" + "".join(f"{r.get(c, float('nan')):>15.4g}" for c in cols))
    for entry in strategy.ledger:
        print(
            f"ledger #{entry.seq} {entry.timestamp} {entry.method} removed {len(entry.removed_ids)} ids: {entry.cert}"
        )
    plot(rows, args.out / "accuracies.png")
    print(
        f"\nwrote {args.out / 'accuracies.png'}, {args.out / 'ledger.jsonl'} and metrics CSV under "
        f"{args.out / 'metrics'}"
    )


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    steps = range(len(rows))
    for key, style in (("retain_acc", "o-"), ("forget_acc", "s-"), ("test_acc", "^-")):
        ax.plot(steps, [r[key] for r in rows], style, label=key.replace("_", " "))
    ax.set_xticks(list(steps), [str(r["step"]).replace(": ", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("ACU on digits: accuracies over the learn/forget sequence")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
