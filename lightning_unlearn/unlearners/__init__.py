"""Unlearners: each executes `ForgetRequest`s on a module with one method.

Each method has one key (its registry name, its modules' name, its docs page), declared on its class with its
registry entry (:attr:`Unlearner.method`, :attr:`Unlearner.method_info`); ``unlearner_class(key)`` and
``method_info(key)`` find them by key, among the classes this package exports.
"""

from __future__ import annotations

from lightning_unlearn.core.keys import RETIRED_KEYS
from lightning_unlearn.unlearners.acu import ACUUnlearner
from lightning_unlearn.unlearners.base import ErasurePendingError, MethodInfo, Unlearner, UnlearningResult
from lightning_unlearn.unlearners.baselines import (
    FinetuneUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RetrainUnlearner,
)
from lightning_unlearn.unlearners.ccl import CCLGradientUnlearner, CCLHessianUnlearner
from lightning_unlearn.unlearners.convex import CertifiedRemovalUnlearner, ResolveUnlearner
from lightning_unlearn.unlearners.hf import HFUnlearner
from lightning_unlearn.unlearners.l1_sparse import L1SparseUnlearner
from lightning_unlearn.unlearners.newton import InfinitesimalJackknifeUnlearner, NewtonStepUnlearner
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner
from lightning_unlearn.unlearners.rbm import MaskProjection, RBMUnlearner
from lightning_unlearn.unlearners.safe import SAFEUnlearner
from lightning_unlearn.unlearners.scrub import SCRUBUnlearner
from lightning_unlearn.unlearners.sisa import SISAUnlearner
from lightning_unlearn.unlearners.sliced import SlicedResolveUnlearner
from lightning_unlearn.unlearners.woodfisher import WoodFisherUnlearner

__all__ = [
    "MethodInfo",
    "available_unlearners",
    "method_info",
    "unlearner_class",
    "CCLGradientUnlearner",
    "HFUnlearner",
    "CCLHessianUnlearner",
    "InfinitesimalJackknifeUnlearner",
    "NewtonStepUnlearner",
    "ACUUnlearner",
    "ErasurePendingError",
    "UnlearningResult",
    "Unlearner",
    "FinetuneUnlearner",
    "NegGradUnlearner",
    "NegGradPlusUnlearner",
    "RandomLabelUnlearner",
    "RetrainUnlearner",
    "SAFEUnlearner",
    "RBMUnlearner",
    "SCRUBUnlearner",
    "L1SparseUnlearner",
    "WoodFisherUnlearner",
    "MaskProjection",
    "CertifiedRemovalUnlearner",
    "ResolveUnlearner",
    "NoisyFinetuneUnlearner",
    "SlicedResolveUnlearner",
    "SISAUnlearner",
]


def _registry() -> dict[str, tuple[type[Unlearner], MethodInfo]]:
    """Every key of the exported unlearner classes, with its class and entry."""
    found: dict[str, tuple[type[Unlearner], MethodInfo]] = {}
    for name in __all__:
        cls = globals()[name]
        if isinstance(cls, type) and issubclass(cls, Unlearner) and cls is not Unlearner:
            found.update((key, (cls, info)) for key, info in cls.registry_entries().items())
    return found


def available_unlearners() -> list[str]:
    """The keys of the library's methods, sorted.

    Example::

        >>> from lightning_unlearn.unlearners import available_unlearners
        >>> "acu" in available_unlearners() and "ccl_hessian" in available_unlearners()
        True
    """
    return sorted(_registry())


def _entry(key: str) -> tuple[type[Unlearner], MethodInfo]:
    registry = _registry()
    if key not in registry:
        renamed = f" (a retired key: the method is {RETIRED_KEYS[key]!r} now)" if key in RETIRED_KEYS else ""
        raise ValueError(f"unknown method {key!r}{renamed}; the library's methods: {', '.join(sorted(registry))}")
    return registry[key]


def unlearner_class(key: str) -> type[Unlearner]:
    """The unlearner class of the method ``key`` (its constructor takes the options :attr:`MethodInfo.fixed` sets).

    Raises:
        ValueError: an unknown key (listing the known ones; a retired key names its successor).

    Example::

        >>> from lightning_unlearn.unlearners import unlearner_class
        >>> unlearner_class("ccl_hessian").__name__, unlearner_class("salun").__name__
        ('CCLHessianUnlearner', 'RBMUnlearner')
    """
    return _entry(key)[0]


def method_info(key: str) -> MethodInfo:
    """The registry entry of the method ``key``: its guarantee, assumptions, cost, papers and fixed options.

    Raises:
        ValueError: an unknown key (listing the known ones; a retired key names its successor).

    Example::

        >>> from lightning_unlearn.unlearners import method_info
        >>> method_info("acu").paper, dict(method_info("salun").fixed)
        ('ACU', {'masking': 'forget'})
    """
    return _entry(key)[1]
