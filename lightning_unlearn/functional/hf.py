"""Hessian-Free online certified unlearning ([HF]), pure torch.

Equation numbers refer to [HF]. Parameters are one flat vector ``theta`` of length ``d`` and the per-sample loss is
:class:`~lightning_unlearn.functional.autodiff.ModuleLoss`, whose batch mean is exactly the objective plain SGD with
``weight_decay=l2`` follows.

The Hessian-vector products of the recursion come from :class:`StepObjective`, forward-over-reverse (``jvp`` of the
step's batch gradient) ``vmap``-ed over the vectors, so that each vector costs one HVP and the step's forward and
backward are paid once per chunk of vectors. :func:`propagate` applies one step of the recursion to a chunk of rows.
BatchNorm layers in training mode are supported (the Hessian and the gradients are those of the step's actual batch
loss, with batch statistics; running buffers are not updated by these passes,
:func:`~lightning_unlearn.functional.autodiff.batch_statistics_only`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cached_property

import torch
from torch import Tensor
from torch.func import functional_call, grad, jvp, vmap

from lightning_unlearn.functional import autodiff
from lightning_unlearn.functional.forward_ad import load_forward_ad

#: peak memory, in bytes, that :func:`hvp_chunk` gives one ``vmap`` call of :meth:`StepObjective.hvp`
HVP_MEMORY = 2**30


def activation_bytes(loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor) -> int:
    """Bytes the batch objective's forward saves for its backward at ``theta`` (activations and the weights the
    backward reads), counted with ``torch.autograd.graph.saved_tensors_hooks`` on one forward."""
    total = 0

    def pack(t: Tensor) -> Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    th = theta.detach().requires_grad_(True)
    with (
        torch.enable_grad(),
        autodiff.batch_statistics_only(loss.module),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        loss.mean(th, x, y)
    return total


def hvp_chunk(loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, memory: int = HVP_MEMORY) -> int:
    """Rows per ``vmap`` call of :meth:`StepObjective.hvp` within ``memory`` bytes: each row's tangent carries
    the forward's saved tensors through the forward and the backward, about three times :func:`activation_bytes`
    (a small model takes all rows at once: the call's fixed cost, a primal forward and backward plus the
    dispatch of every operation, is then paid once per step)."""
    return max(1, memory // max(1, 3 * activation_bytes(loss, theta, x, y)))


class StepObjective:
    """Derivatives of one SGD step's batch objective ``F_B(theta)`` ([HF] Eq. (3)) at ``theta``.

    :meth:`hvp` computes ``V H_B`` (Eq. (8), ``H_B`` symmetric) for the rows of ``V`` by forward-over-reverse
    differentiation (``torch.func``: ``jvp`` of the batch gradient, ``vmap``-ed over the rows, ``chunk_size`` rows
    per call): each call runs the batch's forward and backward once for the primal and batches every row's
    tangent through the same operations (Appendix B.3: each product costs about one gradient). The rows are
    split into the parameters' tangents as views, the ridge's ``l2 V`` is added once. BatchNorm layers in
    training mode use the batch's statistics (the step's actual loss) and their running buffers stay untouched
    (:func:`~lightning_unlearn.functional.autodiff.batch_statistics_only`).

    Args:
        loss: the module's per-sample loss (:class:`~lightning_unlearn.functional.autodiff.ModuleLoss`).
        theta: flat parameters ``w_t``.
        x, y: the step's batch.
        chunk_size: rows per ``vmap`` call in :meth:`hvp` and per-sample gradients per chunk (peak memory about
            ``chunk_size`` times the step's activations, :func:`activation_bytes`); ``None``: all at once.
    """

    def __init__(
        self, loss: autodiff.ModuleLoss, theta: Tensor, x: Tensor, y: Tensor, chunk_size: int | None = None
    ) -> None:
        self.loss, self.x, self.y, self.chunk_size = loss, x.detach(), y.detach(), chunk_size
        self.theta = theta.detach()
        with autodiff.batch_statistics_only(loss.module) as coupled:
            self.coupled = coupled
        # contiguous copies, like the tangents below: forward-mode AD takes a slow path (about 3x on a ResNet) for a
        # tangent whose storage offset differs from its primal's, and views of theta have offsets
        self._params = {name: p.clone() for name, p in autodiff.unflatten(self.theta, loss.spec).items()}

    @cached_property
    def grad(self) -> Tensor:
        """``grad F_B(theta)``: one forward and backward over the batch (batch statistics for BatchNorm)."""
        with autodiff.batch_statistics_only(self.loss.module):
            return grad(autodiff.batch_mean_loss(self.loss, self.x, self.y))(self.theta)

    def _data_loss(self, params: dict[str, Tensor]) -> Tensor:
        outputs = functional_call(self.loss.module, params, (self.x,))
        return self.loss.loss_fn(outputs, self.y).mean()

    def hvp(self, V: Tensor) -> Tensor:
        """``V H_B`` for the ``(k, d)`` rows of ``V`` (cast to ``theta``'s dtype), a new tensor, ``chunk_size`` rows per
        ``vmap`` call."""
        V = V.to(self.theta)
        out = torch.empty_like(V)
        if not V.shape[0]:
            return out
        load_forward_ad()
        data_grad = grad(self._data_loss)
        spans, start = [], 0
        for name, shape in self.loss.spec:
            spans.append((name, start, start + math.prod(shape), shape))
            start += math.prod(shape)
        for lo in range(0, V.shape[0], self.chunk_size or V.shape[0]):
            block = V[lo : lo + (self.chunk_size or V.shape[0])]
            tangents = {
                name: torch.empty((len(block), *shape), dtype=V.dtype, device=V.device).copy_(
                    block[:, a:b].reshape(len(block), *shape)
                )
                for name, a, b, shape in spans
            }
            with autodiff.batch_statistics_only(self.loss.module):
                products = vmap(lambda t: jvp(data_grad, (self._params,), (t,))[1])(tangents)
            for name, a, b, _ in spans:
                out[lo : lo + len(block), a:b] = products[name].reshape(len(block), b - a)
        return out.add_(V, alpha=self.loss.l2) if self.loss.l2 else out

    def hessian(self) -> Tensor:
        """Dense ``(d, d)`` ``H_B``, from :meth:`hvp` of the identity (small models only)."""
        H = self.hvp(torch.eye(self.theta.numel(), dtype=self.theta.dtype, device=self.theta.device))
        return 0.5 * (H + H.T)

    def sample_grads(self, positions: Tensor) -> Tensor:
        """``(m, d)`` injections of the batch elements at ``positions``: the gradient the step loses when the
        element is dropped from the batch, ``grad S_B - grad S_{B without it}`` with ``S = |B| F`` the batch sum.

        Without batch coupling this is ``grad l(theta; z)`` (``vmap(grad(l))``), Eq. (10)'s injection. With
        BatchNorm in training mode the other elements' losses depend on the element through the batch
        statistics, and the difference (one forward/backward over the batch without it, per element) is
        the first-order change of the step [derived].
        """
        x, y, theta = self.x[positions], self.y[positions], self.theta.detach()
        if positions.numel() == 0:
            return theta.new_zeros(0, theta.numel())
        if not self.coupled:
            return autodiff.per_sample_grads(self.loss, theta, x, y, self.chunk_size)
        n = self.x.shape[0]
        if n == 1:  # the batch without its only element is empty: the step loses its whole gradient
            return n * self.grad[None]
        out = []
        for p in positions.tolist():
            keep = torch.arange(n, device=self.x.device) != p
            th = theta.clone().requires_grad_(True)
            with torch.enable_grad(), autodiff.batch_statistics_only(self.loss.module):
                (g,) = torch.autograd.grad((n - 1) * self.loss.mean(th, self.x[keep], self.y[keep]), th)
            out.append(n * self.grad - g)
        return torch.stack(out)


# -- the recursion ---------------------------------------------------------------------------------
def propagate(
    rows: Tensor,
    hvp: Callable[[Tensor], Tensor],
    lr: float,
    batch_size: int,
    positions: Tensor | None = None,
    grads: Tensor | None = None,
) -> Tensor:
    """One step of the canonical forward recursion (equal to Eq. (10)) on a chunk of rows:

    ``a_{t+1} = (I - eta_t H_t) a_t + 1[u in B_t] (eta_t/|B_t|) grad l(w_t; u)``

    Args:
        rows: ``(k, d)`` vectors ``a_t`` of any storage dtype; they are cast to the dtype ``hvp`` returns
            (the parameters' dtype, e.g. float32 for float16 storage), in which the step accumulates.
        hvp: ``V -> V H_t`` for a ``(k, d)`` matrix, as a new tensor (it is updated in place; e.g.
            :meth:`StepObjective.hvp`, ``H_t`` symmetric).
        lr: the step's learning rate ``eta_t``.
        batch_size: ``|B_t|`` (all ranks' elements under DDP).
        positions: for each injected gradient, the index of its row in ``rows`` (a row repeated in the
            batch injects once per occurrence, footnote 5); ``None``: no injection.
        grads: ``(len(positions), d)`` per-sample gradients at ``w_t`` (:meth:`StepObjective.sample_grads`).
            The injection is NOT multiplied by this step's own ``(I - eta_t H_t)`` (Eq. (9)).

    Returns:
        The ``(k, d)`` vectors ``a_{t+1}`` in the accumulation dtype; the caller casts them to its storage.

    Raises:
        ValueError: ``grads`` and ``positions`` disagree in length or width.
    """
    if grads is not None and positions is not None and grads.shape != (positions.numel(), rows.shape[1]):
        raise ValueError(f"{positions.numel()} injected rows but per-sample gradients of shape {tuple(grads.shape)}")
    out = hvp(rows).mul_(-lr).add_(rows)  # in place on hvp's new tensor: one pass
    if positions is None or grads is None:
        return out
    return out.index_add_(0, positions.to(out.device), grads.to(out), alpha=lr / batch_size)


def rank_bracket(
    rows: Tensor,
    hvp: Callable[[Tensor], Tensor],
    lr: float,
    world_size: int,
    local_batch_size: int,
    positions: Tensor,
    grads: Tensor,
) -> Tensor:
    """One DDP rank's share of Eq. (10) for a chunk of rows (the rows are added once, by their owner):

    ``-(eta_t/W) a_t H_{B_r} + 1[u in B_r] (eta_t / (W |B_r|)) grad l(w_t; u)``

    A DDP step follows ``(1/W) sum_r F_{B_r}`` (the ranks' gradients averaged), so ``H_t = (1/W) sum_r H_{B_r}``
    and the sum of the ``W`` brackets plus ``a_t`` is :func:`propagate`'s ``a_{t+1}`` ([derived]; equal when
    the local batches have one size). ``hvp`` is rank ``r``'s ``V -> V H_{B_r}``, ``positions``/``grads`` the
    injections of rank ``r``'s batch elements as in :func:`propagate`. Returns the ``(k, d)`` bracket in the
    dtype ``hvp`` returns.
    """
    bracket = hvp(rows).mul_(-lr / world_size)
    if grads.shape != (positions.numel(), rows.shape[1]):
        raise ValueError(f"{positions.numel()} injected rows but per-sample gradients of shape {tuple(grads.shape)}")
    alpha = lr / (world_size * local_batch_size)
    return bracket.index_add_(0, positions.to(bracket.device), grads.to(bracket), alpha=alpha)


# -- noise calibration (Algorithm 1 line 13, Eqs. (12)-(13), (56)) --------------------------------
def per_sample_bound(
    occurrences: Tensor, lrs: Tensor, batch_sizes: Tensor, grad_bound: float, rho: float
) -> tuple[float, float]:
    """The two terms of the per-sample bound on ``||Delta^{-u}||`` (sum form before Eq. (56)).

    ``C_1 = 2 eta^2 G/(1-q) sum_{k<T} rho^{T-k-1}(q^k - q^{2k})`` (Taylor remainder, Eq. (53); for
    constant step size, q = 1, the limit ``2 eta^2 G sum_k k rho^{T-1-k}``) and
    ``C_2 = sum_{t in occ(u)} (2 eta G/|B_t|) rho^{T-t-1} q^t`` (gradient mismatch, Eq. (54)).
    [interp] ``eta = lrs[0]``, ``q`` is the largest observed step-size ratio (1 if the rate ever
    grows, e.g. when a new experience restarts its schedule), and ``C_2`` sums over the steps
    where u actually occurred (the paper's ``e B + b(u)``), with the actual ``|B_t|``.

    Summed in log space (``logsumexp``): with ``rho > 1`` (a step size too large for the curvature, as
    on a trained CNN) ``rho^T`` leaves the float range; a term that does is returned as ``inf``.
    """
    q = step_ratio(lrs)
    return taylor_term(lrs, grad_bound, rho, q), mismatch_term(occurrences, lrs, batch_sizes, grad_bound, rho, q)


def step_ratio(lrs: Tensor) -> float:
    """``q`` of :func:`per_sample_bound`: the largest observed step-size ratio, capped at 1 [interp]."""
    ratios = lrs[1:] / lrs[:-1] if lrs.numel() > 1 else lrs.new_ones(1)
    return min(1.0, float(ratios.max()))


def taylor_term(lrs: Tensor, grad_bound: float, rho: float, q: float) -> float:
    """``C_1`` of :func:`per_sample_bound` (Eq. (53)): the same for every sample of the trajectory."""
    T, eta = int(lrs.numel()), float(lrs[0])
    k = torch.arange(T, dtype=torch.float64)
    log_decay = torch.xlogy(T - k - 1, torch.tensor(rho, dtype=torch.float64))
    growth = k if q >= 1.0 else (q**k - q ** (2 * k)) / (1 - q)
    return _exp_sum(math.log(2 * eta**2 * grad_bound) if eta * grad_bound > 0 else -math.inf, log_decay + growth.log())


def mismatch_term(
    occurrences: Tensor, lrs: Tensor, batch_sizes: Tensor, grad_bound: float, rho: float, q: float
) -> float:
    """``C_2`` of :func:`per_sample_bound` (Eq. (54)) summed over ``occurrences`` (steps; those of one
    sample, or of several samples at once: the terms add), in ``O(len(occurrences))``."""
    T, eta = int(lrs.numel()), float(lrs[0])
    t = occurrences.double()
    rho_t, q_t = torch.tensor(rho, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    log_c2 = torch.xlogy(T - t - 1, rho_t) + torch.xlogy(t, q_t) - batch_sizes[occurrences].double().log()
    return _exp_sum(math.log(2 * eta * grad_bound) if eta * grad_bound > 0 else -math.inf, log_c2)


def _exp_sum(log_scale: float, log_terms: Tensor) -> float:
    """``exp(log_scale) * sum(exp(log_terms))`` in log space; ``inf`` past the float64 range, 0 for no terms."""
    if not log_terms.numel() or log_scale == -math.inf:
        return 0.0
    return float(torch.exp(torch.logsumexp(log_terms, 0) + log_scale))


def contraction_factor(lrs: Tensor, strong_convexity: float, smoothness: float) -> float:
    """Lemma 3: ``rho = max_t max{|1 - eta_t lambda|, |1 - eta_t M|}`` (conservative)."""
    lrs = lrs.double()
    return float(torch.maximum((1 - lrs * strong_convexity).abs(), (1 - lrs * smoothness).abs()).max())


def deletion_capacity(epsilon: float, delta: float, lr: float, dim: int, rho: float, steps: int) -> float:
    """Eq. (21), ``m = O(eps / (eta sqrt(ln(1/delta)) sqrt(d) rho^n))`` with the O-constant taken as 1
    and ``rho^n`` read as ``rho^T`` (``rho^{nE/|B|}`` in Eq. (14)) [interp]; computed in log space:
    ``inf`` when ``rho^T`` underflows, 0 when it overflows (``rho > 1`` over a long trajectory)."""
    if rho == 0 or lr == 0:
        return math.inf
    log_denom = math.log(lr) + 0.5 * math.log(math.log(1 / delta)) + 0.5 * math.log(dim) + steps * math.log(rho)
    return float(torch.exp(torch.tensor(math.log(epsilon) - log_denom, dtype=torch.float64)))


# -- the retrain the bounds compare with ([HF] Eqs. (4)-(5)) --------------------------------------------------------
def replay_sgd(
    loss: autodiff.ModuleLoss,
    theta: Tensor,
    batches: Iterable[tuple[Tensor, Tensor]],
    lrs: list[float],
    batch_sizes: list[int],
) -> Tensor:
    """[HF] Eqs. (4)-(5): plain SGD from ``theta`` over ``batches`` (step ``t``'s retained samples), each step's sum of
    per-sample gradients divided by the recorded ``batch_sizes[t]`` (the original ``|B_t|``: the step size per
    sample is unchanged when samples are left out; an empty batch takes no step). The retrain HF's vectors and
    the contraction bounds of :mod:`lightning_unlearn.functional.bounds` compare with."""
    for (x, y), lr, size in zip(batches, lrs, batch_sizes, strict=True):
        if len(y):
            theta = theta - lr / size * autodiff.per_sample_grads(loss, theta, x, y).sum(0)
    return theta
