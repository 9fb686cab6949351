"""Method registry: the names the CLI and the harness know, each a :class:`~lightning_unlearn_bench.spec.MethodSpec`.

The built-in methods are :data:`~lightning_unlearn_bench.methods.BUILTIN`; adding a method is one spec::

    register(MethodSpec("mine", MyUnlearner, families=("supervised",), recorder=lambda info: MyRecorder()))
    get_method("mine", epsilon=0.5)  # MyUnlearner(module, recorder, epsilon=0.5) on the family's model

and :func:`unlearner` makes a registered strategy on a module and recorder of the caller's own (no model family).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.core.keys import RETIRED_KEYS
from lightning_unlearn.unlearners.base import Unlearner
from lightning_unlearn_bench.methods import BUILTIN
from lightning_unlearn_bench.spec import MethodSpec
from lightning_unlearn_bench.types import BenchmarkInfo, Built, Method

__all__ = [
    "MethodSpec",
    "available_methods",
    "get_method",
    "method_spec",
    "register",
    "trainer_options",
    "unlearner",
    "with_trainer",
]

_SPECS: dict[str, MethodSpec] = {spec.name: spec for spec in BUILTIN}


def register(spec: MethodSpec, *, replace: bool = False) -> None:
    """Make ``spec`` available by its name (to :func:`get_method` and the CLI's ``--methods``).

    Raises:
        ValueError: the name is taken (unless ``replace``).
    """
    if spec.name in _SPECS and not replace:
        raise ValueError(f"method {spec.name!r} is already registered; pass replace=True to override it")
    _SPECS[spec.name] = spec


def available_methods() -> list[str]:
    """The registered names, sorted."""
    return sorted(_SPECS)


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` registered as ``name``.

    Raises:
        ValueError: an unknown name (listing the registered ones; a retired key names its successor).
    """
    if name not in _SPECS:
        renamed = f" (a retired key: the method is {RETIRED_KEYS[name]!r} now)" if name in RETIRED_KEYS else ""
        raise ValueError(f"unknown method {name!r}{renamed}; registered methods: {', '.join(available_methods())}")
    return _SPECS[name]


def trainer_options(spec: MethodSpec, options: Mapping[str, Any], trainer_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``trainer_kwargs`` added to the strategy's own ``trainer_kwargs`` option if it has one (the
    methods that train a copy of the module), so that its fits get them too."""
    out = dict(options)
    if trainer_kwargs and "trainer_kwargs" in spec.strategy_options():
        out["trainer_kwargs"] = {**(out.get("trainer_kwargs") or {}), **trainer_kwargs}
    return out


def with_trainer(method: Method, trainer_kwargs: Mapping[str, Any]) -> Method:
    """``method`` with ``trainer_kwargs`` (e.g. ``accelerator``, ``devices``, ``precision``, ``logger``) added to the
    ``Trainer`` of each of its continual-learning fits and of its reference's, whose retraining replays them.

    A strategy that trains a copy of the module takes them as its own option (:func:`trainer_options`).
    """
    if not trainer_kwargs:
        return method

    def build(info: BenchmarkInfo) -> Built:
        built = method.build(info)
        built.trainer_kwargs.update(trainer_kwargs)  # in place: a retrain strategy shares this dict
        return built

    reference = with_trainer(method.reference, trainer_kwargs) if method.reference is not None else None
    return Method(method.name, build, reference=reference, family=method.family)


def get_method(name: str, **options: Any) -> Method:
    """The registered method ``name`` with ``options`` (:meth:`MethodSpec.method`).

    Raises:
        ValueError: an unknown name, or an unknown option (listing the valid ones).
    """
    return method_spec(name).method(**options)


def unlearner(name: str, module: Any, recorder: RecorderCallback, **options: Any) -> Unlearner:
    """The registered method ``name``'s strategy on a ``module`` and ``recorder`` the caller trained itself
    (:meth:`MethodSpec.unlearner`).

    Raises:
        ValueError: an unknown name, or an option the strategy does not take (listing the valid ones).
    """
    return method_spec(name).unlearner(module, recorder, **options)
