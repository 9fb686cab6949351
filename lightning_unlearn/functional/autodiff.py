"""Autodiff helpers every method shares, pure torch: flat parameters, a module's per-sample loss, batched derivatives.

Parameters are handled as one flat vector ``theta`` of length ``d`` (the module's trainable parameters, in
``named_parameters`` order); per-sample gradients are ``vmap(grad(l))``, Hessian-vector products forward-over-reverse
(``jvp`` of ``grad``) ``vmap``-ed over the vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vmap

from lightning_unlearn.functional.forward_ad import load_forward_ad

ParamSpec = list[tuple[str, torch.Size]]


# -- flat parameters ------------------------------------------------------------------------------
def param_spec(module: nn.Module) -> ParamSpec:
    """Names and shapes of a module's trainable parameters, in ``named_parameters`` order.

    Args:
        module: the network.

    Returns:
        ``[(name, shape), ...]``, the layout of :func:`flat_params`'s vector.
    """
    return [(n, p.shape) for n, p in module.named_parameters() if p.requires_grad]


def unflatten(theta: Tensor, spec: ParamSpec) -> dict[str, Tensor]:
    """Split a flat vector into named parameter tensors (views; works under ``vmap``).

    Args:
        theta: the flat vector (its last dimension).
        spec: the layout, from :func:`param_spec`.

    Returns:
        ``{name: view of theta in the parameter's shape}``.

    Raises:
        ValueError: ``theta``'s length is not the parameters' total size.
    """
    out, start = {}, 0
    for name, shape in spec:
        size = math.prod(shape)
        out[name] = theta[start : start + size].view(shape)
        start += size
    if start != theta.shape[-1]:
        raise ValueError(f"flat vector has {theta.shape[-1]} entries but the parameters need {start}")
    return out


def flat_params(module: nn.Module) -> Tensor:
    """A module's trainable parameters as one detached flat vector.

    Args:
        module: the network.

    Returns:
        The ``(d,)`` vector, in :func:`param_spec`'s layout.
    """
    return torch.cat([p.detach().reshape(-1) for p in module.parameters() if p.requires_grad])


def set_flat_params(module: nn.Module, theta: Tensor) -> None:
    """Write a flat vector into a module's trainable parameters, in place (cast to each parameter's dtype).

    Args:
        module: the network.
        theta: the ``(d,)`` vector, in :func:`param_spec`'s layout.

    Raises:
        ValueError: ``theta``'s length is not the parameters' total size.
    """
    params = unflatten(theta, param_spec(module))
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.requires_grad:
                p.copy_(params[name].to(p))


def sum_rows(A: Tensor, rows: Tensor, like: Tensor) -> Tensor:
    """``sum_r A[r]`` over ``rows``, added in place one row view at a time (no gathered ``len(rows) x d`` copy; about
    10x faster than gathering on the CPU).

    Args:
        A: the ``(n, d)`` matrix.
        rows: the indices of the rows to add.
        like: the result's dtype and device.

    Returns:
        The ``(d,)`` sum; for one row of a matching ``A``, a view of that row.
    """
    if not rows.numel():
        return torch.zeros_like(like)
    first, *rest = rows.tolist()
    if not rest:
        return A[first].to(like)
    total = A[first].to(like, copy=True)
    for r in rest:
        total.add_(A[r].to(like.device))
    return total


# -- a module's per-sample loss -------------------------------------------------------------------
def cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-sample cross-entropy (no reduction), in at least float32: the recorders' default ``loss_fn``.

    Args:
        outputs: ``(n, classes)`` logits.
        targets: ``(n,)`` class indices.

    Returns:
        The ``(n,)`` losses.
    """
    logits = outputs.to(torch.promote_types(outputs.dtype, torch.float32))
    return nn.functional.cross_entropy(logits, targets.reshape(-1).long(), reduction="none")


class ModuleLoss:
    """The per-sample loss ``l(theta; x, y) = loss_fn(f_theta(x), y) + (l2/2)||theta||^2`` of a module, ``f_theta``
    the module called on the flat parameters ([HF] Eq. (2); [CCL]'s ``l`` with ``mu = l2``).

    Calling it evaluates ONE sample (for ``vmap(grad(.))``); :meth:`mean` evaluates the batch mean with one batched
    forward (the objective plain SGD with ``weight_decay=l2`` follows). The module's buffers are used as they are
    (BatchNorm must be in eval mode for a per-sample loss to exist).

    Args:
        module: the network; only its trainable parameters are replaced by ``theta``.
        l2: ridge coefficient (the optimizer's ``weight_decay`` in the recorders).
        loss_fn: ``loss_fn(outputs, targets) -> (n,)`` per-sample loss (default: :func:`cross_entropy`).
    """

    def __init__(
        self, module: nn.Module, l2: float = 0.0, loss_fn: Callable[[Tensor, Tensor], Tensor] = cross_entropy
    ) -> None:
        self.module, self.l2, self.loss_fn, self.spec = module, float(l2), loss_fn, param_spec(module)

    def mean(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        outputs = functional_call(self.module, unflatten(theta, self.spec), (x,))
        return self.loss_fn(outputs, y).mean() + 0.5 * self.l2 * theta.pow(2).sum()

    def __call__(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return self.mean(theta, x.unsqueeze(0), y.reshape(1, *y.shape))


def batch_mean_loss(loss: ModuleLoss, x: Tensor, y: Tensor) -> Callable[[Tensor], Tensor]:
    """The batch objective ``F_B(theta) = (1/|B|) sum_{i in B} l(theta; z_i)`` as a function of ``theta``.

    Args:
        loss: the module's per-sample loss.
        x, y: the batch.

    Returns:
        ``theta -> F_B(theta)``, a scalar.
    """
    return lambda theta: loss.mean(theta, x, y)


@contextmanager
def batch_statistics_only(module: nn.Module) -> Iterator[bool]:
    """For the duration, BatchNorm layers in training mode normalise with the batch's statistics without updating
    their running buffers (``track_running_stats`` off; the forward is the training forward).

    Args:
        module: the network.

    Yields:
        Whether such a layer exists (then the per-sample losses of a batch are coupled).
    """
    layers = [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats
    ]
    for m in layers:
        m.track_running_stats = False
    try:
        yield bool(layers)
    finally:
        for m in layers:
            m.track_running_stats = True


# -- batched derivatives ---------------------------------------------------------------------------
def per_sample_grads(loss: ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = None) -> Tensor:
    """The gradients ``grad l(theta; z_i)`` of every sample of a batch, one ``vmap`` over the samples.

    Args:
        loss: the module's per-sample loss.
        theta: the flat parameters.
        x, y: the samples.
        chunk_size: samples per ``vmap`` call; ``None``: all at once.

    Returns:
        The ``(n, d)`` gradients.
    """
    return vmap(grad(loss), in_dims=(None, 0, 0), chunk_size=chunk_size)(theta, x, y)


def hvps(loss: ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, V: Tensor, chunk_size: int | None = None) -> Tensor:
    """``V H_B`` for the rows of ``V``, ``H_B`` the (symmetric) Hessian of the batch objective :func:`batch_mean_loss`;
    forward-over-reverse (``jvp`` of ``grad``) ``vmap``-ed over the rows, each product costing about one gradient.

    Args:
        loss: the module's per-sample loss.
        theta: the flat parameters.
        x, y: the batch.
        V: ``(k, d)`` vectors.
        chunk_size: rows per ``vmap`` call; ``None``: all at once.

    Returns:
        The ``(k, d)`` products.
    """
    load_forward_ad()
    g = grad(batch_mean_loss(loss, x, y))
    return vmap(lambda v: jvp(g, (theta,), (v,))[1], chunk_size=chunk_size)(V)


def batch_hessian(loss: ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = 256) -> Tensor:
    """The dense Hessian of the batch objective, from :func:`hvps` of the identity (small models only).

    Args:
        loss: the module's per-sample loss.
        theta: the flat parameters.
        x, y: the batch.
        chunk_size: columns per ``vmap`` call.

    Returns:
        The symmetrised ``(d, d)`` Hessian.
    """
    eye = torch.eye(theta.numel(), dtype=theta.dtype, device=theta.device)
    H = hvps(loss, theta, x, y, eye, chunk_size)
    return 0.5 * (H + H.T)


def top_eigenvalue(apply_h: Callable[[Tensor], Tensor], v: Tensor, iters: int) -> tuple[float, Tensor]:
    """Power iteration for the largest absolute eigenvalue of a symmetric operator (an estimate of a smoothness
    constant).

    Args:
        apply_h: ``v -> H v``.
        v: the starting vector (a warm start).
        iters: the number of iterations.

    Returns:
        The estimate of ``|lambda_max(H)|`` and the last unit vector (the next warm start).
    """
    v = v / v.norm().clamp_min(1e-30)
    value = 0.0
    for _ in range(iters):
        hv = apply_h(v)
        value = float(hv.norm())
        v = hv / max(value, 1e-30)
    return value, v
