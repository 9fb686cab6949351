"""Model families of the harness: a model, its continual-learning recipe, and its gold standard.

Each family builds a model for a benchmark, says how the stream is learned with it (Trainer
options, batch size, the recorder methods on it default to) and has a gold standard: retraining
from scratch on the retained data (:func:`reference`).

* ``"analytic"``: the frozen backbone + ridge head of [ACU] (:class:`AnalyticClassifier`), learned
  with an :class:`AnalyticRecorder`; its retrain is a fresh analytic fit on the retained set.
  [ACU]'s protocol (Section 4.1: "all baselines are updated starting from the same base model")
  runs the baselines on this model too, so they default to it. Settings: ``ridge`` (``gamma`` of
  [ACU] eq. (2)) and ``expansion_dim``.
* ``"supervised"``: the backbone (trainable copy) + a linear layer trained by SGD
  (:class:`SupervisedClassifier`, ``info.epochs`` epochs per experience at ``info.lr``); its
  retrain replays that recipe on the retained samples.
* ``"linear"``: the frozen backbone + a linear layer trained by SGD on ``mean CE + (l2/2)||theta||^2``:
  L2-regularised logistic regression on fixed features, the strongly convex setting in which
  [HF]'s certificate holds (Assumption 1); its retrain replays the recipe. Settings: ``l2`` and ``lr_margin``:
  when the benchmark's ``lr`` exceeds [HF]'s step-size condition ``2/(M + l2)`` (M the closed-form smoothness),
  the family trains at ``lr_margin x 2/(M + l2)`` instead and warns, naming both rates; ``lr_margin=None`` runs
  the benchmark's ``lr`` as given (a certified HF release is then refused, its certificate naming the rate
  that would satisfy the condition).
* ``"convex"``: the frozen backbone + an L2-regularised softmax head (:class:`AnalyticClassifier` without
  expansion) that a :class:`SoftmaxHeadRecorder` solves to a certified distance ``radius`` of its optimum
  (``docs/certified_head.md``); its retrain is a fresh solve on the retained set. Settings: ``l2``, ``radius``
  and ``loss_perturbation`` ([CR]'s ``beta``; ``None``: none).
* ``"proximal"``: the same model with [CCL]'s regulariser ``(lambda/2)||theta - theta_{t-1}||^2``
  (:class:`ProximalClassifier`), for the certified continual-learning methods; each task is solved
  by full-batch L-BFGS finished by Newton-CG to a gradient norm of :data:`NEWTON_TOLERANCE`, as [CCL] assumes
  (exact solutions); its retrain replays the recipe. Settings: ``l2`` and ``reg_lambda``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lightning as L
from torch import nn
from torch.utils.data import DataLoader

from lightning_unlearn.callbacks.acu import AnalyticRecorder
from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.callbacks.samples import SampleRecorder
from lightning_unlearn.functional.bounds import module_constants
from lightning_unlearn.models import (
    AnalyticClassifier,
    ProximalClassifier,
    SupervisedClassifier,
)
from lightning_unlearn.unlearners.baselines import RetrainUnlearner
from lightning_unlearn.warnings import warn
from lightning_unlearn_bench.types import BenchmarkInfo, Built, Method

FAMILIES = ("analytic", "supervised", "linear", "proximal", "convex")
#: each family's settings and their defaults (the linear family's ``lr_margin``: its step size as a fraction of
#: [HF]'s limit 2/(M + l2) when the benchmark's lr exceeds it, or None to keep the benchmark's lr)
SETTINGS: dict[str, dict[str, Any]] = {
    "analytic": {"ridge": 1.0, "expansion_dim": 512},
    "supervised": {},
    "linear": {"l2": 1e-2, "lr_margin": 0.9},
    "proximal": {"l2": 1e-2, "reg_lambda": 1.0},
    "convex": {"l2": 1e-3, "radius": 2e-4, "loss_perturbation": None},
}
#: the proximal family's batch (larger than any experience: one batch per experience) and L-BFGS steps per task
FULL_BATCH, LBFGS_STEPS = 1 << 30, 2
#: the gradient norm the proximal family's Newton-CG finish reaches on every task: a tenth of the certified [CCL]
#: methods' task tolerance (methods.TASK_TOLERANCE, 1e-3), a margin for the check's own float rounding
NEWTON_TOLERANCE = 1e-4


@dataclass
class FamilyModel:
    """A family's model for one benchmark and how the stream is learned with it.

    ``recorder()`` makes the family's own recorder (what methods on it record with, unless they
    bring theirs); ``refit()`` the callbacks that learn the module besides the optimizer (a
    fresh :class:`AnalyticRecorder` for the analytic head; none otherwise), which retraining
    needs again. ``batch_size`` ``None`` means the benchmark's.
    """

    module: L.LightningModule
    recorder: Callable[[], RecorderCallback]
    refit: Callable[[], list[L.Callback]]
    trainer_kwargs: dict[str, Any]
    batch_size: int | None = None


def family_settings(family: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The family's settings: its defaults updated with ``settings``.

    Raises:
        ValueError: an unknown family, or a setting the family does not have (naming its settings).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; one of {FAMILIES}")
    unknown = sorted(set(settings) - set(SETTINGS[family]))
    if unknown:
        raise ValueError(
            f"model family {family!r} takes no setting(s) {unknown}; its settings: {sorted(SETTINGS[family])}"
        )
    return {**SETTINGS[family], **settings}


def build_model(info: BenchmarkInfo, family: str, settings: Mapping[str, Any]) -> FamilyModel:
    """A fresh model of ``family`` for ``info`` (the harness seeds the RNG first, so two builds are equal).

    Raises:
        ValueError: an unknown family or setting.
    """
    s = family_settings(family, settings)
    trainer_kwargs, batch_size = recipe(info, family)
    return FamilyModel(
        _module(info, family, s),
        _recorder(family, s),
        _refit(family, s),
        trainer_kwargs,
        batch_size,
    )


def recipe(info: BenchmarkInfo, family: str) -> tuple[dict[str, Any], int | None]:
    """Continual-learning Trainer options and batch size (``None``: the benchmark's) of a family."""
    if family in ("analytic", "convex"):
        return {"max_epochs": 1}, None
    if family == "proximal":
        # every rank of a multi-device fit solves the whole task (no DistributedSampler): [CCL] needs the exact
        # minimiser of the task's mean loss, which shards padded to equal sizes would weight unevenly
        return {"max_epochs": LBFGS_STEPS, "use_distributed_sampler": False}, FULL_BATCH
    return {"max_epochs": info.epochs}, None


def _module(info: BenchmarkInfo, family: str, s: Mapping[str, Any]) -> L.LightningModule:
    if family in ("analytic", "convex"):
        return AnalyticClassifier(
            copy.deepcopy(info.backbone),
            info.backbone_dim,
            info.num_classes,
            expansion_dim=s.get("expansion_dim"),
            seed=info.seed,
        )
    trainable = family == "supervised"
    net = nn.Sequential(
        copy.deepcopy(info.backbone).requires_grad_(trainable),
        nn.Linear(info.backbone_dim, info.num_classes),
    )
    if family == "supervised":
        return SupervisedClassifier(net, lr=info.lr)
    if family == "linear":
        return SupervisedClassifier(net, lr=_linear_lr(info, net, s), l2=s["l2"])
    return ProximalClassifier(
        net, lr=1.0, l2=s["l2"], reg_lambda=s["reg_lambda"], optimizer="lbfgs", newton_tolerance=NEWTON_TOLERANCE
    )


def _linear_lr(info: BenchmarkInfo, net: nn.Module, s: Mapping[str, Any]) -> float:
    """The linear family's step size: the benchmark's ``lr``, or ``lr_margin x 2/(M + l2)`` when ``lr`` exceeds [HF]
    Lemma 3's condition (``M`` the closed-form per-sample smoothness over the training inputs), with a warning."""
    margin = s["lr_margin"]
    if margin is None:
        return info.lr
    c = module_constants(net, (b[0] for b in DataLoader(info.train, batch_size=1024)), l2=s["l2"])
    if info.lr <= margin * c.max_lr:
        return info.lr
    lr = margin * c.max_lr
    warn(
        f"linear family: the recipe's lr = {info.lr:g} exceeds [HF]'s condition 2/(M + l2) = {c.max_lr:.4g} "
        f"(M = {c.smoothness:.4g}, l2 = {s['l2']:g}); it trains at lr_margin x 2/(M + l2) = {lr:.4g} "
        "(the setting lr_margin=None keeps the recipe's lr, and a certified HF release is then refused)",
    )
    return lr


def _recorder(family: str, s: Mapping[str, Any]) -> Callable[[], RecorderCallback]:
    if family == "analytic":
        return lambda: AnalyticRecorder(s["ridge"])
    if family == "convex":
        return lambda: SoftmaxHeadRecorder(s["l2"], radius=s["radius"], loss_perturbation=s["loss_perturbation"])
    return SampleRecorder


def _refit(family: str, s: Mapping[str, Any]) -> Callable[[], list[L.Callback]]:
    solved = family in ("analytic", "convex")  # the head is learned by its recorder
    return (lambda: [_recorder(family, s)()]) if solved else list


def retrain_method(
    name: str,
    module: Callable[[BenchmarkInfo], L.LightningModule],
    trainer_kwargs: Callable[[BenchmarkInfo], dict[str, Any]],
    refit: Callable[[], list[L.Callback]] = list,
    batch_size: int | None = None,
    family: str = "custom",
) -> Method:
    """A gold standard: :class:`RetrainUnlearner` replaying a model's continual recipe on the retained data.

    ``module(info)`` builds the model (the harness seeds the RNG first, so two builds are equal),
    ``trainer_kwargs(info)`` gives its continual-learning Trainer options and ``refit()`` the
    callbacks that learn with it (e.g. a fresh :class:`AnalyticRecorder` for an analytic head);
    ``batch_size`` that of its fits (``None``: the benchmark's); ``family`` names the model. Give
    methods on a model of your own a reference built the same way.
    """

    def build(info: BenchmarkInfo) -> Built:
        model, recorder, kwargs = module(info), SampleRecorder(), trainer_kwargs(info)
        refits = refit()
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def strategy() -> RetrainUnlearner:
            return RetrainUnlearner(
                model,
                recorder,
                info.train,
                initial,
                fit_callbacks=refit,
                trainer_kwargs=kwargs,
                batch_size=batch_size or info.batch_size,
                seed=info.seed,
            )

        return Built(model, [recorder, *refits], strategy, kwargs, batch_size)

    return Method(name, build, family=family)


def reference(family: str = "analytic", **settings: Any) -> Method:
    """The gold standard of a model family: retraining from scratch (a fresh analytic fit, or the recipe replayed).

    Named ``retrain`` (the analytic family with its defaults), ``retrain[<family>]``, or with the
    settings that differ from the defaults, e.g. ``retrain[analytic,ridge=1,expansion_dim=48]``.

    Raises:
        ValueError: an unknown family or setting.
    """
    s = family_settings(family, settings)
    if s == SETTINGS[family]:
        name = "retrain" if family == "analytic" else f"retrain[{family}]"
    else:
        shown = {k: v for k, v in s.items() if not (k == "lr_margin" and v == SETTINGS[family][k])}
        name = (
            "retrain["
            + ",".join([family, *(f"{k}={v:g}" if v is not None else f"{k}=none" for k, v in shown.items())])
            + "]"
        )

    return retrain_method(
        name,
        lambda info: _module(info, family, s),
        lambda info: recipe(info, family)[0],
        refit=_refit(family, s),
        batch_size=FULL_BATCH if family == "proximal" else None,
        family=family,
    )
