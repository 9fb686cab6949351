"""``lightning-unlearn``: compare unlearning methods on a continual stream from the terminal.

    lightning-unlearn compare --methods acu,hf,hessian,rbm,finetune,neggrad,retrain --requests 5,25
    lightning-unlearn compare --benchmark split-cifar10 --root ~/data --model resnet18 --methods acu,finetune
    lightning-unlearn tradeoff --epsilons 0.1,1,10 --out results/
    lightning-unlearn methods
    lightning-unlearn reproduce acu-table1 --smoke --out results/acu
    lightning-unlearn reproduce safe-table1 --root /data --accelerator gpu --devices 1 --out results/safe

``compare`` learns a class-incremental stream (scikit-learn's digits by default; with
``--benchmark split-cifar10 --root DIR --model resnet18`` a standard benchmark from files on disk,
:mod:`lightning_unlearn.harness.datasets`; never downloaded), executes
K seeded forget requests with every method, and prints the [ACU] Table 1 columns (gaps to
retraining from scratch) and the attack AUCs (MIA-U, offline [LiRA]) next to retraining's, per K;
with ``--out`` it also writes CSVs and a PNG plot. ``tradeoff``
prints the privacy-utility table of the certified methods (test accuracy vs the per-release
epsilon, with the accountant's total epsilon; :mod:`lightning_unlearn.harness.tradeoff`) and with ``--out``
writes ``tradeoff.csv`` and ``tradeoff.png``. ``reproduce`` runs a seed paper's headline table under its
own protocol and prints our numbers next to the paper's (:mod:`lightning_unlearn.harness.papers`);
``--smoke`` runs its CPU smoke scale on the bundled digits, ``--list`` lists the configs.
"""

from __future__ import annotations

import argparse
import ast
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_unlearn.harness.datasets import ACU_BASE_FRACTION, BENCHMARKS, DatasetNotFoundError
from lightning_unlearn.harness.models import MODELS
from lightning_unlearn.harness.registry import available_methods, get_method
from lightning_unlearn.harness.types import BenchmarkInfo
from lightning_unlearn.schedule import make_schedule

#: every registered method, the exact and certified ones first
DEFAULT_METHODS = "acu,hf,hessian,gradient,safe,rbm,salun,retrain,finetune,neggrad,neggrad_plus,randomlabel"

_NOISE = (
    ".*does not have many workers.*",
    ".*no `val_dataloader`.*",
    ".*module\\(s\\) in eval mode.*",
    ".*smaller than the logging interval.*",
    ".*LeafSpec.*",
    ".*`training_step` returns `None`.*",
)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _options(pairs: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``METHOD.KEY=VALUE`` strings as ``{method: {key: value}}`` (values parsed as Python literals)."""
    out: dict[str, dict[str, Any]] = {m: {} for m in methods}
    for pair in pairs:
        target, sep, raw = pair.partition("=")
        method, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise ValueError(f"--option takes METHOD.KEY=VALUE, got {pair!r}")
        if method not in out:
            raise ValueError(f"--option {pair!r} names method {method!r}, which is not among --methods {list(methods)}")
        out[method][key] = _value(raw)
    return out


_WORDS = {"true": True, "false": False, "none": None, "null": None}


def _value(raw: str) -> Any:
    """An option value: ``true``/``false``/``none`` in any case, a Python literal, or the string itself."""
    if raw.strip().lower() in _WORDS:
        return _WORDS[raw.strip().lower()]
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-unlearn", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("methods", help="list the registered methods")
    c = sub.add_parser("compare", help="run the evaluation harness and print the Table 1 gaps")
    c.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated registered names")
    c.add_argument("--requests", type=_ints, default=[5], help="K, the number of forget requests; several: 5,25")
    c.add_argument(
        "--kinds", default="samples", help="request kinds, cycled: samples, class, experience (comma-separated)"
    )
    c.add_argument(
        "--samples-per-request",
        type=int,
        default=None,
        help="size of a sample request (default: a quarter of the learned samples split over the K requests, App. E.1)",
    )
    c.add_argument(
        "--benchmark",
        default="digits",
        choices=("digits", *BENCHMARKS),
        help="the stream: scikit-learn's digits (bundled) or a standard benchmark read from --root",
    )
    c.add_argument(
        "--root", type=Path, default=None, help="folder holding the --benchmark's files (torchvision's formats)"
    )
    c.add_argument(
        "--model", default=None, choices=MODELS, help="backbone of a --benchmark read from --root (default resnet18)"
    )
    c.add_argument(
        "--imagenet-stem", action="store_true", help="resnet18 with torchvision's ImageNet stem, not the CIFAR stem"
    )
    c.add_argument(
        "--per-class", type=int, default=None, help="at most this many training (and test) samples per class of --root"
    )
    c.add_argument(
        "--base-fraction",
        type=float,
        default=ACU_BASE_FRACTION,
        help="share of --root's training samples that pre-trains the backbone (ACU App. E.1: 0.2)",
    )
    c.add_argument(
        "--experiences",
        type=int,
        default=None,
        help="experiences of the stream (default: 5 for digits, the benchmark's usual)",
    )
    c.add_argument("--epochs", type=int, default=5, help="epochs per experience of gradient-trained models")
    c.add_argument(
        "--pretrain-epochs",
        type=int,
        default=None,
        help="epochs to pre-train the frozen backbone on the base split (default: 30 for digits, ACU's 300 for --root)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="METHOD.KEY=VALUE",
        help="a method option, e.g. finetune.epochs=2",
    )
    c.add_argument(
        "--shadows",
        type=int,
        default=4,
        help="shadow models per reference for the offline LiRA AUC (retrains on random halves; 0: no LiRA)",
    )
    c.add_argument("--out", type=Path, default=None, help="directory for CSVs and the PNG plot")
    c.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (default: shown when stderr is a terminal)"
    )
    t = sub.add_parser("tradeoff", help="privacy-utility curve of the certified methods on digits logistic regression")
    t.add_argument(
        "--epsilons", type=_floats, default=[0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0], help="per-release epsilons"
    )
    t.add_argument("--delta", type=float, default=1e-5)
    t.add_argument("--epochs", type=int, default=15, help="SGD epochs of the logistic regression")
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument(
        "--fraction", type=float, default=0.05, help="fraction of the training samples deleted, one per request"
    )
    t.add_argument("--methods", default="hf,hessian,gradient,safe", help="comma-separated: hf, hessian, gradient, safe")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", type=Path, default=None, help="directory for tradeoff.csv and tradeoff.png")
    r = sub.add_parser("reproduce", help="a seed paper's headline table under its protocol, ours next to the paper's")
    r.add_argument("config", nargs="?", default=None, help="a reproduction config: a name (see --list) or a YAML file")
    r.add_argument("--config", dest="config_file", type=Path, default=None, help="a YAML reproduction config file")
    r.add_argument("--list", action="store_true", help="list the reproduction configs")
    r.add_argument("--root", type=Path, default=None, help="directory of the datasets' torchvision-format files")
    r.add_argument("--smoke", action="store_true", help="the CPU smoke scale (digits, a few samples, tiny model)")
    r.add_argument("--setups", default=None, help="comma-separated setup labels to run (default: all)")
    r.add_argument("--accelerator", default=None, help="Lightning accelerator of every fit, e.g. gpu")
    r.add_argument("--devices", type=int, default=None, help="devices per fit (with --accelerator)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, default=None, help="directory for CSVs, PNGs and summary.md")
    r.add_argument("--resume", action="store_true", help="skip the rows --out holds from a run of the same recipe")
    return parser


def reproduce(args: argparse.Namespace) -> str:
    """Run a reproduction config and return its tables (or the list of configs)."""
    from lightning_unlearn.harness.papers import get_config, list_configs
    from lightning_unlearn.harness.repro import is_global_zero, run_config

    if args.config is not None and args.config_file is not None:
        raise ValueError(f"give the config once: {args.config!r} or --config {args.config_file}")
    name = args.config_file or args.config
    if args.list or name is None:
        listing = list_configs()
        print(listing)
        return listing
    if args.devices is not None and args.accelerator is None:
        raise ValueError("--devices needs --accelerator (e.g. --accelerator gpu --devices 2)")
    # one line per request for 20% of the samples deleted one at a time; the guarantee column keeps the verdict
    warnings.filterwarnings("ignore", ".*HF deletion capacity exceeded.*")
    trainer_kwargs = {k: v for k, v in (("accelerator", args.accelerator), ("devices", args.devices)) if v is not None}
    setups = [s.strip() for s in args.setups.split(",")] if args.setups else None
    config = get_config(name)
    result = run_config(
        config,
        root=args.root,
        smoke=args.smoke,
        out=args.out,
        seed=args.seed,
        trainer_kwargs=trainer_kwargs,
        setups=setups,
        resume=args.resume,
    )
    text = "\n\n".join(result.tables)
    if is_global_zero():  # every rank of a multi-device launch runs this command; one prints
        print(text, flush=True)
        print(f"\n{config.name}: {result.seconds:.1f} s" + (f"; wrote {args.out}" if args.out is not None else ""))
    return text


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def tradeoff(args: argparse.Namespace) -> str:
    """Run the privacy-utility benchmark and return the printed table."""
    from lightning_unlearn.harness.tradeoff import format_tradeoff, run_tradeoff, write_tradeoff

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - {"hf", "hessian", "gradient", "safe"})
    if unknown:
        raise ValueError(f"--methods: unknown certified method(s) {unknown}; choose among hf, hessian, gradient, safe")
    if not 0 < args.fraction < 1:
        raise ValueError(f"--fraction must lie in (0, 1), got {args.fraction}")
    rows, setup = run_tradeoff(
        args.epsilons,
        delta=args.delta,
        epochs=args.epochs,
        batch_size=args.batch_size,
        fraction=args.fraction,
        seed=args.seed,
        methods=methods,
        log=lambda _: None,
    )
    table = format_tradeoff(rows)
    print(table, flush=True)
    if args.out is not None:
        print("wrote " + ", ".join(str(p) for p in write_tradeoff(rows, setup.recipe, args.out)))
    return table


def compare(args: argparse.Namespace) -> str:
    """Run the harness for each K and return the printed tables."""
    from lightning_unlearn.harness import evaluate

    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    options = _options(args.option, names)
    methods = [get_method(name, **options[name]) for name in names]
    kinds = tuple(k.strip() for k in args.kinds.split(","))
    if not set(kinds) <= {"samples", "class", "experience"}:
        raise ValueError(f"--kinds takes samples, class and/or experience, got {args.kinds!r}")
    info = _benchmark(args)
    catalog = info.catalog()
    tables = []
    for k in args.requests:
        n = args.samples_per_request or max(1, len(catalog) // (4 * k))
        schedule = make_schedule(catalog, k, kinds=kinds, samples_per_request=n, seed=args.seed)
        report = evaluate(
            methods,
            info,
            schedule,
            out_dir=args.out,
            progress=False if args.no_progress else None,
            shadows=args.shadows,
        )
        tables.append(report.format())
        print("\n" + tables[-1], flush=True)
    if args.out is not None:
        print(f"\nwrote CSVs and plots to {args.out}")
    return "\n\n".join(tables)


def _benchmark(args: argparse.Namespace) -> BenchmarkInfo:
    """The ``--benchmark``: digits, or a standard benchmark read from ``--root``.

    Raises:
        ValueError: ``--root`` missing for a file benchmark, or file-benchmark options given for digits.
    """
    from lightning_unlearn.harness import benchmark_info, digits_benchmark

    if args.benchmark == "digits":
        given = [f for f, v in (("--root", args.root), ("--model", args.model), ("--per-class", args.per_class)) if v]
        if given:
            raise ValueError(f"{', '.join(given)} apply to a --benchmark read from files, not to the bundled digits")
        epochs = 30 if args.pretrain_epochs is None else args.pretrain_epochs
        return digits_benchmark(args.experiences or 5, seed=args.seed, pretrain_epochs=epochs, epochs=args.epochs)
    if args.root is None:
        raise ValueError(f"--benchmark {args.benchmark} reads its files from --root DIR (nothing is downloaded)")
    return benchmark_info(
        args.benchmark,
        args.root,
        model=args.model or "resnet18",
        cifar_stem=not args.imagenet_stem,
        n_experiences=args.experiences,
        seed=args.seed,
        per_class=args.per_class,
        base_fraction=args.base_fraction,
        pretrain={} if args.pretrain_epochs is None else {"epochs": args.pretrain_epochs},
        epochs=args.epochs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "methods":
        print("\n".join(available_methods()))
        return 0
    for noise in _NOISE:
        warnings.filterwarnings("ignore", noise)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    try:
        {"tradeoff": tradeoff, "compare": compare, "reproduce": reproduce}[args.command](args)
    except (ValueError, DatasetNotFoundError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
