"""Closed-form constants of Assumption 1 ([HF]) / Assumption 2.1 ([CCL]) for linear softmax and logistic models.

For a linear model ``z = W phi + b`` on fixed features ``phi`` (a frozen backbone, or the raw
inputs) and the per-sample loss ``l(theta; x, y) = CE(z, y) + (l2/2)||theta||^2`` over all trainable
parameters ``theta = (W, b)``, with ``x~ = (phi, 1)`` (or ``phi`` without a bias) [derived]:

* Hessian: ``(diag(p) - p p^T) (x) x~ x~^T + l2 I``. ``lambda_max(diag(p) - p p^T) <= 1/2`` for any
  probability vector p (and ``p(1 - p) <= 1/4`` for a single sigmoid output), so every per-sample
  Hessian lies between ``l2 I`` and ``M I`` with ``M = ||x~||^2/2 + l2`` (``||x~||^2/4 + l2``), at
  every ``theta``: M is the per-sample smoothness of Assumption 1, not the batch Hessian's norm.
* Gradient of the cross-entropy: ``(p - e_y) (x) x~``, norm ``<= sqrt(2) ||x~||`` (``||x~||`` for a
  sigmoid), the loss' Lipschitz constant ``L_CE``.
* Parameter norm along training: a gradient step on ``mean CE + (l2/2)||theta||^2`` with
  ``eta l2 <= 1`` maps the ball ``||theta|| <= Theta = max(||theta_0||, L_CE/l2)`` into itself
  (``||theta'|| <= (1 - eta l2) Theta + eta L_CE``), and so does the exact minimiser of a task
  objective with a proximal term anchored in the ball. Hence the per-sample gradient, including the
  regulariser, is bounded by ``G = L_CE + l2 Theta`` at every iterate: Lemma 2's G ([HF]) and
  Assumption 2.1's L ([CCL]).

The bounds hold for every sample whose feature norm is at most the ``feature_norm`` given: compute
it over all the data the model learns (:func:`max_feature_norm`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

KINDS = ("bounded", "given", "estimated")


@dataclass(frozen=True)
class ModelConstants:
    """Assumption 1 constants and where they come from.

    Args:
        smoothness: M, an upper bound on every per-sample Hessian's largest eigenvalue.
        grad_bound: G, an upper bound on every per-sample gradient norm along training (also the
            Lipschitz constant L of [CCL]).
        strong_convexity: lambda (mu in [CCL]), a lower bound on every per-sample Hessian's eigenvalues.
        kind: ``"bounded"`` (proved from the model and data, e.g. :func:`linear_model_constants`),
            ``"given"`` (asserted by the caller) or ``"estimated"`` (observed maxima: not a proof;
            a certificate built on them is not certified).
    """

    smoothness: float
    grad_bound: float
    strong_convexity: float
    kind: str = "bounded"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"ModelConstants kind must be one of {KINDS}, got {self.kind!r}")
        if not (self.smoothness >= self.strong_convexity >= 0 and self.grad_bound >= 0):
            raise ValueError(f"need smoothness >= strong_convexity >= 0 and grad_bound >= 0, got {self}")

    @property
    def max_lr(self) -> float:
        """``2/(M + lambda)``: the largest step size with contraction ``rho < 1`` (Lemma 3, Theorem 6 of [HF])."""
        return 2.0 / (self.smoothness + self.strong_convexity)


def linear_model_constants(
    feature_norm: float, l2: float, *, init_norm: float = 0.0, bias: bool = True, binary: bool = False
) -> ModelConstants:
    """Closed-form M, G and lambda of L2-regularised softmax (or, ``binary``, sigmoid) regression (module docstring).

    Args:
        feature_norm: ``max ||phi(x)||`` over the data the model learns.
        l2: the ridge coefficient (> 0: strong convexity).
        init_norm: ``||theta_0||`` of the initial parameters (for [CCL]'s first anchor ``w_0 = 0``, 0).
        bias: whether the linear layer has a bias (which adds 1 to ``||x~||^2``).
        binary: one sigmoid output instead of a softmax.

    Raises:
        ValueError: ``l2 <= 0`` (no strong convexity, no finite parameter bound) or negative norms.
    """
    if not l2 > 0:
        raise ValueError(f"closed-form constants need a positive ridge l2 (strong convexity), got {l2}")
    if feature_norm < 0 or init_norm < 0:
        raise ValueError(f"norms must be >= 0, got feature_norm={feature_norm}, init_norm={init_norm}")
    r2 = feature_norm**2 + (1.0 if bias else 0.0)
    curvature, lipschitz = (r2 / 4, math.sqrt(r2)) if binary else (r2 / 2, math.sqrt(2 * r2))
    theta = max(init_norm, lipschitz / l2)
    return ModelConstants(
        smoothness=curvature + l2, grad_bound=lipschitz + l2 * theta, strong_convexity=l2, kind="bounded"
    )


def linear_head(module: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """Split a model (or its ``.net``) into its frozen feature map and its only trainable layer, a final ``nn.Linear``
    (a bare ``nn.Linear`` has the identity as feature map).

    Raises:
        ValueError: the trainable parameters are not exactly those of one final ``nn.Linear``.
    """
    trainable = [m for m in module.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    seq = getattr(module, "net", module)
    if isinstance(seq, nn.Linear) and trainable == [seq]:
        return nn.Identity(), seq
    if (
        len(trainable) != 1
        or not isinstance(trainable[0], nn.Linear)
        or not isinstance(seq, nn.Sequential)
        or seq[-1] is not trainable[0]
    ):
        raise ValueError(
            "closed-form constants need a linear model: an nn.Sequential (or a module whose .net is one) whose only "
            f"trainable layer is its last, an nn.Linear; got trainable layers {[type(m).__name__ for m in trainable]}"
        )
    return seq[:-1], trainable[0]


@torch.no_grad()
def max_feature_norm(features: nn.Module, inputs: Iterable[Tensor]) -> float:
    """``max ||features(x)||`` over the batches of inputs ``inputs`` (float64; the feature map in eval mode)."""
    was_training, best = features.training, 0.0
    features.eval()
    try:
        for x in inputs:
            phi = features(x).reshape(len(x), -1).double()
            if len(phi):
                best = max(best, float(phi.norm(dim=1).max()))
    finally:
        features.train(was_training)
    return best


def module_constants(
    module: nn.Module, inputs: Iterable[Tensor], l2: float | None = None, binary: bool = False
) -> ModelConstants:
    """:func:`linear_model_constants` of a linear model (:func:`linear_head`) over the inputs it will learn.

    Call it before training: ``||theta_0||`` is read from the module's current parameters.
    ``l2`` defaults to the module's ``l2`` attribute.
    """
    features, head = linear_head(module)
    l2 = float(getattr(module, "l2", 0.0)) if l2 is None else l2
    init = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in head.parameters()))
    return linear_model_constants(
        max_feature_norm(features, inputs), l2, init_norm=init, bias=head.bias is not None, binary=binary
    )
