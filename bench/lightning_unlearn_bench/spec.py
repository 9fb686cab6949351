"""What a registered method is: :class:`MethodSpec`, an unlearner class on the harness's model families.

A :class:`MethodSpec` names a :class:`~lightning_unlearn.unlearners.base.Unlearner`
class and the model families it runs on. Its options are the class constructor's keyword-only
parameters (followed through ``**kwargs`` to its base classes; a ``release`` parameter also by the fields of its
:class:`~lightning_unlearn.privacy.ReleaseConfig`, which :meth:`MethodSpec.release_options` makes one
``release=``), plus ``family`` and the family's settings (:mod:`lightning_unlearn_bench.families`) and the
recorder's options it declares; an unknown option is a ``ValueError`` listing the valid ones. The names are
:mod:`lightning_unlearn_bench.registry`'s.

The harness sets ``ledger``, ``seed`` and ``generator`` itself (runs are reproducible from the
benchmark's seed), and a ``train=`` dataset (the stream's training set) when the class takes one.

Each spec describes itself for ``lightning-unlearn methods``: :meth:`MethodSpec.option_list` (every option's
type hint, default and destination, read from the signatures), :meth:`MethodSpec.needs` (read from the
strategy class) and the ``guarantee``, ``assumptions`` and ``cost`` of its class's registry entry.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.base import Unlearner
from lightning_unlearn.unlearners.baselines import RetrainUnlearner
from lightning_unlearn_bench.families import (
    FAMILIES,
    SETTINGS,
    build_model,
    family_settings,
    reference,
)
from lightning_unlearn_bench.types import BenchmarkInfo, Built, Method

#: constructor arguments the harness sets (from the benchmark's seed, its own ledger): never options
HARNESS_ARGUMENTS = frozenset({"ledger", "seed", "generator"})


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: an unlearner class on a model family.

    Args:
        name: the registry name (what the strategy's certificates name as their method).
        strategy: the :class:`Unlearner` class; its keyword-only constructor parameters
            are the method's options.
        families: the model families it runs on, its default first.
        recorder: ``recorder(info, **recorder_options)`` makes its recorder; ``None``: the family's.
        recorder_options: the options handed to ``recorder``, with their defaults.
        fixed: strategy options fixed by the name (e.g. ``salun`` is :class:`RBMUnlearner` with
            ``masking="forget"``); they are not options. Default: the class's registry entry's.
        managed: keyword-only parameters set from the family's recipe rather than by the user.
        label: the method's name for a set of strategy options (default: ``name``); a family
            other than the default is appended as ``name[family]``.
        settings: the method's own defaults of its family's settings (e.g. [CR]'s loss perturbation).
        context: ``context(info, module, settings) -> (arguments, callbacks)``: constructor
            arguments the harness computes for the strategy (their names must be in ``managed``,
            e.g. closed-form constants of the family's model) and further callbacks that learn
            the stream with the recorder (e.g. a check the strategy reads).
        module_recorder: ``module_recorder(**module_recorder_options)`` makes its recorder on a module of the
            user's (:mod:`~lightning_unlearn_bench.own`, where no model family applies) when that recorder
            learns part of the module itself (ACU's head), so that retraining refits with a fresh one; ``None``:
            ``recorder``, else a :class:`SampleRecorder`.
        module_recorder_options: the options handed to ``module_recorder``, with their defaults.
        guarantee: what a request's certificate promises, citing the theorem (one line).
        assumptions: what the guarantee (or the method) rests on (one line).
        cost: the cost of a request, and of recording (one line).
        paper: the reference key(s) of ``docs/references.md``.

    ``fixed``, ``guarantee``, ``assumptions``, ``cost`` and ``paper`` left out are the strategy class's registry
    entry for ``name`` (:class:`~lightning_unlearn.unlearners.base.MethodInfo`, declared beside the class), so a
    built-in spec never repeats them.
    """

    name: str
    strategy: type[Unlearner]
    families: tuple[str, ...] = FAMILIES
    recorder: Callable[..., RecorderCallback] | None = None
    recorder_options: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    managed: frozenset[str] = frozenset()
    label: Callable[[Mapping[str, Any]], str] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    context: Callable[[BenchmarkInfo, Any, Mapping[str, Any]], tuple[dict[str, Any], list[Any]]] | None = None
    module_recorder: Callable[..., RecorderCallback] | None = None
    module_recorder_options: Mapping[str, Any] = field(default_factory=dict)
    guarantee: str = ""
    assumptions: str = ""
    cost: str = ""
    paper: str = ""

    def __post_init__(self) -> None:
        declared = self.strategy.registry_entries().get(self.name)
        if declared is not None:
            for name in ("fixed", "guarantee", "assumptions", "cost", "paper"):
                if not getattr(self, name):
                    object.__setattr__(self, name, getattr(declared, name))
        if not self.guarantee:
            object.__setattr__(self, "guarantee", "none")

    def strategy_options(self) -> set[str]:
        """The strategy class's keyword-only parameters the user may set (``release`` too, as one object)."""
        release = {"release"} if default_release(self.strategy) is not None else set()
        return release | keyword_options(self.strategy) - HARNESS_ARGUMENTS - self.managed - set(self.fixed)

    def release_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` with the release's fields among them (``epsilon``, ``noise``, ...) made one ``release=``
        (:class:`~lightning_unlearn.privacy.ReleaseConfig`; a field not given keeps the strategy's
        ``default_release``), for a strategy that takes one; else ``options`` as they are.

        Raises:
            ValueError: both ``release`` and some of its fields, or a bad field (named by the config).
        """
        fields = {k: v for k, v in options.items() if k in RELEASE_FIELDS}
        default = default_release(self.strategy)
        if not fields or default is None:
            return dict(options)
        if "release" in options:
            raise ValueError(f"method {self.name!r}: give release= or its fields {sorted(fields)}, not both")
        rest = {k: v for k, v in options.items() if k not in fields}
        return {**rest, "release": dataclasses.replace(default, **fields)}

    def options(self) -> set[str]:
        """Every option :func:`get_method` accepts for this method."""
        family = {"family"} if len(self.families) > 1 else set()
        settings = {k for f in self.families for k in SETTINGS[f]}
        return family | settings | set(self.recorder_options) | self.strategy_options()

    def option_list(self) -> list[Option]:
        """Every option of :meth:`options` with its type hint and default: the strategy's (in its signature's
        order), the recorder's, then ``family`` and the families' settings."""
        strategy = keyword_parameters(self.strategy)
        out = [
            Option(name, hint, param.default, f"strategy {self.strategy.__name__}")
            for name, (param, hint) in strategy.items()
            if name in self.strategy_options()
        ]
        hints = typing.get_type_hints(self.recorder) if self.recorder is not None else {}
        out += [Option(k, hints.get(k, Any), v, "recorder") for k, v in self.recorder_options.items()]
        if len(self.families) > 1:
            out.append(Option("family", typing.Literal[self.families], self.families[0], "model family"))
        for name in dict.fromkeys(k for f in self.families for k in SETTINGS[f]):
            owners = [f for f in self.families if name in SETTINGS[f]]
            default = self.settings.get(name, SETTINGS[owners[0]][name])
            kind = type(default) if default is not None else float | None  # the families' settings are numbers
            out.append(Option(name, kind, default, "setting of family " + "/".join(owners)))
        return out

    def needs(self) -> str:
        """What ``forget`` reads besides the recorded statistics, from the strategy class: the retained data (its
        constructor takes ``train``), the samples to forget (``needs_forget_data``; optional if it only
        ``reads_data``)."""
        parts = ["retained data"] if "train" in inspect.signature(self.strategy.__init__).parameters else []
        if self.strategy.needs_forget_data:
            parts.append("the samples to forget")
        elif self.strategy.reads_data:
            parts.append("the samples to forget (optional)")
        return " + ".join(parts) or "nothing"

    def method(self, **options: Any) -> Method:
        """The :class:`Method` for these options.

        Raises:
            ValueError: an unknown option (listing the valid ones), family or family setting, or a bad release.
        """
        unknown = sorted(set(options) - self.options())
        if unknown:
            raise ValueError(
                f"method {self.name!r} ({self.strategy.__name__}) takes no option(s) {unknown}; "
                f"its options: {sorted(self.options())}"
            )
        options = self.release_options(options)
        family = options.pop("family", self.families[0])
        if family not in self.families:
            raise ValueError(
                f"unknown model family {family!r} for method {self.name!r}; it runs on {list(self.families)}"
            )
        settings = {**self.settings, **{k: options.pop(k) for k in list(options) if k in _all_settings()}}
        family_settings(family, settings)  # a setting of another family is an error
        gold = reference(family, **settings)
        if self.strategy is RetrainUnlearner:
            return gold
        recorder_options = {
            **self.recorder_options,
            **{k: options.pop(k) for k in list(options) if k in self.recorder_options},
        }
        name = self.label(options) if self.label is not None else self.name
        name = name if family == self.families[0] else f"{name}[{family}]"
        spec = self

        def build(info: BenchmarkInfo) -> Built:
            model = build_model(info, family, settings)
            recorder = spec.recorder(info, **recorder_options) if spec.recorder is not None else model.recorder()
            arguments, callbacks = (
                spec.context(info, model.module, family_settings(family, settings))
                if spec.context is not None
                else ({}, [])
            )
            if {"smoothness", "grad_bound", "strong_convexity", "lipschitz"} & set(options):
                arguments.pop("constants", None)  # constants the user gives replace the closed-form ones
            unmanaged = sorted(set(arguments) - spec.managed)
            if unmanaged:
                raise ValueError(f"method {spec.name!r}: context arguments {unmanaged} are not declared as managed")
            return Built(
                model.module,
                [recorder, *callbacks],
                lambda: spec.make_strategy(model.module, recorder, info, {**arguments, **options}),
                model.trainer_kwargs,
                model.batch_size,
            )

        return Method(name, build, reference=gold, family=family)

    def unlearner(self, module: Any, recorder: RecorderCallback, **options: Any) -> Unlearner:
        """The strategy on a ``module`` and ``recorder`` the caller trained itself, where no model family builds
        them: ``options`` are the strategy's constructor parameters after those two (``ledger``, ``train``, the
        ``managed`` ones, which the caller computes, the keyword-only ones followed through ``**kwargs``) and its
        release's fields (made one ``release=``); the name's ``fixed`` options are set.

        Raises:
            ValueError: an option the strategy does not take, or one the name fixes (listing the valid ones), or a
                bad release.
        """
        after = list(inspect.signature(self.strategy.__init__).parameters.values())[3:]  # self, module, recorder
        named = {p.name for p in after if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        valid = (named | keyword_options(self.strategy) | self.strategy_options()) - set(self.fixed)
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(
                f"method {self.name!r} ({self.strategy.__name__}) takes no option(s) {unknown} on a module of "
                f"yours; its options: {sorted(valid)}"
            )
        return self.strategy(module, recorder, **self.fixed, **self.release_options(options))

    def make_strategy(
        self,
        module: Any,
        recorder: RecorderCallback,
        info: BenchmarkInfo,
        options: Mapping[str, Any],
    ) -> Any:
        """The strategy on ``module`` and ``recorder`` with ``options``, given the harness's arguments: the stream's
        training set as ``train``, ``info.seed`` as ``seed`` (unless it seeds certified noise) and ``generator``."""
        own = inspect.signature(self.strategy.__init__).parameters
        chained = keyword_options(self.strategy)
        given: dict[str, Any] = {}
        if "train" in own:
            given["train"] = info.train
        if "seed" in chained and not self.strategy.certified_noise:
            given["seed"] = info.seed  # certified noise is never seeded: it comes from the OS entropy source
        if "generator" in chained:
            given["generator"] = torch.Generator().manual_seed(info.seed)  # seeded: a report is reproducible
        return self.strategy(module, recorder, **given, **self.fixed, **options)


@dataclass(frozen=True)
class Option:
    """An option of a registered method: ``name``, its type hint (``annotation``), ``default``, and ``target``:
    where it goes (the strategy class's keyword, the recorder, the model family or a family's setting)."""

    name: str
    annotation: Any
    default: Any
    target: str

    def type_text(self) -> str:
        """The type hint without module paths, e.g. ``float | tuple[float, float] | None``."""
        text = self.annotation.__name__ if isinstance(self.annotation, type) else str(self.annotation)
        return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", text)


def default_release(cls: type) -> ReleaseConfig | None:
    """The class's ``default_release`` if it publishes through a :class:`~lightning_unlearn.privacy.ReleaseConfig`
    (its constructor's ``release=``), else ``None``."""
    release = getattr(cls, "default_release", None)
    return release if isinstance(release, ReleaseConfig) else None


#: the :class:`~lightning_unlearn.privacy.ReleaseConfig` fields, each an option of a method that takes a release
RELEASE_FIELDS = tuple(f.name for f in dataclasses.fields(ReleaseConfig))


def release_parameters(release: ReleaseConfig) -> dict[str, tuple[inspect.Parameter, Any]]:
    """The :class:`~lightning_unlearn.privacy.ReleaseConfig` fields as keyword-only parameters with their type hints,
    defaulted by ``release`` (a class's ``default_release``); a field it sets is typed without ``None``
    (``epsilon: float`` where the default has one, ``float | None`` for SAFE's uncertified default)."""
    hints = typing.get_type_hints(ReleaseConfig)
    out = {}
    for name in RELEASE_FIELDS:
        default, hint = getattr(release, name), hints[name]
        if default is not None and type(None) in typing.get_args(hint):
            hint = functools.reduce(operator.or_, [a for a in typing.get_args(hint) if a is not type(None)])
        out[name] = (inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default), hint)
    return out


def keyword_parameters(cls: type) -> dict[str, tuple[inspect.Parameter, Any]]:
    """Keyword-only parameters of a class's constructor and their resolved type hints, following ``**kwargs`` up
    to its base classes (the first class declaring a name wins); a ``release`` parameter counts as the fields of
    its :class:`~lightning_unlearn.privacy.ReleaseConfig` (:func:`release_parameters`).

    A base class's keyword-only parameter without a default is one its subclass supplies (e.g.
    the trained baselines' ``default_lr``), so it is not counted.
    """
    out: dict[str, tuple[inspect.Parameter, Any]] = {}
    derived, release = True, default_release(cls)
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        init = vars(klass)["__init__"]
        params = inspect.signature(init).parameters.values()
        hints = typing.get_type_hints(init)  # resolved: the modules annotate lazily
        for p in params:
            if p.name == "release" and release is not None:
                for name, entry in release_parameters(release).items():
                    out.setdefault(name, entry)
            elif p.kind is inspect.Parameter.KEYWORD_ONLY and (derived or p.default is not inspect.Parameter.empty):
                out.setdefault(p.name, (p, hints.get(p.name, p.annotation)))
        derived = False
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return out


def keyword_options(cls: type) -> set[str]:
    """The names of :func:`keyword_parameters`."""
    return set(keyword_parameters(cls))


def _all_settings() -> set[str]:
    return {k for s in SETTINGS.values() for k in s}
