"""The built-in methods of the registry, each an unlearner class on its model families.

A spec keeps what only the harness needs (model families, recorder factories, harness-computed arguments); the
method's guarantee, assumptions, cost, papers and fixed options are its class's registry entry
(:attr:`~lightning_unlearn.unlearners.base.Unlearner.method_info`).

Registered: ``acu``, ``resolve`` and ``certified_removal`` ([CR]; the certified softmax head, on the convex
family), ``hf``, ``ns``, ``ij``, ``ccl_hessian``, ``ccl_gradient``, ``safe``, ``rbm``, ``salun``,
``noisy_finetune`` ([CUNN]; supervised family by default) and the baselines
``retrain``, ``finetune``, ``neggrad``, ``neggrad_plus``, ``randomlabel`` and the further baselines of [ACU]'s
Table 1, ``scrub`` ([SCRUB]), ``l1_sparse`` and ``woodfisher`` ([Sparse]). The baselines, RBM and SalUn run on every
family (default: analytic, [ACU]'s protocol; their defaults are [ACU] App. E.3's);
[HF] (option ``track``: the sample ids its recorder keeps vectors for) and its Hessian-based baselines [NS] and
[IJ] on the linear family, [CCL]'s Hessian and gradient methods (``ccl_hessian``, ``ccl_gradient``) on the
proximal family (with a
:class:`CCLHessianRecorder` and a :class:`CCLRecorder`: Alg. 1 needs no Hessian; both certify with closed-form
constants), [SAFE] on the supervised family by default.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from torch.utils.data import DataLoader

from lightning_unlearn.callbacks.acu import AnalyticRecorder
from lightning_unlearn.callbacks.ccl import CCLHessianRecorder, CCLRecorder
from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.callbacks.hf import TrajectoryRecorder
from lightning_unlearn.callbacks.newton import MAX_BYTES, HessianSumRecorder
from lightning_unlearn.callbacks.optimality import TaskOptimality
from lightning_unlearn.callbacks.safe import SAFERecorder
from lightning_unlearn.functional.bounds import linear_head, linear_model_constants, max_feature_norm, module_constants
from lightning_unlearn.functional.newton import hessian_lipschitz_bound
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.acu import ACUUnlearner
from lightning_unlearn.unlearners.base import Unlearner
from lightning_unlearn.unlearners.baselines import (
    FinetuneUnlearner,
    NegGradPlusUnlearner,
    NegGradUnlearner,
    RandomLabelUnlearner,
    RetrainUnlearner,
)
from lightning_unlearn.unlearners.ccl import (
    CCLGradientUnlearner,
    CCLHessianUnlearner,
)
from lightning_unlearn.unlearners.convex import CertifiedRemovalUnlearner, ResolveUnlearner
from lightning_unlearn.unlearners.hf import HFUnlearner
from lightning_unlearn.unlearners.l1_sparse import L1SparseUnlearner
from lightning_unlearn.unlearners.newton import InfinitesimalJackknifeUnlearner, NewtonStepUnlearner
from lightning_unlearn.unlearners.noisy_finetune import NoisyFinetuneUnlearner
from lightning_unlearn.unlearners.rbm import RBMUnlearner
from lightning_unlearn.unlearners.safe import SAFEUnlearner
from lightning_unlearn.unlearners.scrub import SCRUBUnlearner
from lightning_unlearn.unlearners.woodfisher import WoodFisherUnlearner
from lightning_unlearn_bench.spec import MethodSpec
from lightning_unlearn_bench.types import BenchmarkInfo


def certified_label(name: str) -> Any:
    """``name``, tagged with the options that change its certificate (so variants can be compared side by side):
    the noise, the privacy target and a bound other than the default contraction one."""

    def label(options: Mapping[str, Any]) -> str:
        bound = "" if options.get("bound", "contraction") == "contraction" else f"bound={options['bound']}"
        release, default = options.get("release", ReleaseConfig()), ReleaseConfig()
        if not release.noise:
            tags = ["noise=off"]
        elif release.sigma_override is not None:
            tags = [f"sigma={release.sigma_override:g}"]
        elif (release.epsilon, release.delta) == (default.epsilon, default.delta):
            tags = []
        else:
            tags = [f"eps={release.epsilon:g},delta={release.delta:g}"]
        tags += [bound] if bound else []
        return f"{name}[{','.join(tags)}]" if tags else name

    return label


def _hf(info: BenchmarkInfo, track: Collection[int] | None) -> TrajectoryRecorder:
    return TrajectoryRecorder(track=track)


def _ccl_hessian(info: BenchmarkInfo, hessian: str) -> CCLHessianRecorder:
    return CCLHessianRecorder(hessian=hessian)


def _ccl(info: BenchmarkInfo) -> CCLRecorder:
    return CCLRecorder()


#: largest gradient residual of a proximal task's solution accepted for a certified [CCL] release
TASK_TOLERANCE = 1e-3


def _closed_form(info: BenchmarkInfo, module: Any, settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """[HF]'s context: closed-form constants of the linear head over the stream's training inputs.

    [interp] The weights' norm bound ``max(||theta_0||, L_CE/l2)`` reads ``||theta_0||`` from the freshly
    built module (the harness builds the context before training)."""
    return {"constants": module_constants(module, (b[0] for b in DataLoader(info.train, batch_size=1024)))}, []


def _closed_form_checked(
    info: BenchmarkInfo, module: Any, settings: Mapping[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """[CCL]'s context: closed-form constants (the first task's anchor is ``w_0 = 0``) and a :class:`TaskOptimality`
    check."""
    inputs = (b[0] for b in DataLoader(info.train, batch_size=1024))
    features, head = linear_head(module)
    constants = linear_model_constants(max_feature_norm(features, inputs), float(module.l2), bias=head.bias is not None)
    check = TaskOptimality(TASK_TOLERANCE)
    return {"constants": constants, "optimality": check}, [check]


def _hessian_sum(form: str) -> Any:
    def make(info: BenchmarkInfo, damping: float, max_bytes: int) -> HessianSumRecorder:
        return HessianSumRecorder(form=form, damping=damping, max_bytes=max_bytes)

    return make


def _second_order_constants(
    info: BenchmarkInfo, module: Any, settings: Mapping[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """[NS]/[IJ]'s context: the closed-form L, beta and lambda of the linear head (as [HF]'s) and its Hessian-Lipschitz
    constant M over the stream's training inputs."""
    features, head = linear_head(module)
    norm = max_feature_norm(features, (b[0] for b in DataLoader(info.train, batch_size=1024)))
    constants = module_constants(module, (b[0] for b in DataLoader(info.train, batch_size=1024)))
    return {"constants": constants, "hessian_lipschitz": hessian_lipschitz_bound(norm, bias=head.bias is not None)}, []


def _analytic_on_module(ridge: float, backbone: str | None, head: str) -> AnalyticRecorder:
    """ACU's recorder on a user's module: ``head`` (an :class:`AnalyticHead`) on the frozen submodule ``backbone``."""
    return AnalyticRecorder(ridge, backbone=backbone, head=head)


def _softmax_on_module(
    l2: float, radius: float, loss_perturbation: float | None, backbone: str | None, head: str
) -> SoftmaxHeadRecorder:
    """The certified softmax head's recorder on a user's module: ``head`` on the frozen submodule ``backbone``."""
    return SoftmaxHeadRecorder(l2, radius=radius, loss_perturbation=loss_perturbation, backbone=backbone, head=head)


#: [CR]'s loss perturbation for a residual budget of 0.1 (sum form) at (1, 1e-5)
_CR_PERTURBATION = CertifiedRemovalUnlearner.perturbation_std(0.1, 1.0, 1e-5)
_SOFTMAX_ON_MODULE = {"l2": 1e-3, "radius": 1e-3, "loss_perturbation": None, "backbone": None, "head": "head"}


def _safe(info: BenchmarkInfo, num_classes: int | None) -> SAFERecorder:
    return SAFERecorder(num_classes or info.num_classes, seed=info.seed)


def _second_order(name: str, cls: type[Unlearner], form: str) -> MethodSpec:
    """[NS] or [IJ] ([HF]'s Hessian-based baselines): ``cls`` with the ``form`` of :class:`HessianSumRecorder`."""
    return MethodSpec(
        name,
        cls,
        families=("linear",),
        recorder=_hessian_sum(form),
        recorder_options={"damping": 0.01, "max_bytes": MAX_BYTES},
        label=certified_label(name),
        context=_second_order_constants,
        managed=frozenset({"constants", "hessian_lipschitz"}),
    )


#: the built-in methods (the registry's names, :mod:`lightning_unlearn_bench.registry`)
BUILTIN: tuple[MethodSpec, ...] = (
    MethodSpec(
        "acu",
        ACUUnlearner,
        families=("analytic",),
        module_recorder=_analytic_on_module,
        module_recorder_options={"ridge": 1.0, "backbone": None, "head": "head"},
    ),
    MethodSpec(
        "retrain",
        RetrainUnlearner,
        managed=frozenset({"fit_callbacks", "trainer_kwargs", "batch_size"}),
    ),
    MethodSpec(
        "finetune",
        FinetuneUnlearner,
    ),
    MethodSpec(
        "neggrad",
        NegGradUnlearner,
    ),
    MethodSpec(
        "neggrad_plus",
        NegGradPlusUnlearner,
    ),
    MethodSpec(
        "randomlabel",
        RandomLabelUnlearner,
    ),
    MethodSpec(
        "rbm",
        RBMUnlearner,
    ),
    MethodSpec(
        "salun",
        RBMUnlearner,
    ),
    MethodSpec(
        "hf",
        HFUnlearner,
        families=("linear",),
        recorder=_hf,
        recorder_options={"track": None},
        label=certified_label("hf"),
        context=_closed_form,
        managed=frozenset({"constants"}),
    ),
    _second_order(
        "ns",
        NewtonStepUnlearner,
        "hessian",
    ),
    _second_order(
        "ij",
        InfinitesimalJackknifeUnlearner,
        "inverse",
    ),
    MethodSpec(
        "ccl_hessian",
        CCLHessianUnlearner,
        families=("proximal",),
        recorder=_ccl_hessian,
        recorder_options={"hessian": "auto"},
        label=certified_label("ccl_hessian"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
    ),
    MethodSpec(
        "ccl_gradient",
        CCLGradientUnlearner,
        families=("proximal",),
        recorder=_ccl,
        label=certified_label("ccl_gradient"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
    ),
    MethodSpec(
        "safe",
        SAFEUnlearner,
        families=("supervised", "analytic", "linear", "proximal"),
        recorder=_safe,
        recorder_options={"num_classes": None},
        managed=frozenset({"constants", "trajectory"}),  # its contraction bound needs both: the harness sets neither
    ),
    MethodSpec(
        "scrub",
        SCRUBUnlearner,
    ),
    MethodSpec(
        "l1_sparse",
        L1SparseUnlearner,
    ),
    MethodSpec(
        "woodfisher",
        WoodFisherUnlearner,
    ),
    MethodSpec(
        "resolve",
        ResolveUnlearner,
        families=("convex",),
        label=certified_label("resolve"),
        module_recorder=_softmax_on_module,
        module_recorder_options=_SOFTMAX_ON_MODULE,
    ),
    MethodSpec(
        "certified_removal",
        CertifiedRemovalUnlearner,
        families=("convex",),
        settings={"loss_perturbation": _CR_PERTURBATION},
        module_recorder=_softmax_on_module,
        module_recorder_options={**_SOFTMAX_ON_MODULE, "loss_perturbation": _CR_PERTURBATION},
    ),
    MethodSpec(
        "noisy_finetune",
        NoisyFinetuneUnlearner,
        families=("supervised", "linear"),
        label=certified_label("noisy_finetune"),
        managed=frozenset({"center"}),  # the zero vector: the harness keeps no initial weights for it
    ),
)
