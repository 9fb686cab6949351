"""The built-in methods of the registry, each an unlearning strategy class on its model families.

Registered: ``acu``, ``resolve`` and ``certified_removal`` ([CR]; the certified softmax head, on the convex
family), ``hf``, ``ns``, ``ij``, ``hessian``, ``gradient``, ``safe``, ``rbm``, ``salun``, ``noisy_finetune`` ([CUNN];
supervised family by default) and the baselines
``retrain``, ``finetune``, ``neggrad``, ``neggrad_plus``, ``randomlabel`` and the further baselines of [ACU]'s
Table 1, ``scrub`` ([SCRUB]), ``l1_sparse`` and ``woodfisher`` ([Sparse]). The baselines, RBM and SalUn run on every
family (default: analytic, [ACU]'s protocol; their defaults are [ACU] App. E.3's);
[HF] (option ``track``: the sample ids its recorder keeps vectors for) and its Hessian-based baselines [NS] and
[IJ] on the linear family, [CCL]'s Hessian and gradient methods on the proximal family (with a
:class:`HessianRecorder`, whose estimates are their Lipschitz and smoothness constants), [SAFE] on the supervised
family by default.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from torch.utils.data import DataLoader

from lightning_unlearn.callbacks.hessian import HessianRecorder
from lightning_unlearn.callbacks.newton import MAX_BYTES, HessianSumRecorder
from lightning_unlearn.callbacks.optimality import TaskOptimality
from lightning_unlearn.callbacks.streaming import StreamingRecorder
from lightning_unlearn.callbacks.trajectory import TrajectoryRecorder
from lightning_unlearn.functional.bounds import linear_head, linear_model_constants, max_feature_norm, module_constants
from lightning_unlearn.functional.newton import hessian_lipschitz_bound
from lightning_unlearn.harness.registry import MethodSpec, register
from lightning_unlearn.harness.types import BenchmarkInfo
from lightning_unlearn.strategies.acu import ACUStrategy
from lightning_unlearn.strategies.baselines import (
    FinetuneStrategy,
    NegGradPlusStrategy,
    NegGradStrategy,
    RandomLabelStrategy,
    RetrainStrategy,
)
from lightning_unlearn.strategies.certified import (
    GradientCertifiedStrategy,
    HessianCertifiedStrategy,
)
from lightning_unlearn.strategies.convex import CertifiedRemovalStrategy, ResolveStrategy
from lightning_unlearn.strategies.hf import HFStrategy
from lightning_unlearn.strategies.newton import InfinitesimalJackknifeStrategy, NewtonStepStrategy
from lightning_unlearn.strategies.noisy import NoisyFinetuneStrategy
from lightning_unlearn.strategies.rbm import RBMStrategy
from lightning_unlearn.strategies.scrub import SCRUBStrategy
from lightning_unlearn.strategies.sparse import L1SparseStrategy, WoodFisherStrategy
from lightning_unlearn.strategies.streaming import StreamingStrategy


def certified_label(name: str) -> Any:
    """``name``, tagged with the options that change its certificate (so variants can be compared side by side):
    the noise, the privacy target and a bound other than the default contraction one."""

    def label(options: Mapping[str, Any]) -> str:
        bound = "" if options.get("bound", "contraction") == "contraction" else f"bound={options['bound']}"
        if not options.get("noise", True):
            tags = ["noise=off"]
        elif options.get("sigma_override") is not None:
            tags = [f"sigma={options['sigma_override']:g}"]
        else:
            epsilon, delta = options.get("epsilon", 1.0), options.get("delta", 1e-5)
            tags = [] if (epsilon, delta) == (1.0, 1e-5) else [f"eps={epsilon:g},delta={delta:g}"]
        tags += [bound] if bound else []
        return f"{name}[{','.join(tags)}]" if tags else name

    return label


def _trajectory(info: BenchmarkInfo, track: Collection[int] | None) -> TrajectoryRecorder:
    return TrajectoryRecorder(track=track)


def _hessian(info: BenchmarkInfo, hessian: str) -> HessianRecorder:
    return HessianRecorder(hessian=hessian)


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


def _streaming(info: BenchmarkInfo, num_classes: int | None) -> StreamingRecorder:
    return StreamingRecorder(num_classes or info.num_classes, seed=info.seed)


register(MethodSpec("acu", ACUStrategy, families=("analytic",)))
register(
    MethodSpec(
        "retrain",
        RetrainStrategy,
        managed=frozenset({"fit_callbacks", "trainer_kwargs", "batch_size"}),
    )
)
register(MethodSpec("finetune", FinetuneStrategy))
register(MethodSpec("neggrad", NegGradStrategy))
register(MethodSpec("neggrad_plus", NegGradPlusStrategy))
register(MethodSpec("randomlabel", RandomLabelStrategy))
register(MethodSpec("rbm", RBMStrategy, fixed={"masking": "retain"}))
register(MethodSpec("salun", RBMStrategy, fixed={"masking": "forget"}))
register(
    MethodSpec(
        "hf",
        HFStrategy,
        families=("linear",),
        recorder=_trajectory,
        recorder_options={"track": None},
        label=certified_label("hf"),
        context=_closed_form,
        managed=frozenset({"constants"}),
    )
)
for _name, _cls, _form in (("ns", NewtonStepStrategy, "hessian"), ("ij", InfinitesimalJackknifeStrategy, "inverse")):
    register(
        MethodSpec(
            _name,
            _cls,
            families=("linear",),
            recorder=_hessian_sum(_form),
            recorder_options={"damping": 0.01, "max_bytes": MAX_BYTES},
            label=certified_label(_name),
            context=_second_order_constants,
            managed=frozenset({"constants", "hessian_lipschitz"}),
        )
    )
register(
    MethodSpec(
        "hessian",
        HessianCertifiedStrategy,
        families=("proximal",),
        recorder=_hessian,
        recorder_options={"hessian": "auto"},
        label=certified_label("hessian"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
    )
)
register(
    MethodSpec(
        "gradient",
        GradientCertifiedStrategy,
        families=("proximal",),
        recorder=_hessian,
        recorder_options={"hessian": "auto"},
        label=certified_label("gradient"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
    )
)
register(
    MethodSpec(
        "safe",
        StreamingStrategy,
        families=("supervised", "analytic", "linear", "proximal"),
        recorder=_streaming,
        recorder_options={"num_classes": None},
        managed=frozenset({"constants", "trajectory"}),  # its contraction bound needs both: the harness sets neither
    )
)
register(MethodSpec("resolve", ResolveStrategy, families=("convex",), label=certified_label("resolve")))
register(
    MethodSpec(
        "certified_removal",
        CertifiedRemovalStrategy,
        families=("convex",),
        # [CR]'s loss perturbation for a residual budget of 0.1 (sum form) at (1, 1e-5)
        settings={"loss_perturbation": CertifiedRemovalStrategy.perturbation_std(0.1, 1.0, 1e-5)},
    )
)
register(
    MethodSpec(
        "noisy_finetune",
        NoisyFinetuneStrategy,
        families=("supervised", "linear"),
        label=certified_label("noisy_finetune"),
        managed=frozenset({"center"}),  # the zero vector: the harness keeps no initial weights for it
    )
)
register(MethodSpec("scrub", SCRUBStrategy))
register(MethodSpec("l1_sparse", L1SparseStrategy))
register(MethodSpec("woodfisher", WoodFisherStrategy))
