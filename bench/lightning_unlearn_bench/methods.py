"""The built-in methods of the registry, each an unlearner class on its model families.

Registered: ``acu``, ``resolve`` and ``certified_removal`` ([CR]; the certified softmax head, on the convex
family), ``hf``, ``ns``, ``ij``, ``hessian``, ``gradient``, ``safe``, ``rbm``, ``salun``, ``noisy_finetune`` ([CUNN];
supervised family by default) and the baselines
``retrain``, ``finetune``, ``neggrad``, ``neggrad_plus``, ``randomlabel`` and the further baselines of [ACU]'s
Table 1, ``scrub`` ([SCRUB]), ``l1_sparse`` and ``woodfisher`` ([Sparse]). The baselines, RBM and SalUn run on every
family (default: analytic, [ACU]'s protocol; their defaults are [ACU] App. E.3's);
[HF] (option ``track``: the sample ids its recorder keeps vectors for) and its Hessian-based baselines [NS] and
[IJ] on the linear family, [CCL]'s Hessian and gradient methods on the proximal family (with a
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


def _trajectory(info: BenchmarkInfo, track: Collection[int] | None) -> TrajectoryRecorder:
    return TrajectoryRecorder(track=track)


def _hessian(info: BenchmarkInfo, hessian: str) -> CCLHessianRecorder:
    return CCLHessianRecorder(hessian=hessian)


def _task_deltas(info: BenchmarkInfo) -> CCLRecorder:
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


def _streaming(info: BenchmarkInfo, num_classes: int | None) -> SAFERecorder:
    return SAFERecorder(num_classes or info.num_classes, seed=info.seed)


#: one-line descriptions for ``lightning-unlearn methods``: (guarantee, assumptions, cost, paper)
_TRAINED = "a copy trained through the module's own training_step and optimizer"
_SECOND_ORDER = (
    "the exact minimiser (checked), strong convexity, proved constants incl. the Hessian-Lipschitz M, m <= n/2"
)
_CCL = "strong convexity, proved constants, each task solved to a checked tolerance (TaskOptimality)"
_NONE = "none (no bound on the distance to retraining)"


def _second_order(name: str, cls: type[Unlearner], form: str, guarantee: str, cost: str) -> MethodSpec:
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
        guarantee=guarantee,
        assumptions=_SECOND_ORDER,
        cost=cost,
        paper=name.upper(),
    )


#: the built-in methods (the registry's names, :mod:`lightning_unlearn_bench.registry`)
BUILTIN: tuple[MethodSpec, ...] = (
    MethodSpec(
        "acu",
        ACUUnlearner,
        families=("analytic",),
        module_recorder=_analytic_on_module,
        module_recorder_options={"ridge": 1.0, "backbone": None, "head": "head"},
        guarantee="exact: the head equals ridge retraining on the retained set ([ACU] Thm. 1)",
        assumptions="a frozen backbone; the head is the ridge solution, which the recorder solves in closed form",
        cost="O(k d_F^2) per request of k samples by eq. (5)/(6), or an O(d_F^3) re-solve; recording O(n d_F^2)",
        paper="ACU",
    ),
    MethodSpec(
        "retrain",
        RetrainUnlearner,
        managed=frozenset({"fit_callbacks", "trainer_kwargs", "batch_size"}),
        guarantee="exact by construction (the gold standard)",
        assumptions="the initial weights and the retained data are kept",
        cost="the whole continual recipe replayed on the retained data, per request",
    ),
    MethodSpec(
        "finetune",
        FinetuneUnlearner,
        guarantee=_NONE,
        assumptions=_TRAINED,
        cost="`epochs` epochs over the retained set per request",
        paper="ACU",
    ),
    MethodSpec(
        "neggrad",
        NegGradUnlearner,
        guarantee=_NONE,
        assumptions=_TRAINED + "; the loss is unbounded below (a diverging run stops)",
        cost="`epochs` epochs of gradient ascent over the forget set per request",
        paper="ACU",
    ),
    MethodSpec(
        "neggrad_plus",
        NegGradPlusUnlearner,
        guarantee=_NONE,
        assumptions=_TRAINED,
        cost="`epochs` epochs over the retained set, a forget batch beside each retained batch",
        paper="SCRUB",
    ),
    MethodSpec(
        "randomlabel",
        RandomLabelUnlearner,
        guarantee=_NONE,
        assumptions=_TRAINED + "; training and forget items of one format",
        cost="`epochs` epochs over the retained set plus the relabelled forget set per request",
        paper="ACU",
    ),
    MethodSpec(
        "rbm",
        RBMUnlearner,
        fixed={"masking": "retain"},
        guarantee="none ([RBM] Thm. 4.1: keeps the remaining loss at 0 in the linear model)",
        assumptions=_TRAINED + "; weights salient for the retained data stay",
        cost="one saliency gradient over the retained set, then `epochs` epochs over it per request",
        paper="RBM",
    ),
    MethodSpec(
        "salun",
        RBMUnlearner,
        fixed={"masking": "forget"},
        guarantee=_NONE,
        assumptions=_TRAINED + "; only weights salient for the forget set train",
        cost="one saliency gradient over the forget set, then `epochs` epochs over the retained set per request",
        paper="SalUn",
    ),
    MethodSpec(
        "hf",
        HFUnlearner,
        families=("linear",),
        recorder=_trajectory,
        recorder_options={"track": None},
        label=certified_label("hf"),
        context=_closed_form,
        managed=frozenset({"constants"}),
        guarantee="(epsilon, delta): w + sum a_u plus Gaussian noise calibrated on gamma ([HF] Eq. (56))",
        assumptions="strong convexity (Assumption 1), proved constants, plain SGD with every lr <= 2/(M + lambda)",
        cost="O(k d) per request (vector sums and noise); recording one HVP per tracked sample and step",
        paper="HF",
    ),
    _second_order(
        "ns",
        NewtonStepUnlearner,
        "hessian",
        "(epsilon, delta): a damped Newton step on the retained Hessian plus noise ([HF] Eq. (15), [NS] Alg. 2)",
        "an O(d^3) factorisation per request; recording the dense d x d Hessian (d HVPs over the data)",
    ),
    _second_order(
        "ij",
        InfinitesimalJackknifeUnlearner,
        "inverse",
        "(epsilon, delta): an infinitesimal-jackknife step plus noise ([HF] Eq. (16))",
        "O(k d^2) per request; recording the dense d x d inverse Hessian (one O(d^3) inversion)",
    ),
    MethodSpec(
        "hessian",
        CCLHessianUnlearner,
        families=("proximal",),
        recorder=_hessian,
        recorder_options={"hessian": "auto"},
        label=certified_label("hessian"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
        guarantee="(epsilon, delta): a Newton correction over the task chain plus noise on gamma^H ([CCL] Alg. 2)",
        assumptions=_CCL,
        cost=(
            "a solve with each recorded task Hessian per request (dense: O(d^3); factored, a linear head: conjugate "
            "gradients, O(n_i K d) per iteration); recording a Hessian per task"
        ),
        paper="CCL",
    ),
    MethodSpec(
        "gradient",
        CCLGradientUnlearner,
        families=("proximal",),
        recorder=_task_deltas,
        label=certified_label("gradient"),
        context=_closed_form_checked,
        managed=frozenset({"constants", "optimality"}),
        guarantee="(epsilon, delta): natural forgetting, noise only, gamma^NF ([CCL] Thm. 4.1)",
        assumptions=_CCL,
        cost="O(d) per request (noise); recording task sizes and end points",
        paper="CCL",
    ),
    MethodSpec(
        "safe",
        SAFEUnlearner,
        families=("supervised", "analytic", "linear", "proximal"),
        recorder=_streaming,
        recorder_options={"num_classes": None},
        managed=frozenset({"constants", "trajectory"}),  # its contraction bound needs both: the harness sets neither
        guarantee="none by default ([SAFE] Thm. 2 bounds regret); (epsilon, delta) with epsilon, delta, weight_bound",
        assumptions="one request per round; the certified release needs the weight bound W (Thm. 2(iii))",
        cost="one step from the anchor w_0 per request: gradients of the forget buffer at w_0",
        paper="SAFE",
    ),
    MethodSpec(
        "scrub",
        SCRUBUnlearner,
        guarantee=_NONE + "; SCRUB+R rewinds with held-out rewind_data",
        assumptions=_TRAINED + "; forward returns the logits",
        cost="`epochs` epochs per request: a max-pass over the forget set, a min-pass over the retained set",
        paper="SCRUB",
    ),
    MethodSpec(
        "l1_sparse",
        L1SparseUnlearner,
        guarantee=_NONE,
        assumptions=_TRAINED,
        cost="`epochs` epochs over the retained set with a decaying L1 penalty per request",
        paper="Sparse",
    ),
    MethodSpec(
        "woodfisher",
        WoodFisherUnlearner,
        guarantee=_NONE,
        assumptions="one influence step w + alpha F^-1 v, F the dampened empirical Fisher of retained gradients",
        cost="gradients over the forget and retained sets and n_samples per-sample gradients, O(n_samples^2 d)",
        paper="Sparse, WoodFisher",
    ),
    MethodSpec(
        "resolve",
        ResolveUnlearner,
        families=("convex",),
        label=certified_label("resolve"),
        module_recorder=_softmax_on_module,
        module_recorder_options=_SOFTMAX_ON_MODULE,
        guarantee="(epsilon, delta) [derived]: the head re-solved to within radius of the retained optimum, plus noise",
        assumptions="a frozen backbone; the L2-regularised softmax head is strongly convex (docs/certified_head.md)",
        cost="a few Newton steps of HVPs over the recorder's retained float64 features per request",
    ),
    MethodSpec(
        "certified_removal",
        CertifiedRemovalUnlearner,
        families=("convex",),
        settings={"loss_perturbation": _CR_PERTURBATION},
        module_recorder=_softmax_on_module,
        module_recorder_options={**_SOFTMAX_ON_MODULE, "loss_perturbation": _CR_PERTURBATION},
        guarantee="(epsilon, delta) per release: one Newton step, its exact gradient residual within [CR] Thm. 3",
        assumptions="a frozen backbone; the head trained with a secret loss perturbation; releases not composed",
        cost="one Newton step (preconditioned CG of Hessian-vector products) over the retained features, or a re-solve",
        paper="CR",
    ),
    MethodSpec(
        "noisy_finetune",
        NoisyFinetuneUnlearner,
        families=("supervised", "linear"),
        label=certified_label("noisy_finetune"),
        managed=frozenset({"center"}),  # the zero vector: the harness keeps no initial weights for it
        guarantee="(epsilon, delta) by amplification by iteration: noisy steps from a projected start ([CUNN])",
        assumptions="any loss and module (clipped gradients); update='convex': a linear softmax head (no shift)",
        cost="`steps` noisy steps on the retained data per request (plus optional noise-free epochs)",
        paper="CUNN, PABI",
    ),
)
