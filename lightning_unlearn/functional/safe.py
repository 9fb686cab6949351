"""Pure-torch math of SAFE, streaming unlearning [SAFE].

Each forget request ``F_t`` is one round ``t``. The served model is one normalised gradient step
from the trained weights ``w_0`` (Eq. (27)) on the surrogate risk of Eq. (28): the retention term
(Eq. (14)), whose gradient at ``w_0`` is updated incrementally (Eq. (15)), plus the forgetting
term (Eq. (25)), a KL to a pseudo-target that re-weights ``f(x; w_0)`` by the label shift
(Eq. (20)) and a Gaussian class-conditional density ratio in a random projection (Eq. (21)-(24)).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.distributions import MultivariateNormal
from torch.func import functional_call, grad_and_value

Params = dict[str, Tensor]

#: log-ratio given to a class with no retained sample left (label-shift ratio 0)
EMPTY_CLASS_LOG_RATIO = math.log(1e-8)


def project(x: Tensor, V: Tensor) -> Tensor:
    """``u = V^T vec(x)`` per row (the projection of Eq. (21), before standardisation)."""
    return x.flatten(1).to(V.dtype) @ V


def class_sums(u: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-class sufficient statistics ``(n(c), sum u, sum u u^T)`` of projected samples."""
    k = u.shape[1]
    y = y.long()
    n = torch.bincount(y, minlength=num_classes).to(u.dtype)
    s1 = torch.zeros(num_classes, k, dtype=u.dtype, device=u.device).index_add_(0, y, u)
    s2 = torch.zeros(num_classes, k, k, dtype=u.dtype, device=u.device).index_add_(0, y, u[:, :, None] * u[:, None, :])
    return n, s1, s2


def remove_samples(counts: Tensor, s1: Tensor, s2: Tensor, u: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The deletion update of the class statistics (Eq. (22)-(23) in sufficient-statistics form, [derived]):
    ``n(c) - |F(c)|``, ``sum u - sum_F u``, ``sum u u^T - sum_F u u^T`` for projected forget samples ``u``.

    Raises:
        ValueError: a class would be left with a negative count (samples removed twice or never added).
    """
    n, f1, f2 = class_sums(u.to(s1), y.to(s1.device), counts.numel())
    left = counts - n.to(counts)
    if bool((left < 0).any()):
        raise ValueError(
            f"removing these samples leaves negative class counts {left.tolist()}: they were not all recorded"
        )
    return left, s1 - f1, s2 - f2


def class_moments(n: Tensor, s1: Tensor, s2: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """Per-class mean and unbiased covariance (plus ``ridge * trace/k * I``) from sufficient statistics.

    This is the exact form of the deletion updates Eq. (22) and Eq. (23); the paper's Eq. (23)
    itself is wrong, so the statistics are kept as sums and subtracted instead
    ([derived]). Classes with fewer than 2 samples get an identity covariance (never evaluated).
    """
    k = s1.shape[1]
    safe_n = n.clamp(min=1)[:, None]
    mean = s1 / safe_n
    cov = (s2 - safe_n[:, :, None] * mean[:, :, None] * mean[:, None, :]) / (n - 1).clamp(min=1)[:, None, None]
    eye = torch.eye(k, dtype=s1.dtype, device=s1.device)
    scale = torch.diagonal(cov, dim1=1, dim2=2).sum(-1).clamp(min=1e-12) / k
    cov = cov + ridge * scale[:, None, None] * eye
    return mean, torch.where((n >= 2)[:, None, None], cov, eye)


def log_density_ratio(u: Tensor, moments_t: tuple[Tensor, Tensor], moments_0: tuple[Tensor, Tensor]) -> Tensor:
    """``log N(u | mu_t^c, Sigma_t^c) - log N(u | mu_0^c, Sigma_0^c)`` for every sample and class, shape ``(n, C)``.

    The class-conditional ratio ``p_t(x|y)/p_0(x|y)`` of Eq. (17)-(19) under the Gaussian model of
    Eq. (21). It is computed on the raw projection ``u``: whitening by a fixed affine map (Eq. (21))
    gives the same ratio, the Jacobians cancel ([derived]).
    """
    dens_t = MultivariateNormal(moments_t[0], covariance_matrix=moments_t[1]).log_prob(u[:, None, :])
    dens_0 = MultivariateNormal(moments_0[0], covariance_matrix=moments_0[1]).log_prob(u[:, None, :])
    return dens_t - dens_0


def log_shift_ratio(
    u: Tensor, n_t: Tensor, n_0: Tensor, moments_t: tuple[Tensor, Tensor], moments_0: tuple[Tensor, Tensor]
) -> Tensor:
    """``log q_t^(c)(x)`` for every sample and every class ``c``, shape ``(n, C)`` (Eq. (24)).

    ``log q_c = log n_t(c) - log n_0(c) + log_density_ratio``: the label-shift ratio of Eq. (20)
    times the class-conditional density ratio of Eq. (21)-(23). The factor ``|D_0|/|D_t|`` of
    Eq. (20) is the same for all classes and cancels in the normalisation of Eq. (19), so it is
    left out. [interp] Classes with no retained sample get ``log(1e-8)``; classes
    with one retained sample keep only the label-shift factor; classes never learned get 0.
    """
    log_nt = torch.log(n_t.clamp(min=1)) - torch.log(n_0.clamp(min=1))
    ratio = log_density_ratio(u, moments_t, moments_0)
    has_density = (n_t >= 2) & (n_0 >= 2)
    log_q = log_nt + torch.where(has_density, ratio, torch.zeros_like(ratio))
    log_q = torch.where(n_0 > 0, log_q, torch.zeros_like(log_q))
    return torch.where((n_t == 0) & (n_0 > 0), torch.full_like(log_q, EMPTY_CLASS_LOG_RATIO), log_q)


def pseudo_target(logits_0: Tensor, log_q: Tensor) -> Tensor:
    """``f(x; w_t^*) ~ q_t(x) f(x; w_0)``, normalised over classes (Eq. (19), Eq. (24)).

    [interp]: ``q`` re-weights each class entry of the predictive distribution by its
    own ``q^(c)(x)``; a scalar weight would vanish in the normalisation.
    """
    return torch.softmax(logits_0.to(log_q.dtype) + log_q, dim=-1)


def kl_to_target(logits: Tensor, target: Tensor, direction: str = "model_to_target") -> Tensor:
    """Per-sample ``d_KL(f(x; w), target)`` of Eq. (8)/(25).

    ``"model_to_target"`` is ``KL(f(x;w) || target)``, the paper's argument order ([interp]);
    ``"target_to_model"`` is the reverse.
    """
    log_p = torch.log_softmax(logits.to(target.dtype), dim=-1)
    log_t = torch.log(target.clamp(min=1e-300))
    if direction == "model_to_target":
        return (log_p.exp() * (log_p - log_t)).sum(-1)
    if direction == "target_to_model":
        return (target * (log_t - log_p)).sum(-1)
    raise ValueError(f"kl direction must be 'model_to_target' or 'target_to_model', got {direction!r}")


def summed_loss_grad(
    module: nn.Module,
    params: Params,
    buffers: Mapping[str, Tensor],
    x: Tensor,
    y: Tensor,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
) -> tuple[Params, Tensor]:
    """``sum_i grad_w l(f(x_i; w), y_i)`` at ``params`` and the summed loss (the terms of Eq. (12)/(15)).

    ``l`` is the prediction loss of Eq. (1), "e.g. cross-entropy": ``loss_fn(outputs, targets) -> (n,)``
    per-sample losses (the module's own training loss).
    """

    def loss(p: Params) -> Tensor:
        return loss_fn(functional_call(module, {**p, **buffers}, (x,)), y).sum()

    grads, value = grad_and_value(loss)(params)
    return grads, value.detach()


def forgetting_grad(
    module: nn.Module,
    params: Params,
    buffers: Mapping[str, Tensor],
    x: Tensor,
    target: Tensor,
    weight: float,
    direction: str,
) -> tuple[Params, Tensor]:
    """Gradient at ``params`` of ``weight * mean_i d_KL(f(x_i; w), target_i)`` (Eq. (25), Eq. (26)) and its value."""

    def loss(p: Params) -> Tensor:
        logits = functional_call(module, {**p, **buffers}, (x,))
        return weight * kl_to_target(logits, target, direction).mean()

    grads, value = grad_and_value(loss)(params)
    return grads, value.detach()


def step_size(weight_norm: float, lr_constant: float, rounds: int) -> float:
    """``gamma = sqrt(W) / (K sqrt(T))`` of Theorem 2."""
    return math.sqrt(weight_norm) / (lr_constant * math.sqrt(rounds))


def normalised_step(w0: Tensor, g: Tensor, step: float, noise: Tensor) -> Tensor:
    """``w_t = w_0 - gamma g_t / ||g_t||_2 - b_t`` (Eq. (27), Alg. 1 line 11), ``step`` being the step size
    ``gamma``; a zero gradient takes no step."""
    norm = g.norm()
    direction = g / norm if norm > 0 else torch.zeros_like(g)
    return w0 - step * direction - noise


def theorem1_bound(num_classes: int, n_forgotten: int, n_retained: int) -> float:
    """``C sum_i |F_i| / |D_t|^{3/2}``: Theorem 1's bound on ``|R~_t(w) - R_t(w)|`` (up to its constant)."""
    return num_classes * n_forgotten / n_retained**1.5


def flatten(tensors: Mapping[str, Tensor], names: list[str]) -> Tensor:
    """Concatenate named tensors into one float64 vector (in ``names`` order)."""
    return torch.cat([tensors[n].detach().double().flatten() for n in names])


def unflatten(vector: Tensor, like: Mapping[str, Tensor], names: list[str]) -> Params:
    """Split a vector back into tensors shaped and typed like ``like``."""
    out, start = {}, 0
    for n in names:
        ref = like[n]
        out[n] = vector[start : start + ref.numel()].view(ref.shape).to(ref.dtype)
        start += ref.numel()
    return out
