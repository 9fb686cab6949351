"""Method registry: the names the CLI and the harness know, each mapped to a :class:`Method` factory.

Adding a method is a few lines::

    def my_method(epsilon: float = 1.0) -> Method:
        def build(info: BenchmarkInfo) -> Built:
            module, recorder = supervised_module(info), MyRecorder()
            return Built(module, [recorder], lambda: MyStrategy(module, recorder, epsilon=epsilon), {"max_epochs": info.epochs})
        return Method("mine", build, reference=retrain("supervised"), family="supervised")

    register("mine", my_method)

Model families, each with its gold standard (retraining from scratch on the retained data):

* ``"analytic"``: the frozen backbone + ridge head of ACU (:class:`AnalyticClassifier`), learned
  with an :class:`AnalyticRecorder`; its retrain is a fresh analytic fit on the retained set.
  ACU's protocol (Section 4.1: "all baselines are updated starting from the same base model")
  runs the baselines on this model too, so they default to it.
* ``"supervised"``: the backbone (trainable copy) + a linear layer trained by SGD
  (:class:`SupervisedClassifier`, ``info.epochs`` epochs per experience at ``info.lr``); its
  retrain replays that recipe on the retained samples.
* ``"linear"``: the frozen backbone + a linear layer trained by SGD on ``mean CE + (l2/2)||theta||^2``:
  L2-regularised logistic regression on fixed features, the strongly convex setting in which
  HF's certificate holds (paper 002, Assumption 1); its retrain replays the recipe.
* ``"proximal"``: the same model with paper 004's regulariser ``(lambda/2)||theta - theta_{t-1}||^2``
  (:class:`ProximalClassifier`), for the certified continual-learning methods; each task is solved
  by full-batch L-BFGS, as 004 assumes (exact solutions); its retrain replays the recipe.

Registered: ``acu``, ``hf``, ``hessian``, ``gradient``, ``safe``, ``rbm``, ``salun`` and the baselines
``retrain``, ``finetune``, ``neggrad``, ``neggrad_plus``, ``randomlabel``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import nn

from lightning_unlearn.callbacks.analytic import AnalyticRecorder
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.hessian import HessianRecorder
from lightning_unlearn.callbacks.samples import SampleRecorder
from lightning_unlearn.callbacks.streaming import StreamingRecorder
from lightning_unlearn.callbacks.trajectory import TrajectoryRecorder
from lightning_unlearn.evaluate import BenchmarkInfo, Built, Method
from lightning_unlearn.models import AnalyticClassifier, ProximalClassifier, SupervisedClassifier
from lightning_unlearn.strategies.acu import ACUStrategy
from lightning_unlearn.strategies.certified import GradientCertifiedStrategy, HessianCertifiedStrategy
from lightning_unlearn.strategies.hf import HFStrategy
from lightning_unlearn.strategies.rbm import RBMStrategy
from lightning_unlearn.strategies.streaming import StreamingStrategy
from lightning_unlearn.strategies.baselines import (
    FinetuneStrategy,
    NegGradPlusStrategy,
    NegGradStrategy,
    RandomLabelStrategy,
    RetrainStrategy,
)

MethodFactory = Callable[..., Method]
_METHODS: dict[str, MethodFactory] = {}
FAMILIES = ("analytic", "supervised", "linear", "proximal")

#: ACU's ridge regulariser (its gamma) and random-expansion width used by the analytic family
RIDGE, EXPANSION_DIM = 1.0, 512
#: ridge ``l2`` (strong convexity) of the linear and proximal families, and 004's ``lambda``
L2, REG_LAMBDA = 1e-2, 1.0
#: the proximal family's batch (larger than any experience: one batch per experience) and L-BFGS steps per task
FULL_BATCH, LBFGS_STEPS = 1 << 30, 2


def register(name: str, factory: MethodFactory, *, replace: bool = False) -> None:
    """Make ``factory(**options) -> Method`` available as ``name`` (to the CLI's ``--methods``)."""
    if name in _METHODS and not replace:
        raise ValueError(f"method {name!r} is already registered; pass replace=True to override it")
    _METHODS[name] = factory


def available_methods() -> list[str]:
    return sorted(_METHODS)


def get_method(name: str, **options: Any) -> Method:
    """The registered method ``name`` built with ``options``; ``ValueError`` for unknown names or options."""
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; registered methods: {', '.join(available_methods())}")
    try:
        return _METHODS[name](**options)
    except TypeError as err:
        raise ValueError(f"bad options {options} for method {name!r}: {err}") from None


# -- model families ------------------------------------------------------------------------------
def analytic_module(info: BenchmarkInfo, expansion_dim: int = EXPANSION_DIM) -> AnalyticClassifier:
    """A copy of the frozen backbone, a seeded random expansion and a zero ridge head (eq. 1)."""
    return AnalyticClassifier(copy.deepcopy(info.backbone), info.backbone_dim, info.num_classes, expansion_dim=expansion_dim, seed=info.seed)


def supervised_module(info: BenchmarkInfo) -> SupervisedClassifier:
    """A trainable copy of the backbone and a linear layer, trained by SGD at ``info.lr``."""
    net = nn.Sequential(copy.deepcopy(info.backbone).requires_grad_(True), nn.Linear(info.backbone_dim, info.num_classes))
    return SupervisedClassifier(net, lr=info.lr)


def _linear_head(info: BenchmarkInfo) -> nn.Sequential:
    return nn.Sequential(copy.deepcopy(info.backbone).requires_grad_(False), nn.Linear(info.backbone_dim, info.num_classes))


def linear_module(info: BenchmarkInfo, l2: float = L2) -> SupervisedClassifier:
    """The frozen backbone and a linear layer trained by SGD with ridge ``l2`` (convex in its weights)."""
    return SupervisedClassifier(_linear_head(info), lr=info.lr, l2=l2)


def proximal_module(info: BenchmarkInfo, l2: float = L2, reg_lambda: float = REG_LAMBDA) -> ProximalClassifier:
    """:func:`linear_module` with paper 004's proximal regulariser, each task solved by full-batch L-BFGS."""
    return ProximalClassifier(_linear_head(info), lr=1.0, l2=l2, reg_lambda=reg_lambda, optimizer="lbfgs")


def _gradient_trained(info: BenchmarkInfo) -> dict[str, Any]:
    return {"max_epochs": info.epochs}


def _solved_exactly(info: BenchmarkInfo) -> dict[str, Any]:
    """Trainer options of the proximal family: full-batch L-BFGS steps (with :data:`FULL_BATCH`)."""
    return {"max_epochs": LBFGS_STEPS}


def _recipe(info: BenchmarkInfo, family: str) -> tuple[dict[str, Any], int | None]:
    """Continual-learning Trainer options and batch size (``None``: the benchmark's) of a gradient-trained family."""
    return (_solved_exactly(info), FULL_BATCH) if family == "proximal" else (_gradient_trained(info), None)


def _family(
    info: BenchmarkInfo, family: str, ridge: float, expansion_dim: int, recorder: RecorderCallback | None = None
) -> tuple[L.LightningModule, RecorderCallback, dict[str, Any], int | None]:
    """A model family's module, its recorder (default: the family's), continual-learning Trainer options and batch size."""
    if family == "analytic":
        return analytic_module(info, expansion_dim), recorder or AnalyticRecorder(ridge), {"max_epochs": 1}, None
    modules = {"supervised": supervised_module, "linear": linear_module, "proximal": proximal_module}
    if family in modules:
        return modules[family](info), recorder or SampleRecorder(), *_recipe(info, family)
    raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")


def retrain_method(
    name: str,
    module: Callable[[BenchmarkInfo], L.LightningModule],
    trainer_kwargs: Callable[[BenchmarkInfo], dict[str, Any]],
    refit: Callable[[], list[L.Callback]] = list,
    batch_size: int | None = None,
    family: str = "custom",
) -> Method:
    """A gold standard: :class:`RetrainStrategy` replaying a model's continual recipe on the retained data.

    ``module(info)`` builds the model (the harness seeds the RNG first, so two builds are equal),
    ``trainer_kwargs(info)`` gives its continual-learning Trainer options and ``refit()`` the
    callbacks that learn with it (e.g. a fresh :class:`AnalyticRecorder` for an analytic head);
    ``batch_size`` that of its fits (``None``: the benchmark's); ``family`` names the model. Give methods on a model of your
    own a reference built the same way.
    """

    def build(info: BenchmarkInfo) -> Built:
        model, recorder, kwargs = module(info), SampleRecorder(), trainer_kwargs(info)
        refits = refit()
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def strategy() -> RetrainStrategy:
            return RetrainStrategy(model, recorder, info.train, initial, fit_callbacks=refit, trainer_kwargs=kwargs,
                                   batch_size=batch_size or info.batch_size, seed=info.seed)

        return Built(model, [recorder, *refits], strategy, kwargs, batch_size)

    return Method(name, build, family=family)


def retrain(
    family: str = "analytic", ridge: float = RIDGE, expansion_dim: int = EXPANSION_DIM, l2: float = L2, reg_lambda: float = REG_LAMBDA
) -> Method:
    """The gold standard of a model family (a fresh analytic fit, or the SGD recipe replayed)."""
    _family_check(family)
    if family == "supervised":
        return retrain_method("retrain[supervised]", supervised_module, _gradient_trained, family=family)
    if family == "linear":
        name = "retrain[linear]" if l2 == L2 else f"retrain[linear,l2={l2:g}]"
        return retrain_method(name, lambda info: linear_module(info, l2), _gradient_trained, family=family)
    if family == "proximal":
        name = "retrain[proximal]" if (l2, reg_lambda) == (L2, REG_LAMBDA) else f"retrain[proximal,l2={l2:g},lambda={reg_lambda:g}]"
        return retrain_method(name, lambda info: proximal_module(info, l2, reg_lambda), _solved_exactly, batch_size=FULL_BATCH,
                              family=family)
    default = (ridge, expansion_dim) == (RIDGE, EXPANSION_DIM)
    return retrain_method(
        "retrain" if default else f"retrain[analytic,ridge={ridge:g},d={expansion_dim}]",
        lambda info: analytic_module(info, expansion_dim),
        lambda info: {"max_epochs": 1},
        refit=lambda: [AnalyticRecorder(ridge)],
        family=family,
    )


def acu(ridge: float = RIDGE, expansion_dim: int = EXPANSION_DIM) -> Method:
    """ACU (exact, Theorem 1) on the analytic family."""

    def build(info: BenchmarkInfo) -> Built:
        module, recorder = analytic_module(info, expansion_dim), AnalyticRecorder(ridge)
        return Built(module, [recorder], lambda: ACUStrategy(module, recorder), {"max_epochs": 1})

    return Method("acu", build, reference=retrain("analytic", ridge, expansion_dim), family="analytic")


def _baseline(name: str, cls: type, needs_train: bool, preset: dict[str, Any] | None = None, doc: str = "defaults of ACU App. E.3") -> MethodFactory:
    """Factory of a trained baseline: options are the strategy's hyperparameters, plus the model family.

    ``preset`` options are fixed (e.g. RBM's ``masking``) and cannot be given again.
    """
    preset = dict(preset or {})

    def factory(family: str = "analytic", ridge: float = RIDGE, expansion_dim: int = EXPANSION_DIM, **hyper: Any) -> Method:
        _family_check(family)
        _check_options(cls, hyper, fixed=set(preset))

        def build(info: BenchmarkInfo) -> Built:
            module, recorder, trainer_kwargs, batch_size = _family(info, family, ridge, expansion_dim)
            data = {"train": info.train} if needs_train else {}
            strategy = lambda: cls(module, recorder, **data, seed=info.seed, **preset, **hyper)  # noqa: E731
            return Built(module, [recorder], strategy, trainer_kwargs, batch_size)

        reference = retrain(family, ridge, expansion_dim)
        return Method(name if family == "analytic" else f"{name}[{family}]", build, reference=reference, family=family)

    factory.__doc__ = f"{cls.__name__} ({doc}) on a model family."
    return factory


def _seeded(info: BenchmarkInfo) -> torch.Generator:
    """The noise generator of a certified method: seeded, so a report is reproducible."""
    return torch.Generator().manual_seed(info.seed)


def hf_method(epsilon: float = 1.0, delta: float = 1e-5, l2: float = L2, noise: bool = True, sigma_override: float | None = None) -> Method:
    """HF (paper 002) on the linear family: a :class:`TrajectoryRecorder` over every sample, certified deletion."""

    def build(info: BenchmarkInfo) -> Built:
        module, recorder = linear_module(info, l2), TrajectoryRecorder()
        strategy = lambda: HFStrategy(module, recorder, epsilon=epsilon, delta=delta, noise=noise,  # noqa: E731
                                      sigma_override=sigma_override, generator=_seeded(info))
        return Built(module, [recorder], strategy, *_recipe(info, "linear"))

    return Method(_certified_name("hf", epsilon, delta, noise, sigma_override), build, reference=retrain("linear", l2=l2),
                  family="linear")


def _certified_name(name: str, epsilon: float, delta: float, noise: bool, sigma_override: float | None) -> str:
    """``name``, tagged with the options that change its certificate (so variants can be compared side by side)."""
    if not noise:
        return f"{name}[noise=off]"
    if sigma_override is not None:
        return f"{name}[sigma={sigma_override:g}]"
    return name if (epsilon, delta) == (1.0, 1e-5) else f"{name}[eps={epsilon:g},delta={delta:g}]"


def _continual_certified(name: str, cls: type) -> MethodFactory:
    """Factory of a paper-004 method on the proximal family, with a :class:`HessianRecorder`."""

    def factory(epsilon: float = 1.0, delta: float = 1e-5, l2: float = L2, reg_lambda: float = REG_LAMBDA, hessian: str = "auto",
                noise: bool = True, sigma_override: float | None = None) -> Method:
        def build(info: BenchmarkInfo) -> Built:
            module, recorder = proximal_module(info, l2, reg_lambda), HessianRecorder(hessian=hessian)
            strategy = lambda: cls(module, recorder, epsilon=epsilon, delta=delta, noise=noise,  # noqa: E731
                                   sigma_override=sigma_override, generator=_seeded(info))
            return Built(module, [recorder], strategy, *_recipe(info, "proximal"))

        reference = retrain("proximal", l2=l2, reg_lambda=reg_lambda)
        return Method(_certified_name(name, epsilon, delta, noise, sigma_override), build, reference=reference, family="proximal")

    factory.__doc__ = f"{cls.__name__} (paper 004) on the proximal family; the Lipschitz and smoothness constants are the recorder's estimates."
    return factory


def safe(family: str = "supervised", ridge: float = RIDGE, expansion_dim: int = EXPANSION_DIM, num_classes: int | None = None, **options: Any) -> Method:
    """SAFE streaming unlearning (paper 001): a :class:`StreamingRecorder`; options are :class:`StreamingStrategy`'s."""
    _family_check(family)
    _check_options(StreamingStrategy, options)

    def build(info: BenchmarkInfo) -> Built:
        recorder = StreamingRecorder(num_classes or info.num_classes, seed=info.seed)
        module, _, trainer_kwargs, batch_size = _family(info, family, ridge, expansion_dim, recorder)
        return Built(module, [recorder], lambda: StreamingStrategy(module, recorder, seed=info.seed, **options), trainer_kwargs, batch_size)

    reference = retrain(family, ridge, expansion_dim)
    return Method("safe" if family == "supervised" else f"safe[{family}]", build, reference=reference, family=family)


def _check_options(cls: type, options: dict[str, Any], fixed: frozenset[str] | set[str] = frozenset()) -> None:
    """``ValueError`` naming the options ``cls`` does not take (caught now, not after learning the stream)."""
    allowed = _hyperparameters(cls) - fixed
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{cls.__name__} takes no option(s) {unknown}; its options: {sorted(allowed)}")


def _hyperparameters(cls: type) -> set[str]:
    """Keyword options of a strategy's constructor, following ``**kwargs`` up to its base classes."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return names - {"seed", "ledger", "default_lr"}


def _family_check(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")


register("acu", acu)
register("retrain", retrain)
register("finetune", _baseline("finetune", FinetuneStrategy, needs_train=True))
register("neggrad", _baseline("neggrad", NegGradStrategy, needs_train=False))
register("neggrad_plus", _baseline("neggrad_plus", NegGradPlusStrategy, needs_train=True))
register("randomlabel", _baseline("randomlabel", RandomLabelStrategy, needs_train=True))
register("rbm", _baseline("rbm", RBMStrategy, needs_train=True, preset={"masking": "retain"}, doc="retention-based masking, paper 003 Sec. 5.2"))
register("salun", _baseline("salun", RBMStrategy, needs_train=True, preset={"masking": "forget"}, doc="forget-based masking, paper 003 Eq. (6)-(8)"))
register("hf", hf_method)
register("hessian", _continual_certified("hessian", HessianCertifiedStrategy))
register("gradient", _continual_certified("gradient", GradientCertifiedStrategy))
register("safe", safe)
